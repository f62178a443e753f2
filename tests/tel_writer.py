"""Telemetry and trace files with planted answers (a slow node, a bimodal distribution, an
imbalance, client retries), written by the core's own writers through
`benchfs._core.SyntheticTelemetry` and `benchfs._core.write_trace`: the analysis tests read
exactly what a run writes, and the format is written in one place (docs/telemetry.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from benchfs import _core

TraceRecord = tuple[int, str, int, int, int, int, int, int, int, int, bool]


class TelWriter:
    """One telemetry file at `path` (named as a run names it: `<source>-<id>-w<worker>.tel`):
    set counters and histograms, then `snapshot()` appends their current values."""

    def __init__(
        self,
        path: Path,
        source: str = "server",
        ident: int = 0,
        node: str = "node-0",
        worker: int = 0,
        targets: Sequence[int] = (),
    ) -> None:
        self._file = _core.SyntheticTelemetry(
            path.parent, source, ident, worker, node, list(targets) if source == "client" else None
        )
        assert self._file.path == path, f"the writer names it {self._file.path}, not {path}"
        self.path = path

    def add(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        self._file.add(name, int(value), op, target)

    def set(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        self._file.set(name, int(value), op, target)

    def record(
        self,
        name: str,
        values: Iterable[int] | np.ndarray,
        op: str | None = None,
        target: int | None = None,
    ) -> None:
        self._file.record(name, np.asarray(list(values), dtype=np.uint64).tolist(), op, target)

    def snapshot(self, t_ns: int) -> None:
        self._file.snapshot(t_ns)


def trace_record(
    t_ns: int,
    op: str,
    total_ns: int,
    *,
    server: int = 0,
    worker: int = 0,
    queue_ns: int = 0,
    device_ns: int | None = None,
    file_id: int = 1,
    chunk: int = 0,
    nbytes: int = 4096,
    error: bool = False,
) -> TraceRecord:
    """One traced operation (device time: the total less the queue wait unless given)."""
    device = total_ns - queue_ns if device_ns is None else device_ns
    return (t_ns, op, total_ns, queue_ns, device, file_id, chunk, nbytes, server, worker, error)


def write_trace(
    directory: Path,
    server: int,
    records: Sequence[TraceRecord],
    worker: int = 0,
    node: str = "node-0",
) -> Path:
    """`server-<server>-w<worker>.trace` in `directory` holding `records`."""
    return Path(_core.write_trace(directory, server, worker, node, list(records)))
