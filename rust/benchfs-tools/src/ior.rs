//! The I/O loop of the built-in IOR-compatible workload (`benchfs.workloads.ior`): one rank's
//! transfers of one phase on an open file, in IOR's order, with IOR's data check. The loop runs
//! here so that a rank spends no interpreter time per transfer; MPI coordination (barriers,
//! reductions, error exchange) stays in Python around it.
//!
//! Offsets are IOR's sequential ones (`GetOffsetArraySequential` in hpc/ior `src/ior.c`): for
//! segment `s` and transfer `j` of a block, `s * block + j * xfer` in a file per process, and
//! `s * block * tasks + rank * block + j * xfer` in a shared file, `rank` being the task whose
//! data is accessed (another one under `-C`).
//!
//! Data pattern: the little-endian 64-bit word at file offset `o` (a multiple of 8) written by
//! rank `r` is `((r + 1) << 40) | (o / 8 mod 2^40)`, so a word names its writer and its place,
//! and a wrong offset, a wrong file or a hole (zeros) is told apart from a flipped bit.

use std::time::{Duration, Instant};

use crate::transfer::Direction;
use benchfs_core::client::{Client, FileHandle};
use benchfs_core::error::{Error, Result};

const WORD: usize = 8;
const RANK_SHIFT: u32 = 40;
const INDEX_MASK: u64 = (1 << RANK_SHIFT) - 1;
/// Largest transfer accepted: one buffer of this size is allocated per phase.
pub const MAX_TRANSFER: u64 = 1 << 30;

/// Where one rank's transfers go: IOR's `-s`, `-b`, `-t`, task count and `-F`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub segments: u64,
    pub block_size: u64,
    pub transfer_size: u64,
    pub tasks: u64,
    pub file_per_proc: bool,
    /// The task whose data this rank accesses (its own, or its neighbour's under `-C`).
    pub data_rank: u64,
}

impl Geometry {
    /// Checks IOR's rules (block a multiple of the transfer, transfer a multiple of 8 bytes so
    /// that every transfer starts at a pattern word) and that offsets do not overflow.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.transfer_size == 0 || self.transfer_size > MAX_TRANSFER {
            return bad(format!(
                "transfer size {} must be between 8 bytes and 1 GiB",
                self.transfer_size
            ));
        }
        if !self.transfer_size.is_multiple_of(WORD as u64) {
            return bad(format!(
                "transfer size {} must be a multiple of 8 bytes",
                self.transfer_size
            ));
        }
        if self.block_size == 0 || !self.block_size.is_multiple_of(self.transfer_size) {
            return bad(format!(
                "block size {} must be a positive multiple of the transfer size {}",
                self.block_size, self.transfer_size
            ));
        }
        if self.segments == 0 || self.tasks == 0 || self.data_rank >= self.tasks {
            return bad(format!(
                "segments {} and tasks {} must be positive and rank {} below the tasks",
                self.segments, self.tasks, self.data_rank
            ));
        }
        if self.data_rank + 1 >= 1 << (64 - RANK_SHIFT) {
            return bad(format!("rank {} does not fit the pattern", self.data_rank));
        }
        let per_segment = if self.file_per_proc { 1 } else { self.tasks };
        let end = self
            .segments
            .checked_mul(self.block_size)
            .and_then(|v| v.checked_mul(per_segment));
        if end.is_none() {
            return bad("segments x block size x tasks overflows 64 bits".into());
        }
        Ok(())
    }

    pub fn transfers_per_block(&self) -> u64 {
        self.block_size / self.transfer_size
    }

    /// Transfers of one rank in one phase.
    pub fn ops(&self) -> u64 {
        self.segments * self.transfers_per_block()
    }

    /// File offset of this rank's transfer number `op` (segment-major).
    pub fn offset(&self, op: u64) -> u64 {
        let per_block = self.transfers_per_block();
        let (segment, j) = (op / per_block, op % per_block);
        let within = j * self.transfer_size;
        if self.file_per_proc {
            segment * self.block_size + within
        } else {
            segment * self.block_size * self.tasks + self.data_rank * self.block_size + within
        }
    }
}

/// The pattern word at `offset` (a multiple of 8) of data written by `rank`.
pub fn pattern_word(rank: u64, offset: u64) -> u64 {
    ((rank + 1) << RANK_SHIFT) | ((offset / WORD as u64) & INDEX_MASK)
}

/// Fills `buf` with `rank`'s pattern for file offset `offset` (a multiple of 8).
pub fn fill_pattern(buf: &mut [u8], rank: u64, offset: u64) {
    let base = pattern_word(rank, offset);
    let n = buf.len() / WORD;
    let mut words = buf.chunks_exact_mut(WORD);
    for (i, w) in (&mut words).enumerate() {
        // The index field cannot carry into the rank bits before 8 TiB of offset.
        w.copy_from_slice(&(base + i as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    let last = (base + n as u64).to_le_bytes();
    let len = tail.len();
    tail.copy_from_slice(&last[..len]);
}

/// Says where an 8-byte word of pattern data came from.
pub fn describe_word(word: u64) -> String {
    if word == 0 {
        return "zeros".into();
    }
    let rank = (word >> RANK_SHIFT).wrapping_sub(1);
    if (word >> RANK_SHIFT) != 0 {
        format!(
            "data of rank {rank} at offset {}",
            (word & INDEX_MASK) * WORD as u64
        )
    } else {
        format!("unrecognised bytes {word:016x}")
    }
}

/// The first word that differs from the pattern, and how many words differed in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// File offset of the first differing word.
    pub offset: u64,
    pub expected: u64,
    pub found: u64,
}

impl Mismatch {
    pub fn describe(&self) -> String {
        format!(
            "word at offset {} differs: expected {}, found {}",
            self.offset,
            describe_word(self.expected),
            describe_word(self.found)
        )
    }
}

/// One rank's phase: what to do on which bytes, and when to stop.
#[derive(Debug, Clone)]
pub struct PhaseSpec {
    pub geometry: Geometry,
    pub direction: Direction,
    /// Read: compare with the pattern (IOR's `-R`, and `-W`'s read-back).
    pub verify: bool,
    /// Stop starting transfers after this long (IOR's `-D`); None runs them all.
    pub stonewall: Option<Duration>,
    /// Start at this transfer (the wear-out after a stonewall goes on where the loop stopped).
    pub first_op: u64,
    /// Stop before this transfer (a read after a stonewalled write reads what was written).
    pub max_ops: Option<u64>,
    /// Write: fsync once the transfers are done (IOR's `-e`), inside the timed loop.
    pub fsync: bool,
}

/// What one rank's phase did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PhaseReport {
    pub bytes: u64,
    pub ops: u64,
    /// Time of the loop (and the fsync), in seconds.
    pub seconds: f64,
    /// True when the stonewall stopped the loop before the last transfer.
    pub stonewalled: bool,
    /// Per-transfer latency in seconds.
    pub lat_mean_s: f64,
    pub lat_min_s: f64,
    pub lat_p50_s: f64,
    pub lat_p99_s: f64,
    pub lat_max_s: f64,
    pub fsync_s: f64,
    /// Words that differed from the pattern (verified reads only).
    pub mismatched_words: u64,
    pub first_mismatch: Option<Mismatch>,
}

/// Compares `got` with `rank`'s pattern at `offset`; counts differing words into `report`.
fn check(got: &[u8], rank: u64, offset: u64, report: &mut PhaseReport) {
    let base = pattern_word(rank, offset);
    for (i, w) in got.chunks_exact(WORD).enumerate() {
        let mut bytes = [0u8; WORD];
        bytes.copy_from_slice(w);
        let found = u64::from_le_bytes(bytes);
        let expected = base + i as u64;
        if found != expected {
            report.mismatched_words += 1;
            if report.first_mismatch.is_none() {
                report.first_mismatch = Some(Mismatch {
                    offset: offset + (i * WORD) as u64,
                    expected,
                    found,
                });
            }
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Runs one rank's phase on `file`. A short read (the file ends early) is an error naming the
/// offset; pattern mismatches are counted and reported, not raised, as IOR does.
pub fn run_phase(client: &Client, file: &FileHandle, spec: &PhaseSpec) -> Result<PhaseReport> {
    let g = &spec.geometry;
    g.validate()?;
    let end = spec.max_ops.map_or(g.ops(), |m| m.min(g.ops()));
    let ops = end.saturating_sub(spec.first_op);
    let transfer = g.transfer_size as usize;
    let mut buf = vec![0u8; transfer];
    let mut latencies = Vec::with_capacity(ops.min(1 << 24) as usize);
    let mut report = PhaseReport::default();
    let start = Instant::now();
    let deadline = spec.stonewall.map(|d| start + d);
    for op in spec.first_op..end {
        if let Some(d) = deadline {
            if Instant::now() >= d {
                report.stonewalled = true;
                break;
            }
        }
        let offset = g.offset(op);
        match spec.direction {
            Direction::Write => {
                // IOR also stamps each transfer's buffer with its offset before writing it.
                fill_pattern(&mut buf, g.data_rank, offset);
                let t0 = Instant::now();
                let n = client.write(file, offset, &buf)?;
                latencies.push(t0.elapsed().as_secs_f64());
                if n != transfer {
                    return Err(Error::Path {
                        op: "write",
                        path: format!(
                            "{} (short write at offset {offset}: {n} of {transfer})",
                            file.path
                        ),
                        errno: libc::EIO,
                    });
                }
            }
            Direction::Read => {
                let t0 = Instant::now();
                let n = client.read(file, offset, &mut buf)?;
                latencies.push(t0.elapsed().as_secs_f64());
                if n != transfer {
                    return Err(Error::Path {
                        op: "read",
                        path: format!("{} (short read at offset {offset}: {n} of {transfer} bytes; the file ends early)", file.path),
                        errno: libc::ENODATA,
                    });
                }
                if spec.verify {
                    check(&buf, g.data_rank, offset, &mut report);
                }
            }
        }
        report.ops += 1;
        report.bytes += transfer as u64;
    }
    if spec.fsync && spec.direction == Direction::Write {
        let t0 = Instant::now();
        client.fsync(file)?;
        report.fsync_s = t0.elapsed().as_secs_f64();
    }
    report.seconds = start.elapsed().as_secs_f64();
    if !latencies.is_empty() {
        report.lat_mean_s = latencies.iter().sum::<f64>() / latencies.len() as f64;
        latencies.sort_by(|a, b| a.total_cmp(b));
        report.lat_min_s = latencies[0];
        report.lat_p50_s = quantile(&latencies, 0.5);
        report.lat_p99_s = quantile(&latencies, 0.99);
        report.lat_max_s = latencies[latencies.len() - 1];
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(fpp: bool, rank: u64) -> Geometry {
        Geometry {
            segments: 2,
            block_size: 32,
            transfer_size: 16,
            tasks: 3,
            file_per_proc: fpp,
            data_rank: rank,
        }
    }

    #[test]
    fn offsets_are_segment_major_like_ior() {
        let fpp: Vec<u64> = (0..4).map(|op| geo(true, 1).offset(op)).collect();
        assert_eq!(fpp, vec![0, 16, 32, 48]);
        // Shared: segment 0 holds ranks 0..3's blocks, then segment 1.
        let shared: Vec<u64> = (0..4).map(|op| geo(false, 1).offset(op)).collect();
        assert_eq!(shared, vec![32, 48, 128, 144]);
    }

    #[test]
    fn validation_rejects_ior_errors() {
        let mut g = geo(true, 0);
        g.block_size = 40;
        assert!(g.validate().is_err());
        let mut g = geo(true, 0);
        g.transfer_size = 12;
        g.block_size = 24;
        assert!(g.validate().is_err());
        assert!(geo(false, 3).validate().is_err());
        assert!(geo(false, 2).validate().is_ok());
    }

    #[test]
    fn pattern_names_rank_and_offset() {
        let mut buf = vec![0u8; 24];
        fill_pattern(&mut buf, 2, 4096);
        let mut report = PhaseReport::default();
        check(&buf, 2, 4096, &mut report);
        assert_eq!(report.mismatched_words, 0);
        buf[9] ^= 1;
        check(&buf, 2, 4096, &mut report);
        assert_eq!(report.mismatched_words, 1);
        let m = report.first_mismatch.clone().map(|m| m.offset);
        assert_eq!(m, Some(4104));
        assert_eq!(
            describe_word(pattern_word(2, 4104)),
            "data of rank 2 at offset 4104"
        );
        assert_eq!(describe_word(0), "zeros");
        let mut other = PhaseReport::default();
        check(&buf, 1, 4096, &mut other);
        assert_eq!(other.mismatched_words, 3);
    }
}
