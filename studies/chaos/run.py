"""Chaos during the reads: servers must survive clients killed at random, and every surviving
client must read back its peer's bytes exactly.

    python studies/chaos/run.py --nodes-file n16.toml --clients-per-node 8 --size 64M \
        [--every 3] [--seed N] [--results-root DIR]

`benchfs start --nodes-file` puts a server on every node; then `clients-per-node` client
processes per node (each joins its node's network namespace, as a rank does: BENCHFS_NETNS)
write a file of their own, meet at a barrier (a file per client: no MPI, which would end the
whole job at the first killed rank), and read the file of the next client back, checking every
byte. Meanwhile this process SIGKILLs one random reading client every `--every` seconds. At the
end: every server must still run (`benchfs status`), every client not killed must have verified
its peer's file (exit 0), and the killed clients are named. Prints one JSON line; exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchfs.nodes import load_nodes
from benchfs.units import parse_size

CLIENT = r"""
import os, sys, time, random
from pathlib import Path
from benchfs import Client
me, peer, size, gate = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
PIECE = 4 << 20
def piece(rank, i, n):  # the bytes of `rank`'s file at piece i, made again to check
    return random.Random(rank * 1_000_003 + i).randbytes(n)
c = Client(os.environ["BENCHFS_REGISTRY"], config=Path(os.environ["BENCHFS_CONFIG"]).read_text())
with c.open(f"/chaos-{me}", "wb") as f:
    for i, at in enumerate(range(0, size, PIECE)):
        f.write(piece(me, i, min(PIECE, size - at)))
(gate / f"wrote-{me}").touch()
while not (gate / "read").exists():
    time.sleep(0.2)
(gate / f"reading-{me}").touch()
with c.open(f"/chaos-{peer}", "rb") as f:
    for i, at in enumerate(range(0, size, PIECE)):
        n = min(PIECE, size - at)
        if f.read(n) != piece(peer, i, n):
            print(f"client {me}: the file of client {peer} differs at {at}", flush=True)
            sys.exit(3)
c.close()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-file", required=True)
    ap.add_argument("--clients-per-node", type=int, default=8)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--every", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    ap.add_argument("--results-root", default="results")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    size = parse_size(args.size)
    nodes = load_nodes(args.nodes_file)
    started = subprocess.run(
        ["benchfs", "start", "--nodes-file", args.nodes_file, "--servers-per-node", "1",
         "--results-root", args.results_root],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if started.returncode != 0:
        print(started.stderr, file=sys.stderr)
        return 1
    env = dict(os.environ)
    for line in started.stdout.splitlines():
        if line.startswith("export "):
            key, value = line[len("export ") :].split("=", 1)
            env[key] = shlex.split(value)[0]
    gate = Path(env["BENCHFS_JOB_DIR"]) / "chaos-gate"
    gate.mkdir()
    clients: list[subprocess.Popen[bytes]] = []
    count = len(nodes) * args.clients_per_node
    for rank in range(count):
        node = nodes[rank % len(nodes)]
        own = {**env, "UCX_NET_DEVICES": "eth0", "UCX_TLS": "tcp"}
        if node.netns:
            own["BENCHFS_NETNS"] = node.netns
        peer = (rank + 1) % count
        argv = [sys.executable, "-c", CLIENT, str(rank), str(peer), str(size), str(gate)]
        clients.append(subprocess.Popen(argv, env=own, stdin=subprocess.DEVNULL))
    killed: list[int] = []
    began = time.monotonic()
    try:
        while len(list(gate.glob("wrote-*"))) < count:
            if any(p.poll() is not None for p in clients):
                break
            time.sleep(0.5)
        wrote_s = time.monotonic() - began
        (gate / "read").touch()
        while any(p.poll() is None for p in clients):
            time.sleep(args.every)
            reading = [r for r, p in enumerate(clients) if p.poll() is None
                       and (gate / f"reading-{r}").exists() and r not in killed]  # fmt: skip
            if reading:
                victim = rng.choice(reading)
                clients[victim].send_signal(signal.SIGKILL)
                killed.append(victim)
        codes = [p.wait() for p in clients]
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
        status = subprocess.run(["benchfs", "status", "--json"], env=env, capture_output=True,
                                text=True, check=False)  # fmt: skip
        stopped = subprocess.run(["benchfs", "stop"], env=env, capture_output=True, text=True,
                                 check=False)  # fmt: skip
    failed = {r: c for r, c in enumerate(codes) if r not in killed and c != 0}
    report = {
        "seed": args.seed,
        "clients": count,
        "killed": sorted(killed),
        "survivors_failed": failed,
        "write_s": round(wrote_s, 1),
        "total_s": round(time.monotonic() - began, 1),
        "status_rc": status.returncode,
        "status": status.stdout.strip()[-2000:],
        "stop_rc": stopped.returncode,
        "stop": (stopped.stdout + stopped.stderr).strip()[-2000:],
    }
    print(json.dumps(report))
    return 0 if not failed and status.returncode == 0 and stopped.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
