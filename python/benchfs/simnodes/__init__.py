"""Simulated nodes on this host, made of real kernel objects: what `benchfs-bench diagnose`
measures the screen's accuracy on, and what the benchfs-diagnose tests build.

- `delayfs` (delayfs.c next to this module, compiled with gcc and libfuse3): a FUSE
  passthrough that sleeps before each read or write; a loop device attached with
  `--direct-io=on` to a file inside it is a slow disk (high r_await, %util near 100), and the
  delay can change while it runs.
- blkio cgroup v1 throttling of a loop device: slow above the device.
- network namespaces joined by a bridge (`build_network`; `benchfs-run nodes --netns` makes
  them for a cluster of its own), one pair's traffic shaped with tc tbf.

Everything is registered with `Sim`, which removes it in reverse order even when a test
fails (unmount, detach, delete the namespace or cgroup, stop the FUSE daemon), with bounded
waits.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from benchfs.errors import EXIT_USAGE, BenchfsError
from benchfs.nodes import Node
from benchfs.units import MIB

__all__ = [
    "MIB",
    "ApartNodes",
    "BlkioGroup",
    "Disk",
    "NetNode",
    "Sim",
    "apart_nodes",
    "background_load",
    "build_delayfs",
    "build_network",
    "namespace_pids",
    "namespaces",
    "netns_nodes",
    "node",
    "remove_netns_nodes",
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

    def set_delay(self, read_ms: float, write_ms: float = 0.0, share: float = 1.0) -> None:
        """Delay `share` of the reads and writes (evenly spread; of FUSE requests, which are
        block I/Os at 128 KiB or less) by these many milliseconds."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share {share} is not between 0 and 1")
        (self.mountpoint / ".delay").write_text(
            f"{int(read_ms * 1000)} {int(write_ms * 1000)} {round(share * 1_000_000)}\n"
        )

    def delay(self) -> tuple[float, float, float]:
        """(read ms, write ms, share)."""
        r, w, share = (self.mountpoint / ".delay").read_text().split()
        return int(r) / 1000, int(w) / 1000, int(share) / 1_000_000


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

    def network(self, names: list[str]) -> dict[str, NetNode]:
        """One namespace per node on a bridge (in a namespace of its own), removed in `close`."""
        return build_network(self.tag, names, 10 + os.getpid() % 200, self.on_close)

    def shape_pair(self, a: NetNode, b: NetNode, rate: str) -> None:
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


class NetNode(NamedTuple):
    """A simulated node's network namespace and its address on the nodes' bridge."""

    namespace: str
    address: str

    def prefix(self) -> list[str]:
        """The command prefix of the node's processes: inside its namespace, with UCX on its one
        link and over TCP only (namespaces share the host's memory, and UCX would otherwise
        take shared memory between them: they would not be apart)."""
        return ["ip", "netns", "exec", self.namespace, "env", *UCX_APART]


UCX_APART = ("UCX_NET_DEVICES=eth0", "UCX_TLS=tcp")


def build_network(
    tag: str,
    names: Sequence[str],
    subnet: int,
    created: Callable[[str, Callable[[], None]], None],
) -> dict[str, NetNode]:
    """Namespaces `tag-NAME` with addresses 10.SUBNET.0.i on a bridge in namespace `tag-sw`;
    `created(what, remove)` is told of each as it is made, so a failure part way removes them."""
    switch = f"{tag}-sw"
    sh("ip", "netns", "add", switch)
    created(f"netns {switch}", lambda: delete_namespace(switch))
    sh("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
    out = {}
    for i, name in enumerate(names, start=1):
        ns, port = f"{tag}-{name}", f"{tag}p{i}"
        sh("ip", "netns", "add", ns)
        created(f"netns {ns}", lambda ns=ns: delete_namespace(ns))
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", port, "netns", switch)
        sh("ip", "netns", "exec", switch, "ip", "link", "set", port, "master", "br0")
        sh("ip", "netns", "exec", switch, "ip", "link", "set", port, "up")
        addr = f"10.{subnet}.0.{i}"
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        out[name] = NetNode(ns, addr)
    return out


def delete_namespace(ns: str) -> None:
    sh("ip", "netns", "del", ns)


def namespaces(tag: str) -> list[str]:
    """The network namespaces named `tag-*` (those `build_network` made with this tag)."""
    out = sh("ip", "netns", "list")
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(f"{tag}-"))


def namespace_pids(ns: str) -> list[int]:
    return [int(p) for p in sh("ip", "netns", "pids", ns).stdout.split()]


NODES_TAG = "bfs"
"""The namespaces of `netns_nodes` are `bfs-n1`, ... and the bridge's `bfs-sw`."""
NODES_SUBNET = 250
"""Their addresses are 10.250.0.i (a Sim's are 10.10-209.0.i)."""
MAX_NODES = 250
TAG_RE = re.compile(r"^[A-Za-z0-9]{1,8}$")
"""Short enough for the bridge ports' names (`TAGpI`, at most 15 characters)."""


def netns_nodes(count: int, scratch: Path, tag: str = NODES_TAG) -> list[Node]:
    """Nodes n1..nCOUNT, each in its own network namespace with its own address on one bridge
    and its scratch in `scratch/nI`: servers and clients on different nodes talk TCP between
    distinct hosts. The namespaces outlive this call; `remove_netns_nodes` removes them.
    BenchfsError if the host cannot (not root, no `ip`) or namespaces of `tag` exist already."""
    if not TAG_RE.match(tag):
        raise BenchfsError(
            "EINVAL", f"namespace tag {tag!r}: 1 to 8 letters and digits", EXIT_USAGE
        )
    if not 1 <= count <= MAX_NODES:
        raise BenchfsError(
            "EINVAL", f"--netns takes 1 to {MAX_NODES} nodes, not {count}", EXIT_USAGE
        )
    if os.geteuid() != 0:
        raise BenchfsError("EPERM", "network namespaces need root")
    if shutil.which("ip") is None:
        raise BenchfsError("ENOENT", "network namespaces need `ip` (Debian: iproute2)")
    existing = namespaces(tag)
    if existing:
        raise BenchfsError(
            "EEXIST",
            f"network namespaces {', '.join(existing)} exist already; remove them first with "
            "`benchfs-run nodes --remove-netns`",
        )
    names = [f"n{i}" for i in range(1, count + 1)]
    made: list[Callable[[], None]] = []
    try:
        net = build_network(tag, names, NODES_SUBNET, lambda _what, remove: made.append(remove))
    except RuntimeError as e:
        for remove in reversed(made):
            with contextlib.suppress(RuntimeError):
                remove()
        raise BenchfsError("EIO", str(e)) from e
    nodes = []
    for name in names:
        directory = scratch / name
        directory.mkdir(parents=True, exist_ok=True)
        ns = net[name]
        nodes.append(
            Node(name, ns.namespace, str(directory), prefix=("env", *UCX_APART), netns=ns.namespace)
        )
    return nodes


def remove_netns_nodes(tag: str = NODES_TAG) -> list[str]:
    """Removes the namespaces `netns_nodes` made (none: nothing to do); returns their names.
    BenchfsError, removing nothing, while a process still runs in one of them."""
    if not TAG_RE.match(tag):
        raise BenchfsError(
            "EINVAL", f"namespace tag {tag!r}: 1 to 8 letters and digits", EXIT_USAGE
        )
    found = namespaces(tag)
    busy = {ns: pids for ns in found if (pids := namespace_pids(ns))}
    if busy:
        shown = "; ".join(f"{ns}: {', '.join(map(str, pids))}" for ns, pids in busy.items())
        raise BenchfsError("EBUSY", f"processes still run in the nodes' namespaces ({shown})")
    for ns in found:
        delete_namespace(ns)
    return found


@dataclass(frozen=True)
class ApartNodes:
    """Nodes in network namespaces for the length of a block (`apart_nodes`)."""

    nodes: dict[str, NetNode]

    def prefix(self, name: str) -> list[str]:
        """What runs a whole process on node `name`."""
        return self.nodes[name].prefix()

    def rank_env(self, name: str) -> dict[str, str]:
        """The environment of an MPI rank on node `name`: MPI starts outside the namespace, the
        BenchFS client enters it when it connects."""
        settings = dict(item.split("=", 1) for item in UCX_APART)
        return {"BENCHFS_NETNS": self.nodes[name].namespace, **settings}

    def address(self, name: str) -> str:
        return self.nodes[name].address


@contextlib.contextmanager
def apart_nodes(count: int) -> Iterator[ApartNodes]:
    """Nodes n1..nCOUNT in namespaces of their own on a bridge (as `netns_nodes`, with a tag of
    this process), all removed when the block ends, however it ends."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise BenchfsError("EPERM", "nodes in network namespaces need root and `ip` (iproute2)")
    made: list[Callable[[], None]] = []
    tag = f"bb{os.getpid() % 100000}"
    try:
        names = [f"n{i}" for i in range(1, count + 1)]
        try:
            net = build_network(tag, names, 251, lambda _what, remove: made.append(remove))
        except RuntimeError as e:
            raise BenchfsError("EIO", str(e)) from e
        yield ApartNodes(net)
    finally:
        for remove in reversed(made):
            with contextlib.suppress(RuntimeError):
                remove()


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
