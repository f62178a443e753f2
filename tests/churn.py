"""Client churn against live servers: the reproduction of "servers die under their clients' churn".

    python tests/churn.py [--rounds N] [--clients N] [--seconds S] [--servers N] [--seed N]
    python tests/churn.py client REGISTRY CONFIG NAME        (one client; the harness runs these)

Each round starts `--servers` `benchfsd` daemons over TCP with small socket buffers and a short
request timeout, under glibc's malloc checks (a use after free shows as an abort or a crash,
not as quiet corruption), and keeps `--clients` client processes busy: each writes and reads
back large files (many chunks in flight at once, over rendezvous) and checks every byte. The
harness meanwhile churns them at random moments: SIGKILL (a client dies mid-transfer), SIGSTOP
for longer than the request timeout and SIGCONT (a client the servers give up on comes back),
and a clean SIGTERM; every client that goes is replaced. A round fails if any server dies or
logs a crash, if a server does not stop cleanly on SIGTERM, or if a surviving client read a
wrong byte. Prints one line per round and exits non-zero naming the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: glibc's heap checks for the servers: no per-thread cache (a freed block is reused at once),
#: freed memory filled with 0xa5, and consistency checks on every call (libc_malloc_debug is
#: what makes MALLOC_CHECK_ work since glibc 2.34).
MALLOC_CHECKS = {
    "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.perturb=165",
    "MALLOC_CHECK_": "3",
}
MALLOC_DEBUG_LIB = "libc_malloc_debug.so.0"

#: What a crash leaves in a daemon's log (Rust panics, glibc's heap checks, our signal note).
CRASH_SIGNS = ("panicked", "malloc", "free()", "corrupted", "double free", "Assertion", "abort")

#: Settings that force the teardown races: TCP only, small socket buffers (a transfer stays in
#: flight for many progress calls), a 1 s request timeout (a stopped client is given up on
#: while it still holds its connection), 1 MiB chunks and rendezvous from 8 KiB.
CHURN_OVERRIDES = (
    "network.transports=tcp",
    "layout.chunk_size=1048576",
    "client.request_timeout_s=1.0",
    "client.max_retries=0",
    "cluster.connect_timeout_s=10.0",
    "network.rndv_threshold=8192",
)
#: The largest file a churning client writes (in 1 MiB chunks, all in flight at once).
MAX_FILE = 16 << 20
CHURN_UCX_ENV = {"UCX_TCP_SNDBUF": "65536", "UCX_TCP_RCVBUF": "65536"}


def client_main(registry: str, config_path: str, name: str) -> int:
    """One churning client: writes and reads back files of 1-16 MiB until SIGTERM, checking
    every byte; exits 3 on a wrong byte. Errors of a server that gave up on it are expected."""
    from benchfs import Client

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(os.getpid())
    # Two random buffers, alternated: a stale byte of the previous write differs.
    patterns = [rng.randbytes(MAX_FILE) for _ in range(2)]
    client = Client(registry, config=Path(config_path).read_text())
    print("connected", flush=True)
    i = 0
    while not stop.is_set():
        i += 1
        path = f"/{name}-{i % 3}"
        size = rng.randrange(1, MAX_FILE >> 20) << 20
        data = memoryview(patterns[i % 2])[:size]
        try:
            with client.open(path, "wb") as f:
                f.write(data)
            with client.open(path, "rb") as f:
                back = f.read()
        except OSError:
            continue
        if back != data:
            print(f"{path}: {size} bytes read back differ", flush=True)
            return 3
        print(f"ok {i}", flush=True)
    client.close()
    return 0


class Round:
    """One round: servers, churning clients, and the verdict."""

    def __init__(self, base: Path, servers: int, clients: int, seed: int) -> None:
        from benchfs.cluster import LocalCluster
        from benchfs.config import resolve_config_text

        self.base = base
        self.rng = random.Random(seed)
        self.n_clients = clients
        self.env = {**os.environ, **CHURN_UCX_ENV}
        prefix = ["env", *(f"{k}={v}" for k, v in {**MALLOC_CHECKS, **CHURN_UCX_ENV}.items())]
        prefix.append(f"LD_PRELOAD={MALLOC_DEBUG_LIB}")
        self.cluster = LocalCluster.start_in(
            base,
            resolve_config_text(None, list(CHURN_OVERRIDES)),
            [f"churn-{i}" for i in range(servers)],
            20.0,
            prefix=prefix,
        )
        self.clients: list[subprocess.Popen[str]] = []
        self.gone: list[subprocess.Popen[str]] = []
        self.events: dict[str, int] = {"kill": 0, "stop": 0, "term": 0}
        self.next_name = 0

    def spawn(self) -> None:
        self.next_name += 1
        assert self.cluster.config_path is not None
        log = open(self.base / f"client-{self.next_name}.log", "wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "client",
                str(self.cluster.registry_dir),
                str(self.cluster.config_path),
                f"c{self.next_name}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        self.clients.append(proc)

    def churn_one(self) -> None:
        """Ends clients at random, one of three ways, and starts as many others: a SIGKILL of
        one, a SIGTERM of one, or a SIGSTOP of up to four at once for longer than the request
        timeout (the servers give up on them while they live), then SIGCONT and an end."""
        action = self.rng.choices(["kill", "stop", "term"], weights=[4, 4, 2])[0]
        self.events[action] += 1
        count = self.rng.randint(1, 4) if action == "stop" else 1
        victims = [self.clients.pop(self.rng.randrange(len(self.clients))) for _ in range(count)]
        if action == "stop":
            for proc in victims:
                proc.send_signal(signal.SIGSTOP)
            time.sleep(self.rng.uniform(0.8, 2.5))
            for proc in victims:
                proc.send_signal(signal.SIGCONT)
            time.sleep(self.rng.uniform(0.0, 0.5))
            for proc in victims:
                proc.kill() if self.rng.random() < 0.5 else proc.terminate()
        elif action == "kill":
            victims[0].kill()
        else:
            victims[0].terminate()
        for proc in victims:
            self.gone.append(proc)
            self.spawn()

    def run(self, seconds: float) -> dict[str, Any]:
        for _ in range(self.n_clients):
            self.spawn()
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                time.sleep(self.rng.uniform(0.1, 0.6))
                self.churn_one()
                dead = self.cluster.exited()
                if dead:
                    break
        finally:
            for proc in self.clients:
                proc.terminate()
            bad_clients = []
            for proc in [*self.clients, *self.gone]:
                try:
                    code = proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait(5)
                if code == 3:
                    bad_clients.append(proc.pid)
            died = [(d.server_id, d.proc.returncode) for d in self.cluster.exited()]
            codes = self.cluster.stop(grace_s=10.0)
        crashed_logs = {}
        for daemon in self.cluster.daemons:
            log = daemon.log_path.read_text(errors="replace")
            if any(sign in log for sign in CRASH_SIGNS):
                crashed_logs[daemon.server_id] = log[-2000:]
        return {
            "died": died,
            "exit_codes": codes,
            "crash_logs": crashed_logs,
            "wrong_bytes": bad_clients,
            "events": self.events,
        }


def verdict(result: dict[str, Any]) -> str | None:
    """The round's first failure, or None."""
    if result["died"]:
        sid, code = result["died"][0]
        how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return f"server {sid} died during the churn ({how})"
    bad = {sid: c for sid, c in result["exit_codes"].items() if c != 0}
    if bad:
        return f"servers did not stop cleanly: {bad}"
    if result["crash_logs"]:
        sid, log = next(iter(result["crash_logs"].items()))
        return f"server {sid} logged a crash: ...{log[-400:]}"
    if result["wrong_bytes"]:
        return f"clients {result['wrong_bytes']} read wrong bytes"
    return None


def run_rounds(
    rounds: int, clients: int, seconds: float, servers: int, seed: int, base: Path
) -> list[str | None]:
    verdicts = []
    for r in range(rounds):
        round_seed = seed + r
        start = time.monotonic()
        one = Round(base / f"round-{r}", servers, clients, round_seed)
        result = one.run(seconds)
        failure = verdict(result)
        verdicts.append(failure)
        took = time.monotonic() - start
        print(
            f"round {r + 1}/{rounds} (seed {round_seed}): {failure or 'ok'}; "
            f"churned {json.dumps(result['events'])} in {took:.1f} s",
            flush=True,
        )
    return verdicts


def main(argv: list[str]) -> int:
    if argv[:1] == ["client"]:
        return client_main(*argv[1:4])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--dir", type=Path, default=None, help="keep the rounds' files here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="benchfs-churn-") as tmp:
        base = args.dir or Path(tmp)
        verdicts = run_rounds(
            args.rounds, args.clients, args.seconds, args.servers, args.seed, base
        )
    failed = [v for v in verdicts if v]
    print(f"{len(verdicts) - len(failed)}/{len(verdicts)} rounds ok (seed {args.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
