"""Core dumps of crashed daemons (servers and mounts): where they go, and the line that says
where they went.

Each daemon starts in a directory of its own beside its log (`core-server-<id>/`,
`core-mount-<node>/`) and raises its core size limit to the hard limit (benchfsd and
benchfs-mount do that themselves), so that with the kernel's usual
`core_pattern` (a relative `core`) a crash leaves its core dump in the run. With a pattern that
pipes cores to a program (systemd-coredump, apport) the line names that program instead. The
binary's GNU build id goes with the core, so the dump can be matched to its binary later.
"""

from __future__ import annotations

import contextlib
import signal
import struct
from pathlib import Path

__all__ = [
    "CORE_SIGNALS",
    "binary_in",
    "build_id",
    "core_dir",
    "cores_in",
    "in_dir",
    "report",
    "tidy",
]

#: Signals whose default action dumps core (signal(7)).
CORE_SIGNALS = frozenset(
    {
        signal.SIGQUIT,
        signal.SIGILL,
        signal.SIGTRAP,
        signal.SIGABRT,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGSEGV,
        signal.SIGSYS,
        signal.SIGXCPU,
        signal.SIGXFSZ,
    }
)

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
NT_GNU_BUILD_ID = 3


def core_dir(log_path: Path, daemon: str) -> Path:
    """The directory `daemon` ("server-3", "mount-node1") starts in (its core dump's place)."""
    return log_path.parent / f"core-{daemon}"


def binary_in(argv: list[str], name: str) -> str:
    """The path of program `name` in a launched command line (`name` if it is not there)."""
    return next((a for a in argv if a.endswith(name)), name)


def cores_in(directory: Path) -> list[Path]:
    """The core dumps in `directory`."""
    return sorted(p for p in directory.glob("core*") if p.is_file() and p.suffix != ".txt")


def in_dir(directory: Path, argv: list[str]) -> list[str]:
    """`argv` started in `directory`, by exec (the process is still argv's own). Where the
    directory does not exist (a node that does not see the run's directory) it starts where
    it would have."""
    return ["sh", "-c", 'cd "$0" 2>/dev/null; exec "$@"', str(directory), *argv]


def build_id(binary: Path) -> str | None:
    """The GNU build id of an ELF file (hex), or None."""
    try:
        data = binary.read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None  # only 64-bit little-endian ELF, what benchfsd is built as
    shoff, _, _, _, _, shentsize, shnum = struct.unpack_from("<QIHHHHH", data, 0x28)
    for i in range(shnum):
        sh_type, _, _, offset, size = struct.unpack_from("<IQQQQ", data, shoff + i * shentsize + 4)
        if sh_type != 7:  # SHT_NOTE
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name_end = pos + 12 + ((namesz + 3) & ~3)
            desc = data[name_end : name_end + descsz]
            if ntype == NT_GNU_BUILD_ID and data[pos + 12 : pos + 12 + namesz] == b"GNU\0":
                return desc.hex()
            pos = name_end + ((descsz + 3) & ~3)
    return None


def report(directory: Path, binary: str) -> str:
    """One line on where the core dump of the daemon that started in `directory` is. Writes
    the binary's path and build id beside a core found there."""
    cores = cores_in(directory)
    bid = build_id(Path(binary))
    name = Path(binary).name
    if cores:
        for core in cores:
            note = core.with_name(core.name + ".txt")
            if not note.exists():
                note.write_text(f"binary {binary}\nbuild_id {bid}\n")
        names = ", ".join(str(c) for c in cores)
        return f"core dump {names} ({name} build id {bid}; gdb {binary} {cores[0]})"
    try:
        pattern = CORE_PATTERN.read_text().strip()
    except OSError:
        pattern = ""
    if pattern.startswith("|"):
        program = pattern[1:].split()[0] if pattern[1:].split() else pattern
        return f"its core dump went to {program} (kernel.core_pattern); {name} build id {bid}"
    return (
        f"no core dump in {directory} (kernel.core_pattern {pattern!r}; a hard core size "
        f"limit of 0 forbids them); {name} build id {bid}"
    )


def tidy(directory: Path) -> None:
    """Removes the directory if the daemon left nothing in it."""
    with contextlib.suppress(OSError):
        directory.rmdir()
