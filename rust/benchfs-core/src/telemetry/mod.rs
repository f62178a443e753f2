//! Telemetry: always-on counters and histograms kept by every server worker, and the
//! versioned snapshot files they are written to (format: `docs/telemetry.md`).
//!
//! Recording is single-threaded and cheap: every metric is a [`Cell`] owned by one worker
//! thread (no atomics, no allocation, no clock reads in here), and a histogram record is a
//! leading-zero count, two shifts and five cell updates. With telemetry disabled every
//! `record_*`/`count_*` method returns at its first instruction, which is how the overhead of
//! telemetry is measured.
//!
//! Snapshots hold cumulative values. [`SnapshotWriter::write`] appends one snapshot as a run
//! of fixed 32-byte little-endian records (one per counter, gauge and histogram statistic,
//! and one per non-empty histogram bucket) closed by an end-of-snapshot marker, with a single
//! `write(2)`; a reader that meets a snapshot still being written (or torn by a crash) skips
//! it. [`read_file`] is the Rust reader; `benchfs.telemetry` is the Python one.
//!
//! Clients keep [`ClientMetrics`] (per target server) and write them with the same writer in
//! format version 2. Servers may also keep a [`TraceRing`] of per-operation records, flushed
//! by a [`TraceWriter`] with one `write(2)` at each snapshot, and the [`names`] of the files
//! those records name.
//!
//! One file per job: [`histogram`], the [`catalogue`] of kinds, [`server_metrics`],
//! [`client_metrics`], the [`snapshot`] format and writer, [`trace`]s, and the [`reader`].

pub mod catalogue;
pub mod client_metrics;
pub mod histogram;
pub mod names;
pub mod reader;
pub mod server_metrics;
pub mod snapshot;
#[cfg(test)]
mod tests;
pub mod trace;

pub use catalogue::*;
pub use client_metrics::*;
pub use histogram::*;
pub use names::*;
pub use reader::*;
pub use server_metrics::*;
pub use snapshot::*;
pub use trace::*;
