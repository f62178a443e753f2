"""Type stubs for the native module `benchfs._core` (Rust, PyO3).

Private: import the public names from `benchfs` instead. Every blocking call releases the GIL.
"""

__version__: str
JOB_SECRET_FILE: str
"""Name of the per-job secret file in the registry directory (mode 0600)."""

def resolve_config(path: str | None = None, overrides: list[str] | None = None) -> str:
    """Return the effective configuration as TOML text.

    Precedence: built-in defaults < file (`path`, else `$BENCHFS_CONFIG`) < `BENCHFS_*` variables
    < `overrides` ("section.key=value"; the value is parsed as TOML, else taken as a string).
    Raises FileNotFoundError for a missing file and ValueError for unknown keys, wrong types or
    malformed TOML.
    """

def wait_for_servers(registry_dir: str, expected: int, timeout_s: float) -> list[dict]:
    """Wait until `expected` servers have registered; return them sorted by numeric id.

    Each entry is {"id": int, "node": str, "host": str, "pid": int}. Raises TimeoutError naming
    the expected, found and missing ids, and ValueError naming a malformed registry file.
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
) -> dict[str, float]:
    """Run the storage engine alone (no network) at `queue_depth`; `pattern` is "seqwrite",
    "seqread" or "randread". Returns bytes, seconds, mib_s, ops, p50_us, p99_us,
    mean_inflight, share_depth1 and mean_batch."""

class Server:
    """A chunk server on its own thread in this process (the same code as `benchfsd`)."""

    def __init__(
        self,
        registry_dir: str,
        data_dir: str,
        server_id: int,
        config: str | None = None,
        node: str | None = None,
    ) -> None: ...
    @property
    def server_id(self) -> int: ...
    def stop(self) -> None:
        """Stop serving and remove the registry entry; calling it again does nothing."""
    def __enter__(self) -> Server: ...
    def __exit__(self, *exc: object) -> None: ...

class Client:
    """A BenchFS client. Threads may share one (they take turns); use one per thread for
    parallel I/O."""

    def __init__(
        self, registry_dir: str, config: str | None = None, expected_servers: int | None = None
    ) -> None:
        """Connect once the expected membership has registered (TimeoutError names the missing)."""
    def write(self, path: str, offset: int, data: bytes | bytearray | memoryview) -> int: ...
    def read(self, path: str, offset: int, length: int) -> bytes:
        """Short at the end of the file; never-written ranges inside the file read as zeros."""
    def readinto(self, path: str, offset: int, buffer: bytearray | memoryview) -> int: ...
    def file_size(self, path: str) -> int: ...
    def fsync(self, path: str) -> None:
        """Return once every byte written to `path` is durable on the servers' devices."""
    def locate(self, path: str, offset: int) -> int:
        """The id of the server that holds byte `offset` of `path`."""
    def server_stats(self) -> list[dict[str, int]]:
        """Per server: id, requests, retries, timeouts, failures (as this client saw them)."""
    def server_ids(self) -> list[int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: object) -> None: ...
