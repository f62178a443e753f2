"""The application's own insights, from its Darshan log, in the vocabulary Drishti's users know.

Each check reads the log's POSIX counters (what Drishti reads) and the `[insights]` thresholds
(`app_*`, Drishti's defaults) and returns an `Insight` whose `drishti` names the Drishti codes it
answers to; a check fires where Drishti's would (tests/test_darshan.py runs Drishti on the same
logs). APP-007, which needs the servers' side, is `darshanjoin.slow_ops_by_server`.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from benchfs.analysis.insights import Insight
from benchfs.analysis.thresholds import Thresholds

__all__ = ["APP_CATALOG", "DRISHTI_CODES", "evaluate_app", "posix_frame"]

SIZE_BINS = (
    (100, "0_100"),
    (1 << 10, "100_1K"),
    (10 << 10, "1K_10K"),
    (100 << 10, "10K_100K"),
    (1 << 20, "100K_1M"),
    (4 << 20, "1M_4M"),
    (10 << 20, "4M_10M"),
    (100 << 20, "10M_100M"),
    (1 << 30, "100M_1G"),
)
"""Darshan's request-size bins by their upper edge (Darshan's 100/1K/... are powers of ten
below 1M and KiB-based names above: 1K = 1024 here as in darshan-posix-log-format.h)."""

DRISHTI_CODES: dict[str, tuple[str, ...]] = {
    "APP-001": ("P05", "P06"),
    "APP-002": ("P07", "P08"),
    "APP-003": ("P11", "P13"),
    "APP-004": ("P17",),
    "APP-005": ("P21", "P22"),
    "APP-006": ("P18", "P19"),
}
"""Which Drishti codes each insight answers to. Drishti's others are not insights here:
P01-P04 (the job mostly reads or writes), P09/P10 (redundant traffic), P12/P14 (sequential,
good news), S01 (STDIO) and M01-M10 (MPI-IO collective use and hints)."""

NO_POSIX = "no POSIX records in the log (the program made no POSIX file calls Darshan saw)"

AppCheck = Callable[[pd.DataFrame, Thresholds], Insight]


def posix_frame(records: tuple[dict[str, object], ...] | list[dict[str, object]]) -> pd.DataFrame:
    """The log's POSIX records (`DarshanLog.posix`) as one frame."""
    return pd.DataFrame(list(records))


def _new(ident: str, title: str, trigger: str, recommendation: str) -> Insight:
    return Insight(
        ident,
        title,
        "high",
        False,
        True,
        trigger,
        recommendation=recommendation,
        drishti=list(DRISHTI_CODES[ident]),
    )


def _skip(i: Insight, reason: str) -> Insight:
    i.evaluated, i.reason = False, reason
    return i


def _sum(df: pd.DataFrame, col: str) -> int:
    return int(df[col].sum()) if col in df.columns else 0


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1] or path


def small_requests(df: pd.DataFrame, th: Thresholds) -> Insight:
    edge = max((e for e, _ in SIZE_BINS if e <= th.app_small_bytes), default=100)
    i = _new(
        "APP-001",
        "Small requests",
        f"requests under {edge:,} bytes (insights.app_small_bytes, down to a Darshan bin) are "
        f"over {th.app_small_share:.0%} of the reads (or writes) and over "
        f"{th.app_small_count:,} of them",
        "Each request costs a round trip to a server whatever its size: gather small requests "
        "into larger ones (a buffer in the program, collective I/O, an I/O library's "
        "aggregation), or stage such files whole.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    for op, code in (("READ", "P05"), ("WRITE", "P06")):
        cols = [f"POSIX_SIZE_{op}_{name}" for e, name in SIZE_BINS if e <= edge]
        total = _sum(df, f"POSIX_{op}S")
        small = sum(_sum(df, c) for c in cols)
        i.data[op.lower()] = {"requests": total, "small": small}
        if total and small / total > th.app_small_share and small > th.app_small_count:
            i.fired = True
            per_file = df.assign(small=df[cols].sum(axis=1)).groupby("path")["small"].sum()
            top = per_file.sort_values(ascending=False).head(3)
            files = ", ".join(f"{_name(p)} ({int(n):,})" for p, n in top.items() if n)
            i.evidence.append(
                f"{small:,} of {total:,} {op.lower()}s ({small / total:.0%}) are under "
                f"{edge:,} bytes [{code}]; most in {files}"
            )
    return i


def misaligned(df: pd.DataFrame, th: Thresholds) -> Insight:
    i = _new(
        "APP-002",
        "Misaligned requests",
        f"requests not aligned in memory (or in the file) are over "
        f"{th.app_misaligned_share:.0%} of all",
        "A request that starts off a block boundary touches an extra block at each end: align "
        "offsets and sizes to the file system's block (Darshan's POSIX_FILE_ALIGNMENT) and "
        "buffers to the page.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    total = _sum(df, "POSIX_READS") + _sum(df, "POSIX_WRITES")
    if not total:
        return _skip(i, "no reads or writes in the log")
    for what, col, code in (
        ("memory", "POSIX_MEM_NOT_ALIGNED", "P07"),
        ("file", "POSIX_FILE_NOT_ALIGNED", "P08"),
    ):
        n = _sum(df, col)
        i.data[what] = n
        if n / total > th.app_misaligned_share:
            i.fired = True
            align = int(df["POSIX_FILE_ALIGNMENT"].max()) if what == "file" else 0
            at = f" (alignment {align:,} bytes)" if align else ""
            i.evidence.append(
                f"{n:,} of {total:,} requests ({n / total:.0%}) misaligned in {what}{at} [{code}]"
            )
    return i


def random_access(df: pd.DataFrame, th: Thresholds) -> Insight:
    i = _new(
        "APP-003",
        "Random access",
        f"random reads (or writes: neither consecutive nor at a higher offset than the last) "
        f"over {th.app_random_share:.0%} of them and over {th.app_random_count:,}",
        "Random requests defeat read-ahead and write-behind: sort requests by offset, or read "
        "the whole extent once and pick from memory.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    for op, code in (("READ", "P11"), ("WRITE", "P13")):
        total = _sum(df, f"POSIX_{op}S")
        # Darshan counts a consecutive request as sequential too.
        sequential = _sum(df, f"POSIX_SEQ_{op}S")
        rand = total - sequential
        i.data[op.lower()] = {"requests": total, "random": rand}
        if total and rand / total > th.app_random_share and rand > th.app_random_count:
            i.fired = True
            per_file = (df[f"POSIX_{op}S"] - df[f"POSIX_SEQ_{op}S"]).groupby(df["path"]).sum()
            worst = per_file.idxmax()
            i.evidence.append(
                f"{rand:,} of {total:,} {op.lower()}s ({rand / total:.0%}) random [{code}]; "
                f"most in {_name(worst)} ({int(per_file[worst]):,})"
            )
    return i


def metadata_time(df: pd.DataFrame, th: Thresholds) -> Insight:
    i = _new(
        "APP-004",
        "Metadata-heavy",
        f"a rank spends over {th.app_meta_time_s:g} s in one file's metadata calls (open, "
        "stat, seek, fsync, close)",
        "Open files once and keep them open, stat less (cache what a stat told), and fsync "
        "once when durability is needed; many small files are better packed into one.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    if "POSIX_F_META_TIME" not in df.columns:
        return _skip(i, "no POSIX records in the log")
    slow = df[df["POSIX_F_META_TIME"] > th.app_meta_time_s]
    i.data = {"meta_time_s": float(df["POSIX_F_META_TIME"].sum()), "records": len(slow)}
    if len(slow):
        i.fired = True
        ranks = sorted({int(r) for r in slow["rank"]})
        worst = slow.sort_values("POSIX_F_META_TIME").iloc[-1]
        i.evidence.append(
            f"{len(slow)} rank-file records over {th.app_meta_time_s:g} s (ranks "
            f"{', '.join(map(str, ranks[:8]))}); the worst {worst['POSIX_F_META_TIME']:.1f} s "
            f"in {_name(str(worst['path']))} [P17]"
        )
    return i


def rank_imbalance(df: pd.DataFrame, th: Thresholds) -> Insight:
    i = _new(
        "APP-005",
        "Imbalance across ranks",
        f"on a file several ranks open each on their own, the rank moving most bytes moves "
        f"over {th.app_size_imbalance:.0%} more than the rank moving least (of the most)",
        "Ranks that move unequal shares finish at unequal times and the job waits for the "
        "last: divide the data evenly, or give the heavy ranks fewer other duties.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    own = df[df["rank"] != -1] if "rank" in df.columns else df.iloc[0:0]
    if own.empty:
        return _skip(i, "no per-rank POSIX records in the log")
    agg = own.groupby("path").agg(
        w_max=("POSIX_BYTES_WRITTEN", "max"),
        w_min=("POSIX_BYTES_WRITTEN", "min"),
        r_max=("POSIX_BYTES_READ", "max"),
        r_min=("POSIX_BYTES_READ", "min"),
    )
    for op, hi, lo, code in (("write", "w_max", "w_min", "P21"), ("read", "r_max", "r_min", "P22")):
        share = (agg[hi] - agg[lo]) / agg[hi].where(agg[hi] > 0)
        hit = share[share > th.app_size_imbalance].sort_values(ascending=False)
        i.data[op] = len(hit)
        if len(hit):
            i.fired = True
            files = ", ".join(f"{_name(p)} ({s:.0%})" for p, s in hit.head(3).items())
            i.evidence.append(f"{len(hit)} files with {op} imbalance: {files} [{code}]")
    return i


def stragglers(df: pd.DataFrame, th: Thresholds) -> Insight:
    i = _new(
        "APP-006",
        "Stragglers on shared files",
        f"on a file every rank opened, the slowest rank's bytes (or time) less the fastest's "
        f"is over {th.app_straggler_share:.0%} of all its bytes (or I/O time)",
        "One rank held the others up on a shared file: check that rank's node (benchfs-diagnose) "
        "and spread the file's requests evenly over the ranks.",
    )
    if df.empty:
        return _skip(i, NO_POSIX)
    shared = df[df["rank"] == -1] if "rank" in df.columns else df.iloc[0:0]
    if shared.empty:
        return _skip(i, "no file every rank opened (Darshan reduces those to rank -1)")
    moved = shared["POSIX_BYTES_WRITTEN"] + shared["POSIX_BYTES_READ"]
    gap = (shared["POSIX_SLOWEST_RANK_BYTES"] - shared["POSIX_FASTEST_RANK_BYTES"]).abs()
    spent = shared["POSIX_F_WRITE_TIME"] + shared["POSIX_F_READ_TIME"] + shared["POSIX_F_META_TIME"]
    lag = (shared["POSIX_F_SLOWEST_RANK_TIME"] - shared["POSIX_F_FASTEST_RANK_TIME"]).abs()
    for what, num, den, code in (("bytes", gap, moved, "P18"), ("time", lag, spent, "P19")):
        share = num / den.where(den > 0)
        hit = shared.assign(share=share)[share > th.app_straggler_share]
        i.data[what] = len(hit)
        if len(hit):
            i.fired = True
            worst = hit.sort_values("share").iloc[-1]
            i.evidence.append(
                f"{len(hit)} shared files with a {what} straggler; the worst "
                f"{_name(str(worst['path']))} ({worst['share']:.0%}) [{code}]"
            )
    return i


APP_CATALOG: tuple[AppCheck, ...] = (
    small_requests,
    misaligned,
    random_access,
    metadata_time,
    rank_imbalance,
    stragglers,
)
"""Every application-side insight, in id order."""


def evaluate_app(posix: pd.DataFrame, thresholds: Thresholds) -> list[Insight]:
    """Every application-side insight's verdict on a log's POSIX records."""
    return [check(posix, thresholds) for check in APP_CATALOG]
