"""Advisory locks across the job, through the Python API, between real processes: shared and
exclusive byte ranges, waiting, tests, release by unlock, close and a killed holder, a stopped
holder that keeps its locks, locks that follow a renamed file, locks lost to a server restart,
and the coherence of the bytes at lock boundaries."""

from __future__ import annotations

import errno
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster
from test_persistence import kill_and_restart

# A holder in its own process: opens PATH, takes KIND on [START, END), says "held", then
# waits for a line on stdin ("unlock", "close" or "exit") and says what it did.
HOLDER = r"""
import sys
from benchfs import Client
registry, config, path, exclusive, start, length = sys.argv[1:7]
with Client(registry, config) as c:
    f = c.open(path, "r+")
    f.lock(exclusive == "1", int(start), int(length))
    print("held", flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "unlock":
            f.unlock(int(start), int(length))
        elif what == "close":
            f.close()
        elif what == "relock":
            try:
                f.lock(exclusive == "1", int(start), int(length))
            except OSError as e:
                print("relock", e.errno, e, flush=True)
                continue
        print(what, flush=True)
        if what in ("close", "exit"):
            break
"""


@contextmanager
def holder(
    cluster: LocalCluster, path: str, exclusive: bool = True, start: int = 0, length: int = 0
) -> Iterator[subprocess.Popen[str]]:
    assert cluster.config_path is not None
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cluster.registry_dir), cluster.config_path.read_text(),
         path, "1" if exclusive else "0", str(start), str(length)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def ask(p: subprocess.Popen[str], what: str) -> None:
    assert p.stdin is not None
    p.stdin.write(what + "\n")
    p.stdin.flush()


def answer(p: subprocess.Popen[str], within: float) -> str | None:
    """The holder's next line, or None if it says nothing for `within` seconds."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], within)
    return p.stdout.readline().strip() if ready else None


def tell(p: subprocess.Popen[str], what: str) -> str:
    ask(p, what)
    said = answer(p, 30)
    assert said is not None, f"no answer to {what}"
    return said


def made(cluster: LocalCluster, client: Client, path: str = "/locked") -> str:
    with client.open(path, "w") as f:
        f.write(b"x" * 1000)
    return path


def waits_for(call: Callable[[], object]) -> tuple[threading.Thread, list[float]]:
    """`call` on a thread; the list gets the seconds it took once it returns."""
    took: list[float] = []

    def run() -> None:
        t0 = time.monotonic()
        call()
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, took


@pytest.mark.timeout(90)
def test_ranges_conflict_wait_and_are_released(daemon_cluster: Callable[..., LocalCluster]) -> None:
    cluster = daemon_cluster(3)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as c:
        path = made(cluster, c)
        with holder(cluster, path, exclusive=True, start=0, length=100) as h:
            f = c.open(path, "r+")
            assert not f.lock(True, 50, 10, wait=False)
            assert not f.lock(False, 99, 1, wait=False)
            assert f.lock_conflict(False, 0, 1) == {
                "kind": "write",
                "start": 0,
                "end": 100,
                "pid": 0,
            }
            # Outside its range, anything goes; readers share.
            assert f.lock(True, 100, 50, wait=False) and f.lock(False, 200, 0, wait=False)
            assert f.lock_conflict(True, 150, 10) is None  # our own locks do not conflict
            # A waiting lock is granted once the holder unlocks.
            t, took = waits_for(lambda: f.lock(True, 0, 10))
            time.sleep(0.5)
            assert t.is_alive()
            assert tell(h, "unlock") == "unlock"
            t.join(10)
            assert took and took[0] >= 0.5
            ask(h, "relock")  # waits: we hold [0, 10) now
            assert answer(h, 0.5) is None
            f.close()  # closing releases ours: the holder's waiting relock goes through
            assert answer(h, 10) == "relock"
        with holder(cluster, path, exclusive=False, length=0) as reader:
            g = c.open(path)
            assert g.lock(False, wait=False)  # readers share
            assert not g.lock(True, wait=False)  # ours is a read lock still; theirs conflicts
            assert tell(reader, "close") == "close"
            assert g.lock(True, wait=False)  # their close released theirs
            g.close()


@pytest.mark.timeout(120)
@pytest.mark.serial
def test_a_killed_holder_releases_and_a_stopped_one_keeps(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = daemon_cluster(2, "client.request_timeout_s=3")
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as c:
        path = made(cluster, c)
        f = c.open(path, "r+")
        with holder(cluster, path) as h:
            # Stopped past the request timeout (a waiting lock is asked again each second):
            # it keeps its lock, and the waiter waits.
            h.send_signal(signal.SIGSTOP)
            t, took = waits_for(lambda: f.lock(True))
            time.sleep(4.5)
            assert t.is_alive() and not took
            h.send_signal(signal.SIGCONT)
            assert tell(h, "relock") == "relock"  # still its own
            # Killed: its lock goes with its connection, and the waiter gets it.
            killed = time.monotonic()
            h.kill()
            t.join(10)
            assert took, "the waiter never got the lock of a killed holder"
            assert time.monotonic() - killed < 2.0
        f.close()


@pytest.mark.timeout(90)
def test_locks_follow_a_renamed_file_and_are_lost_with_their_server(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = daemon_cluster(3)
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as c:
        path = made(cluster, c)
        with holder(cluster, path) as h:
            c.rename(path, "/moved")
            g = c.open("/moved", "r+")
            assert not g.lock(True, wait=False)  # kept by the file's id, not its name
            g.close()
            kill_and_restart(cluster, [0, 1, 2])
            # The holder's first calls find the server gone (EHOSTDOWN) until it is greeted
            # again; then the lock request says its locks were lost.
            deadline = time.monotonic() + 20
            said = tell(h, "relock")
            while said.startswith(f"relock {errno.EHOSTDOWN}") and time.monotonic() < deadline:
                time.sleep(0.5)
                said = tell(h, "relock")
            assert said.startswith(f"relock {errno.ENOLCK}") and "restarted" in said, said
            assert "/moved" in said or path in said


@pytest.mark.timeout(90)
def test_a_lock_is_a_boundary_for_the_bytes(daemon_cluster: Callable[..., LocalCluster]) -> None:
    """Writes behind and read-ahead do not cross a lock: a writer that unlocks has its bytes
    on the servers, and a reader that locks reads them, not what it read ahead before."""
    cluster = daemon_cluster(2, "client.write_behind=8M", "client.read_ahead=8M")
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as a, Client(cluster.registry_dir, config) as b:
        with a.open("/shared", "w") as f:
            f.write(b"0" * (4 << 20))
        w, r = a.open("/shared", "r+"), b.open("/shared")
        assert r.read(1 << 20) == b"0" * (1 << 20)  # starts read-ahead of what follows
        for round_ in range(1, 4):
            assert w.lock()
            w.seek(1 << 20)
            w.write(str(round_).encode() * (1 << 20))
            w.unlock()
            assert r.lock(exclusive=False)
            r.seek(1 << 20)
            assert r.read(1 << 20) == str(round_).encode() * (1 << 20)
            r.unlock()
        w.close()
        r.close()


def test_bad_lock_requests_get_one_clear_error(daemon_cluster: Callable[..., LocalCluster]) -> None:
    cluster = daemon_cluster(2)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as c:
        f = c.open(made(cluster, c), "r+")
        with pytest.raises(ValueError, match="must not be negative"):
            f.lock(True, -1, 10)
        with pytest.raises(ValueError, match="lock kind"):
            f._core.lock("both")
        with pytest.raises(ValueError, match="is empty"):
            f._core.lock("write", 10, 10)
        f.close()
        with pytest.raises(ValueError, match="closed"):
            f.lock()
