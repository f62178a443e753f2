//! The packed layout: chunks in fixed-size slots of a few large preallocated files per worker,
//! found through an in-memory index. No inode per chunk, no directory entries, descriptors
//! always open. The index lives for the server's lifetime (an ad-hoc file system lives as long
//! as its job); it is not persisted.

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
}

impl Packed {
    pub fn open(dir: &Path, worker: u32, slot_size: u64, direct: bool) -> Result<Packed> {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        Ok(Packed {
            dir: dir.to_path_buf(),
            worker,
            slot_size,
            slots_per_file: (PACK_FILE_BYTES / slot_size).max(1),
            direct,
            files: RefCell::new(Vec::new()),
            allocated: Cell::new(0),
            index: RefCell::new(HashMap::new()),
            next_slot: Cell::new(0),
        })
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

    pub fn locate(&self, file: FileId, chunk: u64, create: bool) -> io::Result<Option<SlotLocation>> {
        let existing = self.index.borrow().get(&(file, chunk)).map(|s| (s.slot, s.len));
        let (slot, len) = match existing {
            Some(found) => found,
            None if !create => return Ok(None),
            None => {
                let slot = self.next_slot.get();
                // Pack files are created in order, so slot / slots_per_file exists or is next.
                let handle = self.pack_file(slot / self.slots_per_file)?;
                self.reserve(&handle, slot % self.slots_per_file)?;
                self.next_slot.set(slot + 1);
                self.index
                    .borrow_mut()
                    .insert((file, chunk), Slot { slot, len: 0 });
                (slot, 0)
            }
        };
        let file_index = slot / self.slots_per_file;
        Ok(Some(SlotLocation {
            handle: self.pack_file(file_index)?,
            base: (slot % self.slots_per_file) * self.slot_size,
            len,
            file_index,
        }))
    }

    /// Records that the chunk now holds bytes up to `end`.
    pub fn extend(&self, file: FileId, chunk: u64, end: u64) {
        if let Some(s) = self.index.borrow_mut().get_mut(&(file, chunk)) {
            s.len = s.len.max(end);
        }
    }
}
