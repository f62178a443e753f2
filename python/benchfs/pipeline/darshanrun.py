"""`benchfs-run launch --darshan PREFIX`: what must hold before a command is traced with
Darshan (its ranks get it through benchfs.rankexec; the logs land in the results' darshan/)."""

from __future__ import annotations

from pathlib import Path

from benchfs.mpi import flavour, linked_mpi
from benchfs.pipeline.spec import RunSpec


def darshan_problems(spec: RunSpec, mpiexec: str | None) -> list[str]:
    """One line per reason the run cannot trace with Darshan."""
    assert spec.darshan is not None
    if spec.workload != "command" or spec.via not in ("mount", "preload"):
        return [
            "--darshan traces a program of yours (--workload command --via mount or preload): "
            "the built-in workloads and the C library talk to BenchFS's client directly, "
            "where Darshan sees no file call"
        ]
    library = Path(spec.darshan) / "lib" / "libdarshan.so"
    if not library.is_file():
        return [
            f"--darshan {spec.darshan}: no lib/libdarshan.so (contrib/darshan/build-darshan.sh)"
        ]
    linked = linked_mpi(library)
    launcher = flavour(mpiexec) if mpiexec else None
    if linked and launcher and launcher != "unknown" and linked != launcher:
        return [
            f"--darshan {spec.darshan}: its libdarshan.so links {linked}'s MPI, the launcher "
            f"is {launcher}'s ({mpiexec}): build Darshan with that MPI's mpicc"
        ]
    return []
