//! Small files kept with their inodes: an inline file's bytes live in its inode's record at
//! its metadata owner (mirrored, persisted and moved by rename with it), until a write or
//! truncate takes it past `layout.inline_max`. Its bytes then move into chunks, once, in two
//! steps driven by a client ([`MetaStore::promote_begin`], [`MetaStore::promote_end`]): the
//! client writes them to chunks of a generation of their own, and the file takes those chunks
//! only if its bytes are still the ones written. A writer that lost the race, or stopped for
//! a while, can only have written chunks of another generation, which no reader ever reads
//! (docs/namespace.md).

use xxhash_rust::xxh3::xxh3_128;

use super::{Attr, Errno, Kind, MetaStore, Node};
use crate::placement::MAX_GENERATION;
use crate::protocol::meta::INLINE_LIMIT;

impl MetaStore {
    /// Files created from now on keep up to `max` bytes with their inodes (0: none; at most
    /// [`INLINE_LIMIT`]).
    pub fn with_inline(mut self, max: u64) -> MetaStore {
        self.inline_max = (max as usize).min(INLINE_LIMIT);
        self
    }

    /// The file at `path`, when it is file `id` (0: any; ESTALE: the path names another now).
    fn file_node(&mut self, path: &str, id: u128) -> Result<&mut Node, Errno> {
        let node = self.nodes.get_mut(path).ok_or(libc::ENOENT)?;
        match node.attr.kind {
            Kind::Dir => Err(libc::EISDIR),
            Kind::Symlink => Err(libc::ELOOP),
            Kind::File if id != 0 && node.attr.id.0 != id => Err(libc::ESTALE),
            Kind::File => Ok(node),
        }
    }

    /// An inline file's size follows its bytes: they grow (with zeros) or shrink to `size`,
    /// which may not pass `max` (EFBIG: the client moves them into chunks first).
    pub(super) fn resize_inline(node: &mut Node, size: u64, max: usize) -> Result<(), Errno> {
        match node.inline.as_mut() {
            None => Ok(()),
            Some(_) if size > max as u64 => Err(libc::EFBIG),
            Some(bytes) => {
                bytes.resize(size as usize, 0);
                Ok(())
            }
        }
    }

    /// Up to `len` bytes at `offset` of file `id` at `path`, with its attribute; no bytes when
    /// it is not inline (the attribute says where its chunks are).
    pub fn inline_read(
        &mut self,
        path: &str,
        id: u128,
        offset: u64,
        len: u64,
    ) -> Result<(Attr, &[u8]), Errno> {
        let node = self.file_node(path, id)?;
        let bytes = node.inline.as_deref().unwrap_or_default();
        let from = (offset.min(bytes.len() as u64)) as usize;
        let to = (offset.saturating_add(len).min(bytes.len() as u64)) as usize;
        Ok((node.attr, &bytes[from..to]))
    }

    /// Writes `data` at `offset` of inline file `id` at `path`; whether it did (not: the file
    /// is not inline, or would pass the limit), and the attribute.
    pub fn inline_write(
        &mut self,
        path: &str,
        id: u128,
        offset: u64,
        data: &[u8],
    ) -> Result<(Attr, bool), Errno> {
        let max = self.inline_max as u64;
        let node = self.file_node(path, id)?;
        let Some(bytes) = node.inline.as_mut() else {
            return Ok((node.attr, false));
        };
        let end = offset.saturating_add(data.len() as u64);
        if data.is_empty() {
            return Ok((node.attr, true));
        }
        if end > max.max(bytes.len() as u64) {
            return Ok((node.attr, false));
        }
        if end as usize > bytes.len() {
            bytes.resize(end as usize, 0);
        }
        bytes[offset as usize..end as usize].copy_from_slice(data);
        node.attr.size = bytes.len() as u64;
        node.attr.mtime_ns = super::now_ns();
        node.attr.ctime_ns = node.attr.mtime_ns;
        let attr = node.attr;
        self.persist_inode(path)?;
        Ok((attr, true))
    }

    /// The first step of moving inline file `id`'s bytes into chunks: its attribute, its bytes
    /// and the generation of chunks to write them to. An empty file moves at once (generation
    /// 0, nothing to write); a file not inline any more answers with its attribute only.
    pub fn promote_begin(&mut self, path: &str, id: u128) -> Result<(Attr, Vec<u8>, u16), Errno> {
        let node = self.file_node(path, id)?;
        match node.inline.as_deref() {
            None => Ok((node.attr, Vec::new(), 0)),
            Some([]) => {
                node.inline = None;
                node.attr.layout.inline = false;
                node.attr.layout.generation = 0;
                let attr = node.attr;
                self.persist_inode(path)?;
                Ok((attr, Vec::new(), 0))
            }
            Some(bytes) => {
                let bytes = bytes.to_vec();
                let attr = node.attr;
                self.generation = if self.generation >= MAX_GENERATION {
                    1
                } else {
                    self.generation + 1
                };
                Ok((attr, bytes, self.generation))
            }
        }
    }

    /// The second step: file `id` takes the chunks of `generation`, to which a client wrote
    /// bytes whose xxh3-128 is `hash`, if its bytes are still those (else it stays inline, and
    /// the client tries again). Returns the attribute: not inline, of that generation, when
    /// this call moved it.
    pub fn promote_end(&mut self, path: &str, id: u128, generation: u16, hash: u128) -> Result<Attr, Errno> {
        if generation == 0 || generation > MAX_GENERATION {
            return Err(libc::EINVAL);
        }
        let node = self.file_node(path, id)?;
        match node.inline.as_deref() {
            Some(bytes) if xxh3_128(bytes) == hash => {
                node.inline = None;
                node.attr.layout.inline = false;
                node.attr.layout.generation = generation;
                node.attr.ctime_ns = super::now_ns();
                let attr = node.attr;
                self.persist_inode(path)?;
                Ok(attr)
            }
            _ => Ok(node.attr),
        }
    }

    /// Opens or creates the file at `path` as [`MetaStore::create`] does (`flags`, `mode`,
    /// `start`) and, when it is inline and `data` fits, makes `data` its bytes with `mode` and
    /// `mtime_ns`: a whole small file in one request. Returns the attribute, the size before,
    /// and the xxh3-128 of the bytes as kept when it kept them.
    pub fn put_inline(
        &mut self,
        path: &str,
        (flags, mode, start): (u32, u32, Option<u32>),
        mtime_ns: u64,
        data: &[u8],
    ) -> Result<(Attr, u64, Option<u128>), Errno> {
        let fits = data.len() <= self.inline_max;
        let flags = if fits {
            flags
        } else {
            flags | crate::protocol::meta::CHUNKED
        };
        let (attr, old) = self.create(path, flags, mode, start)?;
        if !fits || !attr.layout.inline {
            return Ok((attr, old, None));
        }
        let node = self.file_node(path, attr.id.0)?;
        let bytes = node.inline.get_or_insert_with(Vec::new);
        bytes.clear();
        bytes.extend_from_slice(data);
        let hash = xxh3_128(bytes);
        node.attr.size = data.len() as u64;
        node.attr.mode = mode & 0o7777;
        node.attr.mtime_ns = mtime_ns;
        node.attr.ctime_ns = super::now_ns();
        let attr = node.attr;
        self.persist_inode(path)?;
        Ok((attr, old, Some(hash)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::SizeUpdate;
    use crate::protocol::meta::{CHUNKED, CREATE, TRUNCATE};

    fn store() -> MetaStore {
        MetaStore::new(0, 1, 4, 1 << 20, 7).with_inline(100)
    }

    #[test]
    fn a_small_file_keeps_its_bytes_until_it_outgrows_the_limit() {
        let mut m = store();
        let (a, _) = m.create("/f", CREATE, 0o644, None).expect("create");
        assert!(a.layout.inline);
        let id = a.id.0;
        assert_eq!(
            m.inline_write("/f", id, 10, b"abc").map(|(a, w)| (a.size, w)),
            Ok((13, true))
        );
        let (_, bytes) = m.inline_read("/f", id, 0, 1000).expect("read");
        assert_eq!(bytes, [&[0u8; 10][..], b"abc"].concat());
        // Past the limit: not written, still inline (the client moves it).
        assert_eq!(
            m.inline_write("/f", id, 99, b"xy")
                .map(|(a, w)| (a.layout.inline, w)),
            Ok((true, false))
        );
        assert_eq!(m.set_size("/f", 101, SizeUpdate::Exact), Err(libc::EFBIG));
        assert_eq!(
            m.set_size("/f", 2, SizeUpdate::Exact)
                .map(|(a, old)| (a.size, old)),
            Ok((2, 13))
        );
        // Another file at the path: the handle's requests are refused, not served.
        assert_eq!(m.inline_read("/f", id + 1, 0, 1).err(), Some(libc::ESTALE));
        // Made with chunks: never inline.
        let (c, _) = m.create("/c", CREATE | CHUNKED, 0o644, None).expect("create");
        assert!(!c.layout.inline);
        assert_eq!(m.inline_write("/c", c.id.0, 0, b"a").map(|(_, w)| w), Ok(false));
    }

    #[test]
    fn a_move_into_chunks_takes_only_the_bytes_it_wrote() {
        let mut m = store();
        let (a, _) = m.create("/f", CREATE, 0o644, None).expect("create");
        let id = a.id.0;
        m.inline_write("/f", id, 0, b"first").expect("write");
        let (_, bytes, g1) = m.promote_begin("/f", id).expect("begin");
        assert_eq!(bytes, b"first");
        // A write lands between the two steps: the first attempt loses.
        m.inline_write("/f", id, 0, b"FIRST").expect("write");
        let after = m.promote_end("/f", id, g1, xxh3_128(b"first")).expect("end");
        assert!(after.layout.inline);
        let (_, bytes, g2) = m.promote_begin("/f", id).expect("begin");
        assert_ne!(g1, g2);
        let moved = m.promote_end("/f", id, g2, xxh3_128(&bytes)).expect("end");
        assert!(!moved.layout.inline && moved.layout.generation == g2);
        assert_ne!(moved.data_id(), moved.id.0);
        // Moved: later inline writes are refused, a late end changes nothing.
        assert_eq!(m.inline_write("/f", id, 0, b"z").map(|(_, w)| w), Ok(false));
        assert_eq!(
            m.promote_end("/f", id, g1, xxh3_128(b"FIRST"))
                .map(|a| a.layout.generation),
            Ok(g2)
        );
        // An empty file moves at once, with no chunks to write.
        let (e, _) = m.create("/e", CREATE, 0o644, None).expect("create");
        let (now, bytes, g) = m.promote_begin("/e", e.id.0).expect("begin");
        assert!(!now.layout.inline && bytes.is_empty() && g == 0 && now.data_id() == e.id.0);
    }

    #[test]
    fn a_whole_small_file_in_one_call_and_its_bytes_move_with_a_rename() {
        let mut m = store();
        let (a, old, hash) = m
            .put_inline("/p", (CREATE | TRUNCATE, 0o600, None), 42, b"hello")
            .expect("put");
        assert_eq!((a.size, a.mode, a.mtime_ns, old), (5, 0o600, 42, 0));
        assert_eq!(hash, Some(xxh3_128(b"hello")));
        // Too big for the limit: made with chunks, nothing kept.
        let (b, _, hash) = m
            .put_inline("/q", (CREATE | TRUNCATE, 0o600, None), 42, &[1; 101])
            .expect("put");
        assert!(!b.layout.inline && hash.is_none());
        // Rename: installed elsewhere with its bytes; the old one goes only if unchanged.
        m.install("/r", a, 0, None, b"hello").expect("install");
        assert_eq!(
            m.inline_read("/r", a.id.0, 0, 100).map(|(_, b)| b.to_vec()),
            Ok(b"hello".to_vec())
        );
        assert_eq!(m.install("/s", a, 0, None, b"hell"), Err(libc::EINVAL));
        m.inline_write("/p", a.id.0, 0, b"J").expect("write");
        assert_eq!(
            m.unlink("/p", Some((a.id.0, a.ctime_ns))).err(),
            Some(libc::ESTALE)
        );
    }

    /// A snapshot page of the largest inline files under the longest paths still fits one
    /// metadata reply (a copy being caught up asks for them page by page).
    #[test]
    fn a_snapshot_page_of_the_largest_records_fits_a_reply() {
        use crate::namespace::PATH_MAX;
        use crate::protocol::meta::{INLINE_LIMIT, REPLY_MAX};
        use crate::protocol::mirror::{encode_snapshot, SNAPSHOT_PAGE};
        let mut m = MetaStore::new(0, 1, 4, 1 << 20, 7).with_inline(INLINE_LIMIT as u64);
        let dir = format!("/{}", "d".repeat(200));
        m.mkdir(&dir, 0o755).expect("mkdir");
        let mut deep = dir.clone();
        while deep.len() + 250 < PATH_MAX {
            deep = format!("{deep}/{}", "d".repeat(200));
            m.mkdir(&deep, 0o755).expect("mkdir");
        }
        for i in 0..6 {
            let path = format!("{deep}/{i}{}", "f".repeat(PATH_MAX - 2 - deep.len() - 2));
            let (a, _) = m.create(&path, CREATE, 0o644, None).expect("create");
            m.inline_write(&path, a.id.0, 0, &vec![7u8; INLINE_LIMIT])
                .expect("write");
        }
        let mut after = String::new();
        loop {
            let (records, last, more) = m.snapshot_page(&after, SNAPSHOT_PAGE);
            assert!(encode_snapshot(&last, &records).len() <= REPLY_MAX);
            if !more {
                break;
            }
            after = last;
        }
    }
}
