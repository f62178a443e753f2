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

fn job(client: &Client, spec: &TransferSpec, path: &str) -> Result<(Instant, Instant, u64)> {
    let transfer = spec.transfer_size as usize;
    // A non-constant pattern, so compression or zero detection anywhere would show.
    let mut buf: Vec<u8> = (0..transfer).map(|i| (i % 251) as u8).collect();
    let start = Instant::now();
    let mut moved = 0u64;
    match spec.direction {
        Direction::Write => {
            let file = client.open(path, protocol::meta::CREATE | protocol::meta::TRUNCATE, 0o644)?;
            while moved < spec.file_size {
                let n = (spec.file_size - moved).min(spec.transfer_size) as usize;
                moved += client.write(&file, moved, &buf[..n])? as u64;
            }
            if spec.fsync {
                client.fsync(&file)?;
            }
            client.close(&file)?;
        }
        Direction::Read => {
            let file = client.open(path, 0, 0)?;
            while moved < spec.file_size {
                let n = (spec.file_size - moved).min(spec.transfer_size) as usize;
                let got = client.read(&file, moved, &mut buf[..n])?;
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
