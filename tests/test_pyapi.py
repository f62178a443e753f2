"""The Python API (`benchfs.Client`, `benchfs.File`) on real in-process servers: built-in
`open` modes, io.RawIOBase behaviour, positional I/O, errors with errno, zero-copy readinto,
the GIL released during I/O, and threads."""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import benchfs
from benchfs import Client, File
from benchfs.cluster import LocalCluster
from benchfs.units import MIB
from conftest import InProcessCluster, data_for


@pytest.fixture
def client(inproc_cluster: Callable[..., InProcessCluster]) -> Iterator[Client]:
    cluster = inproc_cluster(2)
    with Client(cluster.registry, config=cluster.config) as c:
        yield c


def test_public_api_is_the_python_layer() -> None:
    assert issubclass(File, io.RawIOBase)
    assert benchfs.Client.__module__ == "benchfs.client"
    assert {"Client", "File", "Stat", "Server"} <= set(benchfs.__all__)


def test_builtin_modes(client: Client) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        client.open("/m.dat")
    assert missing.value.errno == errno.ENOENT
    with client.open("/m.dat", "wb") as f:
        assert f.writable() and not f.readable() and f.seekable()
        assert f.write(b"hello world") == 11
        with pytest.raises(io.UnsupportedOperation):
            f.read()
    with pytest.raises(FileExistsError):
        client.open("/m.dat", "x")
    with client.open("/m.dat", "a") as f:
        f.write(b"!")
        f.seek(0)
        f.write(b"?")  # append mode writes at the end wherever the position is
    with client.open("/m.dat") as f:
        assert f.readable() and not f.writable()
        assert f.read() == b"hello world!?"
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    with client.open("/m.dat", "r+b") as f:
        f.seek(6)
        f.write(b"WORLD")
        f.seek(0)
        assert f.read(11) == b"hello WORLD"
        assert f.read(100) == b"!?"  # short at the end of the file
        assert f.pread(100, 11) == b"!?" and f.pread(1, 12) == b"?" and f.pread(5, 13) == b""
    with client.open("/m.dat", "w+") as f:  # truncates
        assert f.read() == b""
    assert client.stat("/m.dat").st_size == 0
    with client.open("/n.dat", "xb") as f:
        f.write(b"new")
    for bad in ("rt", "rw", "", "rr", "q", "r++"):
        with pytest.raises(ValueError):
            client.open("/m.dat", bad)
    with pytest.raises(TypeError):
        client.open("/m.dat", 1.5)  # type: ignore[arg-type]


def test_os_flags_mode(client: Client) -> None:
    with client.open("/f.dat", os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
        f.write(b"abc")
        with pytest.raises(io.UnsupportedOperation):
            f.read()
    with pytest.raises(FileExistsError):
        client.open("/f.dat", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with client.open("/f.dat", os.O_RDWR | os.O_APPEND) as f:
        f.write(b"def")
        assert f.pread(10, 0) == b"abcdef"
    with client.open("/f.dat", os.O_RDONLY) as f:
        assert f.read() == b"abcdef"
    with pytest.raises(ValueError):
        client.open("/f.dat", os.O_ACCMODE)


def test_seek_tell_read_and_eof(client: Client) -> None:
    data = data_for(1, 0, 300_000)  # several 64 KiB chunks
    with client.open("/s.dat", "w+b") as f:
        f.write(data)
        assert f.tell() == len(data)
        assert f.seek(-10, os.SEEK_END) == len(data) - 10
        assert f.read() == data[-10:]
        assert f.read(5) == b""  # end of file
        assert f.seek(1000) == 1000
        assert f.seek(500, os.SEEK_CUR) == 1500
        assert f.read(70_000) == data[1500:71_500]
        with pytest.raises(OSError) as negative:
            f.seek(-1)
        assert negative.value.errno == errno.EINVAL
        with pytest.raises(ValueError):
            f.seek(0, 7)
        f.seek(len(data) + 100)
        f.write(b"tail")  # a hole before it reads as zeros
        assert f.pread(104, len(data)) == bytes(100) + b"tail"
        f.seek(0)
        assert f.readall() == data + bytes(100) + b"tail"
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    f.close()  # idempotent


def test_positional_io_keeps_the_position(client: Client) -> None:
    with client.open("/p.dat", "w+b") as f:
        f.write(b"0123456789")
        assert f.pwrite(b"AB", 2) == 2
        assert f.pread(4, 1) == b"1AB4"
        buf = bytearray(3)
        assert f.preadinto(buf, 7) == 3 and buf == b"789"
        assert f.tell() == 10
        with pytest.raises(ValueError):
            f.pread(1, -1)
        with pytest.raises(ValueError):
            f.pwrite(b"x", -1)


def test_readinto_fills_caller_buffers_without_copies(client: Client) -> None:
    data = data_for(2, 0, 4 * MIB)
    with client.open("/np.dat", "wb") as f:
        f.write(memoryview(data))
    array = np.zeros(len(data) // 8, dtype=np.float64)
    with client.open("/np.dat") as f:
        assert f.readinto(array) == len(data)
        assert f.readinto(array) == 0  # end of file
    assert array.tobytes() == data
    view = memoryview(bytearray(len(data) + 100))
    with client.open("/np.dat") as f:
        assert f.readinto(view[50:]) == len(data)
    assert bytes(view[50 : 50 + len(data)]) == data and bytes(view[:50]) == bytes(50)
    with client.open("/np.dat") as f, pytest.raises(TypeError):
        f.readinto(np.zeros((4, 4))[:, 1])  # not contiguous


def test_stdlib_layers_work_on_top(client: Client) -> None:
    text = "línea uno\nline two\n" * 1000
    with (
        client.open("/t.txt", "wb") as raw,
        io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8") as w,
    ):
        w.write(text)
    with (
        client.open("/t.txt") as raw,
        io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8") as r,
    ):
        assert r.readline() == "línea uno\n"
        assert r.read() == text[len("línea uno\n") :]
    with client.open("/t.txt") as src, client.open("/copy.txt", "wb") as dst:
        shutil.copyfileobj(src, dst, 4096)
    assert client.stat("/copy.txt").st_size == len(text.encode())


def test_truncate_through_the_handle(client: Client) -> None:
    with client.open("/tr.dat", "w+b") as f:
        f.write(data_for(3, 0, 200_000))
        assert f.truncate(1000) == 1000
        assert f.tell() == 200_000  # truncate does not move the position
        assert f.seek(0, os.SEEK_END) == 1000
        f.seek(500)
        assert f.truncate() == 500
    assert client.stat("/tr.dat").st_size == 500  # close did not regrow it
    with client.open("/tr.dat", "r+b") as f:
        f.truncate(70_000)
        assert f.read() == data_for(3, 0, 500) + bytes(69_500)
    with client.open("/tr.dat") as f, pytest.raises(io.UnsupportedOperation):
        f.truncate(0)


def test_namespace_calls(client: Client) -> None:
    client.mkdir("/d")
    for name in ("b", "a", "c"):
        with client.open(f"/d/{name}", "x") as f:
            f.write(name.encode())
    client.mkdir("/d/sub")
    assert client.listdir("/d") == ["a", "b", "c", "sub"]
    assert client.readdir("/d") == [("a", "file"), ("b", "file"), ("c", "file"), ("sub", "dir")]
    st = client.stat("/d/a")
    assert stat.S_ISREG(st.st_mode) and st.is_file() and st.st_size == 1
    assert st.st_mtime > 0 and len(st.id) == 32 and st.chunk_size == 65536
    assert stat.S_ISDIR(client.stat("/d").st_mode)
    client.rename("/d/a", "/d/z")
    assert client.stat("/d/z").id == st.id and not client.exists("/d/a")
    with pytest.raises(OSError) as full:
        client.rmdir("/d")
    assert full.value.errno == errno.ENOTEMPTY
    client.truncate("/d/z", 10)
    assert client.stat("/d/z").st_size == 10
    for name in ("b", "c", "z"):
        client.unlink(f"/d/{name}")
    client.rmdir("/d/sub")
    client.rmdir("/d")
    assert client.listdir() == []
    with pytest.raises(FileNotFoundError):
        client.stat("/d")
    with pytest.raises(OSError) as relative:
        client.stat("relative")
    assert relative.value.errno == errno.EINVAL
    with pytest.raises(OSError) as long_name:
        client.open("/" + "n" * 256, "w")
    assert long_name.value.errno == errno.ENAMETOOLONG
    client.mkdir("/e")
    with pytest.raises(IsADirectoryError):
        client.open("/e", "w")
    assert client.server_ids() == [0, 1]
    assert sum(s["requests"] for s in client.server_stats()) > 0


@pytest.mark.serial
def test_gil_is_released_during_io(client: Client) -> None:
    """A Python thread keeps running while another waits for a large read."""
    size = 64 * MIB
    with client.open("/big.dat", "wb") as f:
        f.write(bytes(size))
    buf = bytearray(size)
    window: list[float] = []

    def read() -> None:
        with client.open("/big.dat") as f:
            start = time.perf_counter()
            assert f.readinto(buf) == size
            window.extend([start, time.perf_counter()])

    reader = threading.Thread(target=read)
    ticks: list[float] = []
    reader.start()
    while reader.is_alive():
        ticks.append(time.perf_counter())
    reader.join()
    start, end = window
    inside = [t for t in ticks if start <= t <= end]
    gaps = np.diff([start, *inside, end])
    # With the GIL held for the whole read there would be one gap as long as the read.
    assert gaps.max() < max(0.5 * (end - start), 0.02), (gaps.max(), end - start)


def test_threads_with_a_shared_and_with_own_clients(
    inproc_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = inproc_cluster(2)
    errors: list[BaseException] = []
    with Client(cluster.registry, config=cluster.config) as shared:

        def work(rank: int, c: Client) -> None:
            try:
                path = f"/thread-{rank}.dat"
                data = data_for(rank, 0, 3 * MIB + rank)
                with c.open(path, "w") as f:
                    for off in range(0, len(data), 256 * 1024):
                        f.write(data[off : off + 256 * 1024])
                    f.fsync()
                with c.open(path) as f:
                    assert f.read() == data
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        own = [Client(cluster.registry, config=cluster.config) for _ in range(2)]
        threads = [threading.Thread(target=work, args=(r, shared)) for r in range(2)]
        threads += [threading.Thread(target=work, args=(2 + r, own[r])) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for c in own:
            c.close()
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_libraries_loaded_after_a_client_exit_cleanly(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """UCX relocates symbols of every library loaded after it; with malloc symbols relocated,
    numpy's exit handlers freed glibc memory through UCX's allocator, which aborted (SIGABRT
    at exit, nothing printed). The process must end as it would without BenchFS."""
    import subprocess
    import sys

    cluster = daemon_cluster(2)
    script = (
        "import sys\n"
        "from benchfs import Client\n"
        "client = Client(sys.argv[1], expected_servers=2)\n"
        "import numpy, pandas\n"  # loaded after UCX
        "with client.open('/late', 'wb') as f:\n"
        "    f.write(numpy.ones(1 << 16))\n"
        "print('done')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(cluster.registry_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout) == (0, "done\n"), out.stderr


FORKED = r"""
import os, re, sys
from benchfs import Client


def epoll_entries():
    # {epoll descriptor: the descriptors registered in it}, from /proc (what UCX's event
    # thread waits on is one of them).
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[eventpoll]":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                found[int(fd)] = set(re.findall(r"^tfd:\s*(\d+)", info.read(), re.M))
        except OSError:
            pass
    return found


config = open(sys.argv[2]).read()
parent = Client(sys.argv[1], config=config)
with parent.open("/by-parent", "wb") as f:
    f.write(b"p" * 100)
pid = os.fork()
if pid == 0:
    try:
        parent.stat("/by-parent")
        print("the parent's client worked in the child")
    except OSError as e:
        print("parent's client:", e.errno, e.strerror)
    inherited = epoll_entries()
    child = Client(sys.argv[1], config=config)
    with child.open("/by-child", "wb") as f:
        f.write(b"c" * 200)
    with child.open("/by-parent", "rb") as f:
        print("child read", len(f.read()))
    changed = {fd for fd, entries in inherited.items() if epoll_entries().get(fd) != entries}
    print("inherited event sets changed:", sorted(changed))
    sys.stdout.flush()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
with parent.open("/by-child", "rb") as f:
    print("parent read", len(f.read()))
"""


def test_a_forked_child_connects_its_own_client(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """After fork the parent's client (its ring, sockets and UCX worker) stays the parent's:
    the child gets one clear error from it and connects its own. UCX's event thread is not
    copied by fork while its description is: before the child reset it, the child's
    connections were registered in the parent's epoll set (inherited), so their events went
    to the parent and a child's hello could wait forever."""
    import subprocess
    import sys

    cluster = daemon_cluster(2)
    out = subprocess.run(
        [sys.executable, "-c", FORKED, str(cluster.registry_dir), str(cluster.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"parent's client: {errno.EBADFD} this client was made before the fork that made this "
        "process: a forked child connects clients of its own",
        "child read 100",
        "inherited event sets changed: []",
        "child exit 0",
        "parent read 200",
    ], out.stderr


FORKED_BEHIND = r"""
import os, sys
from benchfs import Client

config = open(sys.argv[2]).read()
parent = Client(sys.argv[1], config=config)
data = bytes(range(256)) * (32 * 1024)  # 8 MiB: 128 chunks, most still on their way
f = parent.open("/behind-parent", "wb")
f.write(data)
pid = os.fork()
if pid == 0:
    try:
        f.write(b"x")
        print("the parent's file worked in the child")
    except OSError as e:
        print("parent's file in the child:", e.errno)
    child = Client(sys.argv[1], config=config)
    mine = data[::-1]
    with child.open("/behind-child", "wb") as g:
        g.write(mine)
    with child.open("/behind-child", "rb") as g:
        print("child read back", g.read() == mine)
    sys.exit(0)  # a normal exit: the inherited client and file are dropped in the child
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
f.close()
with parent.open("/behind-parent", "rb") as g:
    print("parent read back", g.read() == data)
with parent.open("/behind-child", "rb") as g:
    print("parent reads the child's", g.read() == data[::-1])
"""


def test_a_fork_while_writes_are_behind_leaves_them_to_the_parent(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """Writes behind are sent by the process's write-behind thread, which a fork does not copy:
    the parent's writes in flight stay the parent's (its thread sends them, its close waits
    for them), the child's copies of the parent's client and files refuse with EBADFD and are
    dropped at its exit without waiting, and the child's own client writes behind through a
    thread of its own."""
    import subprocess
    import sys

    cluster = daemon_cluster(2, "layout.chunk_size=65536", "client.write_behind=32M")
    out = subprocess.run(
        [sys.executable, "-c", FORKED_BEHIND, str(cluster.registry_dir), str(cluster.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"parent's file in the child: {errno.EBADFD}",
        "child read back True",
        "child exit 0",
        "parent read back True",
        "parent reads the child's True",
    ], out.stderr


def test_a_stat_built_from_the_core_is_the_dataclass_it_says() -> None:
    """`_stat_of` fills a `Stat`'s dict directly (a stat's Python cost): the object equals,
    hashes and refuses changes as one made by the constructor."""
    import dataclasses

    from benchfs.client import Stat, _stat_of

    core = {"kind": "file", "size": 5, "mode": 0o640, "id": "ab" * 16, "mtime_ns": 7,
            "ctime_ns": 8, "chunk_size": 1 << 20, "stripe_count": 4, "replicas": 2,
            "stripe_start": 3, "inline": True}  # fmt: skip
    made = Stat(
        st_mode=0o100640, st_size=5, st_mtime_ns=7, st_ctime_ns=8, kind="file", id="ab" * 16,
        chunk_size=1 << 20, stripe_count=4, stripe_start=3, replicas=2, inline=True,
    )  # fmt: skip
    got = _stat_of(core)
    assert got == made and hash(got) == hash(made) and repr(got) == repr(made)
    assert dataclasses.asdict(got) == dataclasses.asdict(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.st_size = 6  # type: ignore[misc]
    assert _stat_of({**core, "kind": "dir", "mode": 0o755}).is_dir()
