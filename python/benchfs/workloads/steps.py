"""The error discipline every MPI workload shares: run a step on each rank, then agree.

A rank that fails must never leave the others waiting in a collective it skips, so after each
step the ranks exchange their outcomes (one allgather) and all take the same next step.

Ranks wait for each other without taking the CPU (`wait_for_all`): MPI libraries busy-poll in
a blocking collective (Open MPI's `opal_progress` with `sched_yield`), so the ranks that finish
a phase first would take the cores from the servers and from the ranks still working when they
share them. Measured on 2 cores with 16 servers and 128 ranks (the kernel's profile): the
ranks' polling held 74% of the CPU time, the servers got 13%, and the reads' last ranks
crawled at 1-20 MiB/s for a minute.
"""

from __future__ import annotations

import errno
import sys
import time
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


WAIT_FIRST_S = 0.0002
WAIT_MAX_S = 0.005
"""A waiting rank tests its barrier after sleeping 0.2 ms, doubling up to 5 ms: at most
200 wake-ups a second per rank, and a release at most 5 ms late before the blocking
barrier that lines the ranks up."""


def wait_for_all(comm: Any) -> None:
    """A barrier that sleeps while others are still working: a non-blocking barrier tested
    with a growing sleep, then a blocking one, so that every rank leaves at once (the ranks
    are then within one sleep of each other: its spin is that short)."""
    request = comm.Ibarrier()
    pause = WAIT_FIRST_S
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, WAIT_MAX_S)
    comm.Barrier()


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
    wait_for_all(comm)
    failures = [{"rank": r, **f} for r, f in enumerate(comm.allgather(error)) if f is not None]
    return error, failures
