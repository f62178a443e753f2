"""`ucx_perftest`, the UCX reference the RPC benchmark puts beside BenchFS: run it, parse it.

A measurement starts a responder (`ucx_perftest -p PORT`) and an initiator
(`ucx_perftest 127.0.0.1 -p PORT -t TEST -s SIZE -n ITERS -w WARMUP ...`) with the same
`UCX_TLS`; the initiator prints a table whose header names the columns:

    |              |              |        latency (usec)        |   bandwidth (MB/s)  | ...
    |    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall | ...
    Final:                 20000      7.562    16.232    75.500      240.65      51.74 ...

Columns are found by these header names (group, then column), never by position. ucx_perftest's
"MB/s" is bytes / 2^20 per second (MiB/s), and its latencies of ping-pong tests (`*_lat`) are
one-way: half the round trip.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchfs.errors import ProbeError
from benchfs.procs import stop_process, tail
from benchfs.ucx import find_tool

__all__ = [
    "PerftestError",
    "PerftestResult",
    "find_perftest",
    "free_port",
    "parse_perftest_output",
    "perftest_command",
    "run_perftest",
]

PERFTEST = "ucx_perftest"
READY_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 3
PERCENTILE = re.compile(r"^(\d+(?:\.\d+)?)%ile$")


class PerftestError(ProbeError):
    """ucx_perftest failed or printed something this parser does not understand."""

    def __init__(self, message: str) -> None:
        super().__init__("EPROTO", message)


@dataclass(frozen=True)
class PerftestResult:
    """The `Final:` row of one ucx_perftest run, by column name ("bandwidth (MB/s) overall")."""

    command: str
    columns: Mapping[str, float]

    def _get(self, group: str, column: str) -> float:
        for name, value in self.columns.items():
            head, _, tail_ = name.rpartition(" ")
            if head.startswith(group) and tail_ == column:
                return value
        raise PerftestError(
            f"`{self.command}` printed no column {group!r}/{column!r} "
            f"(columns: {', '.join(self.columns)})"
        )

    @property
    def iterations(self) -> int:
        return int(self.columns["# iterations"])

    @property
    def mib_s(self) -> float:
        """Bandwidth over the whole run (`bandwidth (MB/s) overall`, which is MiB/s)."""
        return self._get("bandwidth (MB/s)", "overall")

    @property
    def msg_rate(self) -> float:
        return self._get("message rate (msg/s)", "overall")

    @property
    def percentile(self) -> tuple[float, float]:
        """(rank, one-way latency in µs) of the latency percentile column (`-R`, 50 by default)."""
        for name, value in self.columns.items():
            head, _, column = name.rpartition(" ")
            match = PERCENTILE.match(column)
            if head.startswith(("latency (usec)", "overhead (usec)")) and match:
                return float(match.group(1)), value
        raise PerftestError(
            f"`{self.command}` printed no latency percentile column "
            f"(columns: {', '.join(self.columns)})"
        )

    @property
    def latency_us(self) -> float:
        """Mean one-way latency over the whole run (`latency (usec) overall`)."""
        return self._get("latency (usec)", "overall")


def _cells(line: str) -> list[tuple[int, int, str]]:
    """The cells of a `|`-separated table row: (start, end, stripped text)."""
    bars = [i for i, ch in enumerate(line) if ch == "|"]
    return [(a, b, line[a + 1 : b].strip()) for a, b in itertools.pairwise(bars)]


def parse_perftest_output(text: str, command: str) -> PerftestResult:
    """The `Final:` row of ucx_perftest's output, its columns named by the table header.

    The header is two `|` rows: column groups ("latency (usec)") spanning the column names
    ("50.0%ile", "average", ...) beneath them; a column is named "<group> <name>" (or just
    "<name>" under an empty group: "Stage", "# iterations"). Anything else raises
    PerftestError naming `command`.
    """

    def bad(why: str) -> PerftestError:
        shown = "\n".join(text.strip().splitlines()[-8:])
        return PerftestError(
            f"unexpected output from `{command}`: {why}"
            + (f"; its last lines:\n{shown}" if shown else " (it printed nothing)")
        )

    rows = [line.rstrip() for line in text.splitlines() if line.lstrip().startswith("|")]
    names_at = next((i for i, r in enumerate(rows) if "Stage" in r and "iterations" in r), None)
    if names_at is None or names_at == 0:
        raise bad("no table header (a row naming Stage and # iterations under a row of groups)")
    groups, names = _cells(rows[names_at - 1]), _cells(rows[names_at])
    columns: list[str] = []
    for start, end, name in names:
        group = next((g for a, b, g in groups if a <= start and end <= b), None)
        if group is None or not name:
            raise bad(f"header column at {start}..{end} ({name!r}) lies under no column group")
        columns.append(f"{group} {name}" if group else name)
    if columns[:2] != ["Stage", "# iterations"]:
        raise bad(f"header starts with {columns[:2]} instead of Stage, # iterations")
    finals = [line.split() for line in text.splitlines() if line.startswith("Final:")]
    if not finals:
        raise bad("no `Final:` row")
    values = finals[-1][1:]
    if len(values) != len(columns) - 1:
        raise bad(f"the `Final:` row has {len(values)} values for {len(columns) - 1} columns")
    try:
        numbers = [float(v.replace(",", "")) for v in values]
    except ValueError as e:
        raise bad(f"the `Final:` row holds a value that is not a number ({e})") from e
    return PerftestResult(command, dict(zip(columns[1:], numbers, strict=True)))


def find_perftest() -> str:
    """Path of the ucx_perftest of BenchFS's own UCX (the same library on both sides of the
    comparison); ProbeError ENOENT naming where it looked if there is none."""
    try:
        return find_tool(PERFTEST)
    except FileNotFoundError as e:
        raise ProbeError("ENOENT", str(e)) from None


def free_port() -> int:
    """A TCP port that was free a moment ago (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def perftest_command(
    perftest: str,
    port: int,
    test: str,
    size: int,
    iterations: int,
    warmup: int,
    extra: Sequence[str] = (),
    address: str = "127.0.0.1",
) -> list[str]:
    """The initiator's command line (the responder's is `[perftest, "-p", str(port)]`)."""
    return [
        perftest,
        address,
        "-p",
        str(port),
        "-t",
        test,
        "-s",
        str(size),
        "-n",
        str(iterations),
        "-w",
        str(warmup),
        *extra,
    ]


def listening(port: int, pid: int | str = "self") -> bool:
    """True if some socket listens on TCP `port` in the network namespace of process `pid`
    (from its /proc/PID/net/tcp and tcp6)."""
    want = f":{port:04X}"
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                # local_address is "ADDR:PORT" in hex; state 0A is LISTEN.
                if len(fields) > 3 and fields[1].endswith(want) and fields[3] == "0A":
                    return True
    return False


def _wait_listening(proc: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
    """True once the responder listens on `port`; False if it exited or `deadline` passed.

    Its output cannot tell (stdout to a file is block-buffered), and a test connection would
    be taken for the initiator, so the kernel's socket table is asked instead.
    """
    while time.monotonic() < deadline:
        if listening(port, proc.pid):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def run_perftest(
    test: str,
    size: int,
    iterations: int,
    warmup: int,
    tls: str | None,
    workdir: Path,
    timeout_s: float,
    extra: Sequence[str] = (),
    perftest: str | None = None,
    apart: tuple[Sequence[str], Sequence[str], str] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> PerftestResult:
    """One ucx_perftest measurement over `UCX_TLS=tls` on loopback (None: the transports UCX
    chooses itself); both processes always end.
    `apart` = (responder's prefix, initiator's prefix, responder's address) runs the two on
    different nodes (network namespaces; each prefix must exec, keeping the pid). `extra_env`
    adds variables for both sides (`UCX_PROTO_ENABLE`).

    The responder gets a free port and its output goes to a log in `workdir`; the initiator
    starts once the responder listens. A run that exceeds `timeout_s`, exits non-zero or prints
    no result raises PerftestError with the command and the processes' last lines.
    """
    perftest = perftest or find_perftest()
    variables = {**(extra_env or {}), **({} if tls is None else {"UCX_TLS": tls})}
    env = {**os.environ, **variables}
    last: PerftestError | None = None
    for _attempt in range(PORT_ATTEMPTS):
        port = free_port()
        there, here, address = apart or ((), (), "127.0.0.1")
        argv = [
            *here,
            *perftest_command(perftest, port, test, size, iterations, warmup, extra, address),
        ]
        shown = " ".join([*(f"{k}={v}" for k, v in variables.items()), *argv])
        log = workdir / f"perftest-responder-{port}.log"
        with open(log, "wb") as out:
            responder = subprocess.Popen(
                [*there, perftest, "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        initiator: subprocess.Popen[bytes] | None = None
        finished = False
        try:
            if not _wait_listening(responder, port, time.monotonic() + READY_TIMEOUT_S):
                last = PerftestError(
                    f"the ucx_perftest responder on port {port} did not start listening "
                    f"(exit status {responder.poll()}); its log:\n{tail(log, 5)}"
                )
                continue
            initiator = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            try:
                out_b, err_b = initiator.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired as e:
                raise PerftestError(
                    f"`{shown}` did not finish within {timeout_s:g} s; responder log:\n"
                    f"{tail(log, 5)}"
                ) from e
            stdout = out_b.decode(errors="replace")
            stderr = err_b.decode(errors="replace")
            if initiator.returncode != 0:
                raise PerftestError(
                    f"`{shown}` exited with status {initiator.returncode}: "
                    f"{(stderr or stdout).strip()[-600:]}"
                )
            finished = True
            return parse_perftest_output(stdout, shown)
        finally:
            if initiator is not None:
                stop_process(initiator, 2.0, group=True)
            # After a test the responder ends by itself (given a moment); otherwise it still
            # waits for an initiator and is stopped at once.
            stop_process(responder, 2.0, group=True, sig=None if finished else signal.SIGTERM)
            log.unlink(missing_ok=True)
    assert last is not None
    raise last
