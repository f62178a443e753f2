//! Timed transfer loops of the native client, one thread and one `Client` per job: the
//! baseline that `benchfs-bench access` holds the FUSE mount and the Python API against. The
//! loop runs here, in Rust, so the baseline carries no interpreter cost per transfer.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use benchfs_core::client::Client;
use benchfs_core::config::Config;
use benchfs_core::error::{Error, Result};
use benchfs_core::protocol;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Create (truncating) and write each file from offset 0, then fsync and close.
    Write,
    /// Open each existing file and read it from offset 0.
    Read,
}

impl Direction {
    pub fn parse(s: &str) -> Result<Direction> {
        match s {
            "write" => Ok(Direction::Write),
            "read" => Ok(Direction::Read),
            other => Err(Error::InvalidArgument(format!(
                "direction {other:?}: expected write or read"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TransferSpec {
    pub registry_dir: PathBuf,
    pub config: Config,
    /// One job (thread and client) per path.
    pub paths: Vec<String>,
    pub file_size: u64,
    pub transfer_size: u64,
    pub direction: Direction,
    /// Write only: fsync before close, as fio's `end_fsync` (counted in the time).
    pub fsync: bool,
    /// Each transfer-sized block of the file once, in a shuffled order (fio's `randwrite` and
    /// `randread` with its random map); else from offset 0 up.
    pub random: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TransferReport {
    /// Bytes moved by all jobs.
    pub bytes: u64,
    /// From the first job's start to the last job's end (jobs start together at a barrier,
    /// after connecting).
    pub seconds: f64,
}

impl TransferReport {
    pub fn mib_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / (1u64 << 20) as f64
        } else {
            0.0
        }
    }
}

/// Runs one job per path in parallel and times them together.
pub fn run_transfers(spec: &TransferSpec) -> Result<TransferReport> {
    if spec.paths.is_empty() {
        return Err(Error::InvalidArgument("at least one path is needed".into()));
    }
    if spec.transfer_size == 0 || spec.transfer_size > 1 << 30 {
        return Err(Error::InvalidArgument(format!(
            "transfer size {} must be between 1 byte and 1 GiB",
            spec.transfer_size
        )));
    }
    let barrier = Barrier::new(spec.paths.len());
    let outcomes: Vec<Result<(Instant, Instant, u64)>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = spec
            .paths
            .iter()
            .map(|path| {
                let barrier = &barrier;
                scope.spawn(move || {
                    // Connect outside the timed region; every job waits at the barrier even
                    // when its connect failed, so the others are never stuck.
                    let client = Client::connect(&spec.registry_dir, spec.config.clone());
                    barrier.wait();
                    job(&client?, spec, path)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(Error::Protocol("a transfer job panicked".into())))
            })
            .collect()
    });
    let mut first = None::<Instant>;
    let mut last = None::<Instant>;
    let mut bytes = 0;
    for outcome in outcomes {
        let (start, end, moved) = outcome?;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        bytes += moved;
    }
    let seconds = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(TransferReport { bytes, seconds })
}

/// The offsets of a job's transfers, in the order they are made.
fn offsets(spec: &TransferSpec, path: &str) -> Vec<u64> {
    let mut offsets: Vec<u64> = (0..spec.file_size.div_ceil(spec.transfer_size))
        .map(|i| i * spec.transfer_size)
        .collect();
    if spec.random {
        // Fisher-Yates with xorshift64, seeded by the path: the same order every run.
        let mut state = path.bytes().fold(0x9e37_79b9_7f4a_7c15_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        }) | 1;
        for i in (1..offsets.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            offsets.swap(i, (state % (i as u64 + 1)) as usize);
        }
    }
    offsets
}

fn job(client: &Client, spec: &TransferSpec, path: &str) -> Result<(Instant, Instant, u64)> {
    let transfer = spec.transfer_size as usize;
    // A non-constant pattern, so compression or zero detection anywhere would show.
    let mut buf: Vec<u8> = (0..transfer).map(|i| (i % 251) as u8).collect();
    let offsets = offsets(spec, path);
    let length = |offset: u64| (spec.file_size - offset).min(spec.transfer_size) as usize;
    let start = Instant::now();
    let mut moved = 0u64;
    match spec.direction {
        Direction::Write => {
            let file = client.open(path, protocol::meta::CREATE | protocol::meta::TRUNCATE, 0o644)?;
            for &offset in &offsets {
                moved += client.write(&file, offset, &buf[..length(offset)])? as u64;
            }
            if spec.fsync {
                client.fsync(&file)?;
            }
            client.close(&file)?;
        }
        Direction::Read => {
            let file = client.open(path, 0, 0)?;
            for &offset in &offsets {
                let got = client.read(&file, offset, &mut buf[..length(offset)])?;
                if got == 0 {
                    return Err(Error::Path {
                        op: "read",
                        path: path.to_string(),
                        errno: libc::ENODATA,
                    });
                }
                moved += got as u64;
            }
            client.close(&file)?;
        }
    }
    Ok((start, Instant::now(), moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(file_size: u64, random: bool) -> TransferSpec {
        TransferSpec {
            registry_dir: PathBuf::new(),
            config: Config::default(),
            paths: vec!["/f".into()],
            file_size,
            transfer_size: 4096,
            direction: Direction::Read,
            fsync: false,
            random,
        }
    }

    #[test]
    fn random_order_covers_every_block_once_and_is_shuffled() {
        let (sequential, random) = (
            offsets(&spec(1 << 20, false), "/f"),
            offsets(&spec(1 << 20, true), "/f"),
        );
        assert_eq!(sequential, (0..256).map(|i| i * 4096).collect::<Vec<u64>>());
        assert_ne!(random, sequential);
        let mut sorted = random.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, sequential);
        assert_eq!(
            random,
            offsets(&spec(1 << 20, true), "/f"),
            "not the same order each run"
        );
        // A tail shorter than a transfer is one block too.
        assert_eq!(offsets(&spec(4096 * 3 + 5, true), "/f").len(), 4);
    }
}
