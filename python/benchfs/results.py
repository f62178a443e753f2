"""The results directory: the one place that defines its layout (see docs/results.md).

Every run writes one directory, and analysis reads only that directory, so everything a reader
needs to interpret the numbers (versions, command line, nodes, exclusions, effective config,
timings, membership, outcome) is recorded here, written atomically so that a crash never
leaves a half-written manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "ANALYSIS_DIR",
    "CSV_FLOAT_FORMAT",
    "EXCLUDED_JSON",
    "EXCLUDED_TXT",
    "MANIFEST_SCHEMA_VERSION",
    "TELEMETRY_DIR",
    "TELEMETRY_PATTERN",
    "TRACE_PATTERN",
    "Manifest",
    "RunDir",
    "ScreenDir",
    "create_run_dir",
    "create_screen_dir",
    "csv_cell",
    "read_json",
    "utc_now",
    "write_json_atomic",
    "write_text_atomic",
]

MANIFEST_SCHEMA_VERSION = 2
"""Bumped whenever a manifest field changes meaning or disappears."""

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.toml"
SERVERS_DIR = "servers"
WORKLOAD_DIR = "workload"
REGISTRY_DIR = "registry"
TELEMETRY_DIR = "telemetry"
TELEMETRY_PATTERN = "*.tel"
"""Telemetry files in TELEMETRY_DIR: `<source>-<id>-w<worker>[.<n>].tel`, named by the writer
in rust/benchfs-core/src/telemetry/snapshot.rs (format: docs/telemetry.md)."""
TRACE_PATTERN = "*.trace"
"""Per-operation trace files in TELEMETRY_DIR: `server-<id>-w<worker>[.<n>].trace`, beside
the worker's snapshots (format: docs/telemetry.md, "Per-operation traces")."""
ANALYSIS_DIR = "analysis"
"""What `benchfs-analyze --save` writes: report.html, report.json, tables/<name>.csv."""
IOSTAT_DIR = "iostat"
KERNEL_DIR = "kernel"
NETWORK_DIR = "network"
DIAGNOSE_DIR = "diagnose"
EXCLUDED_JSON = "excluded.json"
EXCLUDED_TXT = "excluded.txt"
"""The one node-exclusion shape: a JSON list of {"host", "reasons"} and one host per line."""


def utc_now() -> str:
    """Current UTC time in ISO 8601 with a Z suffix (what the manifest records)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class RunDir:
    """Paths inside one results directory; nothing else should spell these names."""

    path: Path

    @property
    def run_id(self) -> str:
        """The directory name, `<UTC timestamp>-<mode>-<short id>`."""
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    @property
    def config_path(self) -> Path:
        """The effective configuration (TOML) that every process of the run was given."""
        return self.path / CONFIG_NAME

    @property
    def nodes_path(self) -> Path:
        """The nodes the run used (a nodes file, after exclusions and screening)."""
        return self.path / "nodes.toml"

    @property
    def servers_dir(self) -> Path:
        return self.path / SERVERS_DIR

    @property
    def workload_dir(self) -> Path:
        return self.path / WORKLOAD_DIR

    @property
    def registry_dir(self) -> Path:
        """The per-job registry where servers publish their addresses (mode 0700)."""
        return self.path / REGISTRY_DIR

    @property
    def telemetry_dir(self) -> Path:
        """Where every server writes its telemetry snapshots (config `telemetry.dir`)."""
        return self.path / TELEMETRY_DIR

    def telemetry_files(self) -> list[Path]:
        """The telemetry files of the run, sorted by name."""
        return sorted(self.telemetry_dir.glob(TELEMETRY_PATTERN))

    def trace_files(self) -> list[Path]:
        """The per-operation trace files of the run, sorted by name (none unless tracing)."""
        return sorted(self.telemetry_dir.glob(TRACE_PATTERN))

    @property
    def analysis_dir(self) -> Path:
        """Where `benchfs-analyze --save` puts its report and tables."""
        return self.path / ANALYSIS_DIR

    @property
    def analysis_tables_dir(self) -> Path:
        """The CSV export of every analysis table (`analysis/tables/<name>.csv`)."""
        return self.analysis_dir / "tables"

    def server_log(self, server_id: int) -> Path:
        return self.servers_dir / f"server-{server_id}.log"

    def rank_result(self, rank: int) -> Path:
        return self.workload_dir / f"rank-{rank}.json"

    @property
    def workload_summary(self) -> Path:
        return self.workload_dir / "summary.json"

    @property
    def workload_log(self) -> Path:
        """stdout and stderr of the workload launcher (mpiexec) and its ranks."""
        return self.workload_dir / "output.log"

    @property
    def iostat_dir(self) -> Path:
        """iostat captured on every node during the run (`benchfs.probes.iostat.capture`)."""
        return self.path / IOSTAT_DIR

    def iostat_capture(self, node: str) -> Path:
        """One node's capture: the output of `iostat -x -y -t -o JSON` (text if no JSON)."""
        return self.iostat_dir / f"{node}.json"

    @property
    def network_dir(self) -> Path:
        """Every node's TCP counters before and after the run (`benchfs.probes.netstat`)."""
        return self.path / NETWORK_DIR

    def network_capture(self, node: str) -> Path:
        """One node's: `{"node", "host", "netns", "before", "after", "delta"}`."""
        return self.network_dir / f"{node}.json"

    @property
    def kernel_dir(self) -> Path:
        """The kernel's view of every host during the run (`benchfs-diagnose trace`)."""
        return self.path / KERNEL_DIR

    def kernel_capture(self, host: str) -> Path:
        """One host's trace (`benchfs.probes.kerneltrace`, JSON lines)."""
        return self.kernel_dir / f"{host}.jsonl"

    @property
    def diagnose_dir(self) -> Path:
        """Diagnose output of the run: the pre-run screen it used, the in-run judgment."""
        return self.path / DIAGNOSE_DIR

    @property
    def prerun_screen(self) -> Path:
        """A copy of the pre-run screen's `screen.json`, if the run was screened."""
        return self.diagnose_dir / "screen.json"

    @property
    def judge_json(self) -> Path:
        """`benchfs-diagnose judge`: the in-run judgment (JSON)."""
        return self.diagnose_dir / "judge.json"

    @property
    def judge_csv(self) -> Path:
        """`benchfs-diagnose judge`: one row per node."""
        return self.diagnose_dir / "judge.csv"


@dataclass(frozen=True)
class ScreenDir:
    """Paths inside one screen's results directory (`benchfs-diagnose screen`)."""

    path: Path

    @property
    def screen_csv(self) -> Path:
        """One row per node: metrics, flags, verdict."""
        return self.path / "screen.csv"

    @property
    def screen_json(self) -> Path:
        """{"nodes": [{"host", "name", "metrics", "flags", "verdict", ...}], "excluded": [...]}"""
        return self.path / "screen.json"

    @property
    def excluded_json(self) -> Path:
        return self.path / EXCLUDED_JSON

    @property
    def excluded_txt(self) -> Path:
        return self.path / EXCLUDED_TXT

    @property
    def nodes_path(self) -> Path:
        """The nodes file that was screened (a copy)."""
        return self.path / "nodes.toml"

    @property
    def config_path(self) -> Path:
        """The effective configuration (thresholds included)."""
        return self.path / CONFIG_NAME

    @property
    def raw_dir(self) -> Path:
        return self.path / "raw"

    def raw(self, node: str, probe: str) -> Path:
        """Raw output of one probe on one node, e.g. raw/n1/fio-seqread.json."""
        return self.raw_dir / node / probe

    @property
    def network_dir(self) -> Path:
        """Raw output of the network probe (per pair: server and client logs, answers)."""
        return self.raw_dir / "network"


def create_run_dir(root: str | os.PathLike[str], mode: str, now: datetime | None = None) -> RunDir:
    """Create `root/<UTC timestamp>-<mode>-<short id>/` with its subdirectories.

    The timestamp sorts runs in time; the random short id keeps two runs started in the same
    second apart.
    """
    run_dir = RunDir(_new_dir(root, mode, now))
    run_dir.servers_dir.mkdir()
    run_dir.workload_dir.mkdir()
    run_dir.telemetry_dir.mkdir()
    run_dir.registry_dir.mkdir(mode=0o700)
    return run_dir


def _new_dir(root: str | os.PathLike[str], mode: str, now: datetime | None) -> Path:
    """Create `root/<UTC timestamp>-<mode>-<short id>/` and return its absolute path."""
    if not mode or not mode.replace("-", "").isalnum():
        raise ValueError(f"invalid run mode {mode!r}: use letters, digits and '-'")
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    root_path = Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    while True:
        path = root_path / f"{stamp}-{mode}-{secrets.token_hex(3)}"
        try:
            path.mkdir()
            return path.resolve()
        except FileExistsError:
            continue


def create_screen_dir(root: str | os.PathLike[str], now: datetime | None = None) -> ScreenDir:
    """Create `root/<UTC timestamp>-screen-<short id>/` with its `raw/` directory."""
    screen = ScreenDir(_new_dir(root, "screen", now))
    screen.raw_dir.mkdir()
    return screen


@dataclass
class Manifest:
    """Contents of manifest.json: everything needed to interpret a run without its author.

    `versions`: BenchFS, UCX, MPI, kernel, fio, sysstat, Python (None where absent).
    `commands`: [{"what", "argv"}], the pipeline's own command line first. `nodes`: the nodes
    used, with the servers and ranks each ran. `excluded` has the one node-exclusion shape
    ({"host": str, "reasons": [str]}, plus the node's name). `config`: the effective
    configuration (also config.toml), `config_hash` its SHA-256. `processes`: every process the
    run started, with its exit status. `outcome` is {"status": "running"|"ok"|"failed"|
    "interrupted", "code": errno-like name or None, "message": str or None, "exit_code": int or
    None}.
    """

    mode: str
    commands: list[dict[str, Any]]
    versions: dict[str, Any]
    hostname: str = field(default_factory=socket.gethostname)
    started: str = field(default_factory=utc_now)
    finished: str | None = None
    launcher: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[dict[str, Any]] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    membership: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    workload: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    scratch_dirs: dict[str, str] = field(default_factory=dict)
    """Node name -> the job's node-local directory (deleted at the end unless data_kept)."""
    data_kept: bool = False
    analysis: dict[str, Any] | None = None
    outcome: dict[str, Any] = field(
        default_factory=lambda: {
            "status": "running",
            "code": None,
            "message": None,
            "exit_code": None,
        }
    )
    schema_version: int = MANIFEST_SCHEMA_VERSION

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the wall time of a phase in `timings_s`, even when it fails."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings_s[name] = round(time.monotonic() - start, 6)

    def event(self, kind: str, message: str, **details: Any) -> None:
        """Record something notable that happened during the run (e.g. a server died)."""
        self.events.append({"time": utc_now(), "kind": kind, "message": message, **details})

    def finish(self, status: str, code: str | None, message: str | None, exit_code: int) -> None:
        self.finished = utc_now()
        self.outcome = {"status": status, "code": code, "message": message, "exit_code": exit_code}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, run_dir: RunDir) -> None:
        """Write manifest.json atomically (readers see the old or the new one, never a mix)."""
        write_json_atomic(run_dir.manifest_path, self.to_dict())


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write through a temporary file in the same directory and rename it into place."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


CSV_FLOAT_FORMAT = "%.6g"
"""Floats in every CSV BenchFS writes: 6 significant digits (no 0.30000000000000004)."""


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: None empty, floats in CSV_FLOAT_FORMAT, the rest as it is."""
    if value is None:
        return ""
    if isinstance(value, float):
        return CSV_FLOAT_FORMAT % value
    return value


def read_versioned(path: str | os.PathLike[str], fmt: str, version: int) -> dict[str, Any]:
    """The fields of a JSON file written as {"format": fmt, "version": version, ...};
    ValueError when it is another file, or another version of it."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.pop("format", None) != fmt or data.pop("version", None) != version:
        raise ValueError(f"not a {fmt} file of version {version}")
    return data


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file of a results directory; ValueError names the file if it is malformed."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: malformed JSON: {e}") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a JSON file (byte {e.start} is not UTF-8)") from e
