//! The tools' sections of the one configuration file: `[run]` (benchfs-run's defaults),
//! `[diagnose]` (benchfs-diagnose's thresholds) and `[insights]` (benchfs-analyze's). They are
//! resolved with the file system's sections by the core's one resolver
//! ([`benchfs_core::config::resolve_with`]); the daemon, the C library and the mount skip them.

use benchfs_core::config::Sections;
use benchfs_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The tools' sections, in the order the effective configuration lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSections {
    pub run: RunConfig,
    pub diagnose: DiagnoseConfig,
    pub insights: InsightsConfig,
}

impl Sections for ToolSections {
    const SIZE_KEYS: &'static [&'static str] = &[
        "run.file_size",
        "run.transfer_size",
        "diagnose.probe_size",
        "insights.small_write_bytes",
        "insights.app_small_bytes",
    ];
    const ENV_ALIASES: &'static [(&'static str, &'static str)] = &[("BENCHFS_RESULTS", "run.results_root")];

    fn validate(&self) -> Result<()> {
        for (key, value) in [
            ("servers", u64::from(self.run.servers)),
            ("clients", u64::from(self.run.clients)),
            ("repetitions", u64::from(self.run.repetitions)),
            ("transfer_size", self.run.transfer_size),
        ] {
            if value == 0 {
                return Err(Error::Config(format!("run.{key} must be at least 1")));
            }
        }
        self.diagnose.validate()?;
        self.insights.validate()
    }
}

/// Defaults for `benchfs-run` (read by the Python launcher).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub servers: u32,
    pub clients: u32,
    /// Bytes each client writes and reads back.
    pub file_size: u64,
    pub transfer_size: u64,
    /// Iterations of the workload in one run (the default workload writes and reads back
    /// this many times; the built-in IOR and mdtest get `-i`); the summary gives their spread.
    pub repetitions: u32,
    pub results_root: String,
    /// Node-local scratch directory; empty means a fresh directory under /tmp per run.
    pub scratch_dir: String,
    /// Trace each host's kernel during the run (block latency, scheduler, perf profiles) when
    /// root, tracefs, bpftrace and perf allow; otherwise one line says why not.
    pub kernel_trace: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            servers: 2,
            clients: 2,
            file_size: 64 << 20,
            transfer_size: 1 << 20,
            repetitions: 1,
            results_root: "results".into(),
            scratch_dir: String::new(),
            kernel_trace: true,
        }
    }
}

/// The smallest full-screen probe footprint: a 64 MiB sequential file and 32 files of 4 MiB
/// (the quick screen's).
const MIN_PROBE_SIZE: u64 = 192 << 20;

/// Thresholds and durations of `benchfs-diagnose` (read by the Python tool; docs/diagnose.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiagnoseConfig {
    /// Seconds of the workload-shaped probe (many files, random 1-4 MiB reads).
    pub workload_seconds: f64,
    /// Its seconds with `--quick`; the short probes run a quarter of the workload probe's time.
    pub quick_seconds: f64,
    /// Wall-time budget of a whole screen; probes still running then are stopped.
    pub budget_s: f64,
    /// Bytes the full screen's probes lay out on each node's scratch (a sequential file of
    /// up to 1 GiB, the rest 4 MiB files); checked against the free space before probing.
    pub probe_size: u64,
    /// Modified z-score (MAD based) above which a node is an outlier on a metric.
    pub z_threshold: f64,
    /// ... and it must also be at least this much worse than the median (0.2 = 20%).
    pub min_worse: f64,
    /// Smallest spread assumed (relative), so that equal nodes (MAD = 0) flag no noise.
    pub min_spread: f64,
    /// With two nodes: flag the worse one when it is this many times worse than the other.
    pub two_node_ratio: f64,
    /// When half the nodes are slow: flag the worse group when it is this many times worse.
    pub group_ratio: f64,
    /// Device read latency (iostat r_await, ms) that flags a node whatever its peers do.
    pub r_await_ms: f64,
    /// Relative r_await flags need at least this latency (ms), to ignore fast-device noise.
    pub r_await_floor_ms: f64,
    /// A member device this many times slower (r_await) than its twin is flagged.
    pub member_ratio: f64,
    /// Application latency this many times the device's r_await means slow above the device.
    pub above_device_ratio: f64,
    /// Largest share of the nodes a screen excludes (the worst first).
    pub max_exclude_share: f64,
    /// One kind of evidence this many times worse than the peers excludes a node alone; below
    /// it, two independent kinds must agree.
    pub overwhelming_ratio: f64,
    /// Block latency (kernel tracing): a device's slow mode, this many times its main mode ...
    pub mode_gap: f64,
    /// ... is flagged when it holds at least this share of its reads more than its peers do.
    pub mode_min_share: f64,
    /// Judgment of a run: a node's latency rose when its level after a change point is this
    /// many times the level before.
    pub rise_ratio: f64,
    /// Judgment of a run: operations of one kind a node needs before it is judged on them.
    pub min_ops: u64,
    /// Judgment of a run: a node slower than its peers over the run is slow when it was also
    /// slower in at least this share of the intervals since its onset (or one overwhelming).
    pub persist_share: f64,
    /// Judgment of a run: a node that stands out is judged slow only when its excess server
    /// time over the run (ops x its mean beyond the nodes' median) is at least this many
    /// seconds: a node 2x slower on 0.1 ms reads that cost the run 12 ms did not slow it.
    pub min_delay_s: f64,
}

impl Default for DiagnoseConfig {
    fn default() -> Self {
        DiagnoseConfig {
            workload_seconds: 60.0,
            quick_seconds: 10.0,
            budget_s: 900.0,
            probe_size: 9 << 30,
            z_threshold: 3.5,
            min_worse: 0.2,
            min_spread: 0.05,
            two_node_ratio: 2.0,
            group_ratio: 2.0,
            r_await_ms: 20.0,
            r_await_floor_ms: 2.0,
            member_ratio: 5.0,
            above_device_ratio: 4.0,
            max_exclude_share: 0.25,
            overwhelming_ratio: 4.0,
            mode_gap: 8.0,
            mode_min_share: 0.02,
            rise_ratio: 2.0,
            min_ops: 100,
            persist_share: 0.5,
            min_delay_s: 0.1,
        }
    }
}

/// Thresholds of the coded insights of `benchfs-analyze` (read by the Python tool;
/// docs/analysis.md names the insight each key belongs to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InsightsConfig {
    /// An operation slower than this (server op time, ms) is a slow operation .
    pub slow_op_ms: f64,
    /// Operations a server (or the run) needs before a distribution-based insight may fire.
    pub min_ops: u64,
    /// BFS-001: share of data submissions at device depth 1 that means starvation...
    pub depth1_share: f64,
    /// ... while requests waited at least this many times the mean device time to be submitted.
    pub starvation_queue_ratio: f64,
    /// BFS-002: mean SQEs per io_uring_enter at or below this ...
    pub batch_mean_max: f64,
    /// ... while the device had at least this mean depth: one enter per SQE under load.
    pub batch_depth_min: f64,
    /// BFS-004: a member device this many times slower (iostat await) than its node's fastest ...
    pub device_await_ratio: f64,
    /// ... and at least this slow (ms), to ignore noise on fast devices.
    pub device_await_min_ms: f64,
    /// BFS-005: bytes on the busiest server over the mean across servers.
    pub placement_max_mean: f64,
    /// BFS-006: retries per request (client telemetry).
    pub retry_rate: f64,
    /// BFS-007: buffer-pool waits per data operation.
    pub pool_wait_share: f64,
    /// BFS-008: a node's mean read time over its mean write time (or the reverse).
    pub read_write_ratio: f64,
    /// BFS-009: writes of at most this many bytes on average are small ...
    pub small_write_bytes: u64,
    /// ... and fsyncs per write at or above this amplify them.
    pub fsync_per_write: f64,
    /// BFS-010: handle-cache misses per lookup.
    pub handle_miss_share: f64,
    /// Op-time distributions: share a range needs to count as a mode (bimodality flag).
    pub bimodal_mode_share: f64,
    /// BFS-013: a node's TCP retransmission timer expiries during the run (each doubles the
    /// wait before the next try); 0 turns the insight off.
    pub tcp_timeouts: u64,
    /// APP-001 (Drishti P05, P06): an application's request smaller than this is small (Darshan
    /// counts sizes in bins: rounded down to a bin edge, 100, 1K, 10K, 100K, 1M, 4M, ...) ...
    pub app_small_bytes: u64,
    /// ... and small requests fire at over this share of the reads (or writes) ...
    pub app_small_share: f64,
    /// ... and over this many of them.
    pub app_small_count: u64,
    /// APP-002 (P07, P08): requests not aligned in memory (or in the file) over this share.
    pub app_misaligned_share: f64,
    /// APP-003 (P11, P13): random reads (or writes) over this share ...
    pub app_random_share: f64,
    /// ... and over this many of them.
    pub app_random_count: u64,
    /// APP-004 (P17): a rank spending over this many seconds in one file's metadata calls.
    pub app_meta_time_s: f64,
    /// APP-005 (P21, P22): bytes of the rank moving most to a file over those of the rank
    /// moving least, as a share of the most (files several ranks open on their own).
    pub app_size_imbalance: f64,
    /// APP-006 (P18, P19): on a file every rank shares, the slowest rank's bytes (or time)
    /// less the fastest's, as a share of all of them.
    pub app_straggler_share: f64,
    /// APP-007: an application operation this many times slower than the median of its kind
    /// and size is slow, and its servers are named.
    pub app_slow_factor: f64,
}

impl Default for InsightsConfig {
    fn default() -> Self {
        InsightsConfig {
            slow_op_ms: 100.0,
            min_ops: 200,
            depth1_share: 0.9,
            starvation_queue_ratio: 1.0,
            batch_mean_max: 1.2,
            batch_depth_min: 4.0,
            device_await_ratio: 5.0,
            device_await_min_ms: 5.0,
            placement_max_mean: 1.5,
            retry_rate: 0.01,
            pool_wait_share: 0.1,
            read_write_ratio: 5.0,
            small_write_bytes: 65536,
            fsync_per_write: 0.25,
            handle_miss_share: 0.9,
            bimodal_mode_share: 0.1,
            tcp_timeouts: 10,
            // Drishti 0.8's defaults (drishti/includes/config.py, hpc-io/drishti-io 4493988).
            app_small_bytes: 1 << 20,
            app_small_share: 0.1,
            app_small_count: 1000,
            app_misaligned_share: 0.1,
            app_random_share: 0.2,
            app_random_count: 1000,
            app_meta_time_s: 30.0,
            app_size_imbalance: 0.3,
            app_straggler_share: 0.15,
            app_slow_factor: 4.0,
        }
    }
}

impl DiagnoseConfig {
    fn validate(&self) -> Result<()> {
        let positive = [
            ("workload_seconds", self.workload_seconds),
            ("quick_seconds", self.quick_seconds),
            ("budget_s", self.budget_s),
            ("z_threshold", self.z_threshold),
            ("min_spread", self.min_spread),
            ("r_await_ms", self.r_await_ms),
            ("above_device_ratio", self.above_device_ratio),
        ];
        for (key, value) in positive {
            if value.is_nan() || value <= 0.0 {
                return Err(Error::Config(format!("diagnose.{key} must be positive")));
            }
        }
        let ratios = [
            ("two_node_ratio", self.two_node_ratio),
            ("group_ratio", self.group_ratio),
            ("member_ratio", self.member_ratio),
            ("overwhelming_ratio", self.overwhelming_ratio),
            ("mode_gap", self.mode_gap),
            ("rise_ratio", self.rise_ratio),
        ];
        for (key, value) in ratios {
            if value.is_nan() || value <= 1.0 {
                return Err(Error::Config(format!("diagnose.{key} must be greater than 1")));
            }
        }
        let not_negative = [
            ("min_worse", self.min_worse),
            ("r_await_floor_ms", self.r_await_floor_ms),
            ("min_delay_s", self.min_delay_s),
        ];
        for (key, value) in not_negative {
            if value.is_nan() || value < 0.0 {
                return Err(Error::Config(format!("diagnose.{key} must not be negative")));
            }
        }
        if self.probe_size < MIN_PROBE_SIZE {
            return Err(Error::Config(format!(
                "diagnose.probe_size must be at least {} MiB",
                MIN_PROBE_SIZE >> 20
            )));
        }
        for (key, value) in [
            ("max_exclude_share", self.max_exclude_share),
            ("mode_min_share", self.mode_min_share),
            ("persist_share", self.persist_share),
        ] {
            if value.is_nan() || !(0.0..=1.0).contains(&value) {
                return Err(Error::Config(format!("diagnose.{key} must be between 0 and 1")));
            }
        }
        Ok(())
    }
}

impl InsightsConfig {
    /// Every threshold must be a number above zero (shares at most 1).
    fn validate(&self) -> Result<()> {
        let positive = [
            ("slow_op_ms", self.slow_op_ms),
            ("starvation_queue_ratio", self.starvation_queue_ratio),
            ("batch_mean_max", self.batch_mean_max),
            ("batch_depth_min", self.batch_depth_min),
            ("device_await_ratio", self.device_await_ratio),
            ("device_await_min_ms", self.device_await_min_ms),
            ("placement_max_mean", self.placement_max_mean),
            ("read_write_ratio", self.read_write_ratio),
            ("fsync_per_write", self.fsync_per_write),
            ("app_meta_time_s", self.app_meta_time_s),
            ("app_slow_factor", self.app_slow_factor),
        ];
        for (key, value) in positive {
            if value.is_nan() || value <= 0.0 {
                return Err(Error::Config(format!("insights.{key} must be positive")));
            }
        }
        let shares = [
            ("depth1_share", self.depth1_share),
            ("retry_rate", self.retry_rate),
            ("pool_wait_share", self.pool_wait_share),
            ("handle_miss_share", self.handle_miss_share),
            ("bimodal_mode_share", self.bimodal_mode_share),
            ("app_small_share", self.app_small_share),
            ("app_misaligned_share", self.app_misaligned_share),
            ("app_random_share", self.app_random_share),
            ("app_size_imbalance", self.app_size_imbalance),
            ("app_straggler_share", self.app_straggler_share),
        ];
        for (key, value) in shares {
            if value.is_nan() || value <= 0.0 || value > 1.0 {
                return Err(Error::Config(format!(
                    "insights.{key} must be above 0 and at most 1"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use benchfs_core::config::{effective_toml, from_toml_with, resolve_with, with_overrides_with, Config};

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(
        path: Option<&Path>,
        vars: &[(&str, &str)],
        overrides: &[&str],
    ) -> Result<(Config, ToolSections)> {
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        resolve_with(path, &env(vars), &overrides)
    }

    #[test]
    fn sizes_aliases_and_sources() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[layout]\nchunk_size = \"1MiB\"\n[run]\nfile_size = \"2G\"\n",
        )
        .map_err(|e| Error::io("write", e))?;
        let (c, t) = resolve(Some(&file), &[("BENCHFS_RUN_TRANSFER_SIZE", "64k")], &[])?;
        assert_eq!((c.layout.chunk_size, t.run.file_size), (1 << 20, 2 << 30));
        assert_eq!(t.run.transfer_size, 64 << 10);
        let (_, t) = resolve(None, &[("BENCHFS_RESULTS", "/r")], &["run.file_size=4096"])?;
        assert_eq!((t.run.file_size, t.run.results_root.as_str()), (4096, "/r"));
        let e = |r: Result<(Config, ToolSections)>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(from_toml_with("[run]\nfile_size = -1\n"))
            .contains("run.file_size = -1 (from configuration text): must not be negative"));
        assert!(e(resolve(None, &[], &["run.nosuch=1"])).contains("unknown key run.nosuch (from override)"));
        assert_eq!(
            e(resolve(None, &[], &["diagnose.group_ratio=1"])),
            "invalid configuration: diagnose.group_ratio must be greater than 1 (from override)"
        );
        assert!(e(resolve(None, &[], &["insights.retry_rate=2"])).contains("insights.retry_rate"));
        assert!(
            e(resolve(None, &[], &["run.transfer_size=0"])).contains("run.transfer_size must be at least 1")
        );
        assert!(e(resolve(None, &[], &["diagnose.persist_share=2"])).contains("between 0 and 1"));
        assert!(e(resolve(None, &[], &["run.clients=0"])).contains("run.clients must be at least 1"));
        Ok(())
    }

    #[test]
    fn a_recorded_config_with_retired_keys_still_loads() -> Result<()> {
        let text = "[insights]\nslow_node_pct = 10.0\nslow_node_factor = 3.0\nslow_op_ms = 50.0\n";
        let (_, t) = from_toml_with::<ToolSections>(text)?;
        assert_eq!(t.insights.slow_op_ms, 50.0);
        assert!(!effective_toml(&Config::default(), &t).contains("slow_node_pct"));
        Ok(())
    }

    #[test]
    fn the_effective_text_holds_every_section_and_round_trips() -> Result<()> {
        let (c, t) = resolve(None, &[], &["layout.chunk_size=1024", "run.servers=3"])?;
        let text = effective_toml(&c, &t);
        let cluster = text.find("[cluster]").unwrap_or(usize::MAX);
        let run = text.find("[run]").unwrap_or(0);
        assert!(cluster < run && text.contains("[insights]"), "{text}");
        assert_eq!(from_toml_with::<ToolSections>(&text)?, (c.clone(), t.clone()));
        // The file system alone reads the same text.
        assert_eq!(Config::from_toml(&text)?, c);
        let (_, later) = with_overrides_with::<ToolSections>(&text, &["run.clients=4".into()])?;
        assert_eq!((later.run.servers, later.run.clients), (3, 4));
        Ok(())
    }

    #[test]
    fn size_keys_are_integer_keys() -> Result<()> {
        let table =
            toml::Table::try_from(ToolSections::default()).map_err(|e| Error::Config(e.to_string()))?;
        for name in ToolSections::SIZE_KEYS {
            let (s, k) = name.split_once('.').unwrap_or_default();
            assert!(table[s][k].is_integer(), "{name}");
        }
        Ok(())
    }
}
