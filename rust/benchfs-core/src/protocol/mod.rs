//! The wire format: every message starts with one fixed 72-byte little-endian header.
//! See docs/protocol.md. Decoding never panics: short, foreign or unknown headers are errors
//! that the server answers with an error reply.

use crate::error::{Error, Result};
use crate::posix::NAMESPACE_ERRNOS;

pub mod capacity;
pub mod lock;
pub mod meta;
pub mod mirror;

/// "BFS1" in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"BFS1");
/// 3: symbolic links (ops 30 and 31, a request's link target, an attribute's kind 3).
/// 4: advisory locks (op 8).
/// 5: checksums of stored bytes (op 9).
/// 6: writes answered with the checksum of what was stored (op 10); a metadata request's size
///    (set-attribute with SET_SIZE).
/// 7: copies of the metadata (ops 32 and 33; a metadata reply's changes, sequence and record
///    epoch).
/// 8: writes answered with the hash of what was received (op 11); reads answered with the hash
///    of what was read (op 12).
pub const VERSION: u16 = 9;
/// The largest worker address a hello may carry.
pub const HELLO_ADDRESS_MAX: usize = 64 * 1024;
pub const HEADER_LEN: usize = 72;
/// Bytes of a checksum reply's payload (`Op::Checksum`, `Op::WriteChecked`, `Op::WriteHashed`).
pub const CHECKSUM_LEN: usize = 16;

/// Active-message ids: requests travel client to server, replies server to client.
pub const AM_REQUEST: u16 = 1;
pub const AM_REPLY: u16 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Payload: `length` bytes to store at `offset` within chunk `chunk` of `file_id`.
    WriteChunk = 1,
    /// Reply payload: up to `length` bytes from `offset` within the chunk.
    ReadChunk = 2,
    /// Makes every byte of `file_id` written to this server durable before the reply.
    Fsync = 4,
    /// Frees the bytes of `file_id` at and beyond `length` (truncate, unlink). Op 3 is retired.
    TruncateData = 5,
    /// Opens a connection: the payload is the client's UCX worker address, to which the
    /// server connects back for its replies. Reply: [`ReplyValue::Connection`]. Request
    /// `chunk`: an earlier connection id of this client to retire (0: none).
    Hello = 6,
    /// The capacity of the file system holding this worker's data directory and the names it
    /// owns. Reply payload: a `protocol::capacity::Capacity`.
    Statfs = 7,
    /// An advisory lock request on `file_id`: the payload is a `protocol::lock::LockRequest`.
    /// Reply: [`ReplyValue::Lock`]; a test that finds a conflicting lock carries it as the
    /// payload.
    Lock = 8,
    /// The xxh3-128 of `length` bytes at `offset` within chunk `chunk` of `file_id`, as this
    /// server reads them back from its store (never-written bytes count as zeros). Reply
    /// payload: the 16-byte hash, little-endian ([`CHECKSUM_LEN`]).
    Checksum = 9,
    /// As [`Op::WriteChunk`], then the server reads the range back from its store and answers
    /// with its xxh3-128 as [`Op::Checksum`] would (reply `length`: [`CHECKSUM_LEN`], the
    /// payload the hash; a reply without error means every byte was written).
    WriteChecked = 10,
    /// As [`Op::WriteChunk`], answered with the xxh3-128 of the bytes the server received,
    /// hashed in the buffer it stores them from: the transfer and the receipt are covered, the
    /// device is not (no read-back). Reply as [`Op::WriteChecked`]'s.
    WriteHashed = 11,
    /// As [`Op::ReadChunk`], and the reply's `file_id` word carries the xxh3-128 of the
    /// `length` bytes asked for as the server read them from its store (never-written bytes
    /// count as zeros, as [`Op::Checksum`]), hashed in the buffer it sends them from: a read
    /// and its checksum in one pass over the device.
    ReadHashed = 12,
    // Metadata operations: the payload is a `protocol::meta::MetaRequest` of `length` bytes; the
    // reply payload (its size in the reply's `length`) is an attribute or directory entries.
    /// Open or create (flags CREATE, EXCLUSIVE, TRUNCATE). Reply: attribute and
    /// [`ReplyValue::OldSize`] (the size before truncation).
    Create = 16,
    /// Reply: attribute.
    Stat = 17,
    /// Removes a file's inode. Reply: its attribute.
    Unlink = 18,
    /// Reply: attribute.
    Mkdir = 19,
    Rmdir = 20,
    /// Adds entry `name` (kind in `mode`) to directory `path`. Reply: [`ReplyValue::NewEntry`].
    DirAdd = 21,
    /// Removes entry `name` of directory `path` (if `arg` is not 0: only while the entry
    /// carries mark `arg`). Reply: [`ReplyValue::Existed`] (whether it was removed).
    DirRemove = 22,
    /// Entries of `path` after `name`. Reply: entries and [`ReplyValue::MoreFollows`].
    Readdir = 23,
    /// Puts the request's attribute at `path` (rename). Reply: the replaced attribute, if any.
    Install = 24,
    /// Sets the size to `arg` (flags 0: at least; 1: exactly). Reply: attribute and
    /// [`ReplyValue::OldSize`].
    SetSize = 25,
    /// Sets the permission bits to `mode` (flags SET_MODE) and the modification time to `arg`
    /// nanoseconds (flags SET_MTIME). Reply: attribute.
    SetAttr = 26,
    /// Marks entry `name` of directory `path` before its inode goes, so listings check it.
    /// Reply: [`ReplyValue::Existed`].
    DirMark = 27,
    /// Confirms entry `name` of directory `path` if it still carries mark `arg` (a reader found
    /// its inode). Reply: [`ReplyValue::Existed`] (whether it was confirmed).
    DirConfirm = 28,
    /// A find over the names this owner holds: the payload is a `protocol::meta::FindRequest`.
    /// Reply: `protocol::meta::encode_found` (counts, then a page of matches) and
    /// [`ReplyValue::MoreFollows`].
    Find = 29,
    /// Creates a symbolic link at `path` to the request's `target`. Reply: attribute (EEXIST if
    /// the path exists).
    Symlink = 30,
    /// Reply payload: the target of the symbolic link at `path` (EINVAL if it is not one).
    Readlink = 31,
    /// Hands a metadata owner's changes to one of its other copies (payload: a
    /// [`mirror::Mirror`]; `chunk`: 1 + the owner). ESTALE when the copy does not take them
    /// from that server now (the registry's record of lost servers says otherwise).
    Mirror = 32,
    /// A page of the state of a metadata owner's serving copy (`chunk`: 1 + the owner), for
    /// a copy being caught up. Payload: the key to continue after (empty: from the start).
    /// Reply: the page's last key (u16 length, bytes), then records each preceded by its
    /// version (u64); value: whether more follow.
    Snapshot = 33,
    /// An inline file's bytes: `size` bytes from `arg` (the request's `id`, when not 0, must be
    /// the file's). Reply: attribute, then the bytes (none when the file is no longer inline:
    /// its attribute says so, and where its chunks are).
    InlineRead = 34,
    /// Writes the request's `data` at `arg` of an inline file (`id` as for InlineRead). Reply:
    /// attribute and [`ReplyValue::Existed`]: whether it was written (not: the file is not
    /// inline any more, or the write would take it past `layout.inline_max`).
    InlineWrite = 35,
    /// Moves an inline file's bytes into chunks, in two steps. Without flags: reply attribute,
    /// the bytes, and [`ReplyValue::Generation`], under which the client writes them to chunks
    /// (an empty file moves at once: generation 0, not inline in the reply). Then with
    /// `meta::PROMOTE_END`, `arg` that generation and `data` the xxh3-128 of the bytes written:
    /// the file takes those chunks if its bytes are still those. Reply: attribute.
    Promote = 36,
    /// Create (flags and `arg` as Create's) and, when the file is inline, its whole bytes
    /// (`data`), mode and modification time (`size`, ns) in the same request. Reply:
    /// attribute, then the xxh3-128 of the bytes as kept when they were, and
    /// [`ReplyValue::OldSize`].
    PutInline = 37,
}

impl Op {
    /// A write of chunk data (plain, checked or hashed): a payload of `length` bytes.
    pub fn writes_data(self) -> bool {
        matches!(self, Op::WriteChunk | Op::WriteChecked | Op::WriteHashed)
    }

    /// A read of chunk data (plain or hashed): a reply payload of up to `length` bytes.
    pub fn reads_data(self) -> bool {
        matches!(self, Op::ReadChunk | Op::ReadHashed)
    }

    /// A request that moves chunk data (a write or a read of any kind).
    pub fn moves_data(self) -> bool {
        self.writes_data() || self.reads_data()
    }

    pub fn from_u16(v: u16) -> Option<Op> {
        match v {
            1 => Some(Op::WriteChunk),
            2 => Some(Op::ReadChunk),
            4 => Some(Op::Fsync),
            5 => Some(Op::TruncateData),
            6 => Some(Op::Hello),
            7 => Some(Op::Statfs),
            8 => Some(Op::Lock),
            9 => Some(Op::Checksum),
            10 => Some(Op::WriteChecked),
            11 => Some(Op::WriteHashed),
            12 => Some(Op::ReadHashed),
            16 => Some(Op::Create),
            17 => Some(Op::Stat),
            18 => Some(Op::Unlink),
            19 => Some(Op::Mkdir),
            20 => Some(Op::Rmdir),
            21 => Some(Op::DirAdd),
            22 => Some(Op::DirRemove),
            23 => Some(Op::Readdir),
            24 => Some(Op::Install),
            25 => Some(Op::SetSize),
            26 => Some(Op::SetAttr),
            27 => Some(Op::DirMark),
            28 => Some(Op::DirConfirm),
            29 => Some(Op::Find),
            30 => Some(Op::Symlink),
            31 => Some(Op::Readlink),
            32 => Some(Op::Mirror),
            33 => Some(Op::Snapshot),
            34 => Some(Op::InlineRead),
            35 => Some(Op::InlineWrite),
            36 => Some(Op::Promote),
            37 => Some(Op::PutInline),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::WriteChunk => "write_chunk",
            Op::ReadChunk => "read_chunk",
            Op::Fsync => "fsync",
            Op::TruncateData => "truncate_data",
            Op::Hello => "hello",
            Op::Statfs => "statfs",
            Op::Lock => "lock",
            Op::Checksum => "checksum",
            Op::WriteChecked => "write_checked",
            Op::WriteHashed => "write_hashed",
            Op::ReadHashed => "read_hashed",
            Op::Create => "create",
            Op::Stat => "stat",
            Op::Unlink => "unlink",
            Op::Mkdir => "mkdir",
            Op::Rmdir => "rmdir",
            Op::DirAdd => "dir_add",
            Op::DirRemove => "dir_remove",
            Op::Readdir => "readdir",
            Op::Install => "install",
            Op::SetSize => "set_size",
            Op::SetAttr => "set_attr",
            Op::DirMark => "dir_mark",
            Op::DirConfirm => "dir_confirm",
            Op::Find => "find",
            Op::Symlink => "symlink",
            Op::Readlink => "readlink",
            Op::Mirror => "mirror",
            Op::Snapshot => "snapshot",
            Op::InlineRead => "inline_read",
            Op::InlineWrite => "inline_write",
            Op::Promote => "promote",
            Op::PutInline => "put_inline",
        }
    }

    /// Every op, for tests and documentation.
    pub const ALL: [Op; 33] = [
        Op::WriteChunk,
        Op::ReadChunk,
        Op::Fsync,
        Op::TruncateData,
        Op::Hello,
        Op::Statfs,
        Op::Lock,
        Op::Checksum,
        Op::WriteChecked,
        Op::WriteHashed,
        Op::ReadHashed,
        Op::Create,
        Op::Stat,
        Op::Unlink,
        Op::Mkdir,
        Op::Rmdir,
        Op::DirAdd,
        Op::DirRemove,
        Op::Readdir,
        Op::Install,
        Op::SetSize,
        Op::SetAttr,
        Op::DirMark,
        Op::DirConfirm,
        Op::Find,
        Op::Symlink,
        Op::Readlink,
        Op::Mirror,
        Op::Snapshot,
        Op::InlineRead,
        Op::InlineWrite,
        Op::Promote,
        Op::PutInline,
    ];

    /// Whether this op is served by the metadata store (payload: a `MetaRequest`).
    pub fn is_metadata(self) -> bool {
        (self as u16) >= 16
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    /// 0 or a negative errno (replies only).
    pub status: i32,
    /// The connection the server gave this client at hello (requests; replies echo it).
    pub client: u32,
    /// Unique per client; a reply carries its request's id.
    pub request_id: u64,
    pub file_id: u128,
    pub chunk: u64,
    /// Requests: the byte offset within the chunk. Replies: the [`ReplyValue`] word; read it
    /// with [`Header::value`].
    pub offset: u64,
    /// Request: bytes to write or read. Reply: bytes written or read.
    pub length: u64,
    /// The job token (from the job secret); servers refuse requests without the right one.
    pub token: u64,
}

/// What a reply says besides its status, byte count and payload, one meaning per op. It travels
/// in the header's `offset` word and is encoded and decoded only here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyValue {
    /// Data replies and metadata ops with nothing more to say.
    Nothing,
    /// Hello: the connection id that later requests carry in `client`.
    Connection(u32),
    /// Create and SetSize: the file's size before the call.
    OldSize(u64),
    /// DirAdd: the stripe start chosen for a new entry; `None` when the entry existed.
    NewEntry(Option<u32>),
    /// Readdir: whether more entries follow this page.
    MoreFollows(bool),
    /// DirRemove, DirMark, DirConfirm: whether the entry was there (and changed); InlineWrite:
    /// whether the bytes were written.
    Existed(bool),
    /// Promote: the generation of the chunks to write an inline file's bytes to (0: none).
    Generation(u16),
    /// WriteChunk, WriteChecked and ReadChunk: the server's own time for the request, in µs (saturated):
    /// from its arrival to its hand-off to the storage engine (`queue_us`, the server's
    /// `queue_wait_ns`), and to its reply being ready (`total_us`, `total_ns`); 0 when the
    /// server did not serve it (a refusal). What the client's call stages split by.
    Served { queue_us: u32, total_us: u32 },
    /// Lock: what became of the request, and the epoch of the server worker keeping the
    /// file's locks (another epoch than when a lock was taken: the server restarted, and the
    /// lock is gone).
    Lock { state: lock::LockState, epoch: u32 },
}

impl ReplyValue {
    fn word(self) -> u64 {
        match self {
            ReplyValue::Nothing => 0,
            ReplyValue::Connection(id) => u64::from(id),
            ReplyValue::Generation(g) => u64::from(g),
            ReplyValue::OldSize(size) => size,
            // 0 for an existing entry, so a new entry's start is stored plus one.
            ReplyValue::NewEntry(start) => start.map_or(0, |s| u64::from(s) + 1),
            ReplyValue::MoreFollows(more) | ReplyValue::Existed(more) => u64::from(more),
            ReplyValue::Served { queue_us, total_us } => u64::from(queue_us) << 32 | u64::from(total_us),
            ReplyValue::Lock { state, epoch } => (state as u64) << 32 | u64::from(epoch),
        }
    }

    fn of(op: Op, word: u64) -> ReplyValue {
        match op {
            Op::Hello => ReplyValue::Connection(word as u32),
            Op::Create | Op::SetSize | Op::PutInline => ReplyValue::OldSize(word),
            Op::Promote => ReplyValue::Generation(word as u16),
            Op::DirAdd => ReplyValue::NewEntry(word.checked_sub(1).and_then(|s| u32::try_from(s).ok())),
            Op::Readdir | Op::Find | Op::Snapshot => ReplyValue::MoreFollows(word != 0),
            Op::DirRemove | Op::DirMark | Op::DirConfirm | Op::InlineWrite => ReplyValue::Existed(word != 0),
            op if op.moves_data() => ReplyValue::Served {
                queue_us: (word >> 32) as u32,
                total_us: word as u32,
            },
            Op::Lock => ReplyValue::Lock {
                state: lock::LockState::of((word >> 32) as u32),
                epoch: word as u32,
            },
            _ => ReplyValue::Nothing,
        }
    }

    /// The size before the call (0 for replies that carry none).
    pub fn old_size(self) -> u64 {
        match self {
            ReplyValue::OldSize(size) => size,
            _ => 0,
        }
    }
}

/// Why a header could not be decoded, with the request id when it was readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub request_id: Option<u64>,
    /// The sender's connection id, when readable (the server answers on that connection).
    pub client: Option<u32>,
    pub reason: String,
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Protocol(e.reason)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    pub fn request(op: Op, request_id: u64, file_id: u128, chunk: u64, offset: u64, length: u64) -> Self {
        Header {
            op,
            status: 0,
            client: 0,
            request_id,
            file_id,
            chunk,
            offset,
            length,
            token: 0,
        }
    }

    /// This header carrying connection id `client`.
    pub fn on_connection(self, client: u32) -> Self {
        Header { client, ..self }
    }

    /// This header carrying the job token.
    pub fn with_token(self, token: u64) -> Self {
        Header { token, ..self }
    }

    /// The reply to this request with `status` (0 or -errno) and a byte count; its reply
    /// value is its op's empty one until [`Self::with_value`].
    pub fn reply(&self, status: i32, length: u64) -> Self {
        Header {
            status,
            length,
            offset: 0,
            ..*self
        }
    }

    /// This reply carrying `value`, which must be its op's kind of value.
    pub fn with_value(self, value: ReplyValue) -> Self {
        debug_assert!(value == ReplyValue::Nothing || ReplyValue::of(self.op, value.word()) == value);
        Header {
            offset: value.word(),
            ..self
        }
    }

    /// What this reply says for its op.
    pub fn value(&self) -> ReplyValue {
        ReplyValue::of(self.op, self.offset)
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..16].copy_from_slice(&self.client.to_le_bytes());
        b[16..24].copy_from_slice(&self.request_id.to_le_bytes());
        b[24..40].copy_from_slice(&self.file_id.to_le_bytes());
        b[40..48].copy_from_slice(&self.chunk.to_le_bytes());
        b[48..56].copy_from_slice(&self.offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.length.to_le_bytes());
        b[64..72].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Header, DecodeError> {
        let fail = |ids: Option<(u64, u32)>, reason: String| {
            Err(DecodeError {
                request_id: ids.map(|i| i.0),
                client: ids.map(|i| i.1),
                reason,
            })
        };
        if b.len() < HEADER_LEN {
            return fail(
                None,
                format!("header of {} bytes, expected {HEADER_LEN}", b.len()),
            );
        }
        let magic = u32_at(b, 0);
        if magic != MAGIC {
            return fail(None, format!("bad magic {magic:#010x}"));
        }
        let request_id = Some((u64_at(b, 16), u32_at(b, 12)));
        let version = u16_at(b, 4);
        if version != VERSION {
            return fail(
                request_id,
                format!("unsupported protocol version {version} (this side speaks {VERSION})"),
            );
        }
        if b.len() != HEADER_LEN {
            return fail(
                request_id,
                format!("header of {} bytes, expected {HEADER_LEN}", b.len()),
            );
        }
        let op_raw = u16_at(b, 6);
        let Some(op) = Op::from_u16(op_raw) else {
            return fail(request_id, format!("unknown op {op_raw}"));
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[24..40]);
        Ok(Header {
            op,
            status: u32_at(b, 8) as i32,
            client: u32_at(b, 12),
            request_id: u64_at(b, 16),
            file_id: u128::from_le_bytes(id),
            chunk: u64_at(b, 40),
            offset: u64_at(b, 48),
            length: u64_at(b, 56),
            token: u64_at(b, 64),
        })
    }
}

/// Whether a reply status is the server failing (an I/O error, a payload that never arrived),
/// as opposed to success or a metadata owner's answer about a path (ENOENT for a lookup of a
/// name not yet created is an answer, not a fault).
pub fn is_server_fault(status: i32) -> bool {
    status < 0 && !NAMESPACE_ERRNOS.contains(&-status)
}

/// Checks a request header against its payload and the chunk size; returns the errno to answer.
pub fn check_request(h: &Header, payload_len: usize, chunk_size: u64) -> Result<()> {
    let end = h.offset.checked_add(h.length);
    match h.op {
        op if op.moves_data() && end.is_none_or(|e| e > chunk_size) => Err(Error::Protocol(format!(
            "{} range {}+{} exceeds the chunk size {chunk_size}",
            h.op.name(),
            h.offset,
            h.length
        ))),
        op if op.writes_data() && h.length != payload_len as u64 => Err(Error::Protocol(format!(
            "{} header says {} bytes but {payload_len} arrived",
            h.op.name(),
            h.length
        ))),
        Op::Hello if !(1..=HELLO_ADDRESS_MAX).contains(&payload_len) || h.length != payload_len as u64 => {
            Err(Error::Protocol(format!(
                "hello carries a worker address of {payload_len} bytes (header says {}, at most \
                 {HELLO_ADDRESS_MAX})",
                h.length
            )))
        }
        Op::Lock if payload_len != lock::LockRequest::LEN || h.length != payload_len as u64 => {
            Err(Error::Protocol(format!(
                "lock carries {payload_len} bytes (header says {}), not {}",
                h.length,
                lock::LockRequest::LEN
            )))
        }
        Op::ReadChunk | Op::ReadHashed | Op::Fsync | Op::TruncateData if payload_len != 0 => {
            Err(Error::Protocol(format!(
                "{} carries an unexpected payload of {payload_len} bytes",
                h.op.name()
            )))
        }
        Op::Mirror | Op::Snapshot if h.length != payload_len as u64 || payload_len > mirror::REQUEST_MAX => {
            Err(Error::Protocol(format!(
                "{} payload of {payload_len} bytes (header says {}, at most {})",
                h.op.name(),
                h.length,
                mirror::REQUEST_MAX
            )))
        }
        Op::Mirror | Op::Snapshot => Ok(()),
        op if op.is_metadata()
            && (h.length != payload_len as u64
                || !(24..=crate::protocol::meta::REQUEST_MAX).contains(&payload_len)) =>
        {
            Err(Error::Protocol(format!(
                "{} payload of {payload_len} bytes (header says {})",
                op.name(),
                h.length
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header::request(Op::WriteChunk, u64::MAX - 3, u128::MAX / 7, 12345, 17, 4096)
            .with_token(0xFEED)
            .on_connection(0xC0FF)
    }

    #[test]
    fn round_trip() {
        for op in Op::ALL {
            let h = Header { op, ..sample() }.reply(-libc::ENOENT, 99);
            assert_eq!(Header::decode(&h.encode()), Ok(h));
        }
    }

    #[test]
    fn reply_values_survive_the_wire_with_their_op() {
        let cases = [
            (Op::Hello, ReplyValue::Connection(7)),
            (Op::Create, ReplyValue::OldSize(1 << 40)),
            (Op::SetSize, ReplyValue::OldSize(0)),
            (Op::DirAdd, ReplyValue::NewEntry(None)),
            (Op::DirAdd, ReplyValue::NewEntry(Some(0))),
            (Op::DirAdd, ReplyValue::NewEntry(Some(u32::MAX))),
            (Op::Readdir, ReplyValue::MoreFollows(true)),
            (Op::Readdir, ReplyValue::MoreFollows(false)),
            (Op::DirRemove, ReplyValue::Existed(true)),
            (Op::DirRemove, ReplyValue::Existed(false)),
            (Op::Stat, ReplyValue::Nothing),
            (
                Op::ReadChunk,
                ReplyValue::Served {
                    queue_us: 7,
                    total_us: u32::MAX,
                },
            ),
            (
                Op::WriteChunk,
                ReplyValue::Served {
                    queue_us: 0,
                    total_us: 1,
                },
            ),
        ];
        for (op, value) in cases {
            let h = Header { op, ..sample() }.reply(0, 0).with_value(value);
            assert_eq!(
                Header::decode(&h.encode()).map(|d| d.value()),
                Ok(value),
                "{op:?}"
            );
        }
        // A reply's word is not the request's offset: a data reply without its time says 0.
        assert_eq!(
            sample().reply(0, 1).value(),
            ReplyValue::Served {
                queue_us: 0,
                total_us: 0
            }
        );
        assert_eq!(ReplyValue::OldSize(5).old_size(), 5);
        assert_eq!(ReplyValue::Nothing.old_size(), 0);
    }

    #[test]
    fn malformed_headers_are_errors() {
        let good = sample().encode();
        assert!(Header::decode(&good[..10]).is_err_and(|e| e.request_id.is_none()));
        assert!(Header::decode(&[]).is_err());
        let mut bad = good;
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_err_and(|e| e.reason.contains("magic")));
        let mut bad = good;
        bad[4] = (VERSION + 1) as u8;
        let e = Header::decode(&bad).err();
        assert_eq!(e.as_ref().and_then(|e| e.request_id), Some(u64::MAX - 3));
        assert!(e.is_some_and(|e| e.reason.contains(&format!("version {}", VERSION + 1))));
        let mut bad = good;
        bad[6] = 77;
        assert!(Header::decode(&bad).is_err_and(|e| e.reason.contains("unknown op 77")));
        let mut long = good.to_vec();
        long.push(0);
        assert!(Header::decode(&long).is_err());
        let mut bad = good;
        bad[4] = 1;
        bad[12] = 5;
        let e = Header::decode(&bad).err();
        assert_eq!(e.as_ref().and_then(|e| e.client), Some(0xC005));
    }

    /// Bounded randomized test: random bytes and single-byte mutations of valid headers never
    /// panic, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn random_and_mutated_headers_never_panic() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = sample().encode();
        for round in 0..200_000 {
            let mut buf = if round % 2 == 0 {
                let len = (next() % (HEADER_LEN as u64 + 16)) as usize;
                (0..len).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                let mut b = valid.to_vec();
                let at = (next() % HEADER_LEN as u64) as usize;
                b[at] = next() as u8;
                b
            };
            if round % 7 == 0 {
                buf.truncate((next() % (buf.len() as u64 + 1)) as usize);
            }
            if let Ok(h) = Header::decode(&buf) {
                assert_eq!(&h.encode()[..], &buf[..], "decode/encode mismatch");
                let _ = check_request(&h, (next() % 10_000) as usize, 1 << 20);
            }
        }
    }

    /// Replays the cargo-fuzz corpus (rust/fuzz/corpus/header) so findings stay fixed.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/header");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                if let Ok(h) = Header::decode(&bytes) {
                    assert_eq!(&h.encode()[..], &bytes[..]);
                }
                replayed += 1;
            }
        }
        assert!(replayed >= 4, "corpus at {} has {replayed} inputs", dir.display());
    }

    #[test]
    fn request_checks() {
        let h = sample();
        assert!(check_request(&h, 4096, 1 << 20).is_ok());
        assert!(check_request(&h, 4095, 1 << 20).is_err());
        assert!(check_request(&h, 4096, 4096).is_err());
        let overflow = Header {
            offset: u64::MAX,
            ..h
        };
        assert!(check_request(&overflow, 4096, 1 << 20).is_err());
        let read = Header {
            op: Op::ReadChunk,
            ..h
        };
        assert!(check_request(&read, 1, 1 << 20).is_err());
        assert!(check_request(&read, 0, 1 << 20).is_ok());
    }
}
