"""Type stubs for the native module `benchfs._core` (Rust, PyO3).

Private: import the public names from `benchfs` instead. Every blocking call releases the GIL.
"""

import os
from pathlib import Path
from types import TracebackType
from typing import Any, final

from typing_extensions import Buffer  # collections.abc has it from Python 3.12

__all__ = [
    "JOB_SECRET_FILE",
    "Client",
    "File",
    "PlacementStudy",
    "Server",
    "SyntheticTelemetry",
    "__version__",
    "bench_storage",
    "bench_telemetry",
    "bench_transfers",
    "config_with_overrides",
    "flame_graph_svg",
    "fold_perf_script",
    "ior_phase",
    "metadata_server",
    "parse_size",
    "resolve_config",
    "wait_for_servers",
    "write_trace",
]

__version__: str
JOB_SECRET_FILE: str
"""Name of the per-job secret file in the registry directory (mode 0600)."""

def resolve_config(
    path: str | None = None, overrides: list[str] | None = None, environment: bool = True
) -> str:
    """Return the effective configuration as TOML text.

    Precedence: built-in defaults < file (`path`, else `$BENCHFS_CONFIG`) < `BENCHFS_*` variables
    < `overrides` ("section.key=value"; the value is parsed as TOML, else taken as a string;
    size keys also take "4M"). `environment=False` reads neither the variables nor
    `$BENCHFS_CONFIG`. Raises FileNotFoundError for a missing file and ValueError naming the
    key, the value and its source for unknown keys, wrong types, negative numbers, bad sizes,
    names outside an enum, or malformed TOML.
    """

def config_with_overrides(effective: str, overrides: list[str]) -> str:
    """An effective configuration's text with `overrides` applied (no environment)."""

def metadata_server(path: str, servers: int, workers: int) -> int:
    """The index of the server keeping `path`'s metadata in a cluster of that shape."""

def parse_size(text: str) -> int:
    """Bytes of "64M", "1MiB", "4096" or "2g" (every suffix binary); ValueError says why not."""

def fold_perf_script(script: bytes) -> str:
    """`perf script` output (without the period field) folded into stacks, one line each:
    `comm-pid;outer;...;leaf COUNT`, kernel frames marked `_[k]`; ValueError if unreadable."""

def flame_graph_svg(folded: str, title: str, subtitle: str | None = None) -> str:
    """A flame graph (SVG text) of folded stacks (`outer;...;leaf COUNT` per line), colored by
    function name; ValueError when there is nothing to draw."""

def wait_for_servers(registry_dir: str, expected: int, timeout_s: float) -> list[dict]:
    """Wait until `expected` servers have registered; return them sorted by numeric id.

    Each entry is {"id": int, "node": str, "host": str, "domain": str, "pid": int}. Raises
    TimeoutError naming the expected, found and missing ids, and ValueError naming a malformed
    registry file.
    """

def bench_storage(
    data_dir: str,
    pattern: str,
    block_size: int,
    queue_depth: int,
    total_bytes: int,
    chunk_size: int,
    direct_write: bool,
    direct_read: bool,
    layout: str = "chunkfile",
    dataset_bytes: int | None = None,
    submit_timer_us: int = 0,
) -> dict[str, float]:
    """Run the storage engine alone (no network) at `queue_depth`; `pattern` is "seqwrite",
    "seqread" or "randread". `submit_timer_us` > 0 holds each submission until that long
    after the previous one (timer-gated designs; servers never wait). Returns bytes, seconds,
    mib_s, ops, p50_us, p99_us, mean_inflight, share_depth1 and mean_batch."""

def bench_telemetry(
    data_dir: str,
    telemetry_dir: str,
    rounds: int,
    ops_per_block: int,
    block_size: int = 4096,
    queue_depth: int = 16,
    dataset_bytes: int = 64 << 20,
    chunk_size: int = 1 << 20,
    interval_ms: int = 100,
    trace_records: int = 65536,
) -> dict[str, Any]:
    """Run the server's storage path without the network with telemetry off, snapshots and
    traces, alternating in blocks of `ops_per_block` random reads for `rounds` rounds. Returns
    seconds and, per mode ("off", "snapshots", "trace"), a dict of cpu_ns_per_op (one per
    block), ops, snapshots, trace_records, trace_dropped."""

def bench_transfers(
    registry_dir: str,
    config: str,
    paths: list[str],
    file_size: int,
    transfer_size: int,
    direction: str,
    fsync: bool = False,
    random: bool = False,
) -> dict[str, float]:
    """Time the native client moving `file_size` bytes per path in `transfer_size` transfers,
    one thread and client per path; `direction` is "write" (create, write, optional fsync,
    close) or "read"; `random` makes each transfer-sized block once in a shuffled order.
    Returns bytes, seconds and mib_s."""

def ior_phase(
    file: File,
    direction: str,
    segments: int,
    block_size: int,
    transfer_size: int,
    tasks: int,
    file_per_proc: bool,
    data_rank: int,
    verify: bool = False,
    stonewall_s: float = 0.0,
    max_ops: int | None = None,
    fsync: bool = False,
    first_op: int = 0,
) -> dict[str, Any]:
    """One rank's phase of the built-in IOR workload on an open file, the loop in Rust:
    `direction` "write" (stamp each transfer with the pattern) or "read" (compare with it when
    `verify`), at IOR's segment-major offsets for rank `data_rank` of `tasks`. Stops starting
    transfers after `stonewall_s` (0: never) or before transfer `max_ops`, starting at transfer
    `first_op` (the wear-out after a stonewall); `fsync` after writing. Returns bytes,
    ops, seconds, stonewalled, lat_mean_s, lat_min_s, lat_p50_s, lat_p99_s, lat_max_s, fsync_s,
    mismatched_words and first_mismatch (None, or offset, expected, found, message). ValueError
    for a bad geometry (block not a multiple of the transfer, transfer not a multiple of 8)."""

@final
class Server:
    """A chunk server on its own thread in this process (the same code as `benchfsd`)."""

    def __new__(
        cls,
        registry_dir: str,
        data_dir: str,
        server_id: int,
        config: str | None = None,
        node: str | None = None,
    ) -> Server: ...
    @property
    def server_id(self) -> int: ...
    def stop(self) -> None:
        """Stop serving and remove the registry entry; calling it again does nothing."""
    def __enter__(self) -> Server: ...
    def __exit__(
        self,
        _exc_type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
        /,
    ) -> None: ...

@final
class Client:
    """A BenchFS client. Threads may share one (they take turns); use one per thread for
    parallel I/O."""

    def __new__(
        cls, registry_dir: str, config: str | None = None, expected_servers: int | None = None
    ) -> Client:
        """Wait for the expected membership (TimeoutError names the missing); servers are
        connected on first use (all at once with cluster.connect_at_start)."""
    def open(self, path: str, flags: int = 0, mode: int = 0o644) -> File:
        """Open `path`, symbolic links followed; flags take os.O_CREAT, os.O_EXCL, os.O_TRUNC
        and os.O_NOFOLLOW (access bits are ignored). OSError with errno ENOENT, EEXIST, EISDIR,
        ENOTDIR, ELOOP, ENAMETOOLONG or EINVAL on failure."""
    def stat(self, path: str) -> dict[str, int | str]:
        """Links followed: kind ("file"/"dir"), size, mode, id (hex), mtime_ns, ctime_ns,
        chunk_size, stripe_count, stripe_start, replicas, inline (bool: the file's bytes are
        kept with its name, `layout.inline_max`)."""
    def lstat(self, path: str) -> dict[str, int | str]:
        """As stat, a symbolic link's own (kind "symlink", size: its target's length)."""
    def symlink(self, target: str, path: str) -> None:
        """Make a symbolic link at `path` to `target` (kept as given)."""
    def realpath(self, path: str) -> str:
        """`path` with every symbolic link in it resolved."""
    def readlink(self, path: str) -> str:
        """The target of the symbolic link at `path` (EINVAL if it is not one)."""
    def unlink(self, path: str) -> None:
        """Remove a file and free its chunks on every server holding them."""
    def mkdir(self, path: str, mode: int = 0o755) -> None: ...
    def rmdir(self, path: str) -> None:
        """ENOTEMPTY when the directory has entries."""
    def readdir(self, path: str) -> list[tuple[str, str]]:
        """(name, kind) pairs in name order; one metadata owner answers."""
    def find(
        self,
        root: str,
        name: str = "",
        kind: str | None = None,
        size_min: int = 0,
        size_max: int = ...,
        newer_ns: int = 0,
        count_only: bool = False,
    ) -> tuple[int, int, list[tuple[str, str, int, int]]]:
        """A find run on the servers: (examined, matched, [(path, kind, size, mtime_ns)])."""
    def rename(self, src: str, dst: str) -> None:
        """Data does not move. Non-empty directories: EXDEV (see docs/namespace.md)."""
    def truncate(self, path: str, size: int) -> None:
        """Shrinking frees the chunks beyond `size`."""
    def set_attr(self, path: str, mode: int | None = None, mtime_ns: int | None = None) -> None:
        """Set the permission bits and/or the modification time (ns since the epoch)."""
    def set_link_time(self, path: str, mtime_ns: int) -> None:
        """Set the modification time of the symbolic link at `path` itself."""
    def locate(self, path: str, offset: int) -> int:
        """The id of the server that holds byte `offset` of the file at `path`."""
    def time_stats(self, path: str, count: int, seconds: float) -> list[int]:
        """Times `count` stats of `path` one by one in Rust (no interpreter between them), for
        at most `seconds`: each call's nanoseconds."""
    def server_stats(self) -> list[dict[str, int]]:
        """Per server: id, requests, retries, timeouts, failures (as this client saw them)."""
    def checksum(self, path: str) -> dict[str, Any]:
        """{"size", "chunk_size", "chunks"}: the xxh3-128 (32 hex digits) of each
        chunk-aligned range of the file, as its servers read it back."""
    def put_files(
        self, files: list[tuple[str, bytes, int, int]], check: str = "stored"
    ) -> list[dict[str, Any] | OSError]:
        """Write each (path, data, mode, mtime_ns) whole, many at once; per file, in order, the
        checksum of its bytes as `check` says ("received": as its servers received them;
        "stored": as they read them back, as checksum) or the OSError that stopped it."""
    def reachable_files(self, root: str) -> tuple[list[tuple[str, int]], list[tuple[int, str]]]:
        """Every file under `root` the answering metadata owners hold, as (path, size), and
        (server id, error) per owner whose server is gone (its files are not listed)."""
    def lost_servers(self) -> dict[str, list[int]]:
        """The registry's record: {"lost": ids declared lost now, "repaired": ids
        whose copies were re-created since, "joining": ids being caught up}."""
    def locate_metadata(self, path: str) -> int:
        """The id of the server keeping `path`'s metadata."""
    def locate_locks(self, path: str) -> int:
        """The id of the server keeping the file's locks now."""
    def locate_metadata_copies(self, path: str) -> list[int]:
        """The ids of the servers keeping copies of `path`'s metadata, the serving one
        first."""
    def declare_lost(self, ids: list[int]) -> None:
        """Declare servers lost for the job: no copies are placed on them again."""
    def record_repaired(self, ids: list[int]) -> None:
        """Record that the copies these servers held were re-created."""
    def record_rejoined(self, ids: list[int]) -> None:
        """Record that these servers were caught up and are used again."""
    def record_joining(self, ids: list[int]) -> None:
        """Record that these servers are being caught up: they take metadata changes."""
    def catch_up_metadata(self) -> int:
        """Hand every metadata owner's joining copies the serving copy's state."""
    def locate_copies(self, path: str, offset: int) -> list[int]:
        """The ids of the servers holding the copies of byte `offset`, in the order reads
        try them."""
    def copies_left(
        self, paths: list[str], lost: list[int]
    ) -> list[tuple[int, int | None] | OSError]:
        """Per path: (copies asked, the fewest any chunk keeps on servers not in `lost`; None
        for a file without data), or the OSError that stopped it."""
    def repair(
        self, paths: list[str], rejoining: list[int] = ...
    ) -> list[dict[str, int] | OSError]:
        """Re-create the copies servers declared lost held, on the servers standing in for
        them and on the declared servers `rejoining` (caught up), each checked against its
        source: per path {"copies", "bytes", "lost_chunks"} or the OSError that stopped it."""
    def statfs(self) -> dict[str, Any]:
        """The cluster's capacity (total_bytes, free_bytes, avail_bytes, used_bytes, files)
        and `servers`: per server id, node, host, latency_s, error (None when it answered)
        and its own figures."""
    def server_ids(self) -> list[int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        _exc_type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
        /,
    ) -> None: ...

@final
class File:
    """An open file: positional I/O; close publishes the size it wrote (close-to-open)."""

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> int: ...
    def write_checked(
        self, offset: int, data: bytes | bytearray | memoryview, check: str = "stored"
    ) -> list[str]:
        """As write; the xxh3-128 (32 hex digits) of each chunk part written, as `check` says:
        "stored" (the servers read it back after writing it) or "received" (as they received
        it)."""
    def read(self, offset: int, length: int) -> bytes:
        """Short at the end of the file; never-written ranges inside the file read as zeros."""
    def readinto(self, offset: int, buffer: bytearray | memoryview) -> int: ...
    def readinto_hashed(self, offset: int, buffer: bytearray | memoryview) -> tuple[int, list[str]]:
        """As readinto from a chunk-aligned offset; also the xxh3-128 (32 hex digits) of each
        chunk part read, as its servers read it from their stores."""
    def fsync(self) -> None:
        """Return once every byte of the file is durable on its servers' devices."""
    def flush(self) -> None:
        """Return once every write of the file through this client is on its servers (writes
        return earlier, see client.write_behind); raises the first that failed."""
    def truncate(self, size: int) -> None:
        """Set the size through this handle (ftruncate); shrinking frees chunks beyond it."""
    def lock(
        self, kind: str, start: int = 0, end: int = 2**64 - 1, wait: bool = True, test: bool = False
    ) -> dict[str, int | str] | None:
        """Take ("read", "write") or release ("unlock") a lock on bytes [start, end), held by
        this open file across the job; the conflicting lock (kind, start, end, pid), if any."""
    @property
    def size(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def chunk_size(self) -> int: ...
    def checksum(self) -> dict[str, Any]:
        """As Client.checksum, for this file at the size this handle knows."""
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> File: ...
    def __exit__(
        self,
        _exc_type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
        /,
    ) -> None: ...

@final
class PlacementStudy:
    """Simulated creation of `paths` on `servers` servers, then batched chunk placement by
    `scheme` with the servers' own code (see studies/placement)."""

    def __new__(cls, scheme: str, servers: int, paths: list[str]) -> PlacementStudy: ...
    @staticmethod
    def schemes() -> list[str]:
        """Scheme names, the default ("layout") first."""
    def with_servers(self, servers: int) -> PlacementStudy:
        """The same files after the cluster grew (stored layouts do not change)."""
    def servers_into(self, files: Buffer, chunks: Buffer, out: Buffer) -> None:
        """out[i] = server index of chunk chunks[i] of file files[i] (uint64, uint64, uint32)."""
    def copies_into(
        self, files: Buffer, chunks: Buffer, replicas: int, domains: list[str], out: Buffer
    ) -> None:
        """out[i * replicas + r] = server index of copy r of chunk chunks[i] of file files[i],
        over servers in failure domains `domains` (stored layouts only)."""

@final
class SyntheticTelemetry:
    """A telemetry file with chosen contents, written by the core's own writer (for tests and
    studies): a server worker's (`source="server"`, format version 1) or a client's
    (`source="client"`, version 2, for the servers `targets`), named as a run names it."""

    def __new__(
        cls,
        directory: str | os.PathLike[str],
        source: str,
        id: int,
        worker: int = 0,
        node: str = "node-0",
        targets: list[int] | None = None,
    ) -> SyntheticTelemetry: ...
    @property
    def path(self) -> Path: ...
    def add(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        """Adds to a counter (ValueError for a name, op or target the catalogue refuses)."""
    def set(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        """Sets a counter or gauge."""
    def record(
        self, name: str, values: list[int], op: str | None = None, target: int | None = None
    ) -> None:
        """Records values into a histogram."""
    def snapshot(self, t_ns: int) -> None:
        """Appends one snapshot of the current values, taken at `t_ns`."""

def write_trace(
    directory: str | os.PathLike[str],
    server: int,
    worker: int,
    node: str,
    records: list[tuple[int, str, int, int, int, int, int, int, int, int, bool]],
) -> Path:
    """Writes `records` ((t_ns, op, total_ns, queue_ns, device_ns, file_id, chunk, bytes,
    server, worker, error) each) as `server-<server>-w<worker>.trace` in `directory` with the
    core's trace writer; returns its path."""
