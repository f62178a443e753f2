//! Splitting byte ranges into chunks, and the ids chunks are named by (where chunks live:
//! [`crate::placement`]).

/// A file's identity: 128 bits handed out by its metadata owner at create time (the owner's
/// index and a per-start nonce above a counter), so no two files ever share chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u128);

impl FileId {
    /// On-disk and log form.
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// One chunk's share of a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPiece {
    pub chunk: u64,
    /// Offset within the chunk.
    pub offset: u64,
    pub len: u64,
    /// Offset of this piece within the caller's buffer.
    pub buf_offset: u64,
}

/// Splits `[offset, offset+len)` on `chunk_size` boundaries. Empty for `len == 0`.
pub fn split(offset: u64, len: u64, chunk_size: u64) -> impl Iterator<Item = ChunkPiece> {
    let end = offset.saturating_add(len);
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end || chunk_size == 0 {
            return None;
        }
        let chunk = pos / chunk_size;
        let in_chunk = pos % chunk_size;
        let take = (chunk_size - in_chunk).min(end - pos);
        let piece = ChunkPiece {
            chunk,
            offset: in_chunk,
            len: take,
            buf_offset: pos - offset,
        };
        pos += take;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_length_is_empty() {
        assert_eq!(split(5, 0, 4).count(), 0);
        assert_eq!(split(u64::MAX, 10, 4).count(), 0);
    }

    #[test]
    fn aligned_and_unaligned() {
        let p: Vec<_> = split(0, 8, 4).collect();
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].chunk, p[1].offset, p[1].len, p[1].buf_offset), (1, 0, 4, 4));
        let p: Vec<_> = split(3, 6, 4).collect();
        assert_eq!(
            p.iter()
                .map(|c| (c.chunk, c.offset, c.len, c.buf_offset))
                .collect::<Vec<_>>(),
            vec![(0, 3, 1, 0), (1, 0, 4, 1), (2, 0, 1, 5)]
        );
        let p: Vec<_> = split(5, 2, 4).collect();
        assert_eq!((p[0].chunk, p[0].offset, p[0].len), (1, 1, 2));
    }

    #[test]
    fn many_chunks_cover_the_range_exactly() {
        let (offset, len, cs) = (12_345u64, 10_000_000u64, 65_536u64);
        let pieces: Vec<_> = split(offset, len, cs).collect();
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
        let mut next = 0;
        for p in &pieces {
            assert_eq!(p.buf_offset, next);
            assert!(p.offset + p.len <= cs && p.len > 0);
            assert_eq!(p.chunk * cs + p.offset, offset + p.buf_offset);
            next += p.len;
        }
        assert_eq!(pieces.len() as u64, (offset + len - 1) / cs - offset / cs + 1);
    }
}
