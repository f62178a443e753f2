"""The program behind planted-small-random.darshan: rank 0 writes 2,000 small blocks (512
bytes) at random offsets of its file, every other rank writes 8 MiB sequentially in 1 MiB
requests, all through BenchFS's mount. Run under Darshan (README.md has the command)."""

import os
import random
import sys

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
path = os.path.join(sys.argv[1], f"planted.{rank}")
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
if rank == 0:
    rng = random.Random(42)
    block = b"r" * 512
    for _ in range(2000):
        os.pwrite(fd, block, rng.randrange(0, 64 << 20, 512))
else:
    chunk = b"s" * (1 << 20)
    for i in range(8):
        os.pwrite(fd, chunk, i << 20)
os.close(fd)
MPI.COMM_WORLD.Barrier()
