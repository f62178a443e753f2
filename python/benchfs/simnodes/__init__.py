"""Simulated nodes on this host, made of real kernel objects: what `benchfs-bench diagnose`
measures the screen's accuracy on, and what the benchfs-diagnose tests build.

- `delayfs` (delayfs.c next to this module, compiled with gcc and libfuse3): a FUSE
  passthrough that sleeps before each read or write; a loop device attached with
  `--direct-io=on` to a file inside it is a slow disk (high r_await, %util near 100), and the
  delay can change while it runs.
- blkio cgroup v1 throttling of a loop device: slow above the device.
- network namespaces joined by a bridge, one pair's traffic shaped with tc tbf.

Everything is registered with `Sim`, which removes it in reverse order even when a test
fails (unmount, detach, delete the namespace or cgroup, stop the FUSE daemon), with bounded
waits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchfs.nodes import Node
from benchfs.units import MIB

__all__ = [
    "MIB",
    "BlkioGroup",
    "Disk",
    "Sim",
    "background_load",
    "build_delayfs",
    "node",
    "requirements",
    "simulation",
]

DELAYFS_SOURCE = Path(__file__).with_name("delayfs.c")
CGROUP_BLKIO = Path("/sys/fs/cgroup/blkio")


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def requirements() -> list[str]:
    """What this host lacks for the simulation ([] when it can run)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("gcc", "pkg-config", "losetup", "mkfs.ext4", "fusermount3", "fio", "iostat"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not Path("/dev/fuse").exists() or not Path("/dev/loop-control").exists():
        missing.append("/dev/fuse and /dev/loop-control")
    if not CGROUP_BLKIO.is_dir():
        missing.append(f"the blkio cgroup controller ({CGROUP_BLKIO})")
    return missing


def build_delayfs(directory: Path) -> Path:
    binary = directory / "delayfs"
    flags = sh("pkg-config", "--cflags", "--libs", "fuse3").stdout.split()
    sh("gcc", "-O2", "-Wall", "-o", str(binary), str(DELAYFS_SOURCE), *flags)
    return binary


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        time.sleep(0.05)


@dataclass
class DelayFS:
    """One mounted delayfs; `set_delay` changes its read and write delay at once."""

    mountpoint: Path
    proc: subprocess.Popen[bytes]

    def set_delay(self, read_ms: float, write_ms: float = 0.0) -> None:
        (self.mountpoint / ".delay").write_text(f"{int(read_ms * 1000)} {int(write_ms * 1000)}\n")

    def delay(self) -> tuple[float, float]:
        r, w = (self.mountpoint / ".delay").read_text().split()
        return int(r) / 1000, int(w) / 1000


@dataclass
class Disk:
    """A loop device (`name`, e.g. loop3) over a file in its own delayfs."""

    name: str
    fs: DelayFS

    @property
    def dev(self) -> str:
        return f"/dev/{self.name}"

    def majmin(self) -> str:
        return Path(f"/sys/block/{self.name}/dev").read_text().strip()


@dataclass(frozen=True)
class BlkioGroup:
    """A blkio cgroup (v1): a command prefix that enters it, and its limits, which can change
    while its processes run (0 removes one)."""

    path: Path

    def prefix(self) -> list[str]:
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh"]

    def limit(self, disk: Disk, read_bps: int, write_bps: int | None = None) -> None:
        (self.path / "blkio.throttle.read_bps_device").write_text(f"{disk.majmin()} {read_bps}\n")
        if write_bps is not None:
            (self.path / "blkio.throttle.write_bps_device").write_text(
                f"{disk.majmin()} {write_bps}\n"
            )


@dataclass
class Sim:
    """Creates simulated-node resources under `root` and removes all of them in `close`."""

    root: Path
    delayfs: Path
    cleanups: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    tag: str = field(default_factory=lambda: f"bfd{os.getpid() % 100000}")

    def on_close(self, what: str, fn: Callable[[], None]) -> None:
        self.cleanups.append((what, fn))

    def close(self) -> None:
        errors = []
        while self.cleanups:
            what, fn = self.cleanups.pop()
            try:
                fn()
            except Exception as e:
                errors.append(f"{what}: {e}")
        if errors:
            raise RuntimeError("cleanup failed: " + "; ".join(errors))

    # --- delayfs and loop devices -------------------------------------------------------------

    def mount_delayfs(self, name: str) -> DelayFS:
        back, mnt = self.root / f"{name}-back", self.root / f"{name}-mnt"
        back.mkdir()
        mnt.mkdir()
        log = open(self.root / f"{name}-delayfs.log", "wb")
        proc = subprocess.Popen(
            [str(self.delayfs), str(back), str(mnt), "-f", "-o", "max_threads=64"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def stop() -> None:
            if os.path.ismount(mnt):
                if sh("fusermount3", "-u", str(mnt), check=False).returncode != 0:
                    sh("fusermount3", "-u", "-z", str(mnt), check=False)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()

        self.on_close(f"delayfs {mnt}", stop)
        wait_for(
            f"delayfs mounted at {mnt}", lambda: os.path.ismount(mnt) or proc.poll() is not None
        )
        if proc.poll() is not None:
            raise RuntimeError(f"delayfs exited {proc.returncode}; see {log.name}")
        return DelayFS(mnt, proc)

    def disk(self, name: str, size: int = 512 * MIB) -> Disk:
        """A loop device with direct I/O over a sparse file on its own delayfs."""
        fs = self.mount_delayfs(name)
        image = fs.mountpoint / "disk.img"
        with open(image, "wb") as f:
            f.truncate(size)
        dev = sh("losetup", "--find", "--show", "--direct-io=on", str(image)).stdout.strip()
        self.on_close(f"loop {dev}", lambda: sh("losetup", "-d", dev))
        return Disk(Path(dev).name, fs)

    def mount(self, devices: list[Disk], name: str, btrfs: bool = False) -> Path:
        """ext4 on one device (or btrfs), btrfs RAID0 (data) / RAID1 (metadata) across two."""
        target = self.root / f"{name}-scratch"
        target.mkdir()
        if len(devices) == 1 and not btrfs:
            sh(
                "mkfs.ext4",
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
                devices[0].dev,
            )
            sh("mount", devices[0].dev, str(target))
        else:
            profile = ["-d", "raid0", "-m", "raid1"] if len(devices) > 1 else []
            sh("mkfs.btrfs", "-q", "-f", *profile, *(d.dev for d in devices))
            opts = ",".join(f"device={d.dev}" for d in devices)
            sh("mount", "-o", opts, devices[0].dev, str(target))

        def unmount() -> None:
            for _ in range(50):
                if sh("umount", str(target), check=False).returncode == 0:
                    return
                time.sleep(0.1)
            sh("umount", "-l", str(target))

        self.on_close(f"mount {target}", unmount)
        return target

    # --- cgroup ---------------------------------------------------------------------------------

    def blkio_group(self, name: str) -> BlkioGroup:
        """A blkio cgroup (v1) with no limit yet; its prefix runs a command inside it."""
        cg = CGROUP_BLKIO / f"{self.tag}-{name}"
        cg.mkdir()

        def remove() -> None:
            for _ in range(100):
                with contextlib.suppress(OSError):
                    cg.rmdir()
                    return
                time.sleep(0.05)
            cg.rmdir()

        self.on_close(f"cgroup {cg}", remove)
        return BlkioGroup(cg)

    def throttled_prefix(
        self, name: str, disk: Disk, read_bps: int, write_bps: int | None = None
    ) -> list[str]:
        """A command prefix that runs its command in a blkio cgroup limiting `disk`'s reads
        (and writes, when `write_bps` is given)."""
        group = self.blkio_group(name)
        group.limit(disk, read_bps, write_bps)
        return group.prefix()

    # --- network ----------------------------------------------------------------------------------

    def network(self, names: list[str]) -> dict[str, tuple[str, str]]:
        """One namespace per node on a bridge (in a namespace of its own); returns per node its
        (namespace, address)."""
        switch = f"{self.tag}-sw"
        sh("ip", "netns", "add", switch)
        self.on_close(f"netns {switch}", lambda: sh("ip", "netns", "del", switch))
        sh("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
        subnet = 10 + os.getpid() % 200
        out = {}
        for i, name in enumerate(names, start=1):
            ns, port = f"{self.tag}-{name}", f"{self.tag}p{i}"
            sh("ip", "netns", "add", ns)
            self.on_close(f"netns {ns}", lambda ns=ns: sh("ip", "netns", "del", ns))
            sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", port, "netns", switch)
            sh("ip", "netns", "exec", switch, "ip", "link", "set", port, "master", "br0")
            sh("ip", "netns", "exec", switch, "ip", "link", "set", port, "up")
            addr = f"10.{subnet}.0.{i}"
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            out[name] = (ns, addr)
        return out

    def shape_pair(self, a: tuple[str, str], b: tuple[str, str], rate: str) -> None:
        """tc tbf on the traffic between two namespaces only, both directions (an htb root
        sends the pair's packets, picked by a u32 filter, through the tbf; this kernel has
        neither prio nor netem)."""
        for (ns, _), (_, dst) in ((a, b), (b, a)):
            tc = ["ip", "netns", "exec", ns, "tc"]
            sh(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
            for cls in ("1:10", "1:20"):
                sh(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", cls,
                   "htb", "rate", "10gbit")  # fmt: skip
            sh(*tc, "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "tbf",
               "rate", rate, "burst", "32kb", "latency", "100ms")  # fmt: skip
            sh(*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
               "match", "ip", "dst", f"{dst}/32", "flowid", "1:20")  # fmt: skip


@contextlib.contextmanager
def simulation(root: Path, delayfs: Path) -> Iterator[Sim]:
    """A Sim whose resources are all removed when the block ends, however it ends."""
    s = Sim(root, delayfs)
    s.root.mkdir()
    try:
        yield s
    finally:
        s.close()


def node(name: str, scratch: Path, disks: list[Disk], prefix: list[str] | None = None) -> Node:
    return Node(
        name, f"host-{name}", str(scratch), tuple(d.name for d in disks), tuple(prefix or ())
    )


@contextlib.contextmanager
def background_load(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A noise process (e.g. `stress-ng --cpu 2 --io 1`) for the block's duration, stopped
    with its whole process group however the block ends."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
