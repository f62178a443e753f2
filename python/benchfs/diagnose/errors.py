"""Errors of benchfs-diagnose."""

from __future__ import annotations

__all__ = ["DiagnoseError", "ParseError"]


class DiagnoseError(Exception):
    """A screen or judgment failed: `code` is an errno-like name, `message` says what and where."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ParseError(ValueError):
    """A probe's output is malformed or truncated; the message names the file (or command)."""
