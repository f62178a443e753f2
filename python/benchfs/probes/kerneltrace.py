"""What the kernel tells about one host during a run, in one file: block I/O latency per device
per second (`blocklat`), time on and off CPU per program by reason (`sched`), and on-CPU stacks
per process (`perf`, folded).

`HostTrace` starts the three tracers on the host it runs on (one per host, whatever the number
of servers and ranks there), `stop` stops them and `write` streams everything as JSON lines, so
the file can come back through a launcher's standard output from a remote host
(`benchfs-diagnose trace`). Each line is `{"source": S, ...}`: `block` and `sched` carry a
bpftrace record (`record`), `perf` a folded stack (`folded`) or its cost (`tracer`), `host` the
host's name and CPU count, or a `note`: a tracer that could not run, in one line
("kernel tracing unavailable: ..."), everything else going on without it.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from benchfs.errors import ParseError
from benchfs.probes import blocklat, bpftrace, perf, sched

__all__ = ["READY", "HostTrace", "HostTraceData", "parse_host_trace", "read_host_trace"]

READY = "ready"
"""The key of the line saying the tracers are attached."""


class HostTrace:
    """The block, scheduler and perf tracers of this host, their files in `work`."""

    def __init__(self, work: str | os.PathLike[str], profile: bool = True) -> None:
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.notes: list[str] = []
        self.block: blocklat.Capture | None = None
        self.sched: sched.Capture | None = None
        self.perf: perf.Recording | None = None
        why = blocklat.unavailable()
        if why is None:
            self.block = blocklat.Capture(self.work / "block.json")
            self.sched = sched.Capture(self.work / "sched.json")
            for tracer in (self.block, self.sched):
                try:
                    tracer.wait_attached()
                except ParseError as e:
                    self.notes.append(f"kernel tracing unavailable: {e}")
            if self.notes:
                self.stop()
                self.block = self.sched = None
        else:
            self.notes.append(why)
        if profile:
            why = perf.unavailable()
            if why is None:
                self.perf = perf.Recording(self.work / "perf.data")
            else:
                self.notes.append(why)

    def announce(self, out: TextIO) -> None:
        """The `ready` line (the tracers are attached), after a line per tracer that could not
        run: what a run waits for before its workload starts."""
        for note in self.notes:
            out.write(json.dumps({"source": "host", "note": note}) + "\n")
        out.write(json.dumps({"source": "host", READY: True}) + "\n")
        out.flush()
        self.notes.clear()

    def stop(self) -> None:
        for tracer in (self.block, self.sched, self.perf):
            if tracer is not None:
                tracer.stop()

    def write(self, out: TextIO) -> None:
        """Everything captured, as JSON lines (after `stop`); the perf data is folded here and
        removed."""

        def line(doc: dict[str, Any]) -> None:
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")

        line({"source": "host", "host": socket.gethostname(), "cpus": os.cpu_count() or 1})
        for source, tracer in (("block", self.block), ("sched", self.sched)):
            if tracer is None:
                continue
            for raw in tracer.path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue  # a line cut off when the tracer was killed
                line({"source": source, "record": record})
        out.flush()  # kept even if folding the profile outlasts the caller's patience
        if self.perf is not None:
            try:
                folded = self.perf.fold()
            except ParseError as e:
                self.notes.append(f"CPU profiles failed: {e}")
                folded = ""
            for stack in folded.splitlines():
                line({"source": "perf", "folded": stack})
            cost = {"cpu_s": self.perf.cpu_s, "wall_s": self.perf.wall_s}
            line({"source": "perf", "tracer": cost})
            self.perf.data.unlink(missing_ok=True)
        for note in self.notes:
            line({"source": "host", "note": note})
        out.flush()


@dataclass
class HostTraceData:
    """One host's trace, read back."""

    host: str = ""
    cpus: int = 1
    block: list[blocklat.Sample] = field(default_factory=list)
    sched: list[sched.SchedTime] = field(default_factory=list)
    profiles: dict[int, perf.Folded] = field(default_factory=dict)
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per tracer (block, sched, perf), its cost (CPU and wall seconds)."""
    notes: list[str] = field(default_factory=list)


def parse_host_trace(lines: Sequence[str], where: str) -> HostTraceData:
    """A host trace from its lines (a line that is not one, such as a tracer's error message,
    becomes a note naming `where` and the line); ParseError when a tracer's record is
    malformed."""
    data = HostTraceData()
    per: dict[str, list[str]] = {"block": [], "sched": []}
    folded: list[str] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
            source = doc["source"]
        except (ValueError, KeyError, TypeError):
            # The tracer's own messages share the file (a launcher's output): kept as notes.
            data.notes.append(f"{where}:{number}: {raw.strip()[:300]}")
            continue
        if source in per and "record" in doc:
            per[source].append(json.dumps(doc["record"]))
        elif source == "perf" and "folded" in doc:
            folded.append(str(doc["folded"]))
        elif source == "perf" and "tracer" in doc:
            data.costs["perf"] = doc["tracer"]
        elif source == "host" and "note" in doc:
            data.notes.append(str(doc["note"]))
        elif source == "host" and "host" in doc:
            data.host = str(doc.get("host", ""))
            data.cpus = int(doc.get("cpus", 1))
    data.block, extra = blocklat.parse_capture(per["block"], where)
    if "tracer" in extra:
        data.costs["block"] = extra["tracer"]
    data.sched, extra = sched.parse_capture(per["sched"], where)
    if "tracer" in extra:
        data.costs["sched"] = extra["tracer"]
    data.profiles = perf.parse_folded(folded)
    return data


def read_host_trace(path: str | os.PathLike[str]) -> HostTraceData:
    return parse_host_trace(bpftrace.read_lines(path), str(path))
