"""BenchFS as an fsspec file system: `benchfs://` URLs for pandas, Dask, xarray, PyArrow, Zarr.

`fsspec.open("benchfs:///run/data.csv")` and `fsspec.filesystem("benchfs")` find the cluster
the way `benchfs.Client()` does (the variables `benchfs start` exports, or $BENCHFS_CONFIG);
the options `registry`, `config` (TOML text) and `expected_servers` name one instead, e.g.
`storage_options={"registry": "/path/to/registry"}` in pandas. `benchfs:///a/b` and
`benchfs://a/b` both mean the path `/a/b`.

Calls map onto the client: `ls`/`info` onto readdir and stat, `find` onto the servers' own
search (one request per metadata owner instead of a walk), `mv` onto rename, ranged
`cat_file` onto positional reads, files onto `benchfs.File` behind Python's buffering.
"""

from __future__ import annotations

import datetime
import errno
import io
import os
import posixpath
import threading
import time
from typing import Any

from fsspec import AbstractFileSystem

from benchfs.client import Client, Stat

#: What one buffered read or write moves when the caller gives no block size (BenchFS's
#: default chunk: one request per server).
DEFAULT_BLOCK = 4 << 20
#: cp_file's transfer size.
COPY_BLOCK = 4 << 20


class BenchFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec has no type hints
    """fsspec's interface over one `benchfs.Client` (connected at first use).

    Writing a file makes its missing parent directories, as object stores and fsspec's own
    tests expect (`auto_mkdir=False`: FileNotFoundError instead, as `open` does). One client
    serves one request at a time; threads sharing this object take turns. fsspec caches
    instances per set of options and per process, so a forked child (multiprocessing)
    connects one of its own."""

    protocol = "benchfs"
    root_marker = "/"

    def __init__(
        self,
        registry: str | None = None,
        config: str | None = None,
        expected_servers: int | None = None,
        auto_mkdir: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._options = (registry, config, expected_servers)
        self.auto_mkdir = auto_mkdir
        self._client: Client | None = None
        self._client_pid = 0
        self._connecting = threading.Lock()

    @property
    def client(self) -> Client:
        """The client, connected on first use in each process (a forked child that inherited
        this object connects its own: the parent's is the parent's)."""
        with self._connecting:
            if self._client is None or self._client_pid != os.getpid():
                registry, config, expected = self._options
                self._client = Client(registry, config=config, expected_servers=expected)
                self._client_pid = os.getpid()
            return self._client

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        path = str(path)
        if path.startswith("benchfs://"):
            path = path[len("benchfs://") :]
        elif path.startswith("benchfs:"):
            path = path[len("benchfs:") :]
        return posixpath.normpath("/" + path.lstrip("/"))

    def unstrip_protocol(self, name: str) -> str:
        return "benchfs://" + self._strip_protocol(name)

    # -- names -------------------------------------------------------------------------------

    @staticmethod
    def _details(path: str, st: Stat) -> dict[str, Any]:
        return {
            "name": path,
            "size": st.st_size if st.kind == "file" else 0,
            "type": {"dir": "directory", "file": "file"}.get(st.kind, "other"),
            "mode": st.st_mode,
            "mtime": st.st_mtime,
            "id": st.id,
            "islink": False,
        }

    def _link_details(self, path: str, own: Stat) -> dict[str, Any]:
        """A listed symbolic link, as fsspec's LocalFileSystem lists one (fsspec 2026.9.0,
        implementations/local.py, `info` of a DirEntry): type "other", so that walks do not
        descend through it, with its target's size when that is a file."""
        details = self._details(path, own)
        try:
            target = self.client.stat(path)
            details["size"] = target.st_size if target.kind == "file" else 0
        except OSError:
            details["size"] = 0  # dangling, or leading outside BenchFS
        details["islink"] = True
        details["destination"] = self.client.readlink(path)
        return details

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """The attributes `path` leads to; a symbolic link's add "islink" and "destination"
        (as LocalFileSystem.info of a path)."""
        path = self._strip_protocol(path)
        own = self.client.lstat(path)
        if not own.is_symlink():
            return self._details(path, own)
        details = self._details(path, self.client.stat(path))
        details["islink"] = True
        details["destination"] = self.client.readlink(path)
        return details

    def islink(self, path: str) -> bool:
        return self.client.islink(self._strip_protocol(path))

    def lexists(self, path: str, **kwargs: Any) -> bool:
        try:
            self.client.lstat(self._strip_protocol(path))
        except FileNotFoundError:
            return False
        return True

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if st.kind == "file":
            entries = [self._details(path, st)]
        else:
            entries = []
            for name, kind in self.client.readdir(path):
                child = posixpath.join(path, name)
                try:
                    if kind == "symlink":
                        entries.append(self._link_details(child, self.client.lstat(child)))
                    else:
                        entries.append(self._details(child, self.client.stat(child)))
                except FileNotFoundError:
                    continue  # removed since the listing
        return entries if detail else [e["name"] for e in entries]

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        path = self._strip_protocol(path)
        try:
            st = self.client.stat(path)
        except FileNotFoundError:
            return {} if detail else []
        if st.kind == "file":
            found = {path: self._details(path, st)}
        else:
            found = {}
            for f in self.client.find(path).found:
                if f.kind == "dir" and not withdirs:
                    continue
                found[f.path] = {
                    "name": f.path,
                    "size": f.size if f.kind == "file" else 0,
                    "type": {"dir": "directory", "file": "file"}.get(f.kind, "other"),
                    "mtime": f.mtime_ns / 1e9,
                    "islink": f.kind == "symlink",
                }
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self.client.exists(self._strip_protocol(path))

    def modified(self, path: str) -> datetime.datetime:
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.UTC)

    def created(self, path: str) -> datetime.datetime:
        # BenchFS keeps no birth time: the last change of the file's attributes is the
        # closest it has.
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_ctime, tz=datetime.UTC)

    def ukey(self, path: str) -> str:
        st = self.client.stat(self._strip_protocol(path))
        return f"{st.id}:{st.st_mtime_ns}:{st.st_size}"

    # -- directories -------------------------------------------------------------------------

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if create_parents:
            self.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if path == "/":
            if not exist_ok:
                raise FileExistsError(path)
            return
        missing = []
        probe = path
        while probe != "/":
            try:
                st = self.client.stat(probe)
            except FileNotFoundError:
                missing.append(probe)
                probe = posixpath.dirname(probe)
                continue
            if st.kind != "dir":
                raise NotADirectoryError(f"{probe} is a file")
            break
        if not missing and not exist_ok:
            raise FileExistsError(path)
        for p in reversed(missing):
            try:
                self.client.mkdir(p)
            except FileExistsError:
                if self.client.stat(p).kind != "dir":
                    raise
        self.invalidate_cache(path)

    def rmdir(self, path: str) -> None:
        self.client.rmdir(self._strip_protocol(path))
        self.invalidate_cache(path)

    # -- removal and renames -----------------------------------------------------------------

    def rm_file(self, path: str) -> None:
        self.client.unlink(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        path = self._strip_protocol(path)
        if self.client.lstat(path).kind == "dir":  # a link is removed, never its target
            self.client.rmdir(path)
        else:
            self.client.unlink(path)

    def rm(
        self, path: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # Deepest first, so directories are empty when their turn comes.
        for p in sorted(paths, key=lambda p: (p.count("/"), p), reverse=True):
            self._rm(p)
        self.invalidate_cache()

    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        single = isinstance(path1, str) and isinstance(path2, str) and not self._glob(path1)
        if single and maxdepth is None:
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if self.client.stat(src).kind == "file" or recursive:
                if self.isdir(dst):
                    dst = posixpath.join(dst, posixpath.basename(src))
                try:
                    self.client.rename(src, dst)
                except OSError as e:
                    # Directories BenchFS cannot rename (EXDEV, as rename(2) says when it
                    # will not) are copied and removed, as `mv` does.
                    if e.errno != errno.EXDEV:
                        raise
                else:
                    self.invalidate_cache()
                    return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    @staticmethod
    def _glob(path: str) -> bool:
        return any(c in path for c in "*?[")

    def _parent_for_write(self, path: str) -> None:
        if self.auto_mkdir:
            self.makedirs(posixpath.dirname(path), exist_ok=True)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.client.stat(src).kind == "dir":
            self.makedirs(dst, exist_ok=True)
            return
        self._parent_for_write(dst)
        buf = bytearray(COPY_BLOCK)
        view = memoryview(buf)
        with self.client.open(src, "rb") as fin, self.client.open(dst, "wb") as fout:
            while n := fin.readinto(view):
                fout.write(view[:n])

    # -- data --------------------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> io.BufferedIOBase:
        path = self._strip_protocol(path)
        if not autocommit:
            raise NotImplementedError("BenchFS has no transactions: use autocommit")
        size = DEFAULT_BLOCK if block_size in (None, "default") else int(block_size)  # type: ignore[arg-type]
        if "r" not in mode:
            self._parent_for_write(path)
        raw = self.client.open(path, mode.replace("t", "").replace("b", "") or "r")
        if raw.readable() and raw.writable():
            return io.BufferedRandom(raw, buffer_size=size)
        if raw.readable():
            return io.BufferedReader(raw, buffer_size=size)
        return io.BufferedWriter(raw, buffer_size=size)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        with self.client.open(path, "rb") as f:
            if start is None and end is None:
                return f.readall()
            size = f.size
            first = 0 if start is None else (start if start >= 0 else max(size + start, 0))
            last = size if end is None else (end if end >= 0 else max(size + end, 0))
            last = min(last, size)
            if last <= first:
                return b""
            return f.pread(last - first, first)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        self._parent_for_write(path)
        with self.client.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(value)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self._parent_for_write(path)
            with self.client.open(path, "wb"):
                pass
        else:
            self.client.utime(path, time.time_ns())

    def sign(self, path: str, expiration: int = 100, **kwargs: Any) -> str:
        raise NotImplementedError("BenchFS has no URLs to sign")
