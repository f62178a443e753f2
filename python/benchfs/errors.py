"""The one error vocabulary of the BenchFS tools, and the exit statuses of every command.

Every failure a tool reports is a `BenchfsError`: an errno-like `code` (ENOENT, EINVAL, EIO,
ETIMEDOUT, ...) and a one-line `message` that names what failed and where; commands print it
as `<tool>: error CODE: message` and exit with its `exit_code`. The subclasses say which tool
raised it, so a caller may catch one tool's errors or all of them.
"""

from __future__ import annotations

import errno

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "AnalyzeError",
    "BenchError",
    "BenchfsError",
    "DiagnoseError",
    "InputError",
    "JobError",
    "LaunchError",
    "ParseError",
    "ProbeError",
    "RunError",
    "SubmitError",
    "errno_name",
]

EXIT_OK = 0
EXIT_FAILED = 1
"""The tool ran and what it did failed (a run, a benchmark, a screen)."""
EXIT_USAGE = 2
"""Bad input: options, files, configuration; nothing was started."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM, after tearing down what was started."""


class BenchfsError(Exception):
    """A tool failed: `code` is an errno-like name, `message` says what and where."""

    def __init__(self, code: str, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


class RunError(BenchfsError):
    """A run of the pipeline failed (benchfs-run)."""


class LaunchError(BenchfsError):
    """A launcher cannot work here: ENOENT (its program is missing) or EINVAL (e.g. srun
    outside an allocation). Found when the launcher is made, before anything starts: a usage
    error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, EXIT_USAGE)


class JobError(BenchfsError):
    """A started job could not be found, reached, staged or stopped (benchfs)."""


class SubmitError(BenchfsError):
    """A job could not be rendered or submitted (benchfs-run submit)."""


class DiagnoseError(BenchfsError):
    """A screen or a judgment failed (benchfs-diagnose)."""


class BenchError(BenchfsError):
    """A benchmark failed (benchfs-bench)."""


class AnalyzeError(BenchfsError):
    """A run could not be analysed (benchfs-analyze)."""


class ProbeError(BenchfsError):
    """An outside program (fio, ucx_perftest, ...) failed, or printed what its parser does not
    understand; the message names the program and its output."""


class ParseError(BenchfsError, ValueError):
    """A tool's output or a file is malformed or truncated; the message names the file (or
    the command). A ValueError too, as bad input."""

    def __init__(self, message: str, code: str = "EINVAL") -> None:
        super().__init__(code, message)


class InputError(BenchfsError, ValueError):
    """A file the user wrote (nodes file, sweep file, ...) is invalid; the message names the
    file and the key. Found before anything starts: a usage error."""

    def __init__(self, message: str) -> None:
        super().__init__("EINVAL", message, EXIT_USAGE)


def errno_name(e: OSError, default: str = "EIO") -> str:
    """The errno name of an OSError (`default` when it has none)."""
    return errno.errorcode.get(e.errno or 0, default)
