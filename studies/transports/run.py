"""Transport study: which UCX transports carry BenchFS's chunks on one host, how fast, and
whether a killed server is noticed at once (`network.peer_error_handling`).

For each configuration a 1-server local cluster keeps its data on tmpfs; one client process
(`benchfs.clients.calls`) moves 32 MiB calls of 4 MiB chunks for 2 s (`bw write`, `bw read`),
repeats interleaved, medians. Then a client in this process reads the server's file in a loop,
the server is SIGKILLed, and the time until the read fails is taken (30 s request timeout, no
retries: a failure detected by the transport comes within a second, an undetected one at 30 s).

Configurations: TCP alone and the default (UCX's choice) with peer failure detection; shared
memory alone without it; shared memory with it and UCX's two knobs that let its shared-memory
transports claim it (`UCX_MM_ERROR_HANDLING=y`, `UCX_CMA_MEMORY_INVALIDATE=y`). Results go to
results.md and results.json beside this file (docs/config.md quotes them).

    .venv/bin/python studies/transports/run.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchfs.bench.cluster import BenchCluster
from benchfs.client import Client
from benchfs.cluster import find_benchfsd
from benchfs.units import MIB

HERE = Path(__file__).resolve().parent
CHUNK = 4 * MIB
CALL = 8 * CHUNK
SECONDS = 2.0
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Setup:
    name: str
    transports: str
    peer_errors: bool
    env: dict[str, str] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        return [
            f"network.transports={self.transports}",
            f"network.peer_error_handling={str(self.peer_errors).lower()}",
            f"layout.chunk_size={CHUNK}",
            f"client.request_timeout_s={TIMEOUT_S}",
            "client.max_retries=0",
        ]


KNOBS = {"UCX_MM_ERROR_HANDLING": "y", "UCX_CMA_MEMORY_INVALIDATE": "y"}
SETUPS = (
    Setup("tcp", "tcp", True),
    Setup("default", "", True),
    Setup("shm", "shm,self", False),
    Setup("shm + knobs", "shm,self", True, KNOBS),
)


@contextlib.contextmanager
def ucx_env(setup: Setup) -> Iterator[None]:
    """The setup's UCX variables for the processes started (and clients made) in the block."""
    saved = {k: os.environ.get(k) for k in setup.env}
    os.environ.update(setup.env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start(root: Path, setup: Setup) -> BenchCluster:
    """A 1-server cluster of the setup."""
    cluster = BenchCluster(root, setup.name, 1, setup.overrides(), find_benchfsd())
    cluster.start()
    return cluster


def detection_s(root: Path, setup: Setup) -> tuple[float, str]:
    """Seconds from a SIGKILL of the server to the failure of a read in flight, and its error."""
    cluster = start(root, setup)
    assert cluster.cluster is not None
    try:
        client = Client(str(cluster.registry), cluster.config_text())
        with client.open("/kill.dat", "w") as f:
            f.write(b"x" * CALL)
        f = client.open("/kill.dat")
        buf = bytearray(CALL)
        failed: list[tuple[float, str]] = []

        def reader() -> None:
            try:
                while True:
                    f.preadinto(buf, 0)
            except OSError as e:
                failed.append((time.monotonic(), str(e)))

        thread = threading.Thread(target=reader)
        thread.start()
        time.sleep(1.0)
        killed = time.monotonic()
        os.kill(cluster.cluster.daemons[0].pid, signal.SIGKILL)
        thread.join(TIMEOUT_S + 30)
        if not failed:
            raise SystemExit(f"{setup.name}: the read never failed after the kill")
        return failed[0][0] - killed, failed[0][1]
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="benchfs-transports-", dir="/dev/shm"))
    clusters, clients = {}, {}
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for setup in SETUPS:
            with ucx_env(setup):
                clusters[setup.name] = start(work / setup.name.replace(" ", ""), setup)
                clients[setup.name] = clusters[setup.name].start_clients(1, CALL, prepare=True)[0]
        for r in range(a.repeats):
            order = SETUPS if r % 2 == 0 else tuple(reversed(SETUPS))
            for setup in order:
                for op in ("write", "read"):
                    proc = clients[setup.name]
                    proc.send(f"bw {op} {SECONDS}")
                    answer = proc.receive(SECONDS + 60)
                    mib_s = answer["bytes"] / MIB / answer["seconds"]
                    samples.setdefault((setup.name, op), []).append(mib_s)
        for cluster in clusters.values():
            cluster.stop()
        rows = []
        for setup in SETUPS:
            with ucx_env(setup):
                seconds, error = detection_s(work / f"kill-{setup.name.replace(' ', '')}", setup)
            rows.append(
                {
                    "setup": setup.name,
                    "network.transports": setup.transports,
                    "network.peer_error_handling": setup.peer_errors,
                    "env": setup.env,
                    "write_mib_s": statistics.median(samples[(setup.name, "write")]),
                    "read_mib_s": statistics.median(samples[(setup.name, "read")]),
                    "kill_detected_s": round(seconds, 2),
                    "kill_error": error,
                }
            )
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    (HERE / "results.json").write_text(
        json.dumps({"repeats": a.repeats, "rows": rows, "load": load}, indent=1) + "\n"
    )
    lines = [
        "| setup | network.transports | peer_error_handling | UCX variables | write MiB/s "
        "| read MiB/s | read fails after a SIGKILL of the server |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        env = " ".join(f"{k}={v}" for k, v in row["env"].items()) or "-"
        lines.append(
            f"| {row['setup']} | `{row['network.transports'] or '(empty)'}` | "
            f"{str(row['network.peer_error_handling']).lower()} | {env} | "
            f"{row['write_mib_s']:.0f} | {row['read_mib_s']:.0f} | {row['kill_detected_s']} s |"
        )
    lines.append("")
    lines.append(
        f"One client, one server, 4 MiB chunks on tmpfs, medians of {a.repeats} interleaved "
        f"repeats of 2 s; load average at the end {load[0]:.2f}."
    )
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
