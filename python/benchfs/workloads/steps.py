"""The error discipline every MPI workload shares: run a step on each rank, then agree.

A rank that fails must never leave the others waiting in a collective it skips, so after each
step the ranks exchange their outcomes (one allgather) and all take the same next step.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any

from benchfs.errors import BenchfsError, InputError


class UsageError(InputError):
    """Options the workload (like IOR or mdtest) would reject: reported before MPI starts,
    exit status 2."""


class WorkloadError(BenchfsError):
    """A failure whose message is complete on its own (data that does not verify, a short
    file): reported without the exception type in front."""

    def __init__(self, message: str) -> None:
        super().__init__("EIO", message)


class VerificationError(WorkloadError):
    """Bytes read back, or a size, differ from what was written."""


def describe_failure(phase: str, e: BaseException) -> dict[str, Any]:
    """A JSON-ready record of why `phase` failed on this rank."""
    code = getattr(e, "errno", None)
    return {
        "phase": phase,
        "type": type(e).__name__,
        "errno": errno.errorcode.get(code) if isinstance(code, int) else None,
        "message": str(e) if isinstance(e, WorkloadError) else f"{type(e).__name__}: {e}",
    }


def agreed_step(
    comm: Any, workload: str, phase: str, action: Callable[[], None]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Runs `action` on this rank, then exchanges outcomes with every rank.

    Returns this rank's failure (None if it succeeded) and every rank's failures, each with
    its "rank"; the second is the same on all ranks, so they all take the same next step.
    """
    error = None
    try:
        action()
    except Exception as e:  # every failure is reported, whatever its type
        error = describe_failure(phase, e)
        print(
            f"benchfs {workload}: rank {comm.Get_rank()}: {phase} failed: {error['message']}",
            file=sys.stderr,
            flush=True,
        )
    failures = [{"rank": r, **f} for r, f in enumerate(comm.allgather(error)) if f is not None]
    return error, failures
