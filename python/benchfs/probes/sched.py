"""On-CPU and off-CPU time per program, by reason, from the scheduler's tracepoints.

Without CONFIG_SCHEDSTATS the `sched_stat_*` tracepoints are missing; `sched_switch` (with the
state the task leaves in) and `sched_wakeup` give the same split with bpftrace:

- on CPU: from being switched in to being switched out;
- runnable, not running: preempted (left in state R) until switched in again, or woken until
  switched in (the run queue's wait: too many runnable tasks per core);
- off CPU by the state it slept in, until woken: `S` sleeping (waiting for an event: a
  socket, a futex, the event loop with nothing to do), `D` uninterruptible (waiting for I/O,
  in most cases the disk), `I` idle kernel threads, other states.

Totals per task name (`comm`: the program's name, inherited by unnamed threads, so a server's
threads add up under `benchfsd`) over the whole capture, printed at its end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchfs.errors import ParseError
from benchfs.probes import bpftrace

__all__ = ["PROGRAM", "REASONS", "Capture", "SchedTime", "parse_capture", "read_capture"]

PROGRAM = """\
tracepoint:sched:sched_switch {
  if (args->prev_pid != 0) {
    $t = @in_t[args->prev_pid];
    if ($t) { @cpu[args->prev_comm] = sum(nsecs - $t); delete(@in_t[args->prev_pid]); }
    @off_t[args->prev_pid] = nsecs;
    @off_s[args->prev_pid] = args->prev_state;
  }
  if (args->next_pid != 0) {
    $w = @wake_t[args->next_pid];
    $o = @off_t[args->next_pid];
    if ($w) { @runq[args->next_comm] = sum(nsecs - $w); delete(@wake_t[args->next_pid]); }
    else { if ($o) { @runq[args->next_comm] = sum(nsecs - $o); } }
    delete(@off_t[args->next_pid]);
    delete(@off_s[args->next_pid]);
    @in_t[args->next_pid] = nsecs;
  }
}
tracepoint:sched:sched_wakeup {
  $o = @off_t[args->pid];
  if ($o) {
    @slept[args->comm, @off_s[args->pid]] = sum(nsecs - $o);
    delete(@off_t[args->pid]);
    delete(@off_s[args->pid]);
    @wake_t[args->pid] = nsecs;
  }
}
END {
  print(@cpu); print(@runq); print(@slept);
  clear(@cpu); clear(@runq); clear(@slept);
  clear(@in_t); clear(@off_t); clear(@off_s); clear(@wake_t);
}
"""
REASONS = ("on CPU", "runnable", "sleeping", "waiting for I/O", "idle", "other")
"""The columns of a task name's time, in this order."""
_STATES = {0: "runnable", 1: "sleeping", 2: "waiting for I/O", 128: "idle"}
"""The state a task was switched out in (the tracepoint's prev_state) to its reason: R
(preempted), S, D, I."""


class Capture(bpftrace.Capture):
    """The scheduler tracer into a file until `stop`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, PROGRAM)


@dataclass(frozen=True)
class SchedTime:
    """Seconds per reason for one task name."""

    comm: str
    seconds: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def read_capture(path: str | os.PathLike[str]) -> tuple[list[SchedTime], dict[str, Any]]:
    """Per task name, its seconds by reason (REASONS), most time on CPU first; and the
    tracer's cost. ParseError names the file on a malformed record."""
    return parse_capture(bpftrace.read_lines(path), str(path))


def parse_capture(lines: Sequence[str], p: str) -> tuple[list[SchedTime], dict[str, Any]]:
    """`read_capture` of lines read from `p`."""
    per: dict[str, dict[str, float]] = {}
    extra: dict[str, Any] = {}

    def add(comm: str, reason: str, ns: Any) -> None:
        row = per.setdefault(comm, dict.fromkeys(REASONS, 0.0))
        row[reason] += int(ns) / 1e9

    for number, kind, data in bpftrace.records(lines, p):
        try:
            if kind == bpftrace.COST:
                extra[bpftrace.COST] = data
            if kind != "map":
                continue
            for name, values in data.items():
                for key, ns in values.items():
                    if name == "@cpu":
                        add(key, "on CPU", ns)
                    elif name == "@runq":
                        add(key, "runnable", ns)
                    elif name == "@slept":
                        comm, state = key.rsplit(",", 1)
                        add(comm, _STATES.get(int(state), "other"), ns)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ParseError(f"{p}:{number}: not a scheduler tracer record ({e})") from e
    rows = [SchedTime(comm, seconds) for comm, seconds in per.items()]
    rows.sort(key=lambda r: -r.seconds["on CPU"])
    return rows, extra
