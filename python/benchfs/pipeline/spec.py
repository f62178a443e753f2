"""What a run is asked to do (RunSpec), what it reports back (RunReport), and where it reports
while it runs (ProgressSink)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchfs.errors import BenchfsError
from benchfs.results import Manifest, RunDir

WORKLOADS = ("rw", "ior", "mdtest", "io500", "command")
VIA = ("mount", "capi", "preload")


@dataclass
class RunSpec:
    """What the user asked for; None means "take it from the configuration" (or the nodes)."""

    servers: int | None = None
    clients: int | None = None
    file_size: int | None = None
    transfer_size: int | None = None
    repetitions: int | None = None
    config: str | None = None
    sets: Sequence[str] = ()
    keep_data: bool = False
    results_root: str | None = None
    timeout_s: float = 300.0
    kill_server_after_s: float | None = None
    kill_node: bool = False
    """With `kill_server_after_s`: every server of the last server's node, not only it."""
    workload: str = "rw"
    """"rw" (write, cross-read, verify), "ior", "mdtest" (benchfs.workloads.*) or "command"."""
    workload_args: str | None = None
    """Options of the ior or mdtest workload, one shell-quoted string; None: derived defaults."""
    command: str | None = None
    """The user-named command of workload "command" (shell-quoted; `{mount}` is replaced)."""
    via: str = "mount"
    """How the user command reaches BenchFS: "mount" (FUSE, per client node), "capi" (the C
    library) or "preload" (the interposition library, paths under `{mount}`)."""
    nodes_file: str | None = None
    exclude_from: str | None = None
    screen: bool = False
    screen_args: str | None = None
    launcher: str = "local"
    mpiexec: str | None = None
    server_nodes: int | None = None
    servers_per_node: int | None = None
    clients_per_node: int | None = None
    pin_cpus: bool = False
    darshan: str | None = None
    """Darshan's prefix: `command` runs with its libdarshan.so preloaded, DXT on, its logs in
    the results directory's darshan/."""
    analyze: bool = True
    serve: bool = False
    """`benchfs start`: bring the cluster up and leave it running (no workload, no teardown
    unless the start fails); `benchfs stop` ends it."""
    mount_point: str | None = None
    """With `serve`: mount BenchFS at this path on every client host."""
    screen_keeps_clients: bool = False
    """With `screen`: the nodes found slow run no server but keep their client ranks and
    mounts (a job's own allocation, where no node can be given back)."""
    mount_owner: tuple[int, int] | None = None
    """The (uid, gid) the mounts show as every file's owner and let in, when they are not
    the starting user's (root starting a job's burst buffer)."""

    def flag_overrides(self) -> list[str]:
        """Flags as config overrides: they are the highest layer of the one configuration."""
        pairs = {
            "run.servers": self.servers,
            "run.clients": self.clients,
            "run.file_size": self.file_size,
            "run.transfer_size": self.transfer_size,
            "run.repetitions": self.repetitions,
            "run.results_root": self.results_root,
        }
        return [f"{key}={value}" for key, value in pairs.items() if value is not None]


RUN_SUMMARY_SCHEMA_VERSION = 1
"""Version of `benchfs-run launch --json`'s object (benchfs/schemas/run-summary.schema.json)."""


@dataclass
class RunReport:
    """The result of a run, for the terminal and for --json."""

    run_dir: RunDir | None = None
    manifest: Manifest | None = None
    summary: dict[str, Any] | None = None
    error: BenchfsError | None = None
    config: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    launcher: str = "local"
    nodes: int = 0
    workload: str | None = None
    """The workload's kind (`rw`, `ior`, `mdtest`, `command`), known before it starts."""
    workload_line: str | None = None
    """What the workload runs, in words, once its command line is built."""

    @property
    def exit_code(self) -> int:
        return 0 if self.error is None else self.error.exit_code

    def to_json(self) -> dict[str, Any]:
        run = self.config.get("run", {})
        summary = self.summary or {}
        if self.error is None:
            outcome = "ok"
        else:
            outcome = "interrupted" if self.error.code == "EINTR" else "failed"
        excluded = [] if self.manifest is None else self.manifest.excluded
        return {
            "schema_version": RUN_SUMMARY_SCHEMA_VERSION,
            "outcome": outcome,
            "code": None if self.error is None else self.error.code,
            "message": None if self.error is None else self.error.message,
            "write_mib_s": summary.get("write_mib_s"),
            "read_mib_s": summary.get("read_mib_s"),
            "verified": bool(summary.get("verified")) and self.error is None,
            "verify_requested": summary.get("verify_requested", self.workload in ("rw", "mdtest")),
            "bytes": summary.get("bytes"),
            "workload": summary.get("workload", self.workload),
            "workload_line": self.workload_line,
            "rows": summary.get("rows"),
            "spread": summary.get("spread"),
            "launcher": self.launcher,
            "nodes": self.nodes,
            "excluded": [e["host"] for e in excluded],
            "servers": run.get("servers"),
            "clients": run.get("clients"),
            "file_size": run.get("file_size"),
            "transfer_size": run.get("transfer_size"),
            "elapsed_s": round(self.elapsed_s, 3),
            "results_dir": None if self.run_dir is None else str(self.run_dir.path),
            "telemetry_files": None
            if self.run_dir is None
            else len(self.run_dir.telemetry_files()),
        }


class ProgressSink:
    """Where the pipeline reports: phase changes, messages, and bytes moved (live display)."""

    def phase(self, name: str) -> None: ...

    def message(self, text: str) -> None: ...

    def moved(self, written: int, read: int) -> None: ...

    def expect(self, written: int, read: int) -> None:
        """The bytes the workload will write and read in all, when that is known before it
        starts (the default workload, the built-in IOR without arguments): a display can give
        the share done and the time left."""

    def totals(self, written: int, read: int) -> None:
        """The workload's own byte counts once it ended (the servers' telemetry, behind
        `moved`, lags by up to a snapshot)."""

    def close(self) -> None: ...


class MessageSink(ProgressSink):
    """A progress sink that passes messages to a function (the sweep's and tests' way)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit

    def message(self, text: str) -> None:
        self.emit(text)
