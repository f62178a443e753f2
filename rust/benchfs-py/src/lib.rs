//! `benchfs._core`: the thin Python face of the Rust core. The GIL is released for every
//! blocking call; errors become OSError subclasses with errno set (ValueError for bad
//! configuration or registry entries).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use benchfs_core::client::{Check, Client as CoreClient, FileChecksum, FileHandle, WholeFile};
use benchfs_core::config::{self, Config};
use benchfs_core::namespace::{Attr, Kind};
use benchfs_core::posix;
use benchfs_core::protocol::capacity::Capacity;
use benchfs_core::protocol::meta::FindRequest;
use benchfs_core::registry;
use benchfs_core::server::{ServerHandle, ServerOptions};
use benchfs_core::shared::{SharedClient, SharedFile};
use benchfs_core::size;
use benchfs_core::telemetry::{OpKind, TraceRecord, TRACE_FLAG_ERROR};
use benchfs_core::Error;
use benchfs_tools::config::ToolSections;
use benchfs_tools::ior;
use benchfs_tools::placement_study::{Scheme, Study};
use benchfs_tools::storage_bench::{self as bench, Pattern, StorageBenchSpec};
use benchfs_tools::synthetic::{self, SyntheticTelemetry};
use benchfs_tools::transfer::{run_transfers, Direction, TransferSpec};

fn to_py(e: Error) -> PyErr {
    match e {
        Error::Config(_) | Error::Registry { .. } | Error::InvalidArgument(_) | Error::Closed(_) => {
            PyValueError::new_err(e.to_string())
        }
        other => PyOSError::new_err((other.errno(), other.to_string())),
    }
}

/// Asserts that a value may cross into `detach`: the values we pass are only used on the
/// calling thread, which `detach` runs the closure on.
struct OnThisThread<T>(T);
// SAFETY: see above; `detach` runs the closure synchronously on the current thread.
unsafe impl<T> Send for OnThisThread<T> {}
unsafe impl<T> Sync for OnThisThread<T> {}

/// Runs `f(value)` with the GIL released, on this thread.
fn detached<T, R: Send>(py: Python<'_>, value: T, f: impl FnOnce(T) -> R) -> R {
    let job = OnThisThread((value, f));
    py.detach(move || {
        let job = job;
        let (value, f) = job.0;
        f(value)
    })
}

fn config_from(text: Option<&str>) -> PyResult<Config> {
    match text {
        Some(t) => Config::from_toml(t).map_err(to_py),
        None => config::resolve(None, &config::process_env(), &[]).map_err(to_py),
    }
}

/// Effective configuration as TOML: defaults < file (`path`, else $BENCHFS_CONFIG) <
/// BENCHFS_* variables < `overrides` ("section.key=value"). With `environment=False` the
/// variables (and $BENCHFS_CONFIG) are not read: a recorded configuration stays as recorded.
#[pyfunction]
#[pyo3(signature = (path=None, overrides=None, environment=true))]
fn resolve_config(
    path: Option<PathBuf>,
    overrides: Option<Vec<String>>,
    environment: bool,
) -> PyResult<String> {
    let env = if environment {
        config::process_env()
    } else {
        BTreeMap::new()
    };
    let (c, tools) =
        config::resolve_with::<ToolSections>(path.as_deref(), &env, &overrides.unwrap_or_default())
            .map_err(to_py)?;
    Ok(config::effective_toml(&c, &tools))
}

/// An effective configuration's text with `overrides` applied, without the environment.
#[pyfunction]
fn config_with_overrides(effective: &str, overrides: Vec<String>) -> PyResult<String> {
    let (c, tools) = config::with_overrides_with::<ToolSections>(effective, &overrides).map_err(to_py)?;
    Ok(config::effective_toml(&c, &tools))
}

/// Bytes of a size as people write it ("64M", "1MiB", "4096"; every suffix binary).
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    size::parse_size(text).map_err(|why| PyValueError::new_err(format!("invalid size {text:?}: {why}")))
}

/// Waits for `expected` registered servers; returns the membership ordered by numeric id.
#[pyfunction]
fn wait_for_servers<'py>(
    py: Python<'py>,
    registry_dir: PathBuf,
    expected: u32,
    timeout_s: f64,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    if timeout_s.is_nan() || timeout_s < 0.0 {
        return Err(PyValueError::new_err("timeout_s must not be negative"));
    }
    let entries = py
        .detach(|| registry::wait_for(&registry_dir, expected, Duration::from_secs_f64(timeout_s)))
        .map_err(to_py)?;
    entries
        .iter()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("id", e.id)?;
            d.set_item("node", &e.node)?;
            d.set_item("host", &e.host)?;
            d.set_item("domain", &e.domain)?;
            d.set_item("pid", e.pid)?;
            Ok(d)
        })
        .collect()
}

/// An in-process chunk server on its own thread (the same code as `benchfsd`).
#[pyclass(name = "Server", module = "benchfs._core")]
struct PyServer {
    handle: Mutex<Option<ServerHandle>>,
    id: u32,
}

#[pymethods]
impl PyServer {
    #[new]
    #[pyo3(signature = (registry_dir, data_dir, server_id, config=None, node=None))]
    fn new(
        py: Python<'_>,
        registry_dir: PathBuf,
        data_dir: PathBuf,
        server_id: u32,
        config: Option<&str>,
        node: Option<String>,
    ) -> PyResult<Self> {
        let config = config_from(config)?;
        let opts = ServerOptions {
            id: server_id,
            node: node
                .or_else(|| std::env::var("BENCHFS_NODE_NAME").ok())
                .unwrap_or_default(),
            domain: std::env::var("BENCHFS_DOMAIN").unwrap_or_default(),
            data_dir,
            registry_dir,
            config,
        };
        let handle = py.detach(|| ServerHandle::spawn(opts)).map_err(to_py)?;
        Ok(PyServer {
            handle: Mutex::new(Some(handle)),
            id: server_id,
        })
    }

    #[getter]
    fn server_id(&self) -> u32 {
        self.id
    }

    /// Stops the server and removes its registry entry. Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let handle = self
            .handle
            .lock()
            .map_err(|_| PyRuntimeError::new_err("server lock poisoned"))?
            .take();
        if let Some(mut h) = handle {
            py.detach(move || h.stop()).map_err(to_py)?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Py<PyAny>,
        _exc: Py<PyAny>,
        _tb: Py<PyAny>,
    ) -> PyResult<()> {
        self.stop(py)
    }
}

/// A client of a running cluster. Safe to share between threads, which then take turns; use
/// one client per thread for parallel I/O.
#[pyclass(name = "Client", module = "benchfs._core", frozen)]
struct PyClient {
    inner: SharedClient,
}

impl PyClient {
    /// Runs `f` on the client with the GIL released. The lock is taken after the GIL is
    /// released, so a thread waiting for the client never holds the GIL.
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&CoreClient) -> Result<R, Error>) -> PyResult<R> {
        detached(py, &self.inner, |shared| shared.with(f)).map_err(to_py)
    }
}

/// A checked write's check by name: "received" or "stored".
fn check_of(name: &str) -> PyResult<Check> {
    match name {
        "received" => Ok(Check::Received),
        "stored" => Ok(Check::Stored),
        other => Err(PyValueError::new_err(format!(
            "check must be \"received\" or \"stored\", not {other:?}"
        ))),
    }
}

fn contiguous(buf: &PyBuffer<u8>, what: &str) -> PyResult<()> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{what} must be a contiguous buffer"
        )));
    }
    Ok(())
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (registry_dir, config=None, expected_servers=None))]
    fn new(
        py: Python<'_>,
        registry_dir: PathBuf,
        config: Option<&str>,
        expected_servers: Option<u32>,
    ) -> PyResult<Self> {
        let mut config = config_from(config)?;
        if let Some(n) = expected_servers {
            config.cluster.expected_servers = n;
        }
        let client = detached(py, (), |()| {
            CoreClient::connect(&registry_dir, config).map(SharedClient::new)
        })
        .map_err(to_py)?;
        Ok(PyClient { inner: client })
    }

    /// Opens the file at `path`. `flags` takes os.O_CREAT, os.O_EXCL and os.O_TRUNC (the
    /// access mode bits are accepted and ignored: there are no permission checks).
    #[pyo3(signature = (path, flags=0, mode=0o644))]
    fn open(slf: Py<Self>, py: Python<'_>, path: &str, flags: i32, mode: u32) -> PyResult<PyFile> {
        let ns_flags = posix::namespace_flags(flags);
        let handle = slf
            .get()
            .with(py, |c| c.open(path, ns_flags, mode).map(SharedFile::new))?;
        Ok(PyFile {
            client: slf.clone_ref(py),
            file: handle,
            lock_owner: benchfs_core::protocol::lock::new_owner(),
            locked: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Attributes of `path`, links followed: kind ("file" or "dir"), size, mode, id (32 hex
    /// digits), mtime_ns, ctime_ns, chunk_size, stripe_count, stripe_start, replicas, inline.
    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let a = self.with(py, |c| c.stat(path))?;
        attr_dict(py, &a)
    }

    /// As `stat`, but a symbolic link's own attributes (kind "symlink", size: its target's
    /// length).
    fn lstat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let a = self.with(py, |c| c.lstat(path))?;
        attr_dict(py, &a)
    }

    /// Makes a symbolic link at `path` to `target` (kept as given).
    fn symlink(&self, py: Python<'_>, target: &str, path: &str) -> PyResult<()> {
        self.with(py, |c| c.symlink(target, path))
    }

    /// `path` with every symbolic link in it resolved.
    fn realpath(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        self.with(py, |c| c.realpath(path))
    }

    /// The target of the symbolic link at `path`.
    fn readlink(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        self.with(py, |c| c.readlink(path))
    }

    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.with(py, |c| c.unlink(path))
    }

    #[pyo3(signature = (path, mode=0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.with(py, |c| c.mkdir(path, mode))
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.with(py, |c| c.rmdir(path))
    }

    /// The entries of a directory as (name, kind) pairs, in name order.
    fn readdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, &'static str)>> {
        let entries = self.with(py, |c| c.readdir(path))?;
        Ok(entries.into_iter().map(|e| (e.name, kind_name(e.kind))).collect())
    }

    /// A find run on the servers (docs/python.md): (examined, matched, [(path, kind, size,
    /// mtime_ns), ...] in path order; empty when `count_only`).
    #[pyo3(signature = (root, name="", kind=None, size_min=0, size_max=u64::MAX, newer_ns=0, count_only=false))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn find(
        &self,
        py: Python<'_>,
        root: &str,
        name: &str,
        kind: Option<&str>,
        size_min: u64,
        size_max: u64,
        newer_ns: u64,
        count_only: bool,
    ) -> PyResult<(u64, u64, Vec<(String, &'static str, u64, u64)>)> {
        let kind = match kind {
            None => None,
            Some("file") => Some(Kind::File),
            Some("dir") => Some(Kind::Dir),
            Some("symlink") => Some(Kind::Symlink),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "kind {other:?}: expected \"file\", \"dir\" or \"symlink\""
                )))
            }
        };
        let req = FindRequest {
            name: name.to_string(),
            kind,
            size_min,
            size_max,
            newer_ns,
            count_only,
            ..FindRequest::new(root)
        };
        let r = self.with(py, |c| c.find(&req))?;
        let found = r
            .found
            .into_iter()
            .map(|f| (f.path, kind_name(f.kind), f.size, f.mtime_ns))
            .collect();
        Ok((r.examined, r.matched, found))
    }

    /// Every file under `root` that the metadata owners answering hold, as (path, size), and
    /// per owner whose server is gone, (server id, error) (its files are not listed).
    #[allow(clippy::type_complexity)]
    fn reachable_files(
        &self,
        py: Python<'_>,
        root: &str,
    ) -> PyResult<(Vec<(String, u64)>, Vec<(u32, String)>)> {
        let req = FindRequest {
            kind: Some(Kind::File),
            ..FindRequest::new(root)
        };
        let (r, missing) = self.with(py, |c| c.find_reachable(&req, true))?;
        let files = r.found.into_iter().map(|f| (f.path, f.size)).collect();
        let missing = missing
            .into_iter()
            .map(|e| {
                let server = match &e {
                    Error::ServerLost { server, .. } | Error::Timeout { server, .. } => *server,
                    _ => u32::MAX,
                };
                (server, e.to_string())
            })
            .collect();
        Ok((files, missing))
    }

    /// The registry's record of servers declared lost for the job, of those repaired and of
    /// those being caught up: {"lost": [ids], "repaired": [ids], "joining": [ids]}.
    fn lost_servers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let record = self.with(py, |c| c.lost_servers())?;
        let d = PyDict::new(py);
        d.set_item("lost", record.lost)?;
        d.set_item("repaired", record.repaired)?;
        d.set_item("joining", record.joining)?;
        Ok(d)
    }

    /// The id of the server keeping `path`'s metadata (name, size, layout).
    fn locate_metadata(&self, py: Python<'_>, path: &str) -> PyResult<u32> {
        self.with(py, |c| c.locate_metadata(path))
    }

    /// The id of the server keeping the locks of the file at `path` now.
    fn locate_locks(&self, py: Python<'_>, path: &str) -> PyResult<u32> {
        self.with(py, |c| c.locate_locks(path))
    }

    /// The ids of the servers keeping copies of `path`'s metadata: the complete ones (the first
    /// serves), then those only taking changes.
    fn locate_metadata_copies(&self, py: Python<'_>, path: &str) -> PyResult<Vec<u32>> {
        self.with(py, |c| c.locate_metadata_copies(path))
    }

    /// Declares the servers `ids` lost for the job: no client places copies on them or sends
    /// them requests for files of several copies again.
    fn declare_lost(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.with(py, |c| {
            c.declare_lost_servers(&ids);
            Ok(())
        })
    }

    /// Records that the copies servers `ids` held were re-created (after a complete repair).
    fn record_repaired(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.with(py, |c| c.record_repaired(&ids))
    }

    /// Records that servers `ids` were caught up and are used again (after a complete repair).
    fn record_rejoined(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.with(py, |c| c.record_rejoined(&ids))
    }

    /// Records servers `ids` as joining: they take the metadata's changes from now on (and
    /// forget what they held), before `catch_up_metadata` hands them the rest.
    fn record_joining(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.with(py, |c| c.record_joining(&ids))
    }

    /// Hands every metadata owner's joining copies the serving copy's state; the records
    /// copied.
    fn catch_up_metadata(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |c| c.catch_up_metadata())
    }

    /// The ids of the servers holding the copies of byte `offset` of `path`, in the order
    /// reads try them.
    fn locate_copies(&self, py: Python<'_>, path: &str, offset: u64) -> PyResult<Vec<u32>> {
        self.with(py, |c| c.locate_copies(path, offset))
    }

    /// For each path: (copies asked, the fewest any chunk keeps on servers not in `lost`, None
    /// for a file without data), or the OSError that stopped it (returned, not raised).
    fn copies_left<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
        lost: Vec<u32>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let results = self.with(py, |c| c.copies_left(&paths, &lost))?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(left) => Ok((left.asked, left.fewest).into_pyobject(py)?.into_any()),
                Err(e) => Ok(to_py(e).into_value(py).into_bound(py).into_any()),
            })
            .collect()
    }

    /// Re-creates the copies that servers declared lost held of each path's chunks, on the
    /// servers standing in for them and on the declared servers `rejoining` (caught up), each
    /// checked against its source's checksum: per path {"copies", "bytes", "lost_chunks"}, or
    /// the OSError that stopped it (returned).
    #[pyo3(signature = (paths, rejoining=Vec::new()))]
    fn repair<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
        rejoining: Vec<u32>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let results = self.with(py, |c| c.repair(&paths, &rejoining))?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(done) => {
                    let d = PyDict::new(py);
                    d.set_item("copies", done.copies)?;
                    d.set_item("bytes", done.bytes)?;
                    d.set_item("lost_chunks", done.lost_chunks)?;
                    Ok(d.into_any())
                }
                Err(e) => Ok(to_py(e).into_value(py).into_bound(py).into_any()),
            })
            .collect()
    }

    /// Renames within the file system (data does not move).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        self.with(py, |c| c.rename(src, dst))
    }

    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        self.with(py, |c| c.truncate(path, size))
    }

    /// Sets the permission bits and/or the modification time (ns since the epoch).
    #[pyo3(signature = (path, mode=None, mtime_ns=None))]
    fn set_attr(&self, py: Python<'_>, path: &str, mode: Option<u32>, mtime_ns: Option<u64>) -> PyResult<()> {
        self.with(py, |c| c.set_attr(path, mode, mtime_ns).map(|_| ()))
    }

    /// Sets the modification time of the symbolic link at `path` itself (lutimes).
    fn set_link_time(&self, py: Python<'_>, path: &str, mtime_ns: u64) -> PyResult<()> {
        self.with(py, |c| c.set_link_time(path, mtime_ns).map(|_| ()))
    }

    /// The id of the server holding byte `offset` of the file at `path`.
    fn locate(&self, py: Python<'_>, path: &str, offset: u64) -> PyResult<u32> {
        self.with(py, |c| c.locate(path, offset))
    }

    /// Times `count` stats of `path` one by one in Rust, with no interpreter between them, for
    /// at most `seconds`: each call's nanoseconds (`benchfs-bench rpc` sets them beside the
    /// same loop in Python, so the Python call's own cost shows).
    fn time_stats(&self, py: Python<'_>, path: &str, count: usize, seconds: f64) -> PyResult<Vec<u64>> {
        let until = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
        self.with(py, |c| {
            let mut samples = Vec::with_capacity(count);
            for _ in 0..count {
                let t0 = Instant::now();
                c.stat(path)?;
                let t1 = Instant::now();
                samples.push((t1 - t0).as_nanos() as u64);
                if t1 >= until {
                    break;
                }
            }
            Ok(samples)
        })
    }

    /// Per server (membership order): requests sent, retries, timeouts and failures.
    fn server_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let stats = self.with(py, |c| Ok(c.server_stats()))?;
        stats
            .into_iter()
            .map(|c| {
                let d = PyDict::new(py);
                d.set_item("id", c.id)?;
                d.set_item("requests", c.requests)?;
                d.set_item("retries", c.retries)?;
                d.set_item("timeouts", c.timeouts)?;
                d.set_item("failures", c.failures)?;
                Ok(d)
            })
            .collect()
    }

    /// The xxh3-128 of each chunk-aligned range of `path` as its servers read it back:
    /// {"size", "chunk_size", "chunks": [32 hex digits, as xxhash's hexdigest]}.
    fn checksum<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let c = self.with(py, |c| c.checksum(path))?;
        checksum_dict(py, &c)
    }

    /// Writes each `(path, data, mode, mtime_ns)` whole (created, or truncated), many at
    /// once; for each, in order, the checksum of its bytes as `check` says ("received": as its
    /// servers received them; "stored": as they read them back, as `checksum`) or the OSError
    /// that stopped it (returned, not raised).
    #[pyo3(signature = (files, check="stored"))]
    fn put_files<'py>(
        &self,
        py: Python<'py>,
        files: Vec<(String, Vec<u8>, u32, u64)>,
        check: &str,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let check = check_of(check)?;
        let whole: Vec<WholeFile<'_>> = files
            .iter()
            .map(|(path, data, mode, mtime_ns)| WholeFile {
                path,
                data,
                mode: *mode,
                mtime_ns: *mtime_ns,
            })
            .collect();
        let results = self.with(py, |c| c.put_files(&whole, check))?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(sum) => Ok(checksum_dict(py, &sum)?.into_any()),
                Err(e) => Ok(to_py(e).into_value(py).into_bound(py).into_any()),
            })
            .collect()
    }

    /// The cluster's capacity and each server's part (docs/python.md).
    fn statfs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.with(py, |c| c.statfs())?;
        let fill = |d: &Bound<'py, PyDict>, cap: &Capacity| -> PyResult<()> {
            d.set_item("total_bytes", cap.total_bytes)?;
            d.set_item("free_bytes", cap.free_bytes)?;
            d.set_item("avail_bytes", cap.avail_bytes)?;
            d.set_item("used_bytes", cap.used_bytes())?;
            d.set_item("files", cap.inodes)
        };
        let out = PyDict::new(py);
        fill(&out, &c.total)?;
        let servers = c
            .servers
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("id", s.id)?;
                d.set_item("node", &s.node)?;
                d.set_item("host", &s.host)?;
                d.set_item("latency_s", s.latency.as_secs_f64())?;
                match &s.capacity {
                    Ok(cap) => {
                        d.set_item("error", py.None())?;
                        fill(&d, cap)?;
                    }
                    Err(e) => d.set_item("error", e)?,
                }
                Ok(d)
            })
            .collect::<PyResult<Vec<_>>>()?;
        out.set_item("servers", servers)?;
        Ok(out)
    }

    /// The ids of the servers this client uses, ascending.
    fn server_ids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.with(py, |c| Ok(c.membership().iter().map(|e| e.id).collect()))
    }

    /// Closes the connections. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, &self.inner, SharedClient::close);
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Py<PyAny>,
        _exc: Py<PyAny>,
        _tb: Py<PyAny>,
    ) -> PyResult<()> {
        self.close(py)
    }
}

/// The O_* values of this platform (Linux), as Python's `os` module has them.
fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "dir",
        Kind::Symlink => "symlink",
    }
}

/// A checksum for Python: {"size", "chunk_size", "chunks": [32 hex digits, as xxhash's
/// hexdigest]}.
fn checksum_dict<'py>(py: Python<'py>, c: &FileChecksum) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("size", c.size)?;
    out.set_item("chunk_size", c.chunk_size)?;
    let hex: Vec<String> = c.chunks.iter().map(|h| format!("{h:032x}")).collect();
    out.set_item("chunks", hex)?;
    Ok(out)
}

fn attr_dict<'py>(py: Python<'py>, a: &Attr) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", kind_name(a.kind))?;
    d.set_item("size", a.size)?;
    d.set_item("mode", a.mode)?;
    d.set_item("id", a.id.hex())?;
    d.set_item("mtime_ns", a.mtime_ns)?;
    d.set_item("ctime_ns", a.ctime_ns)?;
    d.set_item("chunk_size", a.layout.chunk_size)?;
    d.set_item("stripe_count", a.layout.stripe_count)?;
    d.set_item("replicas", a.layout.replicas)?;
    d.set_item("stripe_start", a.layout.start)?;
    d.set_item("inline", a.layout.inline)?;
    Ok(d)
}

/// An open file of a `Client`: positional I/O (offsets are explicit), fsync, close.
/// Close publishes the size this handle wrote (close-to-open consistency).
#[pyclass(name = "File", module = "benchfs._core", frozen)]
struct PyFile {
    client: Py<PyClient>,
    file: SharedFile,
    /// This open file's lock owner number (its locks are OFD locks), and whether it took any.
    lock_owner: u64,
    locked: std::sync::atomic::AtomicBool,
}

impl PyFile {
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&CoreClient, &FileHandle) -> Result<R, Error>,
    ) -> PyResult<R> {
        let (file, client) = (&self.file, &self.client.get().inner);
        detached(py, (), move |()| file.with(client, f)).map_err(to_py)
    }
}

#[pymethods]
impl PyFile {
    /// Writes a bytes-like object at `offset`; returns the bytes written.
    fn write(&self, py: Python<'_>, offset: u64, data: PyBuffer<u8>) -> PyResult<usize> {
        contiguous(&data, "data")?;
        // SAFETY: the buffer is held (and its exporter pinned) for the whole call.
        let bytes = OnThisThread(unsafe {
            std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes())
        });
        self.with(py, move |c, f| {
            let b = bytes;
            c.write(f, offset, b.0)
        })
    }

    /// Writes as `write` does; returns the xxh3-128 (32 hex digits) of each chunk part of
    /// the range, in order, as `check` says: "stored" (the servers read it back after writing
    /// it) or "received" (as they received it).
    #[pyo3(signature = (offset, data, check="stored"))]
    fn write_checked(
        &self,
        py: Python<'_>,
        offset: u64,
        data: PyBuffer<u8>,
        check: &str,
    ) -> PyResult<Vec<String>> {
        contiguous(&data, "data")?;
        let check = check_of(check)?;
        // SAFETY: the buffer is held (and its exporter pinned) for the whole call.
        let bytes = OnThisThread(unsafe {
            std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes())
        });
        let digests = self.with(py, move |c, f| {
            let b = bytes;
            c.write_checked(f, offset, b.0, check)
        })?;
        Ok(digests.iter().map(|h| format!("{h:032x}")).collect())
    }

    /// Reads up to `length` bytes from `offset` (short only at the end of the file).
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: usize) -> PyResult<Bound<'py, PyBytes>> {
        // Read straight into the bytes object returned (no copy out of a Rust buffer); only a
        // short read (the end of the file) copies, into one of the right size.
        let bytes = PyBytes::new_with(py, length, |_| Ok(()))?;
        // SAFETY: a new bytes object nothing else refers to until it is returned, so its
        // `length` bytes of storage are ours to fill, also with the GIL released.
        let target = OnThisThread(unsafe {
            std::slice::from_raw_parts_mut(pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) as *mut u8, length)
        });
        let n = self.with(py, move |c, f| {
            let t = target;
            c.read(f, offset, t.0)
        })?;
        if n == length {
            return Ok(bytes);
        }
        Ok(PyBytes::new(py, &bytes.as_bytes()[..n]))
    }

    /// Reads into a writable buffer (bytearray, memoryview, numpy array) without an extra copy.
    fn readinto(&self, py: Python<'_>, offset: u64, buffer: PyBuffer<u8>) -> PyResult<usize> {
        contiguous(&buffer, "buffer")?;
        if buffer.readonly() {
            return Err(PyValueError::new_err("buffer is read-only"));
        }
        // SAFETY: writable, contiguous, held for the whole call.
        let target = OnThisThread(unsafe {
            std::slice::from_raw_parts_mut(buffer.buf_ptr() as *mut u8, buffer.len_bytes())
        });
        self.with(py, move |c, f| {
            let t = target;
            c.read(f, offset, t.0)
        })
    }

    /// As `readinto` from a chunk-aligned `offset`, and the xxh3-128 (32 hex digits) of each
    /// chunk part of what was read, as its servers read it from their stores.
    fn readinto_hashed(
        &self,
        py: Python<'_>,
        offset: u64,
        buffer: PyBuffer<u8>,
    ) -> PyResult<(usize, Vec<String>)> {
        contiguous(&buffer, "buffer")?;
        if buffer.readonly() {
            return Err(PyValueError::new_err("buffer is read-only"));
        }
        // SAFETY: writable, contiguous, held for the whole call.
        let target = OnThisThread(unsafe {
            std::slice::from_raw_parts_mut(buffer.buf_ptr() as *mut u8, buffer.len_bytes())
        });
        let (n, digests) = self.with(py, move |c, f| {
            let t = target;
            c.read_hashed(f, offset, t.0)
        })?;
        Ok((n, digests.iter().map(|h| format!("{h:032x}")).collect()))
    }

    /// Returns once every byte of the file is durable on its servers' devices; publishes the size.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c, f| c.fsync(f))
    }

    /// Waits until every write of this file through this client is on its servers (writes
    /// return earlier, see client.write_behind); raises the first that failed.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c, f| c.flush(f))
    }

    /// Sets the file's size through this handle (`ftruncate`); shrinking frees the chunks
    /// beyond it.
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        self.with(py, |c, f| c.ftruncate(f, size))
    }

    /// The size as this handle knows it (the owner's at open, and its own writes).
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |_, f| Ok(f.size()))
    }

    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |_, f| Ok(f.path.clone()))
    }

    /// The file's 128-bit id as 32 hex digits.
    #[getter]
    fn id(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |_, f| Ok(f.attr.id.hex()))
    }

    /// As the client's checksum, for this file at the size this handle knows.
    fn checksum<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.with(py, |c, f| c.checksum_file(f))?;
        checksum_dict(py, &c)
    }

    /// Bytes per chunk of this file's layout (its checksum's ranges).
    #[getter]
    fn chunk_size(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |_, f| Ok(f.attr.layout.chunk_size))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.file.is_closed()
    }

    /// Takes ("read" or "write"), or ("unlock") releases, a lock on bytes [start, end) of the
    /// file (end 2**64-1: to its end, however it grows), held by this open file across every
    /// client of the job (an OFD lock: released by unlock or close). `wait`: until no other
    /// holder conflicts; otherwise a conflicting lock is returned at once. `test`: only says
    /// which lock would conflict (F_GETLK). Returns None, or the conflicting lock as a dict
    /// (kind, start, end, pid).
    #[pyo3(signature = (kind, start=0, end=u64::MAX, wait=true, test=false))]
    fn lock<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        start: u64,
        end: u64,
        wait: bool,
        test: bool,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        use benchfs_core::protocol::lock::{LockClass, LockCmd, LockRequest, LockType};
        let kind = match kind {
            "read" => LockType::Read,
            "write" => LockType::Write,
            "unlock" => LockType::Unlock,
            other => {
                return Err(PyValueError::new_err(format!(
                    "lock kind {other:?}: expected \"read\", \"write\" or \"unlock\""
                )))
            }
        };
        if start >= end {
            return Err(PyValueError::new_err(format!(
                "lock range [{start}, {end}) is empty"
            )));
        }
        let req = LockRequest {
            owner: self.lock_owner,
            start,
            end,
            pid: 0,
            class: LockClass::Fcntl,
            kind,
            cmd: if test {
                LockCmd::Get
            } else if wait {
                LockCmd::SetWait
            } else {
                LockCmd::Set
            },
        };
        if !test && kind != LockType::Unlock {
            self.locked.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let held = self.with(py, move |c, f| c.lock(f, &req))?;
        held.map(|h| {
            let d = PyDict::new(py);
            d.set_item(
                "kind",
                if h.kind == LockType::Write {
                    "write"
                } else {
                    "read"
                },
            )?;
            d.set_item("start", h.start)?;
            d.set_item("end", h.end)?;
            d.set_item("pid", h.pid)?;
            Ok(d)
        })
        .transpose()
    }

    /// Publishes the size this handle wrote, releases its locks, then closes it (even if
    /// publishing failed, which is reported). Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.locked.swap(false, std::sync::atomic::Ordering::Relaxed) && !self.file.is_closed() {
            use benchfs_core::protocol::lock::{LockClass, LockRequest};
            let release = LockRequest::release(self.lock_owner, LockClass::Fcntl);
            // The size is published below whatever this says; a lost server's locks are gone.
            let _ = self.with(py, move |c, f| c.lock(f, &release));
        }
        let (file, client) = (&self.file, &self.client.get().inner);
        detached(py, (), move |()| file.close(client)).map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Py<PyAny>,
        _exc: Py<PyAny>,
        _tb: Py<PyAny>,
    ) -> PyResult<()> {
        self.close(py)
    }
}

/// Simulated creation of `paths` on `servers` servers (one metadata owner per server), then
/// batched chunk placement by a scheme: the placement study's view of the real code.
#[pyclass(name = "PlacementStudy", module = "benchfs._core", frozen)]
struct PyPlacementStudy {
    study: Study,
    files: usize,
}

#[pymethods]
impl PyPlacementStudy {
    #[new]
    fn new(py: Python<'_>, scheme: &str, servers: u32, paths: Vec<String>) -> PyResult<Self> {
        let scheme = Scheme::from_name(scheme).ok_or_else(|| {
            let names: Vec<&str> = Scheme::ALL.iter().map(|s| s.name()).collect();
            PyValueError::new_err(format!("unknown scheme {scheme:?}; one of {names:?}"))
        })?;
        if servers == 0 {
            return Err(PyValueError::new_err("servers must be at least 1"));
        }
        let files = paths.len();
        let study = py.detach(|| Study::new(scheme, servers, &paths));
        Ok(PyPlacementStudy { study, files })
    }

    /// The names of the schemes, BenchFS's default first.
    #[staticmethod]
    fn schemes() -> Vec<&'static str> {
        Scheme::ALL.iter().map(|s| s.name()).collect()
    }

    /// The same files after the cluster grew to `servers` (existing layouts unchanged).
    fn with_servers(&self, servers: u32) -> PyResult<Self> {
        if servers == 0 {
            return Err(PyValueError::new_err("servers must be at least 1"));
        }
        Ok(PyPlacementStudy {
            study: self.study.with_servers(servers),
            files: self.files,
        })
    }

    /// Fills `out[i * replicas + r]` (uint32) with the server index of copy `r` of chunk
    /// `chunks[i]` of file `files[i]` under stored layouts, over servers whose failure domains
    /// are `domains` (one name per server): the copies the clients place.
    fn copies_into(
        &self,
        py: Python<'_>,
        files: PyBuffer<u64>,
        chunks: PyBuffer<u64>,
        replicas: u8,
        domains: Vec<String>,
        out: PyBuffer<u32>,
    ) -> PyResult<()> {
        if !(1..=benchfs_core::placement::MAX_REPLICAS).contains(&replicas) {
            return Err(PyValueError::new_err("replicas must be 1, 2 or 3"));
        }
        if !(files.is_c_contiguous() && chunks.is_c_contiguous() && out.is_c_contiguous()) || out.readonly() {
            return Err(PyValueError::new_err(
                "files, chunks and out must be contiguous; out writable",
            ));
        }
        let n = files.item_count();
        let r = replicas as usize;
        if chunks.item_count() != n || out.item_count() != n * r {
            return Err(PyValueError::new_err(
                "chunks must be as long as files, and out replicas times as long",
            ));
        }
        let domains = benchfs_core::placement::Domains::new(&domains);
        // SAFETY: as in servers_into.
        let (f, c, o) = unsafe {
            (
                OnThisThread(std::slice::from_raw_parts(files.buf_ptr() as *const u64, n)),
                OnThisThread(std::slice::from_raw_parts(chunks.buf_ptr() as *const u64, n)),
                OnThisThread(std::slice::from_raw_parts_mut(out.buf_ptr() as *mut u32, n * r)),
            )
        };
        let study = &self.study;
        let bad = detached(py, (f, c, o), |(f, c, o)| {
            for ((&file, &chunk), slots) in f.0.iter().zip(c.0.iter()).zip(o.0.chunks_mut(r)) {
                match study.copies(file as usize, chunk, replicas, &domains) {
                    Some(copies) if copies.len() == r => {
                        for (slot, s) in slots.iter_mut().zip(copies) {
                            *slot = s as u32;
                        }
                    }
                    Some(_) => return Some(Err(file)),
                    None => return Some(Ok(file)),
                }
            }
            None
        });
        match bad {
            Some(Ok(file)) => Err(PyValueError::new_err(format!(
                "file number {file} out of range (0..{})",
                self.files
            ))),
            Some(Err(_)) => Err(PyValueError::new_err(format!(
                "{replicas} copies need at least {replicas} servers"
            ))),
            None => Ok(()),
        }
    }

    /// Fills `out[i]` (uint32) with the server index of chunk `chunks[i]` of file `files[i]`
    /// (both uint64, file numbers index the paths given at construction).
    fn servers_into(
        &self,
        py: Python<'_>,
        files: PyBuffer<u64>,
        chunks: PyBuffer<u64>,
        out: PyBuffer<u32>,
    ) -> PyResult<()> {
        if !(files.is_c_contiguous() && chunks.is_c_contiguous() && out.is_c_contiguous()) || out.readonly() {
            return Err(PyValueError::new_err(
                "files, chunks and out must be contiguous; out writable",
            ));
        }
        let n = files.item_count();
        if chunks.item_count() != n || out.item_count() != n {
            return Err(PyValueError::new_err(
                "files, chunks and out must have the same length",
            ));
        }
        // SAFETY: contiguous buffers of the checked element types and lengths, held for the
        // whole call; `out` is writable and distinct from the inputs' memory by contract.
        let (f, c, o) = unsafe {
            (
                OnThisThread(std::slice::from_raw_parts(files.buf_ptr() as *const u64, n)),
                OnThisThread(std::slice::from_raw_parts(chunks.buf_ptr() as *const u64, n)),
                OnThisThread(std::slice::from_raw_parts_mut(out.buf_ptr() as *mut u32, n)),
            )
        };
        let study = &self.study;
        let bad = detached(py, (f, c, o), |(f, c, o)| {
            for ((&file, &chunk), slot) in f.0.iter().zip(c.0.iter()).zip(o.0.iter_mut()) {
                match study.server(file as usize, chunk) {
                    Some(s) => *slot = s,
                    None => return Some(file),
                }
            }
            None
        });
        match bad {
            Some(file) => Err(PyValueError::new_err(format!(
                "file number {file} out of range (0..{})",
                self.files
            ))),
            None => Ok(()),
        }
    }
}

/// The index of the server keeping `path`'s metadata in a cluster of `servers` servers of
/// `workers` workers each (what a client of that cluster computes; no cluster is needed).
#[pyfunction]
fn metadata_server(path: &str, servers: usize, workers: usize) -> PyResult<usize> {
    if servers == 0 || workers == 0 {
        return Err(PyValueError::new_err("servers and workers must be at least 1"));
    }
    Ok(benchfs_core::placement::metadata_target(path, servers, workers).0)
}

/// Times the native client moving `file_size` bytes per path in `transfer_size` transfers,
/// one thread and client per path (the baseline of `benchfs-bench access`); `random`: each
/// block once in a shuffled order.
#[pyfunction]
#[pyo3(signature = (registry_dir, config, paths, file_size, transfer_size, direction, fsync=false, random=false))]
#[allow(clippy::too_many_arguments)]
fn bench_transfers<'py>(
    py: Python<'py>,
    registry_dir: PathBuf,
    config: &str,
    paths: Vec<String>,
    file_size: u64,
    transfer_size: u64,
    direction: &str,
    fsync: bool,
    random: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = TransferSpec {
        registry_dir,
        config: Config::from_toml(config).map_err(to_py)?,
        paths,
        file_size,
        transfer_size,
        direction: Direction::parse(direction).map_err(to_py)?,
        fsync,
        random,
    };
    let r = py.detach(|| run_transfers(&spec)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("mib_s", r.mib_s())?;
    Ok(d)
}

/// Runs the storage engine alone (no network) at a fixed queue depth; see docs/bench.md.
#[pyfunction]
#[pyo3(signature = (data_dir, pattern, block_size, queue_depth, total_bytes, chunk_size, direct_write, direct_read, layout="chunkfile", dataset_bytes=None, submit_timer_us=0))]
#[allow(clippy::too_many_arguments)]
fn bench_storage<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    pattern: &str,
    block_size: u64,
    queue_depth: u32,
    total_bytes: u64,
    chunk_size: u64,
    direct_write: bool,
    direct_read: bool,
    layout: &str,
    dataset_bytes: Option<u64>,
    submit_timer_us: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let layout = format!("storage.layout={layout}");
    let mut config = config::resolve(None, &BTreeMap::new(), &[layout]).map_err(to_py)?;
    config.storage.direct_write = direct_write;
    config.storage.direct_read = direct_read;
    let spec = StorageBenchSpec {
        data_dir,
        pattern: Pattern::parse(pattern).map_err(to_py)?,
        block_size,
        queue_depth,
        total_bytes,
        dataset_bytes: dataset_bytes.unwrap_or(total_bytes),
        chunk_size,
        storage: config.storage,
        submit_hold: (submit_timer_us > 0).then(|| Duration::from_micros(submit_timer_us)),
    };
    let r = py.detach(|| bench::bench_storage(&spec)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("mib_s", r.mib_s())?;
    d.set_item("ops", r.ops)?;
    d.set_item("p50_us", r.p50_us)?;
    d.set_item("p99_us", r.p99_us)?;
    d.set_item("mean_inflight", r.mean_inflight)?;
    d.set_item("share_depth1", r.share_depth1)?;
    d.set_item("mean_batch", r.mean_batch)?;
    Ok(d)
}

/// The server's storage path without the network with telemetry off, with snapshots and with
/// per-operation traces, alternating in blocks: CPU time per read for `benchfs-bench
/// analysis`; see docs/bench.md.
#[pyfunction]
#[pyo3(signature = (data_dir, telemetry_dir, rounds, ops_per_block, block_size=4096, queue_depth=16, dataset_bytes=64 << 20, chunk_size=1 << 20, interval_ms=100, trace_records=65536))]
#[allow(clippy::too_many_arguments)]
fn bench_telemetry<'py>(
    py: Python<'py>,
    data_dir: PathBuf,
    telemetry_dir: PathBuf,
    rounds: u32,
    ops_per_block: u64,
    block_size: u64,
    queue_depth: u32,
    dataset_bytes: u64,
    chunk_size: u64,
    interval_ms: u64,
    trace_records: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = bench::TelemetryBenchSpec {
        data_dir,
        telemetry_dir,
        rounds,
        ops_per_block,
        block_size,
        queue_depth,
        dataset_bytes,
        chunk_size,
        interval_ms,
        trace_records,
        storage: Config::default().storage,
    };
    let r = py.detach(|| bench::bench_telemetry(&spec)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("seconds", r.seconds)?;
    for m in &r.modes {
        let e = PyDict::new(py);
        e.set_item("cpu_ns_per_op", m.cpu_ns_per_op.clone())?;
        e.set_item("ops", m.ops)?;
        e.set_item("snapshots", m.snapshots)?;
        e.set_item("trace_records", m.trace_records)?;
        e.set_item("trace_dropped", m.trace_dropped)?;
        d.set_item(m.mode.name(), e)?;
    }
    Ok(d)
}

/// One rank's phase of the built-in IOR workload on an open file: the transfer loop, pattern
/// and check run in Rust with the GIL released (see benchfs_core::ior and docs/workloads.md).
#[pyfunction]
#[pyo3(signature = (file, direction, segments, block_size, transfer_size, tasks, file_per_proc, data_rank, verify=false, stonewall_s=0.0, max_ops=None, fsync=false, first_op=0))]
#[allow(clippy::too_many_arguments)]
fn ior_phase<'py>(
    py: Python<'py>,
    file: &Bound<'py, PyFile>,
    direction: &str,
    segments: u64,
    block_size: u64,
    transfer_size: u64,
    tasks: u64,
    file_per_proc: bool,
    data_rank: u64,
    verify: bool,
    stonewall_s: f64,
    max_ops: Option<u64>,
    fsync: bool,
    first_op: u64,
) -> PyResult<Bound<'py, PyDict>> {
    if !stonewall_s.is_finite() || stonewall_s < 0.0 {
        return Err(PyValueError::new_err("stonewall_s must be a non-negative number"));
    }
    let spec = ior::PhaseSpec {
        geometry: ior::Geometry {
            segments,
            block_size,
            transfer_size,
            tasks,
            file_per_proc,
            data_rank,
        },
        direction: Direction::parse(direction).map_err(to_py)?,
        verify,
        stonewall: (stonewall_s > 0.0).then(|| Duration::from_secs_f64(stonewall_s)),
        first_op,
        max_ops,
        fsync,
    };
    spec.geometry.validate().map_err(to_py)?;
    let r = file.get().with(py, |c, f| ior::run_phase(c, f, &spec))?;
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("ops", r.ops)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("stonewalled", r.stonewalled)?;
    d.set_item("lat_mean_s", r.lat_mean_s)?;
    d.set_item("lat_min_s", r.lat_min_s)?;
    d.set_item("lat_p50_s", r.lat_p50_s)?;
    d.set_item("lat_p99_s", r.lat_p99_s)?;
    d.set_item("lat_max_s", r.lat_max_s)?;
    d.set_item("fsync_s", r.fsync_s)?;
    d.set_item("mismatched_words", r.mismatched_words)?;
    match &r.first_mismatch {
        Some(m) => {
            let e = PyDict::new(py);
            e.set_item("offset", m.offset)?;
            e.set_item("expected", m.expected)?;
            e.set_item("found", m.found)?;
            e.set_item("message", m.describe())?;
            d.set_item("first_mismatch", e)?;
        }
        None => d.set_item("first_mismatch", py.None())?,
    }
    Ok(d)
}

/// A telemetry file with chosen contents, written by the core's own writer (for tests and
/// studies; see `benchfs_tools::synthetic`).
#[pyclass(name = "SyntheticTelemetry", module = "benchfs._core", unsendable)]
struct PySyntheticTelemetry {
    inner: SyntheticTelemetry,
}

#[pymethods]
impl PySyntheticTelemetry {
    /// A server worker's file (`source="server"`, format version 1) or a client's
    /// (`source="client"`, version 2, for the servers `targets`) in `directory`.
    #[new]
    #[pyo3(signature = (directory, source, id, worker=0, node="node-0", targets=None))]
    fn new(
        directory: PathBuf,
        source: &str,
        id: u32,
        worker: u32,
        node: &str,
        targets: Option<Vec<u32>>,
    ) -> PyResult<Self> {
        let inner = match (source, targets) {
            ("server", None) => SyntheticTelemetry::server(&directory, id, worker, node),
            ("client", Some(t)) => SyntheticTelemetry::client(&directory, id, worker, node, &t),
            ("server", Some(_)) => return Err(PyValueError::new_err("a server file has no targets")),
            ("client", None) => return Err(PyValueError::new_err("a client file needs targets")),
            (other, _) => return Err(PyValueError::new_err(format!("unknown source {other:?}"))),
        }
        .map_err(to_py)?;
        Ok(PySyntheticTelemetry { inner })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }

    #[pyo3(signature = (name, value, op=None, target=None))]
    fn add(&mut self, name: &str, value: u64, op: Option<&str>, target: Option<u32>) -> PyResult<()> {
        self.inner.add(name, value, op, target).map_err(to_py)
    }

    #[pyo3(signature = (name, value, op=None, target=None))]
    fn set(&mut self, name: &str, value: u64, op: Option<&str>, target: Option<u32>) -> PyResult<()> {
        self.inner.set(name, value, op, target).map_err(to_py)
    }

    #[pyo3(signature = (name, values, op=None, target=None))]
    fn record(
        &mut self,
        name: &str,
        values: Vec<u64>,
        op: Option<&str>,
        target: Option<u32>,
    ) -> PyResult<()> {
        self.inner.record(name, &values, op, target).map_err(to_py)
    }

    fn snapshot(&mut self, t_ns: u64) -> PyResult<()> {
        self.inner.snapshot(t_ns).map_err(to_py)
    }
}

/// One trace record: (t_ns, op, total_ns, queue_ns, device_ns, file_id, chunk, bytes, server,
/// worker, error).
type TraceTuple = (u64, String, u64, u64, u64, u128, u64, u64, u32, u16, bool);

/// Writes `records` as the trace file `server-<server>-w<worker>.trace` in `directory` with the
/// core's trace writer; returns its path.
#[pyfunction]
fn write_trace(
    directory: PathBuf,
    server: u32,
    worker: u32,
    node: &str,
    records: Vec<TraceTuple>,
) -> PyResult<PathBuf> {
    let records = records
        .into_iter()
        .map(
            |(t_ns, op, total_ns, queue_ns, device_ns, file, chunk, bytes, server, worker, error)| {
                let op = OpKind::ALL
                    .into_iter()
                    .find(|k| k.name() == op)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown op {op:?}")))?;
                Ok(TraceRecord {
                    t_ns,
                    queue_ns,
                    device_ns,
                    total_ns,
                    file,
                    chunk,
                    bytes,
                    server,
                    worker,
                    op: op as u8,
                    flags: if error { TRACE_FLAG_ERROR } else { 0 },
                })
            },
        )
        .collect::<PyResult<Vec<_>>>()?;
    synthetic::write_trace(&directory, server, worker, node, &records).map_err(to_py)
}

/// `perf script` output folded into stacks, one line per stack: `comm-pid;outer;...;leaf N`.
#[pyfunction]
fn fold_perf_script(py: Python<'_>, script: &[u8]) -> PyResult<String> {
    py.detach(|| benchfs_tools::profile::fold_perf_script(script))
        .map_err(|e| PyValueError::new_err(format!("perf script output not folded: {e}")))
}

/// A flame graph (SVG text) of folded stacks (`outer;...;leaf N` per line).
#[pyfunction]
#[pyo3(signature = (folded, title, subtitle=None))]
fn flame_graph_svg(py: Python<'_>, folded: &str, title: &str, subtitle: Option<&str>) -> PyResult<String> {
    py.detach(|| benchfs_tools::profile::flame_graph_svg(folded, title, subtitle))
        .map_err(|e| PyValueError::new_err(format!("no flame graph of {title}: {e}")))
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("JOB_SECRET_FILE", registry::SECRET_FILE)?;
    m.add_function(wrap_pyfunction!(resolve_config, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(metadata_server, m)?)?;
    m.add_function(wrap_pyfunction!(config_with_overrides, m)?)?;
    m.add_function(wrap_pyfunction!(wait_for_servers, m)?)?;
    m.add_function(wrap_pyfunction!(bench_storage, m)?)?;
    m.add_function(wrap_pyfunction!(bench_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(bench_transfers, m)?)?;
    m.add_function(wrap_pyfunction!(ior_phase, m)?)?;
    m.add_class::<PyServer>()?;
    m.add_class::<PyClient>()?;
    m.add_class::<PyFile>()?;
    m.add_class::<PyPlacementStudy>()?;
    m.add_class::<PySyntheticTelemetry>()?;
    m.add_function(wrap_pyfunction!(write_trace, m)?)?;
    m.add_function(wrap_pyfunction!(fold_perf_script, m)?)?;
    m.add_function(wrap_pyfunction!(flame_graph_svg, m)?)?;
    Ok(())
}
