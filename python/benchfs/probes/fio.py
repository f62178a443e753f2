"""Running fio as the reference for the storage cases, and reading its JSON output.

The parser looks results up by key name and copes with the fio versions in use: bandwidth in
`bw_bytes` (B/s) or only `bw` (KiB/s), completion latency in `clat_ns`, `clat_us` or `clat` (µs),
percentile keys spelled "50.000000" or "50.00". Output that is not fio's JSON raises FioError
naming where it came from (the command or the file).
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchfs.errors import ProbeError
from benchfs.units import MIB

__all__ = ["FioError", "FioResult", "find_fio", "fio_command", "parse_fio_json", "run_fio"]

FIO_RW = {"seqwrite": "write", "seqread": "read", "randread": "randread"}
"""fio's `rw=` for each storage pattern."""

# Latency sections, preferred first, with the factor that turns their unit into µs. Total
# latency (`lat_ns`, submission included, written with --lat_percentiles=1) is what the engine
# measures per operation; completion latency (`clat*`) is the fallback for older fio output.
_CLAT_KEYS = (("lat_ns", 1e-3), ("clat_ns", 1e-3), ("clat_us", 1.0), ("clat", 1.0))


class FioError(ProbeError):
    """fio failed, or its output is not the JSON this parser understands."""

    def __init__(self, message: str) -> None:
        super().__init__("EIO", message)


@dataclass(frozen=True)
class FioResult:
    """One fio job's figures for one direction."""

    mib_s: float
    p50_us: float
    p99_us: float
    bytes: int
    seconds: float
    ops: int
    version: str | None = None


def find_fio() -> str:
    found = shutil.which("fio")
    if found is None:
        raise ProbeError("ENOENT", "fio not found on PATH: install fio (apt-get install fio)")
    return found


def fio_command(
    fio: str,
    filename: str,
    pattern: str,
    block_size: int,
    queue_depth: int,
    size: int,
    direct: bool,
    name: str = "benchfs-bench",
) -> list[str]:
    """One job, io_uring, `queue_depth` in flight, `size` bytes over a file of `size` bytes.

    Random reads pick offsets independently (`norandommap`), as the engine does.
    """
    if pattern not in FIO_RW:
        raise ValueError(f"unknown pattern {pattern!r} (expected one of {', '.join(FIO_RW)})")
    argv = [
        fio,
        "--output-format=json",
        "--lat_percentiles=1",
        f"--name={name}",
        f"--filename={filename}",
        f"--rw={FIO_RW[pattern]}",
        f"--bs={block_size}",
        f"--size={size}",
        f"--io_size={size}",
        f"--iodepth={queue_depth}",
        "--ioengine=io_uring",
        f"--direct={int(direct)}",
        "--numjobs=1",
        "--group_reporting=1",
    ]
    if pattern == "randread":
        argv += ["--norandommap=1", "--randrepeat=0"]
    return argv


def _loads(text: str, source: str) -> Any:
    """JSON from fio's stdout, skipping any warning lines fio printed before it."""
    start = text.find("{")
    while start > 0 and text[start - 1] != "\n":
        start = text.find("{", start + 1)
    if start < 0:
        raise FioError(f"{source}: no JSON object in fio's output: {text[:200]!r}")
    try:
        value, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise FioError(
            f"{source}: malformed fio JSON output ({e}); it begins {text[start : start + 200]!r}"
        ) from e
    return value


def _number(section: Mapping[str, Any], key: str, source: str, where: str) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FioError(f"{source}: fio JSON {where}.{key} is missing or not a number: {value!r}")
    return float(value)


def _percentiles(section: Mapping[str, Any], source: str, where: str) -> tuple[float, float]:
    """p50 and p99 latency in µs: total latency when fio wrote its percentiles, else
    completion latency."""
    for key, to_us in _CLAT_KEYS:
        clat = section.get(key)
        if not isinstance(clat, Mapping):
            continue
        table = clat.get("percentile")
        if key == "lat_ns" and not isinstance(table, Mapping):
            continue
        if not isinstance(table, Mapping):
            raise FioError(
                f"{source}: fio JSON {where}.{key} has no percentile table "
                "(were clat_percentiles turned off?)"
            )
        found: dict[float, float] = {}
        for name, value in table.items():
            try:
                found[round(float(name), 6)] = float(value) * to_us
            except (TypeError, ValueError):
                continue
        missing = [p for p in (50.0, 99.0) if p not in found]
        if missing:
            raise FioError(
                f"{source}: fio JSON {where}.{key}.percentile lacks "
                + " and ".join(f"{p:g}%" for p in missing)
            )
        return found[50.0], found[99.0]
    raise FioError(
        f"{source}: fio JSON {where} has no completion latency "
        f"({', '.join(k for k, _ in _CLAT_KEYS)})"
    )


def parse_fio_json(text: str, source: str, direction: str | None = None) -> FioResult:
    """Parse `fio --output-format=json` output of one job (or one reporting group).

    `direction` is "read" or "write"; by default the one that moved bytes. `source` names the
    command or file the text came from, for error messages.
    """
    doc = _loads(text, source)
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    if not isinstance(jobs, list) or not jobs or not isinstance(jobs[0], Mapping):
        raise FioError(f"{source}: fio JSON has no jobs")
    job = jobs[0]
    if job.get("error"):
        raise FioError(f"{source}: fio job {job.get('jobname')!r} failed with error {job['error']}")
    directions = [direction] if direction else ["read", "write"]
    for name in directions:
        section = job.get(name)
        if not isinstance(section, Mapping):
            raise FioError(f"{source}: fio JSON jobs[0] has no {name!r} section")
        where = f"jobs[0].{name}"
        # io_bytes is in bytes where io_kbytes or bw_bytes exist (fio >= 3), in KiB before.
        modern = "io_kbytes" in section or "bw_bytes" in section
        moved = _number(section, "io_bytes", source, where) * (1 if modern else 1024)
        if moved <= 0 and direction is None:
            continue
        if "bw_bytes" in section:
            bw = _number(section, "bw_bytes", source, where)
        else:
            bw = _number(section, "bw", source, where) * 1024
        runtime_ms = _number(section, "runtime", source, where)
        p50, p99 = _percentiles(section, source, where)
        ops = section.get("total_ios")
        return FioResult(
            mib_s=bw / MIB,
            p50_us=p50,
            p99_us=p99,
            bytes=int(moved),
            seconds=runtime_ms / 1000,
            ops=int(ops) if isinstance(ops, int) else 0,
            version=doc.get("fio version"),
        )
    raise FioError(f"{source}: fio moved no bytes in either direction")


def run_fio(
    argv: Sequence[str],
    direction: str,
    timeout_s: float = 3600,
    env: Mapping[str, str] | None = None,
) -> FioResult:
    """Run one fio command (in `env`, else this environment) and parse its JSON; FioError
    names the command on any failure."""
    command = shlex.join(argv)
    try:
        out = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as e:
        raise FioError(f"`{command}` did not finish within {timeout_s:.0f} s") from e
    except OSError as e:
        raise FioError(f"cannot run `{command}`: {e}") from e
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip()[-800:]
        raise FioError(f"`{command}` exited with status {out.returncode}: {detail}")
    return parse_fio_json(out.stdout, f"`{command}`", direction)
