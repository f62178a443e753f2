"""The rich consoles every command prints with.

On a terminal, rich fits output to the terminal's width. Off one (a pipe, a file, a Slurm
log) rich would assume 80 columns and cut table cells to `10…`; there a console is as wide as
its longest line needs, up to `OFF_TERMINAL_WIDTH`, so no value is ever cut.
"""

from __future__ import annotations

from rich.console import Console

__all__ = ["OFF_TERMINAL_WIDTH", "console"]

#: Columns assumed off a terminal: wider than any table the tools print (tables are not
#: expanded, so they stay as narrow as their content).
OFF_TERMINAL_WIDTH = 1000


def console(stderr: bool = False) -> Console:
    """stdout's (or stderr's) console: the terminal's width, or full width off a terminal."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=OFF_TERMINAL_WIDTH)
