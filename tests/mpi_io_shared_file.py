"""One shared file written by every rank with MPI-IO, for tests/test_preload.py: independent
contiguous writes, collective contiguous writes, collective strided writes through a file view
(two-phase I/O) and independent strided writes (ROMIO's data sieving: a read-modify-write of
the span under a byte-range lock, which BenchFS's locks make safe between ranks); read back
collectively and checked, then rank 0 prints the file's size and digest.

usage: mpiexec -n N python mpi_io_shared_file.py PATH"""

import hashlib
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
path = sys.argv[1]
block = 256 * 1024
amode = MPI.MODE_CREATE | MPI.MODE_RDWR


def pattern(part: int) -> np.ndarray:
    return ((np.arange(block, dtype=np.uint32) * 7 + rank * 131 + part * 17) % 251).astype(np.uint8)


fh = MPI.File.Open(comm, path, amode)
fh.Write_at(rank * block, pattern(0))  # independent, contiguous
fh.Write_at_all((size + rank) * block, pattern(1))  # collective, contiguous
# collective, strided: 4 KiB pieces of each rank interleaved after the first 2*size blocks
piece = 4096
ftype = MPI.BYTE.Create_vector(block // piece, piece, piece * size).Commit()
fh.Set_view(2 * size * block + rank * piece, MPI.BYTE, ftype)
fh.Write_all(pattern(2))
fh.Set_view(0, MPI.BYTE, MPI.BYTE)
# independent, strided: data sieving in ROMIO (read-modify-write of the span under a lock)
fh.Set_view((2 * size + 1) * block * size + rank * piece, MPI.BYTE, ftype)
fh.Write(pattern(3))
fh.Set_view(0, MPI.BYTE, MPI.BYTE)
fh.Sync()
comm.Barrier()
got = np.empty(block, dtype=np.uint8)
fh.Read_at_all((size + rank) * block, got)
assert (got == pattern(1)).all(), "collective read"
fh.Set_view(2 * size * block + rank * piece, MPI.BYTE, ftype)
fh.Read_all(got)
assert (got == pattern(2)).all(), "strided read"
fh.Close()
ftype.Free()
comm.Barrier()
if rank == 0:
    with open(path, "rb") as f:
        data = f.read()
    print(len(data), hashlib.sha256(data).hexdigest())
