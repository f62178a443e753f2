"""Standard streams that keep every byte when Python runs unbuffered.

With `PYTHONUNBUFFERED=1` (or `python -u`) `sys.stdout` is a text layer straight over the raw
file, and that layer drops the rest of a write the kernel took only in part (CPython
gh-85393, open since 2020). A write to a terminal is taken in part when a signal arrives
between its 2 KiB pieces, and Open MPI's `mpiexec` gives each rank a pseudo-terminal as its
stdout: under load, rank 0's IOR report came out cut after its first 2048 bytes, with exit
status 0. A buffered layer between the two writes the rest (`io.BufferedWriter` loops over
partial writes); lines still go out as they end.
"""

from __future__ import annotations

import io
import sys


def keep_every_byte() -> None:
    """Put a buffer under `sys.stdout` and `sys.stderr` where they write straight to the file."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not (isinstance(stream, io.TextIOWrapper) and isinstance(stream.buffer, io.RawIOBase)):
            continue
        stream.flush()
        buffered = io.BufferedWriter(stream.buffer)
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                buffered, encoding=stream.encoding, errors=stream.errors, line_buffering=True
            ),
        )
