"""Property test: random sequences of namespace and I/O operations from several clients on a
real local cluster, each compared with an in-memory model (results, errno and every byte).

The model states the semantics docs/namespace.md documents, including BenchFS's chosen
deviations (a lookup under a file is ENOENT, renaming a non-empty directory is EXDEV).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from benchfs import Client

DIRS = ["/a", "/b", "/a/c"]
FILES = ["/f", "/g", "/a/f", "/a/c/f", "/b/g", "/f/x"]
PATHS = sorted({*DIRS, *FILES, "/"})
CHUNK = 4096


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class Model:
    """Directories are sets of names; files are bytearrays."""

    def __init__(self) -> None:
        self.dirs: dict[str, set[str]] = {"/": set()}
        self.files: dict[str, bytearray] = {}

    def exists(self, p: str) -> bool:
        return p in self.dirs or p in self.files

    def add(self, p: str) -> None:
        self.dirs[parent(p)].add(p.rsplit("/", 1)[1])

    def drop(self, p: str) -> None:
        self.dirs[parent(p)].discard(p.rsplit("/", 1)[1])

    def absent(self, p: str) -> int:
        """The error for a path that names nothing: ENOTDIR if a file is among its parents
        (the client's failed lookup walks them, looking for symbolic links), else ENOENT."""
        parents = [p[:i] for i in range(1, len(p)) if p[i] == "/"]
        return errno.ENOTDIR if any(q in self.files for q in parents) else errno.ENOENT

    def parent_error(self, p: str) -> int | None:
        par = parent(p)
        if par in self.files:
            return errno.ENOTDIR
        if par not in self.dirs:
            return self.absent(p)
        return None

    def mkdir(self, p: str) -> int | None:
        if (e := self.parent_error(p)) is not None:
            return e
        if self.exists(p):
            return errno.EEXIST
        self.dirs[p] = set()
        self.add(p)
        return None

    def create(self, p: str, excl: bool, trunc: bool) -> int | None:
        if (e := self.parent_error(p)) is not None:
            return e
        if p in self.dirs:
            return errno.EISDIR
        if p in self.files:
            if excl:
                return errno.EEXIST
            if trunc:
                self.files[p] = bytearray()
            return None
        self.files[p] = bytearray()
        self.add(p)
        return None

    def write(self, p: str, offset: int, data: bytes) -> int | None:
        if p in self.dirs:
            return errno.EISDIR
        if p not in self.files:
            return self.absent(p)
        f = self.files[p]
        if len(f) < offset + len(data):
            f.extend(bytes(offset + len(data) - len(f)))
        f[offset : offset + len(data)] = data
        return None

    def unlink(self, p: str) -> int | None:
        if p in self.dirs:
            return errno.EISDIR
        if p not in self.files:
            return self.absent(p)
        del self.files[p]
        self.drop(p)
        return None

    def rmdir(self, p: str) -> int | None:
        if p == "/":
            return errno.EBUSY
        if p in self.files:
            return errno.ENOTDIR
        if p not in self.dirs:
            return self.absent(p)
        if self.dirs[p]:
            return errno.ENOTEMPTY
        del self.dirs[p]
        self.drop(p)
        return None

    def truncate(self, p: str, size: int) -> int | None:
        if p in self.dirs:
            return errno.EISDIR
        if p not in self.files:
            return self.absent(p)
        f = self.files[p]
        if size < len(f):
            del f[size:]
        else:
            f.extend(bytes(size - len(f)))
        return None

    def rename(self, a: str, b: str) -> int | None:
        if a == "/" or b == "/":
            return errno.EBUSY
        if b.startswith(a + "/"):
            return errno.EINVAL
        if not self.exists(a):
            return self.absent(a)
        if a == b:
            return None
        is_dir = a in self.dirs
        if is_dir and self.dirs[a]:
            return errno.EXDEV
        if (e := self.parent_error(b)) is not None:
            return e
        if is_dir and b in self.files:
            return errno.ENOTDIR
        if not is_dir and b in self.dirs:
            return errno.EISDIR
        if is_dir and b in self.dirs and self.dirs[b]:
            return errno.ENOTEMPTY
        if is_dir:
            self.dirs.pop(b, None)
            self.dirs[b] = self.dirs.pop(a)
        else:
            self.files[b] = self.files.pop(a)
        self.drop(a)
        self.add(b)
        return None


def outcome(call: Callable[[], object]) -> int | None:
    """None on success, else the errno of the OSError raised."""
    try:
        call()
    except OSError as e:
        return e.errno
    return None


def test_namespace_matches_model(inproc_cluster) -> None:
    cluster = inproc_cluster(3, f"layout.chunk_size={CHUNK}")
    clients = [Client(str(cluster.registry), config=cluster.config) for _ in range(3)]
    counter = iter(range(10**9))

    class Machine(RuleBasedStateMachine):
        @initialize()
        def fresh_root(self) -> None:
            # Every example starts from an empty root of its own.
            self.root = f"/t{next(counter)}"
            clients[0].mkdir(self.root)
            self.model = Model()

        def p(self, path: str) -> str:
            return self.root if path == "/" else self.root + path

        @rule(c=st.integers(0, 2), path=st.sampled_from(DIRS + FILES))
        def mkdir(self, c: int, path: str) -> None:
            assert outcome(lambda: clients[c].mkdir(self.p(path))) == self.model.mkdir(path)

        @rule(
            c=st.integers(0, 2),
            path=st.sampled_from(FILES + DIRS),
            excl=st.booleans(),
            trunc=st.booleans(),
        )
        def create(self, c: int, path: str, excl: bool, trunc: bool) -> None:
            flags = (
                os.O_RDWR | os.O_CREAT | (os.O_EXCL if excl else 0) | (os.O_TRUNC if trunc else 0)
            )
            got = outcome(lambda: clients[c].open(self.p(path), flags).close())
            assert got == self.model.create(path, excl, trunc)

        @rule(
            c=st.integers(0, 2),
            path=st.sampled_from(FILES),
            offset=st.integers(0, 3 * CHUNK),
            data=st.binary(min_size=1, max_size=2 * CHUNK + 17),
        )
        def write(self, c: int, path: str, offset: int, data: bytes) -> None:
            def go() -> None:
                with clients[c].open(self.p(path), "r+") as f:
                    assert f.pwrite(data, offset) == len(data)

            expected = self.model.write(path, offset, data)
            # Opening a path under a file is ENOENT here (lookups do not walk parents).
            got = outcome(go)
            assert got == expected

        @rule(c=st.integers(0, 2), path=st.sampled_from(FILES + DIRS + ["/"]))
        def unlink(self, c: int, path: str) -> None:
            assert outcome(lambda: clients[c].unlink(self.p(path))) == self.model.unlink(path)

        @rule(c=st.integers(0, 2), path=st.sampled_from(DIRS + FILES + ["/"]))
        def rmdir(self, c: int, path: str) -> None:
            want = self.model.rmdir(path)
            if path == "/":
                return  # our per-example root is a real directory; "/" itself is tested elsewhere
            assert outcome(lambda: clients[c].rmdir(self.p(path))) == want

        @rule(c=st.integers(0, 2), path=st.sampled_from(FILES), size=st.integers(0, 3 * CHUNK))
        def truncate(self, c: int, path: str, size: int) -> None:
            got = outcome(lambda: clients[c].truncate(self.p(path), size))
            assert got == self.model.truncate(path, size)

        @rule(
            c=st.integers(0, 2),
            a=st.sampled_from(DIRS + FILES),
            b=st.sampled_from(DIRS + FILES),
        )
        def rename(self, c: int, a: str, b: str) -> None:
            got = outcome(lambda: clients[c].rename(self.p(a), self.p(b)))
            assert got == self.model.rename(a, b)

        @invariant()
        def everything_reads_back(self) -> None:
            if not hasattr(self, "model"):
                return
            reader = clients[2]
            for d, names in self.model.dirs.items():
                assert [n for n, _ in reader.readdir(self.p(d))] == sorted(names)
            for path, data in self.model.files.items():
                st_ = reader.stat(self.p(path))
                assert (st_.kind, st_.st_size) == ("file", len(data))
                with reader.open(self.p(path)) as f:
                    assert f.pread(len(data) + 100, 0) == bytes(data)
            for path in PATHS:
                if not self.model.exists(path):
                    expected = self.model.absent(path)
                    assert outcome(lambda p=path: reader.stat(self.p(p))) == expected

    try:
        Machine.TestCase.settings = settings(
            max_examples=60,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        Machine.TestCase().runTest()
    finally:
        for c in clients:
            c.close()
