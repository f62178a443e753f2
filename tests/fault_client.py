"""A client process for tests/test_faults.py: writes, reads back and checks files until
SIGTERM, timing every call; then re-checks what it wrote and reports one JSON object.

    python fault_client.py REGISTRY CONFIG OUT_JSON NAME [--killed-file PATH]

Each file is one chunk (its data on one server), filled with the test pattern of its own seed,
so a byte that is wrong, missing or from another file is detected. Prints `connecting` before
connecting, `writing` once the first write started and `wrote N` once the first and the
eighth file read back right, so the harness can kill it (or its servers) at those points.
Exits 0 after SIGTERM, with its report in OUT_JSON.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from benchfs import Client
from benchfs.workloads.rw import Pattern

#: Errors a client may return for a server fault (anything else is a defect).
FAULT_ERRNOS = {errno.EHOSTDOWN, errno.ETIMEDOUT, errno.ECONNRESET}


class Recorder:
    def __init__(self) -> None:
        self.calls = 0
        self.max_call_s = 0.0
        self.errors: list[dict[str, Any]] = []
        self.error_count = 0
        #: The wall-clock time of the last successful write per server id.
        self.last_ok: dict[int, float] = {}
        #: The server keeping the metadata of the file being worked on (errors name it).
        self.owner: int | None = None

    def call(self, what: str, fn: Any, *args: Any) -> Any:
        start = time.monotonic()
        try:
            return fn(*args)
        except OSError as e:
            self.error_count += 1
            if len(self.errors) < 50:
                self.errors.append(
                    {
                        "call": what,
                        "errno": e.errno,
                        "message": str(e),
                        "at": time.time(),
                        "owner": self.owner,
                    }
                )
            raise
        finally:
            self.calls += 1
            self.max_call_s = max(self.max_call_s, time.monotonic() - start)


def main() -> int:
    registry, config_path, out, name = sys.argv[1:5]
    killed_file = (
        Path(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--killed-file" else None
    )
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    rec = Recorder()
    print("connecting", flush=True)
    config = Path(config_path).read_text()
    client = Client(registry, config=config)
    size = int(tomllib.loads(config)["layout"]["chunk_size"])
    written: dict[str, int] = {}
    # Seeds unique per process and file (the pattern's writer field has 24 bits).
    seed_base = (os.getpid() % 8000) * 1000
    i = 0
    announced = False
    while not stop["now"]:
        path = f"/{name}-{i}"
        seed = seed_base + i % 1000
        i += 1
        data = Pattern(seed).bytes_at(0, size)
        rec.owner = client.locate_metadata(path)
        try:
            f = rec.call("open", client.open, path, "wb")
            try:
                if not announced:
                    print("writing", flush=True)
                    announced = True
                rec.call("write", f.write, data)
            finally:
                rec.call("close", f.close)
            server = rec.call("locate", client.locate, path, 0)
            g = rec.call("open", client.open, path, "rb")
            try:
                back = rec.call("read", g.read)
            finally:
                g.close()
            if back != data:
                raise AssertionError(f"{path}: read back differs right after writing it")
            written[path] = seed
            rec.last_ok[server] = time.time()
            if len(written) in (1, 8):
                print(f"wrote {len(written)}", flush=True)
        except OSError:
            time.sleep(0.01)
    # Re-check every file: those on live servers byte for byte, the others must fail cleanly.
    killed = (
        set(json.loads(killed_file.read_text())) if killed_file and killed_file.exists() else set()
    )
    verified, unreachable, mismatches, bad_errors = 0, 0, [], []
    #: Files whose metadata lives on a live server that could not be read back.
    unreachable_data = 0
    verified_on: dict[int, int] = {}
    for path, seed in written.items():
        try:
            server = client.locate(path, 0)
            with client.open(path, "rb") as g:
                back = g.read()
            if back != Pattern(seed).bytes_at(0, size):
                mismatches.append(path)
            else:
                verified += 1
                verified_on[server] = verified_on.get(server, 0) + 1
        except OSError as e:
            unreachable += 1
            if client.locate_metadata(path) not in killed:
                unreachable_data += 1
            if e.errno not in FAULT_ERRNOS or not any(f"server {k}" in str(e) for k in killed):
                bad_errors.append({"path": path, "errno": e.errno, "message": str(e)})
    report = {
        "calls": rec.calls,
        "max_call_s": rec.max_call_s,
        "error_count": rec.error_count,
        "errors": rec.errors,
        "last_ok": rec.last_ok,
        "written": len(written),
        "verified": verified,
        "verified_on": verified_on,
        "unreachable": unreachable,
        "unreachable_data": unreachable_data,
        "mismatches": mismatches,
        "bad_errors": bad_errors,
    }
    Path(out).write_text(json.dumps(report))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
