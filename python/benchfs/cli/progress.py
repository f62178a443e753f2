"""How `benchfs-run` shows a run while it happens: a live rich display on a terminal, plain
lines otherwise (logs, CI, batch jobs), nothing with --json."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from benchfs.pipeline import ProgressSink
from benchfs.units import MIB, format_size

__all__ = ["LiveProgress", "PlainProgress", "make_progress"]

PLAIN_EVERY_S = 10.0
"""Plain output prints bytes and bandwidth at most this often (phase changes at once)."""


class _Rates:
    """Bytes moved so far, the bandwidth since the previous sample, and, when the totals are
    known, the share done and the time left."""

    def __init__(self) -> None:
        self.written = 0
        self.read = 0
        self.write_mib_s = 0.0
        self.read_mib_s = 0.0
        self._last: tuple[float, int, int] | None = None
        self.window_s = 0.0
        """Seconds the bandwidths were measured over (since the previous sample)."""
        self.expected: tuple[int, int] | None = None
        self._began: float | None = None

    def expect(self, written: int, read: int) -> None:
        self.expected = (written, read)
        self._began = time.monotonic()

    def done(self) -> float | None:
        """The share of the expected bytes moved (0 to 1), or None when not known."""
        if not self.expected or sum(self.expected) == 0:
            return None
        return min(1.0, (self.written + self.read) / sum(self.expected))

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far (None until something moved)."""
        done = self.done()
        if done is None or done <= 0 or self._began is None:
            return None
        return (time.monotonic() - self._began) * (1 - done) / done

    def of(self, moved: int, index: int) -> str:
        """`moved` as people read it, with the total when known: "529MiB of 1GiB"."""
        total = f" of {format_size(self.expected[index])}" if self.expected else ""
        return format_size(moved) + total

    def share(self) -> str:
        done, eta = self.done(), self.eta_s()
        if done is None:
            return ""
        return f"{done:.0%} done" + ("" if eta is None else f", about {eta:.0f} s left")

    def update(self, written: int, read: int) -> None:
        now = time.monotonic()
        if self._last is not None:
            t, w, r = self._last
            dt = now - t
            if dt > 0:
                self.write_mib_s = max(0, written - w) / dt / MIB
                self.read_mib_s = max(0, read - r) / dt / MIB
                self.window_s = dt
        self._last = (now, written, read)
        self.written, self.read = written, read


class PlainProgress(ProgressSink):
    """One line per message and phase, and a bytes/bandwidth line every PLAIN_EVERY_S."""

    def __init__(self, console: Console, tool: str = "benchfs-run") -> None:
        self.console = console
        self.tool = tool
        self.start = time.monotonic()
        self.current = "setup"
        self.rates = _Rates()
        self._next_line = 0.0

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self.start
        self.console.print(
            f"[dim]{self.tool} {elapsed:6.1f}s:[/] {escape(text)}", highlight=False, soft_wrap=True
        )

    def phase(self, name: str) -> None:
        if name != self.current:
            self.current = name
            self._line(f"phase {name}")

    def message(self, text: str) -> None:
        self._line(text)

    def moved(self, written: int, read: int) -> None:
        changed = (written, read) != (self.rates.written, self.rates.read)
        self.rates.update(written, read)
        now = time.monotonic()
        if changed and now >= self._next_line:
            self._next_line = now + PLAIN_EVERY_S
            r = self.rates
            # The current bandwidth, named as such: the summary's is each phase's average.
            share = f" ({r.share()})" if r.share() else ""
            self._line(
                f"{self.current}: written {r.of(r.written, 0)}, read {r.of(r.read, 1)}{share}; "
                f"now {r.write_mib_s:.0f} MiB/s writing, {r.read_mib_s:.0f} MiB/s reading "
                f"(last {r.window_s:.1f} s)"
            )

    def expect(self, written: int, read: int) -> None:
        self.rates.expect(written, read)

    def totals(self, written: int, read: int) -> None:
        self.rates.written, self.rates.read = written, read
        self._line(f"workload moved {format_size(written)} written, {format_size(read)} read")


class LiveProgress(ProgressSink):
    """A live panel (phase, elapsed time, bytes moved, current bandwidth) under the messages."""

    def __init__(self, console: Console, tool: str = "benchfs-run") -> None:
        self.console = console
        self.tool = tool
        self.start = time.monotonic()
        self.current = "setup"
        self.rates = _Rates()
        self.live = Live(
            self._render(),
            console=console,
            transient=True,
            auto_refresh=True,
            refresh_per_second=4,
            get_renderable=self._render,
        )
        self.live.start()

    def _render(self) -> Group:
        r = self.rates
        table = Table.grid(padding=(0, 2))
        table.add_row(
            Text("phase", style="bold"),
            Text(self.current, style="cyan"),
            Text("elapsed", style="bold"),
            Text(f"{time.monotonic() - self.start:.1f} s"),
        )
        table.add_row(
            Text("written", style="bold"),
            Text(f"{r.of(r.written, 0)}  {r.write_mib_s:8.1f} MiB/s"),
            Text("read", style="bold"),
            Text(f"{r.of(r.read, 1)}  {r.read_mib_s:8.1f} MiB/s"),
        )
        if r.share():
            table.add_row(Text("progress", style="bold"), Text(r.share()), Text(""), Text(""))
        return Group(table)

    def phase(self, name: str) -> None:
        self.current = name

    def message(self, text: str) -> None:
        self.live.console.print(f"[dim]{self.tool}:[/] {escape(text)}", highlight=False)

    def moved(self, written: int, read: int) -> None:
        self.rates.update(written, read)

    def expect(self, written: int, read: int) -> None:
        self.rates.expect(written, read)

    def totals(self, written: int, read: int) -> None:
        self.rates.written, self.rates.read = written, read

    def close(self) -> None:
        self.live.stop()


def make_progress(as_json: bool, console: Console, tool: str = "benchfs-run") -> ProgressSink:
    """Live on a terminal, plain lines elsewhere, silent for --json; lines start with `tool`."""
    if as_json:
        return ProgressSink()
    if console.is_terminal:
        return LiveProgress(console, tool)
    return PlainProgress(console, tool)
