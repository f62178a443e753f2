"""The Python API: a `Client` of a running cluster whose files behave like Python's own.

`Client.open` returns a `File`, an `io.RawIOBase`: `read`, `readinto`, `write`, `seek`,
`tell`, `truncate`, `flush`, `fsync` and `close` work as on a file from `open(..., buffering=0)`,
so `io.BufferedReader`, `io.TextIOWrapper`, `shutil.copyfileobj` and numpy's `readinto` all
apply. `pread`, `pwrite` and `preadinto` do positional I/O without moving the position, for
parallel writers of one file. Every call releases the GIL while it waits for the servers;
`readinto` and `preadinto` fill the caller's buffer (bytearray, memoryview, numpy array) with
no copy in between. Failures raise OSError subclasses with errno set (`FileNotFoundError`,
`FileExistsError`, ...).

Consistency is close-to-open (docs/namespace.md): `close` and `fsync` publish the size this
handle wrote; an `open` afterwards, by any client, sees it.
"""

from __future__ import annotations

import io
import os
import stat as stat_module
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from benchfs import _core
from benchfs.checksum import FileChecksum
from benchfs.config import parse_config, resolve_config_text

if TYPE_CHECKING:
    from collections.abc import Buffer, Sequence

Kind = Literal["file", "dir", "symlink"]

_TYPE_BITS: dict[str, int] = {
    "file": stat_module.S_IFREG,
    "dir": stat_module.S_IFDIR,
    "symlink": stat_module.S_IFLNK,
}


def _kind(name: str) -> Kind:
    """A kind as the core names it."""
    if name == "dir":
        return "dir"
    if name == "symlink":
        return "symlink"
    return "file"


@dataclass(frozen=True)
class Stat:
    """What `Client.stat` returns: the `os.stat_result` fields BenchFS has, and the layout."""

    st_mode: int
    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    kind: Kind
    #: The file's 128-bit id as 32 hex digits (stable across rename).
    id: str
    chunk_size: int
    stripe_count: int
    stripe_start: int
    #: Copies of each chunk (`layout.replicas` when the file was created; 0: no data).
    replicas: int
    #: The file's bytes are kept with its name at its metadata owner, not in chunks (a small
    #: file, `layout.inline_max`); they move into chunks once it outgrows that.
    inline: bool

    @property
    def st_mtime(self) -> float:
        return self.st_mtime_ns / 1e9

    @property
    def st_ctime(self) -> float:
        return self.st_ctime_ns / 1e9

    def is_dir(self) -> bool:
        return self.kind == "dir"

    def is_file(self) -> bool:
        return self.kind == "file"

    def is_symlink(self) -> bool:
        return self.kind == "symlink"


def _stat_of(a: dict[str, int | str]) -> Stat:
    """A `Stat` of the core's attribute dict (its values are already ints and strs). Its
    fields go straight into the new instance's dict: the frozen dataclass's `__init__` sets
    each through `object.__setattr__`, which took 2.4-3.0 µs of a stat's ~4 µs in Python
    (`tests/test_pyapi.py` checks the two build equal objects)."""
    kind = _kind(str(a["kind"]))
    st = object.__new__(Stat)
    st.__dict__.update(
        st_mode=_TYPE_BITS[kind] | cast(int, a["mode"]),
        st_size=a["size"],
        st_mtime_ns=a["mtime_ns"],
        st_ctime_ns=a["ctime_ns"],
        kind=kind,
        id=a["id"],
        chunk_size=a["chunk_size"],
        stripe_count=a["stripe_count"],
        stripe_start=a["stripe_start"],
        replicas=a["replicas"],
        inline=bool(a["inline"]),
    )
    return st


def _bytes_view(buffer: Buffer) -> memoryview:
    """`buffer` as flat bytes (numpy arrays of any dtype included), without copying."""
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _flags_of(mode: str | int) -> tuple[int, bool, bool, bool]:
    """(os.O_* flags, readable, writable, append) for a built-in `open` mode or os.open flags."""
    if isinstance(mode, int):
        access = mode & os.O_ACCMODE
        if access not in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):
            raise ValueError(f"invalid access mode in flags {mode:#o}")
        readable = access in (os.O_RDONLY, os.O_RDWR)
        writable = access in (os.O_WRONLY, os.O_RDWR)
        return mode, readable, writable, bool(mode & os.O_APPEND)
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str or os.O_* flags, not {type(mode).__name__}")
    letters = set(mode)
    base = letters & set("rwxa")
    if len(mode) != len(letters) or not letters <= set("rwxab+") or len(base) != 1 or "t" in mode:
        raise ValueError(f"invalid mode {mode!r}: one of r, w, x, a, optionally + and b")
    plus = "+" in letters
    flags = {
        "r": 0,
        "w": os.O_CREAT | os.O_TRUNC,
        "x": os.O_CREAT | os.O_EXCL,
        "a": os.O_CREAT | os.O_APPEND,
    }[base.pop()]
    readable = "r" in letters or plus
    writable = "r" not in letters or plus
    return flags, readable, writable, "a" in letters


@dataclass(frozen=True)
class Found:
    """One match of `Client.find`."""

    path: str
    kind: Kind
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class FindResult:
    """What `Client.find` found: names `examined` under the root, `matched`, and the matches
    in path order (empty with `count_only`)."""

    examined: int
    matched: int
    found: list[Found]


def _span(start: int, length: int) -> tuple[int, int]:
    """[start, end) of a lock; length 0 reaches the end of the file."""
    if start < 0 or length < 0:
        raise ValueError(f"lock range start {start}, length {length}: must not be negative")
    return start, (2**64 - 1 if length == 0 else start + length)


class File(io.RawIOBase):
    """An open BenchFS file (see the module docstring). Not shared between threads: open the
    file once per thread, as with `os.open`; positional calls on one `File` are safe."""

    def __init__(
        self, core: _core.File, mode: str | int, readable: bool, writable: bool, append: bool
    ):
        super().__init__()
        self._core = core
        self._mode = mode
        self._readable = readable
        self._writable = writable
        self._append = append
        self._pos = 0
        self._lock = threading.Lock()

    # --- identity -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The path the file was opened by."""
        return self._core.path

    @property
    def mode(self) -> str | int:
        return self._mode

    @property
    def id(self) -> str:
        """The file's 128-bit id as 32 hex digits."""
        return self._core.id

    @property
    def size(self) -> int:
        """The size as this handle knows it: the owner's at open and its own writes."""
        return self._core.size

    @property
    def chunk_size(self) -> int:
        """Bytes per chunk of the file's layout: the ranges of its checksum."""
        return self._core.chunk_size

    def checksum(self) -> FileChecksum:
        """As `Client.checksum`, at the size this handle knows (the size at open and its own
        writes), without looking the path up again."""
        self._check_open()
        return FileChecksum.from_core(self._core.checksum())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self._pos}"
        return f"<benchfs.File {self._core.path!r} mode={self._mode!r} {state}>"

    # --- io.RawIOBase ---------------------------------------------------------------------

    def readable(self) -> bool:
        self._check_open()
        return self._readable

    def writable(self) -> bool:
        self._check_open()
        return self._writable

    def seekable(self) -> bool:
        self._check_open()
        return True

    def readinto(self, buffer: Buffer) -> int:
        """Reads into `buffer` at the position and advances it; 0 at the end of the file."""
        self._check_readable()
        with self._lock:
            n = self._core.readinto(self._pos, _bytes_view(buffer))
            self._pos += n
            return n

    def readinto_hashed(self, buffer: Buffer) -> tuple[int, tuple[str, ...]]:
        """As `readinto`, from a chunk-aligned position; also the xxh3-128 (32 hex digits) of
        each chunk part read, cut at chunk boundaries, as the servers read it from their
        storage and hashed it in the buffer they sent it from (one pass over their devices).
        In whole chunks, these are the file's `checksum` ranges (`benchfs.checksum`)."""
        self._check_readable()
        with self._lock:
            n, digests = self._core.readinto_hashed(self._pos, _bytes_view(buffer))
            self._pos += n
            return n, tuple(digests)

    def read(self, size: int | None = -1) -> bytes:
        """Up to `size` bytes from the position (all the rest for -1 or None)."""
        if size is None or size < 0:
            return self.readall()
        self._check_readable()
        with self._lock:
            data = self._core.read(self._pos, size)
            self._pos += len(data)
            return data

    def readall(self) -> bytes:
        """The rest of the file, in one request batch (the servers are asked in parallel)."""
        self._check_readable()
        with self._lock:
            data = self._core.read(self._pos, max(self._core.size - self._pos, 0))
            self._pos += len(data)
            return data

    def write(self, data: Buffer) -> int:
        """Writes all of `data` at the position (at the end in append mode) and advances it."""
        self._check_writable()
        with self._lock:
            if self._append:
                self._pos = self._core.size
            n = self._core.write(self._pos, _bytes_view(data))
            self._pos += n
            return n

    def write_checked(self, data: Buffer, check: str = "stored") -> tuple[str, ...]:
        """Writes all of `data` as `write` does; returns the xxh3-128 (32 hex digits) of each
        chunk part of the range written, cut at chunk boundaries: with `check="stored"` as the
        servers read it back after writing it (the device covered), with `"received"` as
        they received it, hashed in the buffer they store from (the network and the receipt
        covered; no second pass over the device). From a chunk-aligned position, in whole
        chunks, these are the file's `checksum` ranges (`benchfs.checksum`)."""
        self._check_writable()
        with self._lock:
            if self._append:
                self._pos = self._core.size
            view = _bytes_view(data)
            digests = self._core.write_checked(self._pos, view, check)
            self._pos += len(view)
            return tuple(digests)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check_open()
        with self._lock:
            if whence == os.SEEK_SET:
                base = 0
            elif whence == os.SEEK_CUR:
                base = self._pos
            elif whence == os.SEEK_END:
                base = self._core.size
            else:
                raise ValueError(f"invalid whence {whence} (SEEK_SET, SEEK_CUR or SEEK_END)")
            if base + offset < 0:
                raise OSError(22, f"negative seek position {base + offset}")
            self._pos = base + offset
            return self._pos

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        """Sets the size (default: the position); the position does not move."""
        self._check_writable()
        with self._lock:
            new_size = self._pos if size is None else size
            if new_size < 0:
                raise OSError(22, f"negative size {new_size}")
            self._core.truncate(new_size)
            return new_size

    def flush(self) -> None:
        """Waits until every write is on the servers (a write returns once it is sent, see
        client.write_behind); raises the first that failed. `fsync` makes them durable and
        publishes the size."""
        self._check_open()
        with self._lock:
            if not self._core.closed:  # io's close flushes after ours closed the handle
                self._core.flush()

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a BenchFS file has no file descriptor (use the FUSE mount)")

    def isatty(self) -> bool:
        self._check_open()
        return False

    def close(self) -> None:
        """Publishes the size this handle wrote, then closes. Idempotent."""
        if self.closed:
            return
        try:
            self._core.close()
        finally:
            super().close()

    # --- BenchFS extras -------------------------------------------------------------------

    def fsync(self) -> None:
        """Returns once every byte of the file is durable on its servers; publishes the size."""
        self._check_open()
        self._core.fsync()

    def lock(
        self, exclusive: bool = True, start: int = 0, length: int = 0, wait: bool = True
    ) -> bool:
        """Locks bytes [start, start + length) of the file (length 0: to its end, however it
        grows), shared or exclusive, for this open file, across every client of the job (an
        OFD lock, as `fcntl.F_OFD_SETLK`): released by `unlock` or `close`. Waits while
        another holder conflicts; with `wait=False`, returns False at once instead. Taking or
        releasing a lock is a boundary: writes are on the servers first, and nothing read
        ahead is used after it."""
        self._check_open()
        held = self._core.lock("write" if exclusive else "read", *_span(start, length), wait)
        return held is None

    def unlock(self, start: int = 0, length: int = 0) -> None:
        """Releases this open file's locks on bytes [start, start + length) (0: to the end)."""
        self._check_open()
        self._core.lock("unlock", *_span(start, length))

    def lock_conflict(
        self, exclusive: bool = True, start: int = 0, length: int = 0
    ) -> dict[str, int | str] | None:
        """The lock that would keep this one from being taken (kind, start, end, pid; as
        `F_OFD_GETLK`), or None."""
        self._check_open()
        return self._core.lock(
            "write" if exclusive else "read", *_span(start, length), wait=False, test=True
        )

    def pread(self, length: int, offset: int) -> bytes:
        """Up to `length` bytes at `offset` (short only at the end); the position stays."""
        self._check_readable()
        if length < 0 or offset < 0:
            raise ValueError("length and offset must not be negative")
        return self._core.read(offset, length)

    def preadinto(self, buffer: Buffer, offset: int) -> int:
        """Fills `buffer` from `offset` without a copy; returns the bytes read."""
        self._check_readable()
        if offset < 0:
            raise ValueError("offset must not be negative")
        return self._core.readinto(offset, _bytes_view(buffer))

    def pwrite(self, data: Buffer, offset: int) -> int:
        """Writes all of `data` at `offset`; the position stays."""
        self._check_writable()
        if offset < 0:
            raise ValueError("offset must not be negative")
        return self._core.write(offset, _bytes_view(data))

    # --- checks ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _check_readable(self) -> None:
        self._check_open()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")


class Client:
    """A client of a running BenchFS cluster.

    Waits until `expected_servers` (default: `cluster.expected_servers` of the configuration)
    have registered in `registry_dir` (default: `cluster.registry_dir` of the configuration);
    connects to each server on its first request there (to all of them at once with
    `cluster.connect_at_start`). One client serves one request at a time; threads that share
    it take turns, so give each thread its own client for parallel I/O. `config` is TOML text
    (`benchfs.config.resolve_config_text`); None means the defaults with $BENCHFS_CONFIG and
    BENCHFS_* applied, so in a job started by `benchfs start` `Client()` finds its cluster.
    """

    def __init__(
        self,
        registry_dir: str | os.PathLike[str] | None = None,
        config: str | None = None,
        expected_servers: int | None = None,
    ) -> None:
        if registry_dir is None:
            text = config if config is not None else resolve_config_text()
            registry_dir = parse_config(text)["cluster"]["registry_dir"]
            if not registry_dir:
                raise ValueError(
                    "no registry directory: pass one, or set BENCHFS_REGISTRY or BENCHFS_CONFIG "
                    '(eval "$(benchfs start ...)" sets both)'
                )
        self._core = _core.Client(os.fspath(registry_dir), config, expected_servers)

    def open(self, path: str, mode: str | int = "r", perm: int = 0o644) -> File:
        """Opens `path` like the built-in `open` (binary modes "r", "w", "x", "a", with "+"
        for both directions; "b" is implied) or like `os.open` when `mode` is an int of os.O_*
        flags (e.g. `os.O_RDWR | os.O_CREAT` to share one file between writers)."""
        flags, readable, writable, append = _flags_of(mode)
        core = self._core.open(path, flags, perm)
        return File(core, mode, readable, writable, append)

    def stat(self, path: str) -> Stat:
        """The attributes of `path`, symbolic links followed."""
        return _stat_of(self._core.stat(path))

    def lstat(self, path: str) -> Stat:
        """The attributes of `path` itself: a symbolic link's own (kind "symlink", its size
        the target's length), not its target's."""
        return _stat_of(self._core.lstat(path))

    def symlink(self, target: str, path: str) -> None:
        """Makes a symbolic link at `path` to `target`, kept as given (as `os.symlink`): a
        relative target is resolved from the link's directory when followed, an absolute one
        is a host path, followed inside BenchFS under its mount point or prefix
        (docs/namespace.md). OSError EEXIST if `path` exists."""
        self._core.symlink(target, path)

    def readlink(self, path: str) -> str:
        """The target of the symbolic link at `path` (OSError EINVAL if it is not one)."""
        return self._core.readlink(path)

    def realpath(self, path: str) -> str:
        """`path` with every symbolic link in it resolved (`os.path.realpath(strict=True)`):
        FileNotFoundError if it leads nowhere, OSError EXDEV if it leads outside BenchFS."""
        return self._core.realpath(path)

    def islink(self, path: str) -> bool:
        try:
            return self._core.lstat(path)["kind"] == "symlink"
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        try:
            self._core.stat(path)
        except FileNotFoundError:
            return False
        return True

    def listdir(self, path: str = "/") -> list[str]:
        """The names in a directory, in name order."""
        return [name for name, _ in self._core.readdir(path)]

    def readdir(self, path: str = "/") -> list[tuple[str, Kind]]:
        """The entries of a directory as (name, kind) pairs, kind "file", "dir" or
        "symlink", in name order (one metadata owner answers)."""
        return [(name, _kind(kind)) for name, kind in self._core.readdir(path)]

    def find(
        self,
        root: str = "/",
        *,
        name: str = "",
        kind: Kind | None = None,
        size: tuple[int, int] | None = None,
        newer_ns: int = 0,
        count_only: bool = False,
    ) -> FindResult:
        """Every name under `root` (and `root` itself) whose last component matches the glob
        `name` (empty: any), of `kind`, with a size in `size` (low, high; inclusive) and a
        modification time after `newer_ns`, evaluated on the servers: each metadata owner
        checks the names it holds and answers with counts and pages of matches."""
        low, high = size if size is not None else (0, 2**64 - 1)
        examined, matched, found = self._core.find(
            root, name, kind, low, high, newer_ns, count_only
        )
        return FindResult(
            examined,
            matched,
            [Found(p, _kind(k), n, t) for p, k, n, t in found],
        )

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self._core.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        """OSError ENOTEMPTY when the directory has entries."""
        self._core.rmdir(path)

    def unlink(self, path: str) -> None:
        """Removes a file and frees its chunks on every server holding them."""
        self._core.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        """Data does not move. A non-empty directory gets EXDEV (docs/namespace.md)."""
        self._core.rename(src, dst)

    def truncate(self, path: str, size: int) -> None:
        """Sets the size of the file at `path`; shrinking frees the chunks beyond it."""
        self._core.truncate(path, size)

    def chmod(self, path: str, mode: int) -> None:
        """Sets the permission bits (stored and reported; BenchFS does not enforce them)."""
        self._core.set_attr(path, mode=mode & 0o7777)

    def set_attrs(self, path: str, mode: int, mtime_ns: int) -> None:
        """`chmod` and `utime` at once, in one request."""
        self._core.set_attr(path, mode=mode & 0o7777, mtime_ns=mtime_ns)

    def utime(self, path: str, mtime_ns: int, follow_symlinks: bool = True) -> None:
        """Sets the modification time, in nanoseconds since the Unix epoch; with
        `follow_symlinks=False`, a symbolic link's own (EINVAL if `path` is not one)."""
        if follow_symlinks:
            self._core.set_attr(path, mtime_ns=mtime_ns)
        else:
            self._core.set_link_time(path, mtime_ns)

    def locate(self, path: str, offset: int) -> int:
        """The id of the server that holds byte `offset` of the file at `path`."""
        return self._core.locate(path, offset)

    def locate_metadata(self, path: str) -> int:
        """The id of the server keeping `path`'s metadata (its name, size and layout): its
        metadata owner's server, whether or not it is lost."""
        return self._core.locate_metadata(path)

    def locate_locks(self, path: str) -> int:
        """The id of the server keeping the locks of the file at `path` now (a lost keeper's
        locks are lost; with copies of the metadata, the copy serving its names keeps the
        file's locks from then on)."""
        return self._core.locate_locks(path)

    def locate_metadata_copies(self, path: str) -> list[int]:
        """The ids of the servers keeping copies of `path`'s metadata (`layout.replicas`), by
        the record of lost servers now: the complete copies, the first serving, then those
        that only take changes (standing in before a repair, or being caught up)."""
        return self._core.locate_metadata_copies(path)

    def locate_copies(self, path: str, offset: int) -> list[int]:
        """The ids of the servers holding the copies of byte `offset` of the file at `path`
        (`layout.replicas` of them), in the order reads try them."""
        return self._core.locate_copies(path, offset)

    def lost_servers(self) -> dict[str, list[int]]:
        """The servers declared lost (a change of a file of several copies, or of the metadata,
        went on without them: they are not used until `repair` catches them up), those whose
        copies `repair` re-created, and those it is catching up: {"lost": [ids], "repaired":
        [ids], "joining": [ids]}."""
        return self._core.lost_servers()

    def declare_lost(self, ids: list[int]) -> None:
        """Declares servers lost (what `benchfs repair` does with servers that do
        not answer): files of several copies are no longer placed on, or read from, them."""
        self._core.declare_lost(ids)

    def record_repaired(self, ids: list[int]) -> None:
        """Records that the copies the servers `ids` held were re-created elsewhere."""
        self._core.record_repaired(ids)

    def record_rejoined(self, ids: list[int]) -> None:
        """Records that the servers `ids` were caught up: every client uses them again."""
        self._core.record_rejoined(ids)

    def record_joining(self, ids: list[int]) -> None:
        """Records that the servers `ids` are being caught up (`repair`): with copies of the
        metadata, they take its changes from now on and serve nothing yet."""
        self._core.record_joining(ids)

    def catch_up_metadata(self) -> int:
        """Hands the copies of the metadata that stand in for lost servers, or that are being
        caught up, the serving copies' state; returns the records copied (0 without copies of
        the metadata)."""
        return self._core.catch_up_metadata()

    def reachable_files(
        self, root: str = "/"
    ) -> tuple[list[tuple[str, int]], list[tuple[int, str]]]:
        """Every file under `root` as (path, size), from the metadata owners that answer, and
        (server id, error) per owner whose server is gone (its files are not listed: a file's
        metadata has one copy, on its owner)."""
        return self._core.reachable_files(root)

    def copies_left(
        self, paths: list[str], lost: list[int]
    ) -> list[tuple[int, int | None] | OSError]:
        """Per path: (copies asked, the fewest any of its chunks keeps on servers not in
        `lost`; None for an empty file), or the OSError that stopped it (returned)."""
        return self._core.copies_left(paths, lost)

    def repair(
        self, paths: list[str], rejoining: list[int] | None = None
    ) -> list[dict[str, int] | OSError]:
        """Re-creates the copies that servers declared lost held of each file's chunks, on
        the servers that took their place and on the declared servers `rejoining` (which
        answer again: caught up, their chunks cut at each file's size first), each checked
        against its source's checksum: per path {"copies", "bytes", "lost_chunks"} or the
        OSError that stopped it (returned)."""
        return self._core.repair(paths, rejoining or [])

    def checksum(self, path: str) -> FileChecksum:
        """The xxh3-128 of each chunk-aligned range of the file at `path`, as the servers
        holding the chunks read them back from their storage, every server at once
        (`benchfs.checksum`). Compare with `ChunkHasher` over the bytes that should be there.
        This client's own writes behind are waited for first."""
        return FileChecksum.from_core(self._core.checksum(path))

    def put_files(
        self, files: Sequence[tuple[str, Buffer, int, int]], check: str = "stored"
    ) -> list[FileChecksum | OSError]:
        """Writes each `(path, data, mode, mtime_ns)` whole: created (or truncated), written,
        and given its size, mode and time, many files at once (`client.max_inflight`). For
        each, in order, the checksum of its bytes as `check` says (as `File.write_checked`:
        "stored", read back after writing, as `checksum` gives it; "received", as the servers
        received them), or the OSError that stopped it, returned, not raised: a failed file
        is never published at its full size."""
        results = self._core.put_files([(p, bytes(d), m, t) for p, d, m, t in files], check)
        return [r if isinstance(r, OSError) else FileChecksum.from_core(r) for r in results]

    def statfs(self) -> dict[str, Any]:
        """The cluster's capacity: `total_bytes`, `free_bytes`, `avail_bytes`, `used_bytes`
        of the file systems holding the servers' data (each counted once however many servers
        share it), `files` (files and directories in BenchFS), and `servers`: per server `id`,
        `node`, `host`, `latency_s`, `error` (None when it answered; then it is left out of
        the totals) and its own figures. OSError only when no server answers."""
        return self._core.statfs()

    def server_ids(self) -> list[int]:
        """The servers this client uses, ascending."""
        return self._core.server_ids()

    def server_stats(self) -> list[dict[str, int]]:
        """Per server: id, requests, retries, timeouts, failures (as this client saw them)."""
        return self._core.server_stats()

    def close(self) -> None:
        """Closes the connections. Idempotent."""
        self._core.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
