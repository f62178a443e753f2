"""IOR, fio and mdtest output as result rows.

Parsed formats (docs/submit.md, "Result parsers"):

- IOR's text output: the per-iteration table (`access bw(MiB/s) [IOPS Latency(s)] block(KiB)
  xfer(KiB) open(s) wr/rd(s) close(s) total(s) iter`) and the "Summary of all tests" table,
  both located by their header line and read by column name, so that the columns IOR added over
  time (IOPS, Latency, Stonewall) are found wherever they are. Layout from IOR's
  src/ior-output.c (PrintTableHeader, PrintReducedResult, PrintLongSummaryHeader,
  PrintLongSummaryOneOperation).
- IOR's JSON output (`-O summaryFormat=JSON`): `tests[].Results` (per iteration; an array per
  iteration, or a flat array) and `summary[]`.
- fio's JSON output (`--output-format=json`): every job and direction that moved bytes, through
  `benchfs.probes.fio.parse_fio_json`.
- mdtest's text output (4.x, and the built-in mdtest, which prints the same): the "SUMMARY rate"
  table as `RateRow`s (operations per second). Layout from hpc/ior 5fcf0ba995fd src/mdtest.c
  (mdtest_test_name, summarize_results: "   %-18s " then max, min, mean and std dev as
  "%14.3f").

Malformed or truncated input raises `ParseError` naming the source and what is missing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchfs.errors import ParseError
from benchfs.probes.fio import FioError, parse_fio_json
from benchfs.units import KIB, MIB

__all__ = [
    "MDTEST_OPERATIONS",
    "ParseError",
    "RateRow",
    "ResultRow",
    "parse_fio",
    "parse_ior",
    "parse_ior_json",
    "parse_ior_text",
    "parse_mdtest",
]

OPERATIONS = ("write", "read")


@dataclass(frozen=True)
class ResultRow:
    """One measured figure: one operation of one iteration, or a summary over iterations.

    `kind` is "iteration" or "summary"; for summary rows `bw_mib_s` is the mean over the
    iterations and `iteration` is None. Sizes are in bytes, times in seconds; a field the tool
    does not report is None.
    """

    tool: str
    operation: str
    kind: str
    bw_mib_s: float
    iops: float | None = None
    bytes: int | None = None
    transfer_size: int | None = None
    block_size: int | None = None
    segments: int | None = None
    tasks: int | None = None
    iteration: int | None = None
    test_id: int | None = None
    seconds: float | None = None
    latency_s: float | None = None
    bw_min_mib_s: float | None = None
    bw_max_mib_s: float | None = None
    bw_std_mib_s: float | None = None
    file_per_proc: bool | None = None
    api: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# IOR text.

_SUMMARY_TITLE = "Summary of all tests:"
_OPTION_RE = re.compile(r"^\s*([A-Za-z][A-Za-z /]*?)\s*[:=]\s*(.*?)\s*$")


def _float(token: str, source: str, line_no: int, column: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ParseError(
            f"{source}:{line_no}: column {column!r} is {token!r}, not a number"
        ) from None
    if not math.isfinite(value):
        raise ParseError(f"{source}:{line_no}: column {column!r} is {token!r}")
    return value


def _options(lines: Sequence[str]) -> dict[str, str]:
    """`key : value` lines of IOR's Options/Summary block (`tasks : 4`, `segments : 16`)."""
    out: dict[str, str] = {}
    for line in lines:
        match = _OPTION_RE.match(line)
        if match:
            out.setdefault(match.group(1).strip().lower(), match.group(2))
    return out


def _int_option(options: Mapping[str, str], *keys: str) -> int | None:
    for key in keys:
        value = options.get(key)
        if value is not None:
            match = re.match(r"^(\d+)", value)
            if match:
                return int(match.group(1))
    return None


def _header_columns(header: str) -> list[str]:
    """Column names of a table header; IOR's two StdDev columns become bw and ops StdDev."""
    names = header.split()
    seen = 0
    for i, name in enumerate(names):
        if name == "StdDev":
            names[i] = "StdDev(MiB)" if seen == 0 else "StdDev(OPs)"
            seen += 1
    return names


def _iteration_rows(lines: list[str], source: str) -> list[ResultRow]:
    rows: list[ResultRow] = []
    columns: list[str] | None = None
    block_start = 0
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(_SUMMARY_TITLE):
            columns = None  # the summary table is not per iteration
            continue
        if stripped.startswith("access") and "bw(MiB/s)" in stripped:
            columns = _header_columns(stripped)
            block_start = i
            for need in ("bw(MiB/s)", "block(KiB)", "xfer(KiB)", "iter"):
                if need not in columns:
                    raise ParseError(f"{source}:{i + 1}: results header lacks {need!r}")
            continue
        if columns is None:
            continue
        words = stripped.split()
        if not words or words[0] not in OPERATIONS:
            continue
        if len(words) != len(columns):
            raise ParseError(
                f"{source}:{i + 1}: {words[0]} line has {len(words)} columns, the header "
                f"{len(columns)} (truncated output?)"
            )
        value = dict(zip(columns, words, strict=True))
        options = _options(lines[:block_start])

        def num(col: str, i: int = i, value: dict[str, str] = value) -> float:
            return _float(value[col], source, i + 1, col)

        def opt(col: str, value: dict[str, str] = value) -> float | None:
            if col not in value or value[col] == "-":
                return None
            return num(col)

        block = round(num("block(KiB)") * KIB)
        tasks = _int_option(options, "tasks", "clients")
        segments = _int_option(options, "segments")
        moved = block * segments * tasks if tasks and segments else None
        rows.append(
            ResultRow(
                tool="ior",
                operation=words[0],
                kind="iteration",
                bw_mib_s=num("bw(MiB/s)"),
                iops=opt("IOPS"),
                bytes=moved,
                transfer_size=round(num("xfer(KiB)") * KIB),
                block_size=block,
                segments=segments,
                tasks=tasks,
                iteration=int(num("iter")),
                seconds=opt("total(s)"),
                latency_s=opt("Latency(s)"),
                file_per_proc=_access_fpp(options.get("access")),
                api=options.get("api"),
            )
        )
    return rows


def _access_fpp(access: str | None) -> bool | None:
    if access is None:
        return None
    return access.startswith("file-per-process")


_SUMMARY_NEEDS = ("Operation", "Max(MiB)", "Min(MiB)", "Mean(MiB)", "Mean(s)", "#Tasks")


def _summary_rows(lines: list[str], source: str) -> list[ResultRow]:
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(_SUMMARY_TITLE)]
    if not starts:
        raise ParseError(
            f"{source}: no {_SUMMARY_TITLE!r} table: the IOR output is truncated, or IOR "
            "failed before it finished"
        )
    start = starts[-1]
    # The header follows the title on the same line (IOR prints no newline after it) or the next.
    rest = lines[start].strip()[len(_SUMMARY_TITLE) :].strip()
    header_at = start
    if not rest:
        header_at = start + 1
        while header_at < len(lines) and not lines[header_at].strip():
            header_at += 1
        rest = lines[header_at].strip() if header_at < len(lines) else ""
    columns = _header_columns(rest)
    missing = [c for c in _SUMMARY_NEEDS if c not in columns]
    if missing:
        raise ParseError(
            f"{source}:{header_at + 1}: summary header lacks {', '.join(map(repr, missing))}"
        )
    rows = []
    for i in range(header_at + 1, len(lines)):
        words = lines[i].split()
        if not words:
            if rows:
                break
            continue
        if words[0] not in OPERATIONS:
            break
        if len(words) != len(columns):
            raise ParseError(
                f"{source}:{i + 1}: summary {words[0]} line has {len(words)} columns, the "
                f"header {len(columns)} (truncated output?): {lines[i].strip()[:300]!r}"
            )
        value = dict(zip(columns, words, strict=True))

        def num(col: str, i: int = i, value: dict[str, str] = value) -> float:
            return _float(value[col], source, i + 1, col)

        def maybe(col: str, value: dict[str, str] = value) -> float | None:
            return num(col) if col in value and value[col] != "NA" else None

        def whole(col: str, value: dict[str, str] = value) -> int | None:
            return int(num(col)) if col in value else None

        aggregate = maybe("aggs(MiB)")
        fpp = whole("fPP")
        rows.append(
            ResultRow(
                tool="ior",
                operation=words[0],
                kind="summary",
                bw_mib_s=num("Mean(MiB)"),
                iops=maybe("Mean(OPs)"),
                bytes=None if aggregate is None else round(aggregate * MIB),
                transfer_size=whole("xsize"),
                block_size=whole("blksiz"),
                segments=whole("segcnt"),
                tasks=whole("#Tasks"),
                test_id=whole("Test#"),
                seconds=num("Mean(s)"),
                bw_min_mib_s=num("Min(MiB)"),
                bw_max_mib_s=num("Max(MiB)"),
                bw_std_mib_s=maybe("StdDev(MiB)"),
                file_per_proc=None if fpp is None else bool(fpp),
                api=value.get("API"),
            )
        )
    if not rows:
        raise ParseError(f"{source}:{header_at + 1}: the summary table has no write or read row")
    return rows


def parse_ior_text(text: str, source: str) -> list[ResultRow]:
    """Rows of IOR's text output: every per-iteration line, then the summary table's rows."""
    lines = text.splitlines()
    if not any(line.startswith("IOR-") or "bw(MiB/s)" in line for line in lines) and not any(
        _SUMMARY_TITLE in line for line in lines
    ):
        raise ParseError(f"{source}: not IOR output (no IOR banner, results or summary table)")
    iterations = _iteration_rows(lines, source)
    return iterations + _summary_rows(lines, source)


# IOR JSON.


def _json_number(obj: Mapping[str, Any], key: str, where: str, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParseError(f"{where}.{key} is missing or not a number: {value!r}")
    return value


def _json_doc(text: str, source: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{source}: no JSON object in the output: {text[:120]!r}")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise ParseError(f"{source}: malformed or truncated JSON: {e}") from None
    if not isinstance(doc, Mapping):
        raise ParseError(f"{source}: expected a JSON object")
    return doc


def parse_ior_json(text: str, source: str) -> list[ResultRow]:
    """Rows of IOR's JSON output: every `tests[].Results` entry, then `summary[]`."""
    doc = _json_doc(text, source)
    tests = doc.get("tests")
    summary = doc.get("summary")
    if not isinstance(tests, list) or not isinstance(summary, list):
        raise ParseError(
            f"{source}: IOR JSON needs a 'tests' and a 'summary' list (truncated output, or "
            "not IOR's -O summaryFormat=JSON?)"
        )
    rows: list[ResultRow] = []
    for t, test in enumerate(tests):
        where = f"{source}: tests[{t}]"
        if not isinstance(test, Mapping):
            raise ParseError(f"{where} is not an object")
        params = test.get("Parameters") if isinstance(test.get("Parameters"), Mapping) else {}
        options = test.get("Options") if isinstance(test.get("Options"), Mapping) else {}
        results = test.get("Results")
        if not isinstance(results, list):
            raise ParseError(f"{where}.Results is missing or not a list")
        # One array per iteration (IOR 3.3+), or one flat list in which each access repeats.
        if all(isinstance(r, list) for r in results):
            entries = [(it, r) for it, group in enumerate(results) for r in group]
        else:
            counts: dict[str, int] = {}
            entries = []
            for r in results:
                access = r.get("access") if isinstance(r, Mapping) else None
                entries.append((counts.get(str(access), 0), r))
                counts[str(access)] = counts.get(str(access), 0) + 1
        tasks = options.get("tasks", params.get("numTasks"))
        segments = params.get("segmentCount", options.get("segments"))
        for n, (iteration, r) in enumerate(entries):
            rwhere = f"{where}.Results[{n}]"
            if not isinstance(r, Mapping):
                raise ParseError(f"{rwhere} is not an object")
            access = r.get("access")
            if access not in OPERATIONS:
                continue  # "remove" timings carry no bandwidth
            block = round(_json_number(r, "blockKiB", rwhere) * KIB)
            task_n = tasks if isinstance(tasks, int) else None
            seg_n = segments if isinstance(segments, int) else None
            rows.append(
                ResultRow(
                    tool="ior",
                    operation=access,
                    kind="iteration",
                    bw_mib_s=float(_json_number(r, "bwMiB", rwhere)),
                    iops=_json_number(r, "iops", rwhere, required=False),
                    bytes=block * task_n * seg_n if task_n and seg_n else None,
                    transfer_size=round(_json_number(r, "xferKiB", rwhere) * KIB),
                    block_size=block,
                    segments=seg_n,
                    tasks=task_n,
                    iteration=iteration,
                    test_id=test.get("TestID") if isinstance(test.get("TestID"), int) else t,
                    seconds=_json_number(r, "totalTime", rwhere, required=False),
                    latency_s=_json_number(r, "latency", rwhere, required=False),
                    file_per_proc=None
                    if params.get("filePerProc") is None
                    else bool(params.get("filePerProc")),
                    api=params.get("api") if isinstance(params.get("api"), str) else None,
                )
            )
    if not summary:
        raise ParseError(f"{source}: IOR JSON 'summary' is empty (did IOR finish?)")
    for s, entry in enumerate(summary):
        where = f"{source}: summary[{s}]"
        if not isinstance(entry, Mapping):
            raise ParseError(f"{where} is not an object")
        op = entry.get("operation")
        if op not in OPERATIONS:
            raise ParseError(f"{where}.operation is {op!r}, not write or read")
        xsize = _json_number(entry, "xsizeMiB", where, required=False)
        fpp = entry.get("filePerProc")
        rows.append(
            ResultRow(
                tool="ior",
                operation=op,
                kind="summary",
                bw_mib_s=float(_json_number(entry, "bwMeanMIB", where)),
                iops=_json_number(entry, "OPsMean", where, required=False),
                bytes=None if xsize is None else round(xsize * MIB),
                transfer_size=_json_number(entry, "transferSize", where),
                block_size=_json_number(entry, "blockSize", where),
                segments=_json_number(entry, "segmentCount", where),
                tasks=_json_number(entry, "numTasks", where),
                test_id=_json_number(entry, "TestID", where, required=False),
                seconds=_json_number(entry, "MeanTime", where, required=False),
                bw_min_mib_s=_json_number(entry, "bwMinMIB", where, required=False),
                bw_max_mib_s=_json_number(entry, "bwMaxMIB", where, required=False),
                bw_std_mib_s=_json_number(entry, "bwStdMIB", where, required=False),
                file_per_proc=None if fpp is None else bool(fpp),
                api=entry.get("API") if isinstance(entry.get("API"), str) else None,
            )
        )
    return rows


def parse_ior(text: str, source: str) -> list[ResultRow]:
    """IOR output in either format: JSON when it starts with `{`, else text."""
    if text.lstrip().startswith("{"):
        return parse_ior_json(text, source)
    return parse_ior_text(text, source)


# fio JSON.


def _fio_size(value: Any) -> int | None:
    """fio's `bs` option as bytes ("4k", "1m", "65536"); None when absent or a range."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    match = re.match(r"^(\d+)([kmgt]?)i?b?$", value.strip().lower())
    if match is None:
        return None
    return int(match.group(1)) << (10 * " kmgt".index(match.group(2) or " "))


def parse_fio(text: str, source: str) -> list[ResultRow]:
    """One row per fio job and direction that moved bytes (`kind` "iteration",
    `iteration` the job's index), from `fio --output-format=json`."""
    doc = _json_doc(text, source)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ParseError(f"{source}: fio JSON has no jobs")
    global_options = doc.get("global options")
    global_options = global_options if isinstance(global_options, Mapping) else {}
    rows = []
    for j, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            raise ParseError(f"{source}: jobs[{j}] is not an object")
        options = job.get("job options")
        options = {**global_options, **(options if isinstance(options, Mapping) else {})}
        one = json.dumps({"fio version": doc.get("fio version"), "jobs": [job]})
        for op in OPERATIONS:
            section = job.get(op)
            if not isinstance(section, Mapping) or not section.get("io_bytes"):
                continue
            try:
                result = parse_fio_json(one, f"{source} jobs[{j}]", op)
            except FioError as e:
                raise ParseError(e.message) from None
            iops = section.get("iops")
            numjobs = options.get("numjobs")
            rows.append(
                ResultRow(
                    tool="fio",
                    operation=op,
                    kind="iteration",
                    bw_mib_s=result.mib_s,
                    iops=float(iops) if isinstance(iops, int | float) else None,
                    bytes=result.bytes,
                    transfer_size=_fio_size(options.get("bs")),
                    block_size=_fio_size(options.get("size")),
                    tasks=int(numjobs) if str(numjobs or "").isdigit() else 1,
                    iteration=j,
                    seconds=result.seconds,
                    latency_s=result.p50_us / 1e6,
                    api=str(options.get("ioengine")) if options.get("ioengine") else None,
                )
            )
    if not rows:
        raise ParseError(f"{source}: no fio job moved any bytes")
    return rows


# mdtest text.

# mdtest's operation names (src/mdtest.c, mdtest_test_name) by the key rows use.
MDTEST_OPERATIONS = {
    "dir_create": "Directory creation",
    "dir_stat": "Directory stat",
    "dir_read": "Directory read",
    "dir_remove": "Directory removal",
    "dir_rename": "Directory rename",
    "create": "File creation",
    "stat": "File stat",
    "read": "File read",
    "remove": "File removal",
    "tree_create": "Tree creation",
    "tree_remove": "Tree removal",
}
_MDTEST_KEYS = {label: key for key, label in MDTEST_OPERATIONS.items()}
_MDTEST_TITLE = re.compile(r"^SUMMARY rate(?: \(in ops/sec\))?: \(of (\d+) iterations?\)")
_NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"
_MDTEST_ROW = re.compile(rf"^\s+(\S.*?)\s*:?\s+{_NUMBER}\s+{_NUMBER}\s+{_NUMBER}\s+{_NUMBER}\s*$")


@dataclass(frozen=True)
class RateRow:
    """One metadata rate: mdtest's summary of one operation over its iterations, in
    operations per second (`ops_s` the mean, as mdtest's "Mean" column)."""

    tool: str
    operation: str
    kind: str
    ops_s: float
    ops_max_s: float
    ops_min_s: float
    ops_std_s: float
    iterations: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_mdtest(text: str, source: str) -> list[RateRow]:
    """The "SUMMARY rate" table of mdtest's text output (every one, if several)."""
    rows: list[RateRow] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        title = _MDTEST_TITLE.match(lines[i].strip())
        i += 1
        if title is None:
            continue
        iterations = int(title[1])
        # The header and its dashes, then one line per operation until a blank or "--" line.
        while i < len(lines) and not lines[i].strip().startswith("---"):
            i += 1
        i += 1
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("--"):
            m = _MDTEST_ROW.match(lines[i])
            if m is None:
                raise ParseError(f"{source} line {i + 1}: not an mdtest rate row: {lines[i]!r}")
            label, values = m[1], [float(v) for v in m.groups()[1:]]
            if label not in _MDTEST_KEYS:
                raise ParseError(f"{source} line {i + 1}: unknown mdtest operation {label!r}")
            rows.append(
                RateRow(
                    tool="mdtest",
                    operation=_MDTEST_KEYS[label],
                    kind="summary",
                    ops_s=values[2],
                    ops_max_s=values[0],
                    ops_min_s=values[1],
                    ops_std_s=values[3],
                    iterations=iterations,
                )
            )
            i += 1
    if not rows:
        raise ParseError(f'{source}: no mdtest "SUMMARY rate" table')
    return rows
