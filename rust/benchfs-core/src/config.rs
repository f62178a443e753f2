//! The one configuration of BenchFS. Defaults live here and nowhere else; the daemon, the client
//! and the Python tools all resolve it through [`resolve`]:
//! built-in defaults < TOML file < `BENCHFS_*` environment variables < explicit overrides.
//!
//! [`Config`] holds the file system's sections. The same file also holds the tools' sections
//! ([`TOOL_SECTIONS`], typed in `benchfs_tools::config`): the file system skips them, and the
//! tools resolve the whole file with [`resolve_with`], one resolver for both.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::size::parse_size;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub layout: LayoutConfig,
    pub client: ClientConfig,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub network: NetworkConfig,
    pub telemetry: TelemetryConfig,
}

/// Membership: where servers register and how many a client waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Directory where servers publish their addresses (one per job).
    pub registry_dir: String,
    /// Servers a client waits for before starting; 0 means "not set".
    pub expected_servers: u32,
    /// How long a client waits for the expected membership, and then for its servers'
    /// answers to its hellos.
    pub connect_timeout_s: f64,
    /// Servers a client greets at once while connecting (the rest wait for a slot).
    pub connect_parallel: u32,
    /// Connect to every server when the client starts, failing at once if any cannot be
    /// reached; off, a client connects to each server on its first request there.
    pub connect_at_start: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            registry_dir: String::new(),
            expected_servers: 0,
            connect_timeout_s: 30.0,
            connect_parallel: 64,
            connect_at_start: false,
        }
    }
}

/// How files are laid out over the servers: decided by the servers, and returned to clients
/// with each file's layout (a client's own value has no effect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LayoutConfig {
    /// Bytes per chunk; a file's byte range is split on these boundaries.
    pub chunk_size: u64,
    /// Copies of each chunk of a file created from now on, on servers of distinct failure
    /// domains (1 to 3).
    pub replicas: u8,
    /// A file created from now on keeps its bytes with its inode at its metadata owner while
    /// it is at most this long (one request to write or read it, no chunk file); it moves into
    /// chunks when it grows past it. 0: every file has chunks. At most 32 KiB.
    pub inline_max: u64,
}

impl Default for LayoutConfig {
    fn default() -> Self {
        LayoutConfig {
            chunk_size: 4 << 20,
            replicas: 1,
            inline_max: 8 << 10,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// Chunk requests one client keeps in flight at most.
    pub max_inflight: u32,
    /// Requests one client keeps in flight to any one server worker at most.
    pub max_inflight_per_server: u32,
    /// Time after which a request counts as failed.
    pub request_timeout_s: f64,
    /// Retries of an idempotent request (read, fsync, truncate, stat, readdir, directory entry
    /// removal) after a timeout; writes are never retried after a timeout (a late original
    /// could land after a newer write).
    pub max_retries: u32,
    /// First retry delay; doubles per retry, with full jitter.
    pub retry_backoff_ms: u64,
    /// Bytes a client keeps in flight ahead of its sequential readers, in all (0: none). A
    /// handle whose read starts where its previous read ended asks for the chunks after it.
    /// The default is studies/pipeline's best (docs/storage.md).
    pub read_ahead: u64,
    /// Bytes of writes the clients of a process may have handed to its write-behind thread
    /// and not yet had answered, in all (0: every write waits for its answer). Failures are
    /// returned by the file's next write, fsync, flush or close. Off by default, by
    /// measurement: one writer through the mount is 1.6-2.2x faster with 32 MiB, but parallel
    /// ranks gain nothing and the deep server queues it makes let the analysis judge a healthy
    /// node slow (docs/storage.md).
    pub write_behind: u64,
    /// `write_behind` for the mount (`benchfs-mount`), whose daemon outlives the programs
    /// that write through it: on by default, by measurement (`benchfs-bench access`'s
    /// mount-writer cases; docs/storage.md).
    pub mount_write_behind: u64,
    /// Host directories, `:`-separated, where this namespace is seen besides `$BENCHFS_MOUNT`
    /// and the interposition library's prefix: a link's absolute target under one of them
    /// is followed inside BenchFS (docs/namespace.md). `/` makes every absolute target a
    /// path in BenchFS.
    pub link_roots: String,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_inflight: 16,
            max_inflight_per_server: 8,
            request_timeout_s: 30.0,
            max_retries: 2,
            retry_backoff_ms: 50,
            read_ahead: 32 << 20,
            write_behind: 0,
            mount_write_behind: 32 << 20,
            link_roots: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Event-loop threads per server, each with its own io_uring and UCX worker.
    pub workers: u32,
    /// Requests served at once per worker (a fixed set of service tasks, never a spawn per
    /// request).
    pub max_in_service: u32,
    /// Requests waiting beyond those; further requests are refused with EAGAIN.
    pub max_queued: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 1,
            max_in_service: 32,
            max_queued: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Page-aligned buffers of `layout.chunk_size` bytes per server worker (the memory bound).
    pub buffer_count: u32,
    /// io_uring submission queue entries per server worker.
    pub ring_entries: u32,
    /// On-disk layout: one file per chunk, or chunks packed in large files.
    pub layout: DiskLayout,
    /// When data and metadata are on stable storage (docs/storage.md).
    pub durability: Durability,
    /// O_DIRECT for writes (bypass the page cache); unaligned heads and tails handled.
    pub direct_write: bool,
    /// O_DIRECT for reads.
    pub direct_read: bool,
    /// Open chunk files kept per worker (bounded handle cache).
    pub handle_cache: u32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            buffer_count: 32,
            ring_entries: 256,
            layout: DiskLayout::Chunkfile,
            durability: Durability::None,
            // Measured here (docs/storage.md): direct writes 1093 vs buffered 279 MiB/s once
            // writeback throttles; buffered sequential reads 1590 vs direct 1207 MiB/s.
            direct_write: true,
            direct_read: false,
            handle_cache: 512,
        }
    }
}

/// `storage.layout`: how chunks are kept on a server's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskLayout {
    /// One file per chunk.
    Chunkfile,
    /// Chunks in large preallocated files.
    Packed,
    /// Nothing kept, for benchmarks of the protocol alone: a write is answered once received
    /// and its bytes dropped; a read answers with as many bytes as asked, of no meaning.
    Discard,
}

/// `storage.durability`: when what a client wrote is on stable storage. Every mode but
/// `memory` survives a server process crash (metadata commits reach the kernel before the
/// reply); they differ in what survives a machine crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Metadata is kept in memory only: a restarted server has forgotten its names (the
    /// fastest metadata; for jobs that never restart a server).
    Memory,
    /// Data and metadata reach stable storage when the kernel writes them back (or at an
    /// explicit fsync, for data).
    None,
    /// Every metadata change is on stable storage before its reply; data when `fsync` returns.
    Fsync,
    /// As `fsync`, and `close` of a file that was written also makes its data durable first
    /// (IO500's rule: durable when close returns).
    Close,
}

/// The UCX transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// UCX transports (`UCX_TLS` syntax, e.g. "tcp", "shm,self"); empty: UCX chooses.
    pub transports: String,
    /// Payload size from which UCX uses rendezvous (zero-copy into the receiver's buffer);
    /// 0: UCX's own threshold.
    pub rndv_threshold: u64,
    /// Detect failed peers so their requests fail instead of hanging until the timeout. UCX
    /// 1.13's shared-memory transports cannot do this, so `false` is needed to use them.
    pub peer_error_handling: bool,
    /// Microseconds an event loop keeps polling after activity before it sleeps in the
    /// kernel (a wake-up costs tens of microseconds); 0 never spins. Idle loops never spin.
    pub spin_us: u64,
    /// UCX's newer protocol selection (`UCX_PROTO_ENABLE`). Off: UCX 1.22 then moves BenchFS's
    /// chunks as fast as 1.13 did; on, 4 MiB transfers over TCP ran at 0.6x (docs/bench.md).
    pub ucx_proto_v2: bool,
    /// UCX TCP's send and receive segment (`UCX_TCP_TX_SEG_SIZE`, `UCX_TCP_RX_SEG_SIZE`): the
    /// largest piece a payload moves in, each one receive and one handler call. 0: UCX's
    /// (8 KiB and 64 KiB). 256 KiB by measurement (docs/bench.md); a `UCX_TCP_*` variable
    /// set in the environment wins.
    pub tcp_segment_size: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            transports: String::new(),
            rndv_threshold: 0,
            peer_error_handling: true,
            spin_us: 50,
            ucx_proto_v2: false,
            tcp_segment_size: 256 << 10,
        }
    }
}

impl NetworkConfig {
    /// The UCX settings this section asks for.
    pub fn worker_options(&self) -> benchfs_ucx::WorkerOptions {
        benchfs_ucx::WorkerOptions {
            transports: (!self.transports.is_empty()).then(|| self.transports.clone()),
            rndv_threshold: (self.rndv_threshold > 0).then_some(self.rndv_threshold),
            proto_v2: self.ucx_proto_v2,
            tcp_segment_size: (self.tcp_segment_size > 0).then_some(self.tcp_segment_size),
            serialized: false,
        }
    }
}

/// Always-on counters and histograms, and where servers write their snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Record histograms and counters (off only to measure their overhead).
    pub enabled: bool,
    /// Directory for snapshot files; empty means keep counters in memory only.
    pub dir: String,
    /// Snapshot period in milliseconds (100 to 60000).
    pub interval_ms: u64,
    /// Per-operation trace records on servers (`<dir>/server-<id>-w<worker>.trace`).
    pub trace: bool,
    /// Trace records buffered per server worker between two snapshots (more are dropped and
    /// counted): the bound on the trace's memory, 72 bytes each.
    pub trace_records: u64,
}

/// Upper bound of `telemetry.trace_records` (16 Mi records = 1.2 GiB per worker).
pub const MAX_TRACE_RECORDS: u64 = 1 << 24;

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            enabled: true,
            dir: String::new(),
            interval_ms: 1000,
            trace: false,
            trace_records: 65536,
        }
    }
}

/// Environment variables with short names, kept for the launch scripts' convenience.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("BENCHFS_REGISTRY", "cluster.registry_dir"),
    ("BENCHFS_EXPECTED_SERVERS", "cluster.expected_servers"),
];

/// Names the configuration file when no path is given.
pub const CONFIG_ENV: &str = "BENCHFS_CONFIG";

impl Config {
    /// Checks the relations between keys that types alone do not express.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.to_string()));
        if self.layout.chunk_size == 0 || self.layout.chunk_size > (1 << 30) {
            return bad("layout.chunk_size must be between 1 byte and 1 GiB");
        }
        if !(1..=crate::placement::MAX_REPLICAS).contains(&self.layout.replicas) {
            return bad("layout.replicas must be 1, 2 or 3");
        }
        if self.layout.inline_max > crate::protocol::meta::INLINE_LIMIT as u64 {
            return bad("layout.inline_max must be at most 32 KiB (32768 bytes)");
        }
        if self.client.max_inflight == 0 || self.client.max_inflight_per_server == 0 {
            return bad("client.max_inflight and client.max_inflight_per_server must be at least 1");
        }
        if self.client.read_ahead > (1 << 30) {
            return bad("client.read_ahead must be at most 1 GiB");
        }
        if self.client.write_behind > (1 << 30) {
            return bad("client.write_behind must be at most 1 GiB");
        }
        if self.client.mount_write_behind > (1 << 30) {
            return bad("client.mount_write_behind must be at most 1 GiB");
        }
        if let Some(bad_root) = self
            .client
            .link_roots
            .split(':')
            .find(|r| !r.is_empty() && !r.starts_with('/'))
        {
            return Err(Error::Config(format!(
                "client.link_roots: {bad_root:?} is not an absolute path"
            )));
        }
        if self.client.max_retries > 10 {
            return bad("client.max_retries must be at most 10");
        }
        if self.cluster.connect_parallel == 0 {
            return bad("cluster.connect_parallel must be at least 1");
        }
        if self.network.spin_us > 10_000 {
            return bad("network.spin_us must be at most 10000");
        }
        let segment = self.network.tcp_segment_size;
        if segment != 0 && !(8 << 10..=16 << 20).contains(&segment) {
            return bad("network.tcp_segment_size must be 0 (UCX's) or 8K to 16M");
        }
        if self.network.transports.contains(char::is_whitespace) {
            return bad("network.transports is a comma-separated list without spaces");
        }
        if self.client.request_timeout_s.is_nan() || self.client.request_timeout_s <= 0.0 {
            return bad("client.request_timeout_s must be positive");
        }
        if self.cluster.connect_timeout_s.is_nan() || self.cluster.connect_timeout_s < 0.0 {
            return bad("cluster.connect_timeout_s must not be negative");
        }
        if self.server.max_in_service == 0 {
            return bad("server.max_in_service must be at least 1");
        }
        if self.server.workers == 0 || self.server.workers > 64 {
            return bad("server.workers must be between 1 and 64");
        }
        if self.storage.handle_cache == 0 {
            return bad("storage.handle_cache must be at least 1");
        }
        if !(100..=60_000).contains(&self.telemetry.interval_ms) {
            return bad("telemetry.interval_ms must be between 100 and 60000");
        }
        if !(1..=MAX_TRACE_RECORDS).contains(&self.telemetry.trace_records) {
            return bad("telemetry.trace_records must be between 1 and 16777216");
        }
        if self.telemetry.trace && !self.telemetry.enabled {
            return bad("telemetry.trace needs telemetry.enabled = true");
        }
        if self.storage.buffer_count == 0 {
            return bad("storage.buffer_count must be at least 1");
        }
        if !self.storage.ring_entries.is_power_of_two() || self.storage.ring_entries > 32768 {
            return bad("storage.ring_entries must be a power of two up to 32768");
        }
        Ok(())
    }

    /// The effective configuration as TOML (what goes into every results directory), headed
    /// by [`EFFECTIVE_HEADER`]: read back, it is taken as it is, without the environment.
    pub fn to_toml(&self) -> String {
        effective_toml(self, &FsOnly {})
    }

    /// Parses a complete or partial TOML text over the defaults, without env or overrides
    /// (an effective configuration: what `to_toml` wrote, or what a client was handed).
    pub fn from_toml(text: &str) -> Result<Config> {
        from_toml_with::<FsOnly>(text).map(|(config, _)| config)
    }
}

/// The effective configuration of the file system's and `more` sections as TOML, headed by
/// [`EFFECTIVE_HEADER`].
pub fn effective_toml<X: Serialize>(config: &Config, more: &X) -> String {
    #[derive(Serialize)]
    struct Both<'a, X> {
        #[serde(flatten)]
        fs: &'a Config,
        #[serde(flatten)]
        more: &'a X,
    }
    match toml::to_string(&Both { fs: config, more }) {
        Ok(body) => format!("{EFFECTIVE_HEADER}\n{body}"),
        Err(e) => format!("# cannot serialise config: {e}\n"),
    }
}

/// [`Config::from_toml`] with `X`'s sections too.
pub fn from_toml_with<X: Sections>(text: &str) -> Result<(Config, X)> {
    let mut r = Resolver::new::<X>()?;
    let file: toml::Table =
        toml::from_str(text).map_err(|e| Error::Config(format!("malformed TOML: {e}")))?;
    r.merge_table(file, "configuration text")?;
    r.finish()
}

/// First line of an effective configuration ([`Config::to_toml`]). A file that starts with it
/// is complete and already has every layer applied, so [`resolve`] does not apply the
/// `BENCHFS_*` variables over it again (only explicit overrides): every process a run starts
/// with it runs exactly what the run recorded.
pub const EFFECTIVE_HEADER: &str =
    "# BenchFS effective configuration: complete; BENCHFS_* variables are not applied over it \
     (delete this line to use it as a base)";

/// Keys whose values are byte sizes: integers, or strings such as "4M" ([`parse_size`]).
pub const SIZE_KEYS: &[&str] = &[
    "layout.chunk_size",
    "layout.inline_max",
    "network.rndv_threshold",
    "network.tcp_segment_size",
    "client.read_ahead",
    "client.write_behind",
    "client.mount_write_behind",
];

/// Sections of the configuration file that the tools own: the file system skips them.
pub const TOOL_SECTIONS: &[&str] = &["run", "diagnose", "insights"];

/// More sections of the configuration file, resolved with the file system's by the one
/// resolver ([`resolve_with`]): the tools' sections. Their defaults are `Default`, their keys
/// and types those of the serialised struct.
pub trait Sections: Serialize + DeserializeOwned + Default {
    /// Keys whose values are byte sizes (as [`SIZE_KEYS`]).
    const SIZE_KEYS: &'static [&'static str] = &[];
    /// Short environment variables for some of the keys: (variable, "section.key").
    const ENV_ALIASES: &'static [(&'static str, &'static str)] = &[];
    /// Checks the relations between keys that types alone do not express.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// The file system's sections alone: a file's [`TOOL_SECTIONS`] are skipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct FsOnly {}

impl Sections for FsOnly {}

/// Old names still accepted, each with a one-line notice: (old, new).
const RENAMED: &[(&str, &str)] = &[("client.chunk_size", "layout.chunk_size")];

/// Keys no longer read, still accepted in files (a results directory's recorded config.toml
/// keeps them) with a one-line notice: (key, what replaced it).
const RETIRED: &[(&str, &str)] = &[
    ("insights.slow_node_pct", "the judgment of a run, [diagnose]"),
    ("insights.slow_node_factor", "the judgment of a run, [diagnose]"),
];

/// Each renamed or retired key's notice is printed once per process.
static NOTICED: Mutex<Vec<&str>> = Mutex::new(Vec::new());

/// Whether `name` is a retired key (telling the user once): its value is then ignored.
fn retired(name: &str, origin: &str) -> bool {
    let Some(&(old, now)) = RETIRED.iter().find(|(old, _)| *old == name) else {
        return false;
    };
    let mut noticed = NOTICED.lock().unwrap_or_else(PoisonError::into_inner);
    if !noticed.contains(&old) {
        noticed.push(old);
        crate::warn_line!("benchfs: {old} (from {origin}) is no longer used ({now}); it is ignored");
    }
    true
}

/// The current name of `name`, telling the user once if it is an old one.
fn current_name(name: &str, origin: &str) -> String {
    let Some(&(old, new)) = RENAMED.iter().find(|(old, _)| *old == name) else {
        return name.to_string();
    };
    let mut noticed = NOTICED.lock().unwrap_or_else(PoisonError::into_inner);
    if !noticed.contains(&old) {
        noticed.push(old);
        crate::warn_line!("benchfs: {old} (from {origin}) is now called {new}; the old name will go");
    }
    new.to_string()
}

/// Builds one configuration: the defaults' table, each value merged over it with where it came
/// from, so every error names the key, its value and its source.
struct Resolver {
    table: toml::Table,
    /// "section.key" -> the source of its value (a file, a variable, "override").
    origins: BTreeMap<String, String>,
    /// The sections that are `X`'s, not the file system's.
    more: Vec<String>,
    size_keys: Vec<&'static str>,
    env_aliases: Vec<(&'static str, &'static str)>,
}

impl Resolver {
    /// The defaults of the file system's sections and of `X`'s.
    fn new<X: Sections>() -> Result<Resolver> {
        let defaults = |r: std::result::Result<toml::Table, toml::ser::Error>| {
            r.map_err(|e| Error::Config(format!("cannot build defaults: {e}")))
        };
        let mut table = defaults(toml::Table::try_from(Config::default()))?;
        let more = defaults(toml::Table::try_from(X::default()))?;
        let more_names = more.keys().cloned().collect();
        table.extend(more);
        Ok(Resolver {
            table,
            origins: BTreeMap::new(),
            more: more_names,
            size_keys: [SIZE_KEYS, X::SIZE_KEYS].concat(),
            env_aliases: [ENV_ALIASES, X::ENV_ALIASES].concat(),
        })
    }

    /// A key of a tool section when the tools' sections are not being resolved: skipped.
    fn skipped(&self, name: &str) -> bool {
        let section = name.split_once('.').map_or(name, |(s, _)| s);
        TOOL_SECTIONS.contains(&section) && !self.table.contains_key(section)
    }

    /// Merges a parsed file (`origin` names it): sections and keys must exist in the defaults.
    fn merge_table(&mut self, over: toml::Table, origin: &str) -> Result<()> {
        for (section, value) in over {
            if self.skipped(&section) {
                continue;
            }
            let toml::Value::Table(keys) = value else {
                return Err(Error::Config(format!(
                    "{section} must be a table [{section}] (from {origin})"
                )));
            };
            for (key, value) in keys {
                self.set(&format!("{section}.{key}"), value, origin)?;
            }
        }
        Ok(())
    }

    /// Sets "section.key" from a string typed as people type it (a variable or an override):
    /// a string key takes it as is, any other key parses it as a TOML value.
    fn set_str(&mut self, name: &str, raw: &str, origin: &str) -> Result<()> {
        let name = current_name(name, origin);
        if self.skipped(&name) || retired(&name, origin) {
            return Ok(());
        }
        let is_size = self.size_keys.contains(&name.as_str());
        let value = match self.slot(&name, origin)? {
            toml::Value::String(_) => toml::Value::String(raw.to_string()),
            _ if is_size => toml::Value::String(raw.to_string()),
            _ => {
                let doc: toml::Table = toml::from_str(&format!("v = {raw}")).map_err(|_| {
                    Error::Config(format!("{name} = {raw:?} (from {origin}) is not a valid value"))
                })?;
                doc.get("v")
                    .cloned()
                    .ok_or_else(|| Error::Config(format!("{name}: empty value (from {origin})")))?
            }
        };
        self.set(&name, value, origin)
    }

    fn slot(&mut self, name: &str, origin: &str) -> Result<&mut toml::Value> {
        let unknown = || Error::Config(format!("unknown key {name} (from {origin})"));
        let (section, key) = name.split_once('.').ok_or_else(unknown)?;
        self.table
            .get_mut(section)
            .and_then(toml::Value::as_table_mut)
            .and_then(|s| s.get_mut(key))
            .ok_or_else(unknown)
    }

    /// Sets "section.key" to `value`, converted to the default's type: integers where floats
    /// are expected, size strings for the size keys; anything else of another type, a negative
    /// number for an unsigned key or a bad size is refused, naming the key and its source.
    fn set(&mut self, name: &str, value: toml::Value, origin: &str) -> Result<()> {
        use toml::Value as V;
        let name = current_name(name, origin);
        if self.skipped(&name) || retired(&name, origin) {
            return Ok(());
        }
        let is_size = self.size_keys.contains(&name.as_str());
        let slot = self.slot(&name, origin)?;
        let bad = |why: String| Error::Config(format!("{name} = {value} (from {origin}): {why}"));
        let typed = match (&*slot, &value) {
            (V::Integer(_), V::String(text)) if is_size => {
                let bytes = parse_size(text).map_err(bad)?;
                V::Integer(i64::try_from(bytes).map_err(|_| bad("too large".into()))?)
            }
            (V::Integer(_), V::Integer(i)) if *i < 0 => {
                return Err(bad("must not be negative".into()));
            }
            (V::Float(_), V::Integer(i)) => V::Float(*i as f64),
            (d, v) if std::mem::discriminant(d) == std::mem::discriminant(v) => value.clone(),
            (d, v) => {
                let sizes = if is_size { " or a size such as \"4M\"" } else { "" };
                return Err(bad(format!(
                    "must be {}{sizes}, not {}",
                    d.type_str(),
                    v.type_str()
                )));
            }
        };
        *slot = typed;
        self.origins.insert(name, origin.to_string());
        Ok(())
    }

    /// The typed configuration, checked: a value serde refuses (out of range, not one of an
    /// enum's names) is reported with its key and source.
    fn finish<X: Sections>(self) -> Result<(Config, X)> {
        let Resolver {
            mut table,
            origins,
            more,
            ..
        } = self;
        let origin = |name: &str| origins.get(name).map_or("the defaults", String::as_str);
        let more_table: toml::Table = more
            .iter()
            .filter_map(|name| table.remove(name).map(|v| (name.clone(), v)))
            .collect();
        let refused = |e: serde_path_to_error::Error<toml::de::Error>| {
            let name = e.path().to_string();
            let why = plain(e.inner().message());
            Error::Config(format!("{name} (from {}): {why}", origin(&name)))
        };
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(refused)?;
        let extra: X = serde_path_to_error::deserialize(toml::Value::Table(more_table)).map_err(refused)?;
        // A relation or range check names its key first: add where that key's value came from.
        let sourced = |e: Error| match e {
            Error::Config(m) => {
                let key = m.split_whitespace().next().unwrap_or_default();
                match origins.get(key) {
                    Some(from) => Error::Config(format!("{m} (from {from})")),
                    None => Error::Config(m),
                }
            }
            other => other,
        };
        config.validate().map_err(sourced)?;
        extra.validate().map_err(sourced)?;
        Ok((config, extra))
    }
}

/// serde's words for the two refusals left after [`Resolver::set`] in a user's words:
/// "unknown variant `x`, expected `a` or `b`" and "invalid value: integer `n`, expected u32".
fn plain(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        if let Some((value, allowed)) = rest.split_once(", expected ") {
            let allowed = allowed.replace(" or ", ", ").replace("one of ", "");
            return format!("{value} is not one of {allowed}");
        }
    }
    if let Some(rest) = message.strip_prefix("invalid value: integer ") {
        if let Some((value, kind)) = rest.split_once(", expected ") {
            let max = match kind {
                "u32" => u64::from(u32::MAX),
                _ => u64::MAX,
            };
            return format!("{value} is too large (at most {max})");
        }
    }
    message.to_string()
}

/// Resolves the configuration: defaults < file (`path`, else `$BENCHFS_CONFIG`) < `BENCHFS_*`
/// variables from `env` < `overrides` (`section.key=value`). The variables are skipped for an
/// effective configuration file ([`EFFECTIVE_HEADER`]).
pub fn resolve(path: Option<&Path>, env: &BTreeMap<String, String>, overrides: &[String]) -> Result<Config> {
    resolve_with::<FsOnly>(path, env, overrides).map(|(config, _)| config)
}

/// [`resolve`] with `X`'s sections too.
pub fn resolve_with<X: Sections>(
    path: Option<&Path>,
    env: &BTreeMap<String, String>,
    overrides: &[String],
) -> Result<(Config, X)> {
    let mut r = Resolver::new::<X>()?;
    let env_path = env.get(CONFIG_ENV).filter(|p| !p.is_empty()).map(Path::new);
    let mut effective = false;
    if let Some(file) = path.or(env_path) {
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::io(format!("configuration file {}", file.display()), e))?;
        let over: toml::Table = toml::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: malformed TOML: {e}", file.display())))?;
        r.merge_table(over, &file.display().to_string())?;
        effective = text.starts_with(EFFECTIVE_HEADER);
    }
    if !effective {
        r.apply_env(env)?;
    }
    r.apply_overrides(overrides)?;
    r.finish()
}

/// An effective configuration's text with `overrides` applied (no environment): for facts
/// only known after resolving, such as a run's directories and shape.
pub fn with_overrides(effective: &str, overrides: &[String]) -> Result<Config> {
    with_overrides_with::<FsOnly>(effective, overrides).map(|(config, _)| config)
}

/// [`with_overrides`] with `X`'s sections too.
pub fn with_overrides_with<X: Sections>(effective: &str, overrides: &[String]) -> Result<(Config, X)> {
    let mut r = Resolver::new::<X>()?;
    let over: toml::Table =
        toml::from_str(effective).map_err(|e| Error::Config(format!("malformed TOML: {e}")))?;
    r.merge_table(over, "configuration text")?;
    r.apply_overrides(overrides)?;
    r.finish()
}

impl Resolver {
    fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<()> {
        // Generic variables: BENCHFS_<SECTION>_<KEY> for every key the defaults have, and the
        // renamed keys' old names.
        let mut names: Vec<String> = self
            .table
            .iter()
            .filter_map(|(s, v)| v.as_table().map(|t| (s, t)))
            .flat_map(|(s, t)| t.keys().map(move |k| format!("{s}.{k}")))
            .collect();
        names.extend(RENAMED.iter().map(|(old, _)| old.to_string()));
        for name in &names {
            let var = format!("BENCHFS_{}", name.replace('.', "_").to_uppercase());
            if let Some(raw) = env.get(&var) {
                self.set_str(name, raw, &var)?;
            }
        }
        for (var, name) in self.env_aliases.clone() {
            if let Some(raw) = env.get(var) {
                self.set_str(name, raw, var)?;
            }
        }
        Ok(())
    }

    fn apply_overrides(&mut self, overrides: &[String]) -> Result<()> {
        for item in overrides {
            let (name, raw) = item
                .split_once('=')
                .filter(|(name, _)| name.contains('.'))
                .ok_or_else(|| Error::Config(format!("override {item:?} is not section.key=value")))?;
            self.set_str(name.trim(), raw.trim(), "override")?;
        }
        Ok(())
    }
}

/// The process environment's `BENCHFS_*` variables.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("BENCHFS_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn precedence_defaults_file_env_override() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[layout]\nchunk_size = 65536\n[client]\nmax_inflight = 4\n",
        )
        .map_err(|e| Error::io("write", e))?;
        let c = resolve(Some(&file), &env(&[]), &[])?;
        assert_eq!(c.layout.chunk_size, 65536);
        assert_eq!(c.client.request_timeout_s, 30.0);
        let c = resolve(Some(&file), &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "8")]), &[])?;
        assert_eq!(c.client.max_inflight, 8);
        let c = resolve(
            Some(&file),
            &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "8"), ("BENCHFS_REGISTRY", "/r")]),
            &["client.max_inflight=2".into()],
        )?;
        assert_eq!(c.client.max_inflight, 2);
        assert_eq!(c.cluster.registry_dir, "/r");
        Ok(())
    }

    #[test]
    fn sizes_as_people_write_them() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[layout]\nchunk_size = \"1MiB\"\n").map_err(|e| Error::io("write", e))?;
        let c = resolve(
            Some(&file),
            &env(&[("BENCHFS_NETWORK_RNDV_THRESHOLD", "64k")]),
            &[],
        )?;
        assert_eq!(
            (c.layout.chunk_size, c.network.rndv_threshold),
            (1 << 20, 64 << 10)
        );
        let c = resolve(None, &env(&[]), &["layout.chunk_size=1M".into()])?;
        assert_eq!(c.layout.chunk_size, 1 << 20);
        // The old name still works, from every source.
        let c = resolve(None, &env(&[("BENCHFS_CLIENT_CHUNK_SIZE", "2M")]), &[])?;
        assert_eq!(c.layout.chunk_size, 2 << 20);
        let c = resolve(None, &env(&[]), &["client.chunk_size=1M".into()])?;
        assert_eq!(c.layout.chunk_size, 1 << 20);
        assert_eq!(
            Config::from_toml("[client]\nchunk_size = \"8M\"\n")?
                .layout
                .chunk_size,
            8 << 20
        );
        // The effective text has plain numbers and the enums' names.
        let text = c.to_toml();
        assert!(text.contains("chunk_size = 1048576") && text.contains("layout = \"chunkfile\""));
        Ok(())
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e = |r: Result<Config>| r.err().map(|e| e.to_string()).unwrap_or_default();
        let over = |o: &str| e(resolve(None, &env(&[]), &[o.to_string()]));
        assert!(e(Config::from_toml("[client]\nchunk_sise = 1\n")).contains("unknown key client.chunk_sise"));
        assert!(
            e(Config::from_toml("[client]\nmax_inflight = \"big\"\n")).contains(
                "client.max_inflight = \"big\" (from configuration text): must be integer, not string"
            )
        );
        assert!(e(Config::from_toml("[layout]\nchunk_size = \"big\"\n"))
            .contains("layout.chunk_size = \"big\" (from configuration text): expected a whole number"));
        assert!(over("client.max_inflight=1.5").contains("client.max_inflight"));
        assert!(over("client.read_ahead=2G").contains("client.read_ahead must be at most 1 GiB"));
        assert!(over("client.write_behind=2G").contains("client.write_behind must be at most 1 GiB"));
        assert!(over("client.write_behind=lots").contains("client.write_behind = \"lots\""));
        assert!(
            over("client.mount_write_behind=2G").contains("client.mount_write_behind must be at most 1 GiB")
        );
        assert!(over("network.tcp_segment_size=4K").contains("network.tcp_segment_size must be 0"));
        assert!(over("network.tcp_segment_size=32M").contains("network.tcp_segment_size must be 0"));
        assert!(e(Config::from_toml("[client\n")).contains("malformed TOML"));
        assert!(e(Config::from_toml("[layout]\nchunk_size = 0\n"))
            .contains("layout.chunk_size must be between 1 byte and 1 GiB (from configuration text)"));
        assert!(over("layout.chunk_size=2G").contains("between 1 byte and 1 GiB (from override)"));
        assert!(e(resolve(
            None,
            &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "x y")]),
            &[]
        ))
        .contains("BENCHFS_CLIENT_MAX_INFLIGHT"));
        assert!(over("nosuch.key=1").contains("unknown key nosuch.key (from override)"));
        assert!(over("nokey=1").contains("is not section.key=value"));
        assert!(e(resolve(Some(Path::new("/nonexistent/c.toml")), &env(&[]), &[]))
            .contains("configuration file /nonexistent/c.toml"));
        // Negative values, bad suffixes and enum names: the key, the value and the source.
        assert_eq!(
            over("client.max_inflight=-5"),
            "invalid configuration: client.max_inflight = -5 (from override): must not be negative"
        );
        assert!(
            e(resolve(None, &env(&[("BENCHFS_LAYOUT_CHUNK_SIZE", "-5")]), &[])).contains(
                "layout.chunk_size = \"-5\" (from BENCHFS_LAYOUT_CHUNK_SIZE): a size must not be negative"
            )
        );
        assert!(over("layout.chunk_size=1X")
            .contains("layout.chunk_size = \"1X\" (from override): unknown suffix"));
        assert_eq!(
            over("storage.layout=striped"),
            "invalid configuration: storage.layout (from override): `striped` is not one of \
             `chunkfile`, `packed`, `discard`"
        );
        assert!(over("storage.submit_policy=timer").contains("storage.submit_policy"));
        assert!(over("client.max_inflight=5000000000")
            .contains("client.max_inflight (from override): `5000000000` is too large (at most 4294967295)"));
        assert!(over("client=1").contains("is not section.key=value"));
    }

    #[test]
    fn effective_config_round_trips() -> Result<()> {
        let c = resolve(
            None,
            &env(&[]),
            &["layout.chunk_size=1024".into(), "storage.layout=packed".into()],
        )?;
        assert_eq!(Config::from_toml(&c.to_toml())?, c);
        Ok(())
    }

    #[test]
    fn an_effective_file_is_read_without_the_environment() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("config.toml");
        let recorded = resolve(None, &env(&[]), &["client.max_inflight=3".into()])?;
        std::fs::write(&file, recorded.to_toml()).map_err(|e| Error::io("write", e))?;
        let vars = env(&[
            ("BENCHFS_CLIENT_MAX_INFLIGHT", "9"),
            ("BENCHFS_SERVER_WORKERS", "7"),
        ]);
        assert_eq!(resolve(Some(&file), &vars, &[])?, recorded);
        let over = resolve(Some(&file), &vars, &["server.workers=5".into()])?;
        assert_eq!((over.client.max_inflight, over.server.workers), (3, 5));
        // A plain file (the header deleted) is a base again.
        let text = recorded.to_toml().replacen(EFFECTIVE_HEADER, "", 1);
        std::fs::write(&file, text).map_err(|e| Error::io("write", e))?;
        assert_eq!(resolve(Some(&file), &vars, &[])?.client.max_inflight, 9);
        let later = with_overrides(&recorded.to_toml(), &["server.workers=4".into()])?;
        assert_eq!((later.client.max_inflight, later.server.workers), (3, 4));
        Ok(())
    }

    /// The file system reads a file written for the tools too: it skips their sections (from
    /// a file, the environment and overrides), and still refuses unknown ones.
    #[test]
    fn the_tools_sections_are_skipped() -> Result<()> {
        let text = "[run]\nservers = 4\nno_such_key = 1\n[diagnose]\nz_threshold = 2.0\n\
                    [client]\nmax_inflight = 5\n";
        assert_eq!(Config::from_toml(text)?.client.max_inflight, 5);
        let vars = env(&[("BENCHFS_RUN_SERVERS", "7"), ("BENCHFS_RESULTS", "/r")]);
        let c = resolve(
            None,
            &vars,
            &["insights.min_ops=3".into(), "client.max_inflight=6".into()],
        )?;
        assert_eq!(c.client.max_inflight, 6);
        assert!(!c.to_toml().contains("[run]"));
        let e = Config::from_toml("[runn]\nservers = 4\n")
            .err()
            .map(|e| e.to_string());
        assert!(e.unwrap_or_default().contains("unknown key runn.servers"));
        Ok(())
    }

    #[test]
    fn size_keys_are_integer_keys() -> Result<()> {
        let r = Resolver::new::<FsOnly>()?;
        for name in SIZE_KEYS {
            let (s, k) = name.split_once('.').unwrap_or_default();
            assert!(r.table[s][k].is_integer(), "{name}");
        }
        Ok(())
    }
}
