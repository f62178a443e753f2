"""A lock-taking client process for tests/test_faults.py's lock round.

    python lock_client.py REGISTRY CONFIG OUT_JSON NAME count|hold

`count`: until SIGTERM, takes the exclusive lock of /counter's first 8 bytes (waiting),
reads the counter there, writes it plus one and unlocks. An increment is `confirmed` when
every call of it succeeded, `doubtful` when a call failed after the lock was granted (the new
value may be written). ENOLCK (the lock server restarted) counts as `lost`; server faults
(EHOSTDOWN, ETIMEDOUT, ECONNRESET) are retried; any other error is a bad error. Prints
`counting` after the first confirmed increment.

`hold`: takes the same lock, prints `held` and keeps it until SIGTERM (then unlocks).

Both write one JSON report to OUT_JSON and exit 0 after SIGTERM.
"""

from __future__ import annotations

import errno
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchfs import Client

FAULT_ERRNOS = {errno.EHOSTDOWN, errno.ETIMEDOUT, errno.ECONNRESET}
COUNTER = "/counter"


def main() -> int:
    registry, config_path, out, _name, mode = sys.argv[1:6]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    report: dict[str, Any] = {
        "confirmed": 0,
        "doubtful": 0,
        "lost": 0,
        "retried": 0,
        "bad_errors": [],
        "max_lock_s": 0.0,
        "max_call_s": 0.0,
    }
    if mode == "hold":
        # SIGTERM stays pending until sigwait takes it: blocked before the client's threads
        # start (they inherit the mask), or one of them would take it instead.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    client = Client(registry, config=Path(config_path).read_text())
    f = client.open(COUNTER, "r+")

    def timed(what: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            key = "max_lock_s" if what == "lock" else "max_call_s"
            report[key] = max(report[key], time.monotonic() - t0)

    def failed(e: OSError, what: str) -> None:
        if e.errno == errno.ENOLCK:
            report["lost"] += 1
        elif e.errno in FAULT_ERRNOS:
            report["retried"] += 1
            time.sleep(0.05)
        elif len(report["bad_errors"]) < 20:
            report["bad_errors"].append({"call": what, "errno": e.errno, "message": str(e)})

    if mode == "hold":
        timed("lock", f.lock, True, 0, 8)
        print("held", flush=True)
        signal.sigwait({signal.SIGTERM})
        timed("unlock", f.unlock, 0, 8)
    announced = False
    while mode == "count" and not stop["now"]:
        try:
            timed("lock", f.lock, True, 0, 8)
        except OSError as e:
            failed(e, "lock")
            continue
        step = "read"
        try:
            f.seek(0)
            value = int.from_bytes(timed(step, f.read, 8), "little")
            step = "write"
            f.seek(0)
            timed(step, f.write, (value + 1).to_bytes(8, "little"))
            step = "unlock"
            timed(step, f.unlock, 0, 8)
        except OSError as e:
            report["doubtful"] += 1
            failed(e, step)
            continue
        report["confirmed"] += 1
        if not announced:
            print("counting", flush=True)
            announced = True
    f.close()
    client.close()
    Path(out).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
