//! Membership through a registry directory: each server publishes `server-<id>.json`
//! atomically (temporary file + rename, mode 0600); clients wait for the expected membership.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Version 2 added `address_check`, 3 `domain`, 4 `metadata_copies`.
pub const ENTRY_VERSION: u32 = 4;

/// What a server publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryEntry {
    pub version: u32,
    /// Numeric server id; membership is ordered by it, never by a string.
    pub id: u32,
    pub node: String,
    /// The failure domain: copies of a chunk go to servers of distinct domains.
    pub domain: String,
    /// Copies of each metadata owner's names (`layout.replicas`; 1: its server only).
    pub metadata_copies: u8,
    pub host: String,
    pub pid: u32,
    /// One UCX worker address per server worker (event loop), hex encoded.
    pub ucx_addresses: Vec<String>,
    /// A checksum of the addresses (hex): UCX aborts the process on a malformed address, so a
    /// damaged entry must be refused before one reaches it.
    pub address_check: String,
}

impl RegistryEntry {
    /// The entry of server `id` whose workers listen at `addresses`.
    pub fn new(id: u32, node: String, host: String, addresses: &[Vec<u8>]) -> RegistryEntry {
        RegistryEntry {
            version: ENTRY_VERSION,
            id,
            domain: node.clone(),
            metadata_copies: 1,
            node,
            host,
            pid: std::process::id(),
            ucx_addresses: addresses.iter().map(|a| hex(a)).collect(),
            address_check: address_check(addresses),
        }
    }

    /// The same entry in failure domain `domain`.
    pub fn in_domain(mut self, domain: String) -> RegistryEntry {
        self.domain = domain;
        self
    }

    /// The same entry with `copies` copies of each metadata owner's names.
    pub fn with_metadata_copies(mut self, copies: u8) -> RegistryEntry {
        self.metadata_copies = copies;
        self
    }

    /// The decoded worker addresses, in worker order, checked against `address_check`.
    pub fn addresses(&self) -> Result<Vec<Vec<u8>>> {
        if self.ucx_addresses.is_empty() {
            return Err(Error::Protocol(format!("server {}: no UCX address", self.id)));
        }
        let addresses = self
            .ucx_addresses
            .iter()
            .map(|a| self.decode_address(a))
            .collect::<Result<Vec<_>>>()?;
        if address_check(&addresses) != self.address_check {
            return Err(Error::Protocol(format!(
                "server {}: UCX addresses do not match their checksum (a damaged entry)",
                self.id
            )));
        }
        Ok(addresses)
    }

    fn decode_address(&self, address: &str) -> Result<Vec<u8>> {
        let s = address.as_bytes();
        if !s.len().is_multiple_of(2) || s.is_empty() {
            return Err(Error::Protocol(format!(
                "server {}: UCX address has odd or zero length",
                self.id
            )));
        }
        s.chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(|| Error::Protocol(format!("server {}: UCX address is not hex", self.id)))
            })
            .collect()
    }
}

fn address_check(addresses: &[Vec<u8>]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for a in addresses {
        h.update(&(a.len() as u64).to_le_bytes());
        h.update(a);
    }
    format!("{:016x}", h.digest())
}

/// The per-job secret in the registry directory (mode 0600).
pub const SECRET_FILE: &str = "job.secret";
const SECRET_BYTES: usize = 32;

/// The job's secret: read it, or create it atomically if this is the first server of the job
/// (a temporary file linked into place, so concurrent servers agree on one secret).
pub fn load_or_create_secret(dir: &Path) -> Result<Vec<u8>> {
    if let Ok(secret) = load_secret(dir) {
        return Ok(secret);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create registry {}", dir.display()), e))?;
    let mut secret = vec![0u8; SECRET_BYTES];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut secret))
        .map_err(|e| Error::io("read /dev/urandom", e))?;
    // Unique per attempt (threads of one process race too): named by fresh random bytes.
    let tmp = dir.join(format!(".{SECRET_FILE}.{}.tmp", hex(&secret[..8])));
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(hex(&secret).as_bytes())?;
        f.sync_all()
    };
    write().map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    let linked = fs::hard_link(&tmp, dir.join(SECRET_FILE));
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(secret),
        // Another server of the job won the race: use its secret.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_secret(dir),
        Err(e) => Err(Error::io(
            format!("create {}", dir.join(SECRET_FILE).display()),
            e,
        )),
    }
}

/// The job's secret, which must exist (clients never create one).
pub fn load_secret(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join(SECRET_FILE);
    let bad = |reason: String| Error::Registry {
        path: path.clone(),
        reason,
    };
    let text = fs::read_to_string(&path).map_err(|e| bad(format!("no job secret: {e}")))?;
    let bytes: Option<Vec<u8>> = text
        .trim()
        .as_bytes()
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
        })
        .collect();
    match bytes {
        Some(b) if b.len() >= 16 => Ok(b),
        _ => Err(bad("the job secret must be at least 16 bytes, hex encoded".into())),
    }
}

/// The token requests carry: derived from the secret, so the secret itself never travels.
pub fn job_token(secret: &[u8]) -> u64 {
    // Never 0, so a header with no token set is always refused.
    xxhash_rust::xxh3::xxh3_64_with_seed(secret, 0xB3C4_F5E6) | 1
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn entry_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("server-{id}.json"))
}

/// Publishes an entry atomically: readers see the whole file or none of it.
pub fn publish(dir: &Path, entry: &RegistryEntry) -> Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create registry {}", dir.display()), e))?;
    let path = entry_path(dir, entry.id);
    let tmp = dir.join(format!(".server-{}.json.{}.tmp", entry.id, std::process::id()));
    let text = serde_json::to_string(entry).map_err(|e| Error::Protocol(e.to_string()))?;
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("publish {}", path.display()), e)
    })?;
    Ok(path)
}

/// Removes this server's entry (on clean shutdown). A missing entry is not an error.
pub fn unpublish(dir: &Path, id: u32) {
    let _ = fs::remove_file(entry_path(dir, id));
}

/// The entry server `id` has published now (a restarted server publishes its new addresses).
pub fn read_entry(dir: &Path, id: u32) -> Result<RegistryEntry> {
    parse_entry(&entry_path(dir, id))
}

fn parse_entry(path: &Path) -> Result<RegistryEntry> {
    let bad = |reason: String| Error::Registry {
        path: path.to_path_buf(),
        reason,
    };
    let text = fs::read_to_string(path).map_err(|e| bad(format!("unreadable: {e}")))?;
    if text.trim().is_empty() {
        return Err(bad("empty file".into()));
    }
    let entry: RegistryEntry =
        serde_json::from_str(&text).map_err(|e| bad(format!("malformed or truncated JSON: {e}")))?;
    if entry.version != ENTRY_VERSION {
        return Err(bad(format!(
            "entry version {} (expected {ENTRY_VERSION})",
            entry.version
        )));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name != format!("server-{}.json", entry.id) {
        return Err(bad(format!(
            "names server id {} but the file name disagrees",
            entry.id
        )));
    }
    entry.addresses().map_err(|e| bad(e.to_string()))?;
    Ok(entry)
}

/// Every entry currently in the directory, ordered by numeric id.
pub fn scan(dir: &Path) -> Result<Vec<RegistryEntry>> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("read registry {}", dir.display()), e)),
    };
    let mut entries = Vec::new();
    for item in read {
        let item = item.map_err(|e| Error::io(format!("read registry {}", dir.display()), e))?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("server-") && name.ends_with(".json") {
            entries.push(parse_entry(&item.path())?);
        }
    }
    entries.sort_by_key(|e| e.id);
    Ok(entries)
}

/// How long a client waits for a registry directory that does not exist yet (a server makes
/// it as it starts) before it takes the path for a mistake.
pub const REGISTRY_APPEARS: Duration = Duration::from_secs(5);

/// Waits until at least `expected` servers are registered, or fails naming the missing ids
/// (ENOENT naming the directory if it still does not exist after [`REGISTRY_APPEARS`]).
pub fn wait_for(dir: &Path, expected: u32, timeout: Duration) -> Result<Vec<RegistryEntry>> {
    if expected == 0 {
        return Err(Error::Config(
            "the expected number of servers is not set (cluster.expected_servers or BENCHFS_EXPECTED_SERVERS)".into(),
        ));
    }
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        let entries = scan(dir)?;
        if entries.len() >= expected as usize {
            return Ok(entries);
        }
        // A directory that never appears is a wrong path, not slow servers: say so early.
        if entries.is_empty() && start.elapsed() >= REGISTRY_APPEARS.min(timeout) && !dir.is_dir() {
            return Err(Error::io(
                format!(
                    "registry directory {} (no server made it within {} s)",
                    dir.display(),
                    REGISTRY_APPEARS.min(timeout).as_secs_f64()
                ),
                std::io::Error::from_raw_os_error(libc::ENOENT),
            ));
        }
        if start.elapsed() >= timeout {
            let found: Vec<u32> = entries.iter().map(|e| e.id).collect();
            let missing = (0..expected).filter(|i| !found.contains(i)).collect();
            return Err(Error::MissingServers {
                expected: expected as usize,
                found,
                missing,
                waited_s: start.elapsed().as_secs_f64(),
            });
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u32) -> RegistryEntry {
        RegistryEntry::new(id, format!("n{id}"), "h".into(), &[vec![1, 2, 255]])
    }

    #[test]
    fn publish_scan_order_and_mode() -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        for id in [10, 2, 1] {
            publish(dir.path(), &entry(id))?;
        }
        let ids: Vec<u32> = scan(dir.path())?.iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![1, 2, 10]);
        let mode = fs::metadata(entry_path(dir.path(), 2))
            .map_err(|e| Error::io("stat", e))?
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(scan(dir.path())?[0].addresses()?, vec![vec![1, 2, 255]]);
        unpublish(dir.path(), 2);
        assert_eq!(scan(dir.path())?.len(), 2);
        Ok(())
    }

    #[test]
    fn bad_entries_are_named() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let good = serde_json::to_string(&entry(0)).map_err(|e| Error::Protocol(e.to_string()))?;
        let renamed = serde_json::to_string(&entry(7)).map_err(|e| Error::Protocol(e.to_string()))?;
        let not_hex = good.replace("0102ff", "zz");
        // One byte of the address changed: hex still, but not the address the server had.
        let damaged = good.replace("0102ff", "0103ff");
        let old = good.replace("\"version\":4", "\"version\":1");
        let cases: [(&str, &str); 7] = [
            ("", "empty"),
            ("{\"version\":4,\"id\":0,\"no", "truncated"),
            ("\u{0}garbage", "malformed"),
            (&renamed, "disagrees"),
            (&not_hex, "not hex"),
            (&damaged, "checksum"),
            (&old, "entry version 1"),
        ];
        for (text, want) in cases {
            fs::write(entry_path(dir.path(), 0), text).map_err(|e| Error::io("write", e))?;
            let err = scan(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("server-0.json") && err.contains(want), "{err}");
        }
        Ok(())
    }

    #[test]
    fn one_secret_per_job_even_when_servers_race() -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let reg = dir.path().join("reg");
        assert!(load_secret(&reg).is_err());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let reg = reg.clone();
                std::thread::spawn(move || load_or_create_secret(&reg))
            })
            .collect();
        let secrets: Vec<Vec<u8>> = threads
            .into_iter()
            .map(|t| t.join().map_err(|_| Error::Stopped).and_then(|r| r))
            .collect::<Result<_>>()?;
        assert!(secrets.iter().all(|s| s == &secrets[0] && s.len() == 32));
        assert_eq!(load_secret(&reg)?, secrets[0]);
        let mode = fs::metadata(reg.join(SECRET_FILE))
            .map_err(|e| Error::io("stat", e))?
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_ne!(job_token(&secrets[0]), job_token(&[0; 32]));
        fs::write(reg.join(SECRET_FILE), "abc").map_err(|e| Error::io("write", e))?;
        assert!(load_secret(&reg).is_err_and(|e| e.to_string().contains("job.secret")));
        Ok(())
    }

    #[test]
    fn wait_names_missing_servers() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        publish(dir.path(), &entry(0))?;
        publish(dir.path(), &entry(2))?;
        let start = Instant::now();
        let err = wait_for(dir.path(), 4, Duration::from_millis(200)).err();
        assert!(start.elapsed() < Duration::from_secs(2));
        match err {
            Some(Error::MissingServers { found, missing, .. }) => {
                assert_eq!(found, vec![0, 2]);
                assert_eq!(missing, vec![1, 3]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(wait_for(dir.path(), 2, Duration::from_millis(10))?.len(), 2);
        Ok(())
    }

    #[test]
    fn a_registry_that_never_appears_is_named_early() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let wrong = dir.path().join("registy");
        let start = Instant::now();
        let err = wait_for(&wrong, 2, Duration::from_secs(30)).err();
        let waited = start.elapsed();
        assert!(
            waited >= REGISTRY_APPEARS && waited < REGISTRY_APPEARS * 2,
            "{waited:?}"
        );
        let err = err.map(|e| (e.errno(), e.to_string())).unwrap_or_default();
        assert_eq!(err.0, libc::ENOENT);
        assert!(
            err.1.contains("registry directory") && err.1.contains("registy"),
            "{}",
            err.1
        );
        // One that appears (a server starting late) is waited for as before.
        let late = dir.path().join("late");
        let maker = {
            let late = late.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                publish(&late, &entry(0))
            })
        };
        assert_eq!(wait_for(&late, 1, Duration::from_secs(10))?.len(), 1);
        maker
            .join()
            .map_err(|_| Error::Config("publisher panicked".into()))??;
        Ok(())
    }
}
