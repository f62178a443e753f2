//! The packed layout: chunks in fixed-size slots of a few large preallocated files per worker,
//! found through an in-memory index. No inode per chunk, no directory entries, descriptors
//! always open. The index is written to `w<worker>.index` when the store closes (40-byte
//! little-endian records: file id, chunk, slot, length), and every change to it is appended
//! to `w<worker>.journal` as it happens (the same records; length `u64::MAX` removes), so a
//! server restarted after a crash still finds every chunk: the index, then the journal, are
//! read back when the store opens.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::chunking::FileId;
use crate::error::{Error, Result};

use super::Handle;

/// Bytes per pack file at most.
const PACK_FILE_BYTES: u64 = 1 << 30;
/// Bytes per index record: file id (16), chunk, slot, length (8 each).
const INDEX_RECORD: usize = 40;
/// Slots preallocated at a time as a pack file fills (small file systems stay usable).
const GROW_SLOTS: u64 = 16;

struct Slot {
    slot: u64,
    /// End of the furthest byte written in the chunk.
    len: u64,
}

pub struct SlotLocation {
    pub handle: Rc<Handle>,
    pub base: u64,
    pub len: u64,
    pub file_index: u64,
}

pub struct Packed {
    dir: PathBuf,
    worker: u32,
    slot_size: u64,
    slots_per_file: u64,
    direct: bool,
    files: RefCell<Vec<Rc<Handle>>>,
    /// Slots of the newest pack file already preallocated.
    allocated: Cell<u64>,
    index: RefCell<HashMap<(FileId, u64), Slot>>,
    next_slot: Cell<u64>,
    /// Slots of removed chunks, reused before new ones (their bytes were punched out).
    free: RefCell<Vec<u64>>,
    /// Index changes since the index was last written, appended as they happen.
    journal: fs::File,
}

/// A journal record's length that removes the chunk.
const REMOVED: u64 = u64::MAX;

fn record(file: FileId, chunk: u64, slot: u64, len: u64) -> [u8; INDEX_RECORD] {
    let mut r = [0u8; INDEX_RECORD];
    r[0..8].copy_from_slice(&(file.0 as u64).to_le_bytes());
    r[8..16].copy_from_slice(&((file.0 >> 64) as u64).to_le_bytes());
    for (i, v) in [chunk, slot, len].into_iter().enumerate() {
        r[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    r
}

impl Packed {
    pub fn open(dir: &Path, worker: u32, slot_size: u64, direct: bool) -> Result<Packed> {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let journal_path = dir.join(format!("w{worker}.journal"));
        let journal = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&journal_path)
            .map_err(|e| Error::io(format!("open {}", journal_path.display()), e))?;
        let packed = Packed {
            dir: dir.to_path_buf(),
            worker,
            slot_size,
            slots_per_file: (PACK_FILE_BYTES / slot_size).max(1),
            direct,
            files: RefCell::new(Vec::new()),
            allocated: Cell::new(0),
            index: RefCell::new(HashMap::new()),
            next_slot: Cell::new(0),
            free: RefCell::new(Vec::new()),
            journal,
        };
        packed.load_index()?;
        // The journal is now in the index: write both down, start the journal afresh.
        packed
            .persist()
            .map_err(|e| Error::io(format!("save the index in {}", dir.display()), e))?;
        Ok(packed)
    }

    /// Appends an index change to the journal (one write: it reaches the kernel before the
    /// operation is answered, so a killed server loses nothing).
    fn log(&self, file: FileId, chunk: u64, slot: u64, len: u64) -> io::Result<()> {
        use std::io::Write;
        (&self.journal).write_all(&record(file, chunk, slot, len))
    }

    /// Makes the journal durable (with the data, at fsync).
    pub fn sync_journal(&self) -> io::Result<()> {
        self.journal.sync_data()
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join(format!("w{}.index", self.worker))
    }

    fn load_index(&self) -> Result<()> {
        let path = self.index_path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        };
        if !bytes.len().is_multiple_of(INDEX_RECORD) {
            return Err(Error::Config(format!(
                "{} is truncated ({} bytes, records are {INDEX_RECORD})",
                path.display(),
                bytes.len()
            )));
        }
        let word = |r: &[u8], at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&r[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let mut index = self.index.borrow_mut();
        let mut top = 0;
        for r in bytes.chunks_exact(INDEX_RECORD) {
            let file = FileId(word(r, 0) as u128 | (word(r, 8) as u128) << 64);
            let (chunk, slot, len) = (word(r, 16), word(r, 24), word(r, 32));
            if len > self.slot_size {
                return Err(Error::Config(format!(
                    "{}: slot {slot} claims {len} bytes",
                    path.display()
                )));
            }
            index.insert((file, chunk), Slot { slot, len });
            top = top.max(slot + 1);
        }
        let journal = self.dir.join(format!("w{}.journal", self.worker));
        let mut changes =
            fs::read(&journal).map_err(|e| Error::io(format!("read {}", journal.display()), e))?;
        // A crash may cut the last record short: it was never acknowledged, leave it out.
        changes.truncate(changes.len() / INDEX_RECORD * INDEX_RECORD);
        for r in changes.chunks_exact(INDEX_RECORD) {
            let file = FileId(word(r, 0) as u128 | (word(r, 8) as u128) << 64);
            let (chunk, slot, len) = (word(r, 16), word(r, 24), word(r, 32));
            if len == REMOVED {
                index.remove(&(file, chunk));
            } else if len <= self.slot_size {
                index.insert((file, chunk), Slot { slot, len });
            } else {
                return Err(Error::Config(format!(
                    "{}: slot {slot} claims {len} bytes",
                    journal.display()
                )));
            }
            top = top.max(slot + 1);
        }
        drop(index);
        for f in 0..top.div_ceil(self.slots_per_file) {
            self.pack_file(f)
                .map_err(|e| Error::io(format!("open pack file {f}"), e))?;
        }
        self.allocated.set(self.slots_per_file);
        // New slots start in a fresh pack file, so reopened files need no further reservation.
        self.next_slot
            .set(top.div_ceil(self.slots_per_file) * self.slots_per_file);
        Ok(())
    }

    /// Writes the index atomically (temporary file + rename), then empties the journal.
    pub fn persist(&self) -> io::Result<()> {
        let mut out = Vec::with_capacity(self.index.borrow().len() * INDEX_RECORD);
        for ((file, chunk), s) in self.index.borrow().iter() {
            out.extend_from_slice(&record(*file, *chunk, s.slot, s.len));
        }
        let path = self.index_path();
        let tmp = path.with_extension("index.tmp");
        fs::write(&tmp, &out)?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, &path)?;
        fs::File::open(&self.dir)?.sync_all()?;
        self.journal.set_len(0)
    }

    fn pack_file(&self, index: u64) -> io::Result<Rc<Handle>> {
        if let Some(h) = self.files.borrow().get(index as usize) {
            return Ok(h.clone());
        }
        let path = self.dir.join(format!("w{}-{index:05}.pack", self.worker));
        let handle = super::open_handle(&path, true, self.direct)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let handle = Rc::new(handle);
        self.files.borrow_mut().push(handle.clone());
        self.allocated.set(0);
        Ok(handle)
    }

    /// Preallocates the newest pack file up to and including `slot_in_file`, in steps.
    fn reserve(&self, handle: &Handle, slot_in_file: u64) -> io::Result<()> {
        if slot_in_file < self.allocated.get() {
            return Ok(());
        }
        let target = (slot_in_file + GROW_SLOTS).min(self.slots_per_file);
        let from = self.allocated.get() * self.slot_size;
        let len = (target * self.slot_size - from) as i64;
        // SAFETY: fallocate on a descriptor we own; unwritten extents read as zeros.
        if unsafe { libc::fallocate(handle.buffered_fd(), 0, from as i64, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        self.allocated.set(target);
        Ok(())
    }

    /// Whether no chunk is stored.
    pub fn is_empty(&self) -> bool {
        self.index.borrow().is_empty()
    }

    /// The chunks of `file` stored (a scan of the index: for a file written in an earlier
    /// life of the server only).
    pub fn chunks_of(&self, file: FileId) -> std::collections::HashSet<u64> {
        self.index
            .borrow()
            .keys()
            .filter(|(f, _)| *f == file)
            .map(|&(_, c)| c)
            .collect()
    }

    pub fn locate(&self, file: FileId, chunk: u64, create: bool) -> io::Result<Option<SlotLocation>> {
        let existing = self.index.borrow().get(&(file, chunk)).map(|s| (s.slot, s.len));
        let (slot, len) = match existing {
            Some(found) => found,
            None if !create => return Ok(None),
            None => match self.free.borrow_mut().pop() {
                Some(slot) => {
                    self.log(file, chunk, slot, 0)?;
                    self.index
                        .borrow_mut()
                        .insert((file, chunk), Slot { slot, len: 0 });
                    (slot, 0)
                }
                None => self.new_slot(file, chunk)?,
            },
        };
        let file_index = slot / self.slots_per_file;
        Ok(Some(SlotLocation {
            handle: self.pack_file(file_index)?,
            base: (slot % self.slots_per_file) * self.slot_size,
            len,
            file_index,
        }))
    }

    fn new_slot(&self, file: FileId, chunk: u64) -> io::Result<(u64, u64)> {
        {
            {
                let slot = self.next_slot.get();
                // Pack files are created in order, so slot / slots_per_file exists or is next.
                let handle = self.pack_file(slot / self.slots_per_file)?;
                self.reserve(&handle, slot % self.slots_per_file)?;
                self.log(file, chunk, slot, 0)?;
                self.next_slot.set(slot + 1);
                self.index
                    .borrow_mut()
                    .insert((file, chunk), Slot { slot, len: 0 });
                Ok((slot, 0))
            }
        }
    }

    /// Cuts the chunk to `len` bytes (0 removes it): the bytes beyond are punched out of the
    /// pack file, so they read as zeros if the chunk grows again, and their space is returned.
    pub fn cut(&self, file: FileId, chunk: u64, len: u64) -> io::Result<()> {
        let Some((slot, old)) = self.index.borrow().get(&(file, chunk)).map(|s| (s.slot, s.len)) else {
            return Ok(());
        };
        let handle = self.pack_file(slot / self.slots_per_file)?;
        let base = (slot % self.slots_per_file) * self.slot_size;
        if old > len {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: fallocate on a descriptor we own, inside this slot.
            let rc = unsafe {
                libc::fallocate(
                    handle.buffered_fd(),
                    mode,
                    (base + len) as i64,
                    (old - len) as i64,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if len == 0 {
            self.log(file, chunk, slot, REMOVED)?;
            self.index.borrow_mut().remove(&(file, chunk));
            self.free.borrow_mut().push(slot);
        } else if len < old {
            self.log(file, chunk, slot, len)?;
            if let Some(s) = self.index.borrow_mut().get_mut(&(file, chunk)) {
                s.len = len;
            }
        }
        Ok(())
    }

    /// Records that the chunk now holds bytes up to `end`.
    pub fn extend(&self, file: FileId, chunk: u64, end: u64) -> io::Result<()> {
        let grown = match self.index.borrow_mut().get_mut(&(file, chunk)) {
            Some(s) if end > s.len => {
                s.len = end;
                Some(s.slot)
            }
            _ => None,
        };
        match grown {
            Some(slot) => self.log(file, chunk, slot, end),
            None => Ok(()),
        }
    }
}
