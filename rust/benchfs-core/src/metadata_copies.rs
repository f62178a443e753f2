//! A server worker's part in the copies of the metadata (`layout.replicas` 2 or 3,
//! docs/namespace.md "Copies of the metadata"): which metadata owners it serves now, which it
//! keeps a copy of, and the stores of those copies.
//!
//! Who serves an owner is decided by the registry's record of lost servers alone
//! ([`crate::lost`]), never by a server's or a client's own guess: the owner's server while it
//! is not declared lost, else the next copy on the ring of failure domains
//! ([`Domains::metadata_servers`]). Each worker reads the record again whenever it changed
//! (one `stat` per metadata request), before serving: a client appends a `lost` line before
//! it sends anything to the next copy, so from then on the declared server refuses every
//! metadata request (ESTALE) and its copies refuse its changes; nothing it serves after the
//! line can fork the namespace.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use crate::error::Result;
use crate::lost::{read_lost, Event, LOST_FILE};
use crate::namespace::MetaStore;
use crate::placement::{Domains, MetadataCopies};
use crate::registry;

type Errno = i32;

/// What this worker last read of the record.
#[derive(Default)]
struct Seen {
    /// The record's length and modification time when read (None: never read, or absent).
    stamp: Option<(u64, SystemTime)>,
    events: Vec<Event>,
    /// Declared lost (joining or not), and of those, joining: server indexes.
    lost: Vec<usize>,
    joining: Vec<usize>,
    epoch: u64,
    /// Where the copies of each server's owners are by `events`, worked out on first use.
    chains: HashMap<usize, MetadataCopies>,
}

/// Makes the store of a copy of metadata owner `owner` (empty, or reopened from the device).
pub type MakeStore = Box<dyn Fn(u32) -> Result<MetaStore>>;

pub struct CopyKeeper {
    copies: u8,
    workers: u32,
    servers: u32,
    /// This server's index (its id).
    me: usize,
    registry_dir: PathBuf,
    seen: RefCell<Seen>,
    /// The record, open once it exists.
    record: RefCell<Option<std::fs::File>>,
    /// Emptied since this server was last declared lost (see `refresh`).
    wiped: Cell<bool>,
    wipe_own: Cell<bool>,
    domains: RefCell<Option<Domains>>,
    /// The copies of other owners' metadata this worker keeps, by owner.
    stores: RefCell<HashMap<u32, MetaStore>>,
    make_store: MakeStore,
}

impl CopyKeeper {
    pub fn new(
        copies: u8,
        (servers, workers): (u32, u32),
        me: u32,
        registry_dir: PathBuf,
        make_store: MakeStore,
    ) -> CopyKeeper {
        CopyKeeper {
            copies,
            workers: workers.max(1),
            servers,
            me: me as usize,
            registry_dir,
            seen: RefCell::new(Seen::default()),
            record: RefCell::new(None),
            wiped: Cell::new(false),
            wipe_own: Cell::new(false),
            domains: RefCell::new(None),
            stores: RefCell::new(HashMap::new()),
            make_store,
        }
    }

    /// Reads the record again if it changed since last read (a `stat` otherwise).
    fn refresh(&self) {
        let stamp = self.stamp();
        if stamp == self.seen.borrow().stamp {
            return;
        }
        // An unreadable record changes nothing here; the next request reads it again.
        let Ok(record) = read_lost(&self.registry_dir) else {
            return;
        };
        let to = |ids: &[u32]| ids.iter().map(|&i| i as usize).collect::<Vec<_>>();
        let (lost, joining_ids) = (to(&record.lost), to(&record.joining));
        let joining = joining_ids.contains(&self.me);
        // Declared, this server missed changes: before it takes any as a joining copy, it
        // forgets every name it held (repair hands it the serving copies' state).
        if joining && !self.wiped.get() {
            self.wipe_stores();
            self.wipe_own.set(true);
            self.wiped.set(true);
        }
        if !lost.contains(&self.me) {
            self.wiped.set(false);
        }
        *self.seen.borrow_mut() = Seen {
            stamp,
            events: record.events,
            lost,
            joining: joining_ids,
            epoch: record.epoch,
            chains: HashMap::new(),
        };
    }

    /// The record's length and modification time: `fstat` of the record, held open once it
    /// exists (it is only ever appended to).
    fn stamp(&self) -> Option<(u64, SystemTime)> {
        let mut file = self.record.borrow_mut();
        if file.is_none() {
            *file = std::fs::File::open(self.registry_dir.join(LOST_FILE)).ok();
        }
        let m = file.as_ref()?.metadata().ok()?;
        Some((m.len(), m.modified().ok()?))
    }

    /// Empties the copies of other owners this worker keeps.
    fn wipe_stores(&self) {
        for store in self.stores.borrow_mut().values_mut() {
            store.wipe();
        }
    }

    /// Whether this worker's own owner must be emptied too (once per catch-up; the server
    /// state holds that store).
    pub fn take_wipe_own(&self) -> bool {
        self.wipe_own.replace(false)
    }

    /// The record's epoch as this worker last read it (its length).
    pub fn epoch(&self) -> u64 {
        self.seen.borrow().epoch
    }

    /// The servers' failure domains, from the registry once every server is in it.
    fn domains(&self) -> Option<Domains> {
        if let Some(d) = self.domains.borrow().as_ref() {
            return Some(d.clone());
        }
        let entries = registry::scan(&self.registry_dir).ok()?;
        if entries.len() != self.servers as usize {
            return None;
        }
        let names: Vec<&str> = entries.iter().map(|e| e.domain.as_str()).collect();
        let domains = Domains::new(&names);
        *self.domains.borrow_mut() = Some(domains.clone());
        Some(domains)
    }

    /// `f` of where owner `owner`'s copies are now, by the record.
    fn with_copies_of<T>(
        &self,
        owner: u32,
        f: impl FnOnce(&MetadataCopies) -> T,
    ) -> std::result::Result<T, Errno> {
        self.refresh();
        let mut seen = self.seen.borrow_mut();
        if seen.lost.contains(&self.me) && !seen.joining.contains(&self.me) {
            return Err(libc::ESTALE);
        }
        let server = (owner / self.workers) as usize;
        if !seen.chains.contains_key(&server) {
            // Until every server has registered no one can say; the client retries.
            let domains = self.domains().ok_or(libc::EAGAIN)?;
            let copies = domains.metadata_servers(server, self.copies, &seen.events);
            seen.chains.insert(server, copies);
        }
        Ok(f(&seen.chains[&server]))
    }

    /// Ok when this server serves owner `owner`'s requests now; ESTALE when another copy does
    /// (or this server is declared lost).
    pub fn check_serving(&self, owner: u32) -> std::result::Result<(), Errno> {
        let serving = self.with_copies_of(owner, MetadataCopies::serving)?;
        if serving == Some(self.me) {
            Ok(())
        } else {
            Err(libc::ESTALE)
        }
    }

    /// Ok when this server takes changes of owner `owner` made by server `producer`: the
    /// producer serves the owner now and this server keeps one of its other copies.
    pub fn check_mirror(&self, owner: u32, producer: u32) -> std::result::Result<(), Errno> {
        let me = self.me;
        let takes = self.with_copies_of(owner, |c| {
            c.serving() == Some(producer as usize) && c.mirrors().any(|s| s == me)
        })?;
        if takes {
            Ok(())
        } else {
            Err(libc::ESTALE)
        }
    }

    /// Whether a copy's store has changes waiting for their commit.
    pub fn has_staged(&self) -> bool {
        self.stores.borrow().values().any(MetaStore::has_staged)
    }

    /// Commits every copy's staged changes (each store its own transaction); returns how many
    /// writes they made, EIO if any commit failed.
    pub fn commit(&self) -> std::result::Result<usize, Errno> {
        let mut result = Ok(0);
        for store in self.stores.borrow().values() {
            match (store.commit(), &mut result) {
                (Ok(n), Ok(total)) => *total += n,
                (Err(e), _) => result = Err(e),
                (Ok(_), Err(_)) => {}
            }
        }
        result
    }

    /// Runs `f` on this worker's store of owner `owner`'s copy (made on first use).
    pub fn with_store<T>(
        &self,
        owner: u32,
        f: impl FnOnce(&mut MetaStore) -> std::result::Result<T, Errno>,
    ) -> std::result::Result<T, Errno> {
        let mut stores = self.stores.borrow_mut();
        let store = match stores.entry(owner) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match (self.make_store)(owner) {
                Ok(s) => v.insert(s),
                Err(e) => {
                    crate::warn_line!("benchfs: copy of metadata owner {owner}: {e}");
                    return Err(libc::EIO);
                }
            },
        };
        f(store)
    }
}
