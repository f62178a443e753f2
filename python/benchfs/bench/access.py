"""`benchfs-bench access`: what the access layers cost, measured against the native client.

One local cluster whose servers keep data on tmpfs (so the device is not what is measured),
one FUSE mount of it, and per case two tools moving the same bytes in the same transfers:

- `fio-{psync,uring}-{write,read}`: fio through the mount, `--direct=1` (the kernel page cache
  serves nothing), bs=1M, 2 jobs each with its own file, iodepth 1; against the native client
  (`_core.bench_transfers`: one thread and one client per file, the loop in Rust).
- `fio-psync-{randwrite,randread}`: the same at bs=4k, each 4 KiB block of the file once in a
  random order (fio's random map; the native client shuffles its blocks likewise).
- `python-readinto`: `benchfs.File.readinto` of one file in 4 MiB calls into one buffer;
  against the native client reading the same file in the same transfers.
- `preload-{psync,pvsync2}-{write,read,randwrite,randread}`: the same fio runs under
  `LD_PRELOAD` of the interposition library (docs/preload.md), files under its prefix (a real,
  empty local directory, which must still be empty afterwards); against the native client,
  and at 4 KiB random also against the mount (`fio-psync-rand*`).
- `preload-cp`: `cp` of one large BenchFS file to another under the library, against the
  Python client copying it in 4 MiB reads and writes.
- `metadata` (a section of its own, in operations per second): a small C loop creating,
  stat-ing and unlinking files (`metaloop.c` beside this module, built with `cc`), through
  the library against the same loop over the C library.
- `mount-writer` (a section of its own): one writer through the mount, as programs write: `dd`
  of a file in 4 KiB, 64 KiB and 1 MiB writes with `conv=fsync`, and `tar x` of an archive of
  Python's standard library (2,450 files, 104 MB; `--quick`: its `email` package), through a
  mount with the default `client.mount_write_behind` against a second mount of the same
  cluster with it at 0 (every write answered before the next), interleaved. This is what
  chose the mount's default.

Repeats are interleaved (`benchfs.bench.stats.interleave`) and the report gives medians.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client, _core
from benchfs.bench.cluster import BenchCluster
from benchfs.bench.render import print_lines_and_targets, print_ratio_cases
from benchfs.bench.stats import interleave, median, ratio
from benchfs.errors import BenchError
from benchfs.native import PACKAGE_DIR, preload_env
from benchfs.probes.fio import find_fio, run_fio
from benchfs.units import MIB, format_size

TOOLS = ("layer", "native")
FIO_CASES = ("fio-psync-write", "fio-psync-read", "fio-uring-write", "fio-uring-read")
RANDOM_CASES = ("fio-psync-randwrite", "fio-psync-randread")
PRELOAD_CASES = tuple(
    f"preload-{engine}-{direction}"
    for engine in ("psync", "pvsync2")
    for direction in ("write", "read", "randwrite", "randread")
)
CASES = (*FIO_CASES, *RANDOM_CASES, "python-readinto", *PRELOAD_CASES, "preload-cp")
META_OPS = ("create", "stat", "unlink")
WRITER_CASES = ("dd-4k", "dd-64k", "dd-1m", "tar-x")
WRITER_TOOLS = ("default", "off")
"""The mount with its default write-behind, and one with client.mount_write_behind = 0."""
WRITER_TARGET = 1.6
"""The mount's default against write-behind off, one writer."""
METALOOP = Path(__file__).with_name("metaloop.c")
FIO_JOBS = 2
FIO_BLOCK = MIB
RANDOM_BLOCK = 4096
PY_TRANSFER = 4 * MIB
TARGETS = {"fio": 0.9, "random": 0.5, "python-readinto": 0.95, "preload": 0.9}
PRELOAD_OVER_MOUNT = 1.5
"""4 KiB random through the preload against the same through the mount."""


@dataclass(frozen=True)
class AccessSettings:
    servers: int = 2
    repeats: int = 3
    fio_file_size: int = 512 * MIB
    """Bytes per fio job (and per native thread)."""
    py_file_size: int = 1024 * MIB
    random_file_size: int = 32 * MIB
    """Bytes per job of the 4 KiB random cases."""
    meta_files: int = 2000
    """Files of each pass of the metadata loop."""
    dd_size: int = 256 * MIB
    """Bytes of each dd of the mount-writer cases."""
    tar_tree: str = ""
    """The tree the tar-x case extracts, under Python's standard library ("": all of it but
    site-packages and bytecode)."""
    mount_threads: int | None = None

    @classmethod
    def quick(cls) -> AccessSettings:
        return cls(
            repeats=1,
            fio_file_size=16 * MIB,
            py_file_size=32 * MIB,
            random_file_size=2 * MIB,
            meta_files=100,
            dd_size=16 * MIB,
            tar_tree="email",
        )


ENGINES = {"psync": "psync", "uring": "io_uring", "pvsync2": "pvsync2"}


def _fio_argv(fio: str, mountpoint: Path, engine: str, direction: str, size: int) -> list[str]:
    random = direction.startswith("rand")
    return [
        fio,
        "--output-format=json",
        f"--name=access-{engine}{'-random' if random else ''}",
        f"--directory={mountpoint}",
        f"--rw={direction}",
        f"--bs={RANDOM_BLOCK if random else FIO_BLOCK}",
        f"--size={size}",
        f"--ioengine={ENGINES[engine]}",
        "--iodepth=1",
        "--direct=1",
        f"--numjobs={FIO_JOBS}",
        "--group_reporting=1",
    ]


class AccessBench:
    """The cluster, the mount and the clients of one run; `measure` runs one step."""

    def __init__(
        self, settings: AccessSettings, cluster: BenchCluster, mountpoint: Path, prefix: Path
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.mountpoint = mountpoint
        self.prefix = prefix
        self.config = cluster.config_text()
        self.fio = find_fio()
        own = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
        self.preload_env = preload_env({**own, "BENCHFS_CONFIG": str(cluster.config_path)}, prefix)

    def native(
        self, paths: list[str], size: int, transfer: int, direction: str, random: bool = False
    ) -> float:
        r = _core.bench_transfers(
            str(self.cluster.registry),
            self.config,
            paths,
            size,
            transfer,
            direction,
            random=random,
        )
        return float(r["mib_s"])

    def prepare(self) -> None:
        """The files that the native readers read before any write case ran (written once,
        untimed); fio lays out its own."""
        self.native(["/py.dat"], self.settings.py_file_size, PY_TRANSFER, "write")
        self.native(["/cp-src.bin"], self.settings.py_file_size, PY_TRANSFER, "write")
        size = self.settings.random_file_size
        self.native(self.random_paths(), size, FIO_BLOCK, "write")

    @staticmethod
    def random_paths() -> list[str]:
        return [f"/native-random.{j}" for j in range(FIO_JOBS)]

    def python_readinto(self, client: Client) -> float:
        size = self.settings.py_file_size
        buf = memoryview(bytearray(PY_TRANSFER))
        with client.open("/py.dat") as f:
            start = time.perf_counter()
            moved = 0
            while n := f.readinto(buf):
                moved += n
            seconds = time.perf_counter() - start
        if moved != size:
            raise BenchError("EIO", f"python readinto read {moved} bytes of {size}")
        return moved / MIB / seconds

    def copy(self, tool: str, client: Client) -> float:
        """`cp` under the library, or the Python client, from /cp-src.bin to /cp-dst.bin."""
        size = self.settings.py_file_size
        start = time.perf_counter()
        if tool == "layer":
            done = subprocess.run(
                ["cp", f"{self.prefix}/cp-src.bin", f"{self.prefix}/cp-dst.bin"],
                env=self.preload_env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                raise BenchError("EIO", f"cp under the preload failed: {done.stderr.strip()}")
        else:
            buf = memoryview(bytearray(PY_TRANSFER))
            with client.open("/cp-src.bin") as src, client.open("/cp-dst.bin", "wb") as dst:
                while n := src.readinto(buf):
                    dst.write(buf[:n])
        seconds = time.perf_counter() - start
        copied = client.stat("/cp-dst.bin").st_size
        if copied != size:
            raise BenchError("EIO", f"the copy has {copied} bytes of {size}")
        client.unlink("/cp-dst.bin")
        return size / MIB / seconds

    def measure(self, case: str, tool: str, client: Client) -> float:
        s = self.settings
        if case == "preload-cp":
            return self.copy(tool, client)
        if case == "python-readinto":
            if tool == "layer":
                return self.python_readinto(client)
            return self.native(["/py.dat"], s.py_file_size, PY_TRANSFER, "read")
        layer, engine, direction = case.split("-")
        if layer == "preload":
            random = direction.startswith("rand")
            size = s.random_file_size if random else s.fio_file_size
            plain = direction.removeprefix("rand")
            if tool == "layer":
                # Jobs as threads of one process, like the native client's threads.
                argv = [*_fio_argv(self.fio, self.prefix, engine, direction, size), "--thread"]
                return run_fio(argv, plain, timeout_s=600, env=self.preload_env).mib_s
            if random:
                return self.native(self.random_paths(), size, RANDOM_BLOCK, plain, random=True)
            paths = [f"/native-{engine}.{j}" for j in range(FIO_JOBS)]
            return self.native(paths, size, FIO_BLOCK, direction)
        if case in RANDOM_CASES:
            size, plain = s.random_file_size, direction.removeprefix("rand")
            if tool == "layer":
                argv = _fio_argv(self.fio, self.mountpoint, engine, direction, size)
                return run_fio(argv, plain, timeout_s=600).mib_s
            return self.native(self.random_paths(), size, RANDOM_BLOCK, plain, random=True)
        if tool == "layer":
            argv = _fio_argv(self.fio, self.mountpoint, engine, direction, s.fio_file_size)
            return run_fio(argv, direction, timeout_s=600).mib_s
        paths = [f"/native-{engine}.{j}" for j in range(FIO_JOBS)]
        return self.native(paths, s.fio_file_size, FIO_BLOCK, direction)


def _kind(name: str) -> str:
    if name == "python-readinto":
        return name
    if name in PRELOAD_CASES or name == "preload-cp":
        return "preload"
    return "random" if name in RANDOM_CASES else "fio"


def access_targets(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    by_name = {c["name"]: c for c in cases}
    for c in cases:
        limit = TARGETS[_kind(c["name"])]
        found.append(
            {
                "target": f"{c['name']}: ratio >= {limit:g}",
                "value": c["ratio"],
                "met": None if c["ratio"] is None else c["ratio"] >= limit,
            }
        )
    for direction in ("randwrite", "randread"):
        preload, mount = (
            by_name.get(f"preload-psync-{direction}"),
            by_name.get(f"fio-psync-{direction}"),
        )
        if preload is None or mount is None:
            continue
        value = ratio(preload["mib_s"], mount["mib_s"])
        found.append(
            {
                "target": f"preload-psync-{direction} over the mount >= {PRELOAD_OVER_MOUNT:g}",
                "value": value,
                "met": None if value is None else value >= PRELOAD_OVER_MOUNT,
            }
        )
    return found


class MetaLoop:
    """The metadata loop built twice (through the library, over the C library)."""

    def __init__(self, root: Path) -> None:
        self.posix = root / "metaloop-posix"
        self.capi = root / "metaloop-capi"
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise BenchError("ENOENT", "no C compiler (cc) for the metadata loop")
        lib = PACKAGE_DIR / "lib"
        include = PACKAGE_DIR / "include"
        for out, extra in (
            (self.posix, []),
            (
                self.capi,
                ["-DVIA_CAPI", f"-I{include}", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lbenchfs"],
            ),
        ):
            done = subprocess.run(
                [cc, "-O2", "-o", str(out), str(METALOOP), *extra],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise BenchError("EIO", f"cannot build {out.name}: {done.stderr.strip()}")

    def run(self, tool: str, bench: AccessBench, count: int) -> dict[str, float]:
        if tool == "preload":
            argv, env = [str(self.posix), f"{bench.prefix}/meta", str(count)], bench.preload_env
        else:
            env = {
                **{k: v for k, v in bench.preload_env.items() if k != "LD_PRELOAD"},
                "BENCHFS_REGISTRY": str(bench.cluster.registry),
            }
            argv = [str(self.capi), "/meta", str(count)]
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise BenchError("EIO", f"the metadata loop ({tool}) failed: {done.stderr.strip()}")
        rates = json.loads(done.stdout)
        return {op: float(rates[op]) for op in META_OPS}


def metadata_targets(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "target": f"metadata {o['op']} through the preload: ratio to the C library >= "
            f"{TARGETS['preload']:g}",
            "value": o["ratio"],
            "met": None if o["ratio"] is None else o["ratio"] >= TARGETS["preload"],
        }
        for o in metadata["ops"]
    ]


def run_metadata(
    root: Path, bench: AccessBench, client: Client, settings: AccessSettings
) -> dict[str, Any]:
    """Interleaved repeats of the metadata loop; medians per operation and their ratio."""
    loop = MetaLoop(root)
    client.mkdir("/meta")
    samples: dict[str, dict[str, list[float]]] = {
        t: {op: [] for op in META_OPS} for t in ("preload", "capi")
    }
    for step in interleave(["metadata"], settings.repeats, ("preload", "capi")):
        for op, rate in loop.run(step.tool, bench, settings.meta_files).items():
            samples[step.tool][op].append(rate)
    client.rmdir("/meta")
    ops = []
    for op in META_OPS:
        preload, capi = median(samples["preload"][op]), median(samples["capi"][op])
        ops.append(
            {
                "op": op,
                "preload_ops_s": preload,
                "capi_ops_s": capi,
                "ratio": ratio(preload, capi),
                "samples": samples["preload"][op],
                "capi_samples": samples["capi"][op],
            }
        )
    return {"files": settings.meta_files, "ops": ops}


class MountWriter:
    """One writer through a mount (`dd`, `tar x`), timed, into a fresh directory each time."""

    def __init__(self, root: Path, settings: AccessSettings) -> None:
        self.settings = settings
        self.archive = root / "tree.tar"
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        tree = stdlib / settings.tar_tree if settings.tar_tree else stdlib
        done = subprocess.run(
            ["tar", "cf", str(self.archive), "--exclude=site-packages",
             "--exclude=__pycache__", "-C", str(tree.parent), tree.name],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise BenchError("EIO", f"cannot make the tar archive: {done.stderr.strip()}")
        self.runs = 0

    def run(self, case: str, mountpoint: Path) -> float:
        """MiB/s of one case: dd's bytes, or the archive's, over the wall time."""
        self.runs += 1
        where = mountpoint / f"writer-{self.runs}"
        where.mkdir()
        if case == "tar-x":
            argv = ["tar", "xf", str(self.archive), "-C", str(where)]
            size = self.archive.stat().st_size
        else:
            bs = {"dd-4k": 4096, "dd-64k": 65536, "dd-1m": MIB}[case]
            size = self.settings.dd_size
            argv = ["dd", "if=/dev/zero", f"of={where / 'f'}", f"bs={bs}",
                    f"count={size // bs}", "conv=fsync", "status=none"]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if case == "tar-x" and done.returncode == 0:
            done = subprocess.run(["sync", "-f", str(where)], capture_output=True, text=True,
                                  timeout=600, check=False)  # fmt: skip
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise BenchError("EIO", f"{' '.join(argv)} failed: {done.stderr.strip()}")
        shutil.rmtree(where)
        return size / MIB / seconds


def run_mount_writer(
    root: Path,
    cluster: BenchCluster,
    default_mount: Path,
    settings: AccessSettings,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The mount-writer cases: the default mount against a second one without write-behind."""
    from benchfs.mount import mounted

    writer = MountWriter(root, settings)
    off = root / "mnt-wb0"
    off.mkdir()
    samples: dict[tuple[str, str], list[float]] = {}
    with mounted(
        cluster.registry,
        off,
        config_path=cluster.config_path,
        overrides=["client.mount_write_behind=0"],
        threads=settings.mount_threads,
    ):
        steps = interleave(list(WRITER_CASES), settings.repeats, WRITER_TOOLS)
        for i, step in enumerate(steps, 1):
            progress(f"mount writer [{i}/{len(steps)}] {step.case}, write-behind {step.tool}")
            point = default_mount if step.tool == "default" else off
            samples.setdefault((step.case, step.tool), []).append(writer.run(step.case, point))
    budget = int(cluster.settings()["client"]["mount_write_behind"])
    cases = []
    for name in WRITER_CASES:
        default, without = median(samples[(name, "default")]), median(samples[(name, "off")])
        cases.append(
            {
                "name": name,
                "mib_s": default,
                "off_mib_s": without,
                "ratio": ratio(default, without),
                "samples": samples[(name, "default")],
                "off_samples": samples[(name, "off")],
            }
        )
    return {
        "mount_write_behind": budget,
        "dd_size": settings.dd_size,
        "tar_bytes": writer.archive.stat().st_size,
        "tar_tree": settings.tar_tree or "the standard library",
        "cases": cases,
    }


def writer_targets(writer: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "target": f"mount-writer {c['name']}: the default over write-behind off >= "
            f"{WRITER_TARGET:g}",
            "value": c["ratio"],
            "met": None if c["ratio"] is None else c["ratio"] >= WRITER_TARGET,
        }
        for c in writer["cases"]
    ]


def run_access(
    root: Path,
    settings: AccessSettings,
    benchfsd: str,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Starts the cluster and the mount, runs the interleaved schedule, stops everything."""
    from benchfs.mount import mounted

    cluster = BenchCluster(root / "access", "access", settings.servers, [], benchfsd)
    mountpoint = root / "mnt"
    mountpoint.mkdir()
    prefix = root / "preload"
    prefix.mkdir()
    samples: dict[tuple[str, str], list[float]] = {}
    cluster.start()
    try:
        with mounted(
            cluster.registry,
            mountpoint,
            config_path=cluster.config_path,
            threads=settings.mount_threads,
        ):
            bench = AccessBench(settings, cluster, mountpoint, prefix)
            with Client(cluster.registry, config=bench.config) as client:
                bench.prepare()
                steps = interleave(list(CASES), settings.repeats, TOOLS)
                for i, step in enumerate(steps, 1):
                    progress(f"[{i}/{len(steps)}] {step.case} {step.tool}")
                    value = bench.measure(step.case, step.tool, client)
                    samples.setdefault((step.case, step.tool), []).append(value)
                progress("metadata loop: preload against the C library")
                metadata = run_metadata(root, bench, client, settings)
            writer = run_mount_writer(root, cluster, mountpoint, settings, progress)
    finally:
        cluster.stop()
    if any(prefix.iterdir()):
        raise BenchError("EIO", f"the preload's prefix {prefix} is not empty: a call escaped it")
    cases = []
    for name in CASES:
        layer = median(samples[(name, "layer")])
        native = median(samples[(name, "native")])
        cases.append(
            {
                "name": name,
                "mib_s": layer,
                "native_mib_s": native,
                "ratio": ratio(layer, native),
                "samples": samples[(name, "layer")],
                "native_samples": samples[(name, "native")],
            }
        )
    return {
        "cases": cases,
        "metadata": metadata,
        "mount_writer": writer,
        "targets": access_targets(cases) + metadata_targets(metadata) + writer_targets(writer),
        "data_dir": str(root),
        "servers": settings.servers,
        "repeats": settings.repeats,
        "fio_file_size": settings.fio_file_size,
        "fio_jobs": FIO_JOBS,
        "py_file_size": settings.py_file_size,
        "random_file_size": settings.random_file_size,
    }


def render(console: Console, report: dict[str, Any]) -> None:
    """Each layer beside the native client, for people."""
    print_ratio_cases(
        console,
        f"benchfs-bench access: medians of {report['repeats']} (MiB/s)",
        ("layer", "native"),
        "native_mib_s",
        report["cases"],
    )
    fio = f"{report['fio_jobs']} jobs x {format_size(report['fio_file_size'])}, bs 1M, direct"
    lines = [
        ("servers' data", f"{report['data_dir']} ({report['data_fs']})"),
        ("fio", fio),
        ("fio random", f"{format_size(report['random_file_size'])} per job, bs 4k, direct"),
        ("readinto", f"{format_size(report['py_file_size'])} in 4 MiB calls"),
        ("preload", "the fio cases under LD_PRELOAD, psync and pvsync2; cp of the readinto file"),
    ]
    meta = report["metadata"]
    for o in meta["ops"]:
        r = "-" if o["ratio"] is None else f"{o['ratio']:.2f}"
        lines.append(
            (
                f"metadata {o['op']}",
                f"preload {o['preload_ops_s']:.0f}/s, C library {o['capi_ops_s']:.0f}/s, ratio {r}",
            )
        )
    writer = report["mount_writer"]
    for c in writer["cases"]:
        r = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
        lines.append(
            (
                f"mount writer {c['name']}",
                f"write-behind {format_size(writer['mount_write_behind'])} (the default) "
                f"{c['mib_s']:.0f} MiB/s, off {c['off_mib_s']:.0f} MiB/s, ratio {r}",
            )
        )
    lines.append(
        (
            "mount writer",
            f"dd of {format_size(writer['dd_size'])} with conv=fsync; tar x of "
            f"{writer['tar_tree']} ({format_size(writer['tar_bytes'])}), then sync",
        )
    )
    print_lines_and_targets(console, lines, report["targets"])
