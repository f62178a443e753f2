//! The payloads of metadata requests and replies: open and rename flags, attributes,
//! [`MetaRequest`] and readdir entries ([`DirEntry`]). docs/protocol.md gives the layouts;
//! decoding never panics and never trusts a client's paths.

use crate::chunking::FileId;
use crate::namespace::{normalize, Attr, Kind, NAME_MAX, PATH_MAX};
use crate::placement::{Layout, MAX_GENERATION, MAX_REPLICAS};

/// Open flags on the wire (the client maps O_* to these).
pub const CREATE: u32 = 1;
pub const EXCLUSIVE: u32 = 2;
pub const TRUNCATE: u32 = 4;
/// Rename: fail with EEXIST instead of replacing the target.
pub const NO_REPLACE: u32 = 8;
/// Open: do not follow a symbolic link in the last place (O_NOFOLLOW: ELOOP). The client's
/// alone; never sent.
pub const NO_FOLLOW: u32 = 16;
/// Dir-add (rename): an entry that is not a directory takes the new kind if it has another
/// (a file renamed over a link, or a link over a file).
pub const RETYPE: u32 = 32;
/// Set-attribute flags: which of the request's mode and time to apply.
pub const SET_MODE: u32 = 1;
pub const SET_MTIME: u32 = 2;
/// Set-attribute: on a symbolic link itself (its modification time only), not followed.
pub const SET_LINK: u32 = 4;
/// Set-attribute: the size becomes at least the request's `size`, as a close reports its
/// writes (before the time is set, so the time given stays).
pub const SET_SIZE: u32 = 8;

/// Promote: the second step (the bytes are in the chunks of the request's generation).
pub const PROMOTE_END: u32 = 1;
/// Open, PutInline: make a new file with chunks, not inline (its creator will write more
/// than `layout.inline_max`).
pub const CHUNKED: u32 = 64;
/// Create: the reply carries an inline file's bytes after the attribute (an open that will
/// read them: close-to-open lets its reads use them).
pub const WITH_BYTES: u32 = 256;
/// Unlink: only while the inode is unchanged since the request's `arg` (its change time in
/// ns) and its id the request's: a rename moving an inline file's bytes, which it read at that
/// time (ESTALE otherwise).
pub const UNCHANGED: u32 = 128;

/// Readdir pages hold at most this many entries (and stay well under [`REPLY_MAX`]).
pub const READDIR_PAGE: usize = 512;
/// The largest metadata reply payload.
pub const REPLY_MAX: usize = 64 * 1024;
/// The most bytes a file keeps with its inode (`layout.inline_max` at most): they and the
/// attribute fit one metadata reply, and so does a snapshot page with the largest record
/// (`mirror::SNAPSHOT_PAGE`).
pub const INLINE_LIMIT: usize = 32 * 1024;
/// The fixed part of a metadata request: flags, mode, arg, size, four lengths and an id.
const REQUEST_FIXED: usize = 56;
/// The largest metadata request payload: the fixed part, two paths, a link target, an inline
/// file's bytes and an attribute.
pub const REQUEST_MAX: usize = REQUEST_FIXED + 3 * PATH_MAX + INLINE_LIMIT + ATTR_LEN;

pub const ATTR_LEN: usize = 64;

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Attr {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.layout.replicas);
        let placed = self.layout.generation.min(MAX_GENERATION) | (u16::from(self.layout.inline) << 15);
        out.extend_from_slice(&placed.to_le_bytes());
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.id.0.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.mtime_ns.to_le_bytes());
        out.extend_from_slice(&self.ctime_ns.to_le_bytes());
        out.extend_from_slice(&self.layout.chunk_size.to_le_bytes());
        out.extend_from_slice(&self.layout.stripe_count.to_le_bytes());
        out.extend_from_slice(&self.layout.start.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Option<Attr> {
        if b.len() != ATTR_LEN {
            return None;
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[8..24]);
        let layout = Layout {
            chunk_size: le_u64(b, 48),
            stripe_count: le_u32(b, 56),
            start: le_u32(b, 60),
            replicas: b[1],
            inline: b[3] & 0x80 != 0,
            generation: u16::from_le_bytes([b[2], b[3]]) & MAX_GENERATION,
        };
        let kind = Kind::from_u8(b[0])?;
        if kind == Kind::File
            && (layout.chunk_size == 0
                || layout.stripe_count == 0
                || !(1..=MAX_REPLICAS).contains(&layout.replicas))
        {
            return None;
        }
        if kind != Kind::File && (layout.inline || layout.generation != 0) {
            return None;
        }
        if layout.stripe_count > 0 && layout.start >= layout.stripe_count {
            return None;
        }
        Some(Attr {
            kind,
            mode: le_u32(b, 4),
            id: FileId(u128::from_le_bytes(id)),
            size: le_u64(b, 24),
            mtime_ns: le_u64(b, 32),
            ctime_ns: le_u64(b, 40),
            layout,
        })
    }
}

/// A metadata request's payload: flags, mode, a numeric argument, one or two paths (or a
/// directory and an entry name), a symbolic link's target (symlink, and install of a link)
/// and, for install, an attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub flags: u32,
    pub mode: u32,
    pub arg: u64,
    /// Set-attribute with [`SET_SIZE`]: the size; 0 otherwise.
    pub size: u64,
    pub path: String,
    pub name: String,
    /// A link's target as its creator wrote it: any bytes but NUL, 1 to PATH_MAX - 1.
    pub target: String,
    /// Bytes of an inline file (its writes, a whole small file, a rename's move), at most
    /// [`INLINE_LIMIT`].
    pub data: Vec<u8>,
    /// The file the request is about, when the path must still name it (an inline file's
    /// reads and writes: a handle's path may have been renamed over); 0: any.
    pub id: u128,
    pub attr: Option<Attr>,
}

impl MetaRequest {
    pub fn new(path: &str) -> MetaRequest {
        MetaRequest {
            flags: 0,
            mode: 0,
            arg: 0,
            size: 0,
            path: path.to_string(),
            name: String::new(),
            target: String::new(),
            data: Vec::new(),
            id: 0,
            attr: None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let strings = self.path.len() + self.name.len() + self.target.len() + self.data.len();
        let mut out = Vec::with_capacity(REQUEST_FIXED + strings + ATTR_LEN);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.arg.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.path.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.target.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(&self.data);
        if let Some(a) = &self.attr {
            a.encode(&mut out);
        }
        out
    }

    /// Decodes and validates: paths must be normalized absolute paths (the server never trusts
    /// a client to have normalized them), names valid single components.
    pub fn decode(b: &[u8]) -> Result<MetaRequest, String> {
        if b.len() < REQUEST_FIXED || b.len() > REQUEST_MAX {
            return Err(format!("metadata payload of {} bytes", b.len()));
        }
        let (plen, nlen, tlen, dlen) = (
            le_u32(b, 24) as usize,
            le_u32(b, 28) as usize,
            le_u32(b, 32) as usize,
            le_u32(b, 36) as usize,
        );
        let rest = b.len() - REQUEST_FIXED;
        if plen > rest || nlen > rest - plen || tlen > rest - plen - nlen || dlen > rest - plen - nlen - tlen
        {
            return Err("metadata payload shorter than its paths".into());
        }
        if dlen > INLINE_LIMIT {
            return Err(format!("{dlen} inline bytes (at most {INLINE_LIMIT})"));
        }
        let (p0, n0, t0) = (REQUEST_FIXED, REQUEST_FIXED + plen, REQUEST_FIXED + plen + nlen);
        let d0 = t0 + tlen;
        let attr = match rest - plen - nlen - tlen - dlen {
            0 => None,
            ATTR_LEN => Some(Attr::decode(&b[d0 + dlen..]).ok_or("malformed attribute")?),
            n => return Err(format!("{n} unexpected trailing bytes")),
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[40..56]);
        let text =
            |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| "path is not UTF-8".to_string());
        let path = text(&b[p0..n0])?;
        let name = text(&b[n0..t0])?;
        let target = text(&b[t0..t0 + tlen])?;
        if target.len() >= PATH_MAX || target.contains('\0') {
            return Err(format!(
                "link target of {} bytes, or with a NUL byte",
                target.len()
            ));
        }
        if normalize(&path).ok().as_deref() != Some(path.as_str()) {
            return Err(format!("path {path:?} is not a normalized absolute path"));
        }
        if !name.is_empty()
            && (name.len() > NAME_MAX || name.contains(['/', '\0']) || name == "." || name == "..")
        {
            return Err(format!("entry name {name:?} is not a valid name"));
        }
        Ok(MetaRequest {
            flags: le_u32(b, 0),
            mode: le_u32(b, 4),
            arg: le_u64(b, 8),
            size: le_u64(b, 16),
            path,
            name,
            target,
            data: b[d0..d0 + dlen].to_vec(),
            id: u128::from_le_bytes(id),
            attr,
        })
    }
}

/// One directory entry as readdir returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: Kind,
    /// 0 for a confirmed entry; else its mark (namespace.rs): the reader checks the inode.
    pub mark: u64,
}

/// The kind byte's flag for an entry followed by its mark.
const MARKED: u8 = 0x80;

/// Encodes readdir entries: per entry a kind byte (with [`MARKED`] set when a mark follows),
/// a u16 length, the name, then the mark (u64) for a marked entry.
pub fn encode_entries(entries: &[DirEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let marked = if e.mark != 0 { MARKED } else { 0 };
        out.push(e.kind as u8 | marked);
        out.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
        out.extend_from_slice(e.name.as_bytes());
        if e.mark != 0 {
            out.extend_from_slice(&e.mark.to_le_bytes());
        }
    }
    out
}

pub fn decode_entries(mut b: &[u8]) -> Option<Vec<DirEntry>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 3 {
            return None;
        }
        let marked = b[0] & MARKED != 0;
        let kind = Kind::from_u8(b[0] & !MARKED)?;
        let len = u16::from_le_bytes([b[1], b[2]]) as usize;
        let name = std::str::from_utf8(b.get(3..3 + len)?).ok()?.to_string();
        b = &b[3 + len..];
        let mark = if marked {
            let m = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
            b = &b[8..];
            if m == 0 {
                return None;
            }
            m
        } else {
            0
        };
        out.push(DirEntry { name, kind, mark });
    }
    Some(out)
}

/// What a find looks for (op `find`, sent to every metadata owner): the names under `root`
/// (and `root` itself) whose last component matches `name` (a glob: `*`, `?`, `[...]`; empty:
/// any), of `kind` (None: any), with a size in `size_min..=size_max` and a modification time
/// after `newer_ns` (0: any). `count_only` answers with the counts alone; else a page of at most
/// `max` matches after `after` (in path order) follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindRequest {
    pub root: String,
    pub name: String,
    pub kind: Option<Kind>,
    pub size_min: u64,
    pub size_max: u64,
    pub newer_ns: u64,
    pub count_only: bool,
    pub after: String,
    pub max: u32,
}

/// The fixed part of a find request: kind, count_only, 2 zero bytes, max, size_min,
/// size_max, newer_ns, then the lengths of root, name and after.
const FIND_FIXED: usize = 44;

impl FindRequest {
    pub fn new(root: &str) -> FindRequest {
        FindRequest {
            root: root.to_string(),
            name: String::new(),
            kind: None,
            size_min: 0,
            size_max: u64::MAX,
            newer_ns: 0,
            count_only: false,
            after: String::new(),
            max: READDIR_PAGE as u32,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIND_FIXED + self.root.len() + self.name.len() + self.after.len());
        out.push(self.kind.map_or(0, |k| k as u8));
        out.push(u8::from(self.count_only));
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&self.max.to_le_bytes());
        for v in [self.size_min, self.size_max, self.newer_ns] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for s in [&self.root, &self.name, &self.after] {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        for s in [&self.root, &self.name, &self.after] {
            out.extend_from_slice(s.as_bytes());
        }
        out
    }

    /// Decodes and validates (normalized paths, a name pattern that is one component).
    pub fn decode(b: &[u8]) -> Result<FindRequest, String> {
        if b.len() < FIND_FIXED || b.len() > REQUEST_MAX {
            return Err(format!("find payload of {} bytes", b.len()));
        }
        let kind = match b[0] {
            0 => None,
            k => Some(Kind::from_u8(k).ok_or(format!("find kind {k}"))?),
        };
        let lens = [
            le_u32(b, 32) as usize,
            le_u32(b, 36) as usize,
            le_u32(b, 40) as usize,
        ];
        if lens.iter().sum::<usize>() != b.len() - FIND_FIXED {
            return Err("find payload does not match its lengths".into());
        }
        let mut at = FIND_FIXED;
        let mut text = |len: usize| {
            let s =
                String::from_utf8(b[at..at + len].to_vec()).map_err(|_| "find text is not UTF-8".to_string());
            at += len;
            s
        };
        let (root, name, after) = (text(lens[0])?, text(lens[1])?, text(lens[2])?);
        let normalized = |p: &str| normalize(p).ok().as_deref() == Some(p);
        if !normalized(&root) || !(after.is_empty() || normalized(&after)) {
            return Err(format!(
                "find paths {root:?}, {after:?}: not normalized absolute paths"
            ));
        }
        if name.len() > NAME_MAX || name.contains(['/', '\0']) || glob::Pattern::new(&name).is_err() {
            return Err(format!("find name pattern {name:?} is not one valid pattern"));
        }
        Ok(FindRequest {
            root,
            name,
            kind,
            size_min: le_u64(b, 8),
            size_max: le_u64(b, 16),
            newer_ns: le_u64(b, 24),
            count_only: b[1] != 0,
            after,
            max: le_u32(b, 4).clamp(1, READDIR_PAGE as u32),
        })
    }
}

/// One match of a find, as its reply carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub mtime_ns: u64,
}

/// A find reply: the names examined and matched (in the whole find over this owner, the
/// page's matches included), then the page: per match kind (u8), size, mtime_ns (u64), path
/// length (u16) and path.
pub fn encode_found(examined: u64, matched: u64, page: &[Found]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&examined.to_le_bytes());
    out.extend_from_slice(&matched.to_le_bytes());
    for f in page {
        out.push(f.kind as u8);
        out.extend_from_slice(&f.size.to_le_bytes());
        out.extend_from_slice(&f.mtime_ns.to_le_bytes());
        out.extend_from_slice(&(f.path.len() as u16).to_le_bytes());
        out.extend_from_slice(f.path.as_bytes());
    }
    out
}

pub fn decode_found(b: &[u8]) -> Option<(u64, u64, Vec<Found>)> {
    let (examined, matched) = (
        u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
        u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
    );
    let mut rest = &b[16..];
    let mut page = Vec::new();
    while !rest.is_empty() {
        let kind = Kind::from_u8(*rest.first()?)?;
        let size = u64::from_le_bytes(rest.get(1..9)?.try_into().ok()?);
        let mtime_ns = u64::from_le_bytes(rest.get(9..17)?.try_into().ok()?);
        let len = u16::from_le_bytes(rest.get(17..19)?.try_into().ok()?) as usize;
        let path = std::str::from_utf8(rest.get(19..19 + len)?).ok()?.to_string();
        page.push(Found {
            path,
            kind,
            size,
            mtime_ns,
        });
        rest = &rest[19 + len..];
    }
    Some((examined, matched, page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::MetaStore;

    #[test]
    fn entries_round_trip() {
        let all: Vec<DirEntry> = (0..300)
            .map(|i| DirEntry {
                name: format!("n{i:04}"),
                kind: if i % 3 == 0 { Kind::Dir } else { Kind::File },
                mark: if i % 5 == 0 { 1 << 40 | i } else { 0 },
            })
            .collect();
        assert_eq!(decode_entries(&encode_entries(&all)), Some(all));
        assert_eq!(decode_entries(&[9, 1, 0, b'x']), None);
        assert_eq!(decode_entries(&[1, 5, 0, b'x']), None);
        // A marked entry without its mark, or with mark 0.
        assert_eq!(decode_entries(&[0x81, 1, 0, b'x', 1, 2]), None);
        assert_eq!(decode_entries(&[0x81, 1, 0, b'x', 0, 0, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn find_requests_and_replies_round_trip_and_reject_garbage() {
        let mut r = FindRequest::new("/a/b");
        r.name = "*01*".into();
        r.kind = Some(Kind::File);
        r.size_min = 3901;
        r.size_max = 3901;
        r.newer_ns = 42;
        r.after = "/a/b/x".into();
        assert_eq!(FindRequest::decode(&r.encode()), Ok(r.clone()));
        let good = r.encode();
        for cut in 0..good.len() {
            assert!(FindRequest::decode(&good[..cut]).is_err());
        }
        for (root, name) in [("a/b", ""), ("/a/../b", ""), ("/", "x/y"), ("/", "[")] {
            let mut q = FindRequest::new("/");
            q.root = root.into();
            q.name = name.into();
            assert!(
                FindRequest::decode(&q.encode()).is_err(),
                "{root:?} {name:?} accepted"
            );
        }
        let page = vec![Found {
            path: "/a/b/f01".into(),
            kind: Kind::File,
            size: 3901,
            mtime_ns: 7,
        }];
        assert_eq!(decode_found(&encode_found(9, 1, &page)), Some((9, 1, page)));
        assert_eq!(decode_found(&[0; 15]), None);
    }

    #[test]
    fn requests_round_trip_and_reject_garbage() {
        let mut r = MetaRequest::new("/a/b");
        r.flags = CREATE;
        r.name = "c".into();
        let mut m = MetaStore::new(0, 1, 1, 4096, 1);
        r.attr = Some(m.create("/x", CREATE, 0o600, None).expect("create").0);
        assert_eq!(MetaRequest::decode(&r.encode()), Ok(r.clone()));
        let good = r.encode();
        for cut in 0..good.len() {
            let _ = MetaRequest::decode(&good[..cut]);
        }
        for bad in ["a/b", "/a/../b", "/a//b", ""] {
            let mut q = MetaRequest::new(bad);
            q.path = bad.into();
            assert!(MetaRequest::decode(&q.encode()).is_err(), "{bad:?} accepted");
        }
        let mut q = MetaRequest::new("/");
        q.name = "..".into();
        assert!(MetaRequest::decode(&q.encode()).is_err());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut b = good.clone();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % b.len() as u64) as usize;
            b[at] = (x >> 32) as u8;
            let _ = MetaRequest::decode(&b);
        }
    }
}
