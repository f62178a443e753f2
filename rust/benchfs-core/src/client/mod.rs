//! The client: splits byte ranges into chunks, places them on servers, and keeps at most
//! `client.max_inflight` chunk requests in flight. Every request carries a client-unique id and
//! its reply is matched by that id, so concurrent requests never take each other's replies.
//!
//! Memory safety across timeouts: request payloads and read destinations are the caller's
//! buffers, handed to UCX without copies. A request that is abandoned (timeout, or a sibling's
//! error) leaves its UCX operations in `orphans`; before any public call returns, the client
//! force-closes the endpoints of failed servers (which completes their operations with an
//! error) and waits until no UCX operation refers to the caller's memory.

mod capacity;
mod connect;
mod data;
mod find;
mod inline;
mod links;
mod locks;
mod meta_copies;
mod names;
mod netns;
mod put;
mod readahead;
mod replicas;
mod replybuf;
mod rpc;
mod sender;
mod telemetry;
mod window;
mod writebehind;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use benchfs_ucx::Worker;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::namespace::{Attr, Kind};
use crate::placement::Domains;
use crate::registry::{self, RegistryEntry};
use crate::runtime::Runtime;
use crate::telemetry::{ClientMetrics, OpKind};

pub use self::capacity::{ClusterCapacity, ServerCapacity};
use self::connect::Probing;
pub use self::data::FileChecksum;
pub use self::find::FindResult;
pub use self::put::{Check, WholeFile};
use self::readahead::ReadAhead;
pub use self::replicas::{CopiesLeft, Repaired};
use self::rpc::{make_worker, ServerLink, Shared};
use self::telemetry::ClientTelemetry;
use self::window::Window;
pub use self::writebehind::write_behind_group;
use self::writebehind::Behind;
pub use crate::lost::{append_lost, read_lost, LostServers, LOST_FILE};

/// An open file: its identity and layout as its owner gave them at open, and what this handle
/// wrote (reported to the owner at fsync and close: close-to-open consistency).
#[derive(Debug)]
pub struct FileHandle {
    pub path: String,
    pub attr: Attr,
    written_end: Cell<u64>,
    reported_end: Cell<u64>,
    /// The size as last seen from the owner.
    known_size: Cell<u64>,
    /// Where this handle's last read ended: a read starting there is sequential.
    next_read: Cell<u64>,
    /// Counts changes to the file's bytes (this handle's writes and truncates, and those of
    /// the handles it is shared with): read-ahead taken before a change is not used after it.
    changes: Arc<AtomicU64>,
    /// Whether writes through this handle were left behind since its last flush.
    behind: Cell<bool>,
    /// The attribute the data path addresses: `attr`, until the handle learns that the file's
    /// bytes moved from its inode into chunks (client/inline.rs).
    placed: Cell<Attr>,
    /// An inline file's bytes as its open found them, and the change count then: its reads
    /// use them until a change through the handles sharing its count (close-to-open).
    at_open: std::cell::RefCell<Option<(Vec<u8>, u64)>>,
}

impl FileHandle {
    /// Where the file's bytes are, as this handle last learned (its layout and chunk id).
    pub fn placed(&self) -> Attr {
        self.placed.get()
    }

    /// The size as this handle knows it: the owner's at open (or last refresh) and its writes.
    pub fn size(&self) -> u64 {
        self.known_size.get().max(self.written_end.get())
    }

    /// True when this handle wrote past what it last published (its close would tell the
    /// owner a new size), or left writes behind that its close would wait for.
    pub fn unpublished(&self) -> bool {
        self.written_end.get() > self.reported_end.get() || self.behind.get()
    }

    /// Tells the handle the file is at least `size` long: what other handles of the same
    /// caller wrote and have not published (a mount shares one size among its handles). Reads
    /// are then clamped at no less; nothing is published by it.
    pub fn learn_size(&self, size: u64) {
        self.known_size.set(self.known_size.get().max(size));
    }

    /// Makes this handle count changes to the file's bytes in `changes`, shared with other
    /// handles of the same file (a mount's, whose handles serve different clients), so that
    /// no client reads ahead across another's write or truncate. A write counts when it
    /// returns, and once more when it is answered if it was written behind.
    pub fn share_changes(&mut self, changes: &Arc<AtomicU64>) {
        self.changes = changes.clone();
        // The bytes its open found stay good until the next change counted there.
        if let Some((_, seen)) = self.at_open.get_mut() {
            *seen = changes.load(Ordering::Acquire);
        }
    }

    /// Forgets an inline file's bytes as its open found them: reads ask the owner from now on
    /// (a lock boundary: what another holder wrote before must be read).
    pub fn forget_bytes_at_open(&self) {
        self.at_open.borrow_mut().take();
    }

    /// Tells every handle sharing this one's counter that the file's bytes changed.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn change_count(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}

/// What one client saw of one server (reported by [`Client::server_stats`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerCounters {
    pub id: u32,
    pub requests: u64,
    pub retries: u64,
    pub timeouts: u64,
    pub failures: u64,
}

/// A client connected to every server of the membership. Use from one thread.
pub struct Client {
    runtime: Runtime,
    /// Replaced only by [`Client::reset_transport`].
    worker: RefCell<Worker>,
    /// This client's worker address, sent in every hello (servers connect back to it).
    address: RefCell<Rc<[u8]>>,
    links: RefCell<Vec<ServerLink>>,
    /// One window per (server, worker), indexed like `links[server].endpoints[worker]`.
    windows: Vec<Vec<Window>>,
    membership: Vec<RegistryEntry>,
    /// The membership's failure domains: where a chunk's copies go.
    domains: Domains,
    /// Servers declared lost (client/replicas.rs), by index, until they rejoin: no copy is placed
    /// on them and no request goes to them for a file of several copies.
    declared: RefCell<Vec<usize>>,
    /// Of those, the ones whose declaration could not be written to the record.
    unrecorded: RefCell<Vec<usize>>,
    /// The record's epoch (its length) when this client last read it.
    epoch: Cell<u64>,
    /// The record's lines as this client last read them, and where the copies of each
    /// server's metadata owners are by them (client/meta_copies.rs), worked out on first use.
    record_events: RefCell<Vec<crate::lost::Event>>,
    metadata_chains: RefCell<HashMap<usize, crate::placement::MetadataCopies>>,
    /// Copies of each metadata owner's names (client/meta_copies.rs); 1: its server only.
    metadata_copies: u8,
    /// Where the servers publish their entries: a lost server is looked up there again, in
    /// case it restarted at other addresses.
    registry_dir: std::path::PathBuf,
    /// Servers that restarted at other addresses than the membership's: their entries now.
    moved: RefCell<HashMap<usize, RegistryEntry>>,
    shared: Rc<Shared>,
    next_request: Cell<u64>,
    /// Jitter for retry backoff (xorshift state).
    rng: Cell<u64>,
    config: Config,
    /// Said once: this client's `layout.chunk_size` is not the servers' (only theirs applies).
    told_chunk_size: Cell<bool>,
    /// Whether this client resolves symbolic links in the paths it is given (client/links.rs);
    /// off for a face whose paths come resolved (the mount: the kernel follows links).
    resolve_links: Cell<bool>,
    /// Host directories where this namespace is seen (links::link_roots), longest first.
    link_roots: Vec<String>,
    /// Per file with locks taken through this client: the epoch of the server worker keeping
    /// them (client/locks.rs), to tell a restart.
    lock_epochs: RefCell<std::collections::HashMap<u128, u32>>,
    /// Metadata reply buffers kept for reuse (replybuf.rs).
    reply_bufs: RefCell<Vec<Vec<u8>>>,
    /// The job token every request carries.
    token: u64,
    telemetry: ClientTelemetry,
    /// `BENCHFS_CRASH_AT=op:step`: a test's crash point (see `Client::step_done`).
    crash_at: Option<(String, u32)>,
    read_ahead: ReadAhead,
    /// This client's side of write-behind (client/writebehind.rs).
    behind: Behind,
}

impl Client {
    /// Waits for the expected membership in `registry_dir`; connects to every server now with
    /// `cluster.connect_at_start`, else to each on its first request there.
    pub fn connect(registry_dir: &Path, config: Config) -> Result<Client> {
        config.validate()?;
        let timeout = Duration::from_secs_f64(config.cluster.connect_timeout_s);
        let membership = registry::wait_for(registry_dir, config.cluster.expected_servers, timeout)?;
        let token = registry::job_token(&registry::load_secret(registry_dir)?);
        let runtime = Runtime::new(config.storage.ring_entries.min(64))?;
        runtime
            .reactor()
            .set_spin(Duration::from_micros(config.network.spin_us));
        let shared = Rc::new(Shared {
            pending: RefCell::new(HashMap::new()),
            orphans: RefCell::new(Vec::new()),
            detached_orphans: RefCell::new(Vec::new()),
            late_replies: Cell::new(0),
            malformed_replies: Cell::new(0),
        });
        // A client holds about two descriptors per server worker (as servers do per client).
        let needed = membership
            .iter()
            .map(|e| e.ucx_addresses.len() as u64 * 2)
            .sum::<u64>()
            + 256;
        match crate::process::ensure_descriptor_limit(needed) {
            Ok(limit) if limit < needed => crate::warn_line!(
                "benchfs: the descriptor limit is {limit} (its hard limit), and connecting to {} \
                 servers needs about {needed}; raise the hard limit (ulimit -Hn)",
                membership.len()
            ),
            _ => {}
        }
        let (worker, address) = make_worker(&config, &runtime, &shared)?;
        for (i, entry) in membership.iter().enumerate() {
            if entry.metadata_copies != membership[0].metadata_copies {
                return Err(Error::Config(format!(
                    "server {} keeps {} copies of its metadata and server 0 {}: the servers of one \
                     job must be started with the same layout.replicas",
                    entry.id, entry.metadata_copies, membership[0].metadata_copies
                )));
            }
            if entry.id as usize != i || entry.ucx_addresses.len() != membership[0].ucx_addresses.len() {
                return Err(Error::Config(format!(
                    "membership must be servers 0..{} with equal worker counts (server {} at position {i} has {} \
                     workers): metadata owners and layouts are numbered that way",
                    membership.len(),
                    entry.id,
                    entry.ucx_addresses.len()
                )));
            }
        }
        let windows = membership
            .iter()
            .map(|e| e.ucx_addresses.iter().map(|_| Window::default()).collect())
            .collect();
        let links = membership
            .iter()
            .map(|e| ServerLink {
                id: e.id,
                endpoints: Vec::new(),
                conns: Vec::new(),
                lost: None,
                probe: Probing::idle(),
                connecting: false,
                waiters: Vec::new(),
            })
            .collect();
        let telemetry = ClientTelemetry::new(&config, &membership)?;
        let domains = Domains::new(&membership.iter().map(|e| e.domain.as_str()).collect::<Vec<_>>());
        let link_roots = links::link_roots(&config.client.link_roots);
        let metadata_copies = membership[0].metadata_copies.max(1);
        let client = Client {
            runtime,
            worker: RefCell::new(worker),
            address: RefCell::new(address),
            links: RefCell::new(links),
            windows,
            membership,
            domains,
            declared: RefCell::new(Vec::new()),
            unrecorded: RefCell::new(Vec::new()),
            epoch: Cell::new(0),
            record_events: RefCell::new(Vec::new()),
            metadata_chains: RefCell::new(HashMap::new()),
            metadata_copies,
            shared,
            next_request: Cell::new(1),
            rng: Cell::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0x9E37_79B9, |d| d.as_nanos() as u64)
                    | 1,
            ),
            config,
            told_chunk_size: Cell::new(false),
            resolve_links: Cell::new(true),
            link_roots,
            registry_dir: registry_dir.to_path_buf(),
            moved: RefCell::new(HashMap::new()),
            lock_epochs: RefCell::new(std::collections::HashMap::new()),
            reply_bufs: RefCell::new(Vec::new()),
            token,
            telemetry,
            crash_at: crash_point()?,
            read_ahead: ReadAhead::default(),
            behind: Behind::new(),
        };
        client.refresh_declared();
        if !client.config.cluster.connect_at_start {
            return Ok(client);
        }
        let all: Vec<usize> = (0..client.server_count()).collect();
        let failed = client.connect_servers(&all, Instant::now() + timeout);
        let mut failed = failed.into_iter();
        match failed.next() {
            None => Ok(client),
            Some((_, Error::ServerLost { server, reason })) if failed.len() > 0 => {
                let others: Vec<String> = failed.map(|(i, _)| client.membership[i].id.to_string()).collect();
                Err(Error::ServerLost {
                    server,
                    reason: format!(
                        "{reason} (servers {} could not be reached either)",
                        others.join(", ")
                    ),
                })
            }
            Some((_, e)) => Err(e),
        }
    }

    /// This client's telemetry counters and histograms (per target in membership order).
    pub fn telemetry(&self) -> &ClientMetrics {
        &self.telemetry.metrics
    }

    /// The servers this client uses, ordered by numeric id.
    pub fn membership(&self) -> &[RegistryEntry] {
        &self.membership
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The id of the server that holds byte `offset` of the file at `path`.
    pub fn locate(&self, path: &str, offset: u64) -> Result<u32> {
        let _call = self.telemetry_call(OpKind::Meta);
        let attr = self.file_to_locate(path)?;
        if attr.layout.inline {
            // Its bytes are with its name.
            return self.locate_metadata(path);
        }
        Ok(self.membership[self.route(&attr, offset / attr.layout.chunk_size).0].id)
    }

    /// The attribute of the file at `path` whose bytes are located (EISDIR for anything else).
    fn file_to_locate(&self, path: &str) -> Result<Attr> {
        let attr = self.stat(path)?;
        if attr.kind != Kind::File {
            return Err(Error::Path {
                op: "locate",
                path: path.into(),
                errno: libc::EISDIR,
            });
        }
        Ok(attr)
    }

    /// What this client saw of each server, ordered like the membership.
    pub fn server_stats(&self) -> Vec<ServerCounters> {
        let m = &self.telemetry.metrics;
        let sum = |f: &dyn Fn(OpKind) -> u64| OpKind::ALL.into_iter().map(f).sum::<u64>();
        self.membership
            .iter()
            .enumerate()
            .map(|(i, e)| ServerCounters {
                id: e.id,
                requests: sum(&|k| m.requests(i, k)),
                retries: sum(&|k| m.retries(i, k)),
                timeouts: sum(&|k| m.timeouts(i, k)),
                failures: sum(&|k| m.errors(i, k)),
            })
            .collect()
    }

    /// Runs a public operation to completion, then makes sure no UCX operation still refers
    /// to the caller's memory.
    fn run<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.poll_probes();
        let result = self.runtime.block_on(fut)?;
        self.quiesce()?;
        self.shared
            .detached_orphans
            .borrow_mut()
            .retain(|(r, _)| !r.is_done());
        result
    }

    /// Replies that arrived after their request was abandoned, and undecodable replies.
    pub fn reply_anomalies(&self) -> (u64, u64) {
        (
            self.shared.late_replies.get(),
            self.shared.malformed_replies.get(),
        )
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.any_writes_behind() {
            // Writes already returned to their callers go out before the endpoints close
            // (bounded by the request timeout; a failure has nobody left to tell).
            let _ = self.runtime.block_on(self.settle_all());
        }
        // The last snapshot: everything this client did.
        self.telemetry.snapshot(Instant::now(), true);
        // Close endpoints (forcibly, bounded) before the worker goes away.
        self.links.borrow_mut().clear();
    }
}

/// The crash point a test set in `BENCHFS_CRASH_AT` (`op:step`), if any.
fn crash_point() -> Result<Option<(String, u32)>> {
    let Ok(text) = std::env::var("BENCHFS_CRASH_AT") else {
        return Ok(None);
    };
    text.split_once(':')
        .and_then(|(op, step)| Some((op.to_string(), step.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| {
            Error::Config(format!(
                "BENCHFS_CRASH_AT={text:?}: expected op:step, e.g. unlink:1"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::meta;
    use crate::server::{ServerHandle, ServerOptions};

    /// The last resort of `quiesce` (a UCX worker rebuilt because UCX kept caller memory after
    /// the endpoints of a lost server were closed) leaves a client that works: new worker, new
    /// connections to every server, data intact.
    #[test]
    fn a_rebuilt_transport_reconnects_and_serves() -> Result<()> {
        rebuild_with_writes_behind()
    }

    /// Rebuilds abort rendezvous transfers (the writes behind), which UCX completes only once
    /// its registration cache lets go of their buffers. Two threads rebuilding at once, with
    /// workers destroyed before UCX had called back for every request, corrupted the heap in
    /// 10 of 10 runs of this test (UCX 1.22: glibc aborted in ucp_worker_destroy, or SIGSEGV).
    #[test]
    fn rebuilds_on_two_threads_at_once_keep_the_heap_intact() {
        let threads: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(|| (0..10).try_for_each(|_| rebuild_with_writes_behind())))
            .collect();
        for t in threads {
            let outcome = t.join().expect("a rebuilding thread panicked");
            outcome.expect("a rebuild failed");
        }
    }

    /// Bytes written behind move while the program makes no call at all: the process's
    /// write-behind thread sends them (an event loop run only inside calls never would).
    #[test]
    fn writes_behind_move_while_the_program_makes_no_call() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut config = Config::default();
        config.cluster.expected_servers = 2;
        config.layout.chunk_size = 64 * 1024;
        config.client.write_behind = 4 << 20;
        let servers = two_servers(dir.path(), &config)?;
        let client = Client::connect(&dir.path().join("registry"), config)?;
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let f = client.open("/behind", meta::CREATE, 0o644)?;
        assert_eq!(client.write(&f, 0, &data)?, data.len());
        let start = Instant::now();
        while client.any_writes_behind() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "writes behind did not move without calls"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut back = vec![0u8; data.len()];
        assert_eq!(client.read(&f, 0, &mut back)?, data.len());
        assert!(back == data, "the bytes written behind");
        client.close(&f)?;
        drop(client);
        drop(servers);
        Ok(())
    }

    /// Clients of one write-behind group (a mount's threads) writing at once with a small
    /// budget: each waits for room in turn, and every one is woken (a group shares a number,
    /// not an event loop).
    #[test]
    fn a_group_of_clients_writing_behind_at_once_all_finish() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut config = Config::default();
        config.cluster.expected_servers = 2;
        config.layout.chunk_size = 64 * 1024;
        config.client.write_behind = 256 * 1024;
        let servers = two_servers(dir.path(), &config)?;
        let group = write_behind_group();
        let (done, finished) = std::sync::mpsc::channel();
        for t in 0..3u8 {
            let (registry, config, done) = (dir.path().join("registry"), config.clone(), done.clone());
            std::thread::spawn(move || {
                let outcome = (|| -> Result<bool> {
                    let mut client = Client::connect(&registry, config)?;
                    client.write_behind_as(group);
                    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 249) as u8 ^ t).collect();
                    let path = format!("/group-{t}");
                    let f = client.open(&path, meta::CREATE, 0o644)?;
                    for (i, piece) in data.chunks(48 * 1024).enumerate() {
                        client.write(&f, (i * 48 * 1024) as u64, piece)?;
                    }
                    client.close(&f)?;
                    let g = client.open(&path, 0, 0)?;
                    let mut back = vec![0u8; data.len()];
                    client.read(&g, 0, &mut back)?;
                    Ok(back == data)
                })();
                let _ = done.send(outcome);
            });
        }
        for _ in 0..3 {
            let outcome = finished
                .recv_timeout(Duration::from_secs(60))
                .expect("a writer of the group never finished");
            assert!(outcome?, "a writer's bytes");
        }
        drop(servers);
        Ok(())
    }

    /// Two servers with their data and registry under `dir` (stopped when dropped).
    fn two_servers(dir: &Path, config: &Config) -> Result<Vec<ServerHandle>> {
        (0..2)
            .map(|id| {
                ServerHandle::spawn(ServerOptions {
                    id,
                    node: format!("node-{id}"),
                    domain: String::new(),
                    data_dir: dir.join(format!("data-{id}")),
                    registry_dir: dir.join("registry"),
                    config: config.clone(),
                })
            })
            .collect()
    }

    fn rebuild_with_writes_behind() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut config = Config::default();
        config.cluster.expected_servers = 2;
        config.layout.chunk_size = 64 * 1024;
        config.storage.buffer_count = 8;
        // Writes behind the caller, unanswered when the transport is rebuilt, are sent again.
        config.client.write_behind = 1 << 20;
        // No spinning: after the rebuild the client's loop waits in the kernel, as idle ones do.
        config.network.spin_us = 0;
        let servers = two_servers(dir.path(), &config)?;
        let client = Client::connect(&dir.path().join("registry"), config)?;
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let f = client.open("/kept", meta::CREATE, 0o644)?;
        assert_eq!(client.write(&f, 0, &data)?, data.len());
        let old_address = client.address.borrow().clone();
        let old_conns: Vec<Vec<u32>> = client.links.borrow().iter().map(|l| l.conns.clone()).collect();

        client.reset_transport()?;

        assert_ne!(
            *client.address.borrow(),
            old_address,
            "the worker was not replaced"
        );
        let links = client.links.borrow();
        assert!(links
            .iter()
            .all(|l| l.lost.is_none() && l.endpoints.iter().all(Option::is_some)));
        let new_conns: Vec<Vec<u32>> = links.iter().map(|l| l.conns.clone()).collect();
        assert_ne!(new_conns, old_conns, "the servers did not open new connections");
        drop(links);
        let mut back = vec![0u8; data.len()];
        assert_eq!(client.read(&f, 0, &mut back)?, data.len());
        assert_eq!(back, data);
        client.close(&f)?;
        drop(client);
        drop(servers);
        Ok(())
    }
}
