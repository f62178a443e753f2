//! CPU profiles for `benchfs-analyze`: `perf script` output folded into stacks and flame graphs
//! drawn from them, both by inferno (the Rust port of Brendan Gregg's FlameGraph), offline.

use inferno::collapse::{perf, Collapse};
use inferno::flamegraph;
use std::io;

/// `perf script` output folded into one line per distinct stack, `comm-pid;outer;...;leaf N`,
/// the process first (so one file holds every process of a host), kernel frames marked `_[k]`.
pub fn fold_perf_script(script: &[u8]) -> io::Result<String> {
    let mut options = perf::Options::default();
    options.include_pid = true;
    options.annotate_kernel = true;
    options.nthreads = 1;
    let mut folder = perf::Folder::from(options);
    let mut out = Vec::new();
    folder.collapse(script, &mut out)?;
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A flame graph (SVG) of folded stacks (`outer;...;leaf N` per line). Colors follow the
/// function names (`hash`), so one function has one color in every graph of a report.
pub fn flame_graph_svg(folded: &str, title: &str, subtitle: Option<&str>) -> io::Result<String> {
    let mut options = flamegraph::Options::default();
    options.title = title.to_string();
    options.subtitle = subtitle.map(str::to_string);
    options.count_name = "samples".to_string();
    options.hash = true;
    options.deterministic = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, folded.lines(), &mut out)?;
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "benchfsd 4242/4243 [000] 100.000001: cpu-clock:pppH: \n\
        \t    55d0c0ffee00 benchfs_core::server::serve+0x10 (/usr/bin/benchfsd)\n\
        \t    55d0c0ffef00 main+0x20 (/usr/bin/benchfsd)\n\
        \n\
        benchfsd 4242/4243 [000] 100.010001: cpu-clock:pppH: \n\
        \t    ffffffff81000000 io_submit_sqes+0x5 ([kernel.kallsyms])\n\
        \t    55d0c0ffef00 main+0x20 (/usr/bin/benchfsd)\n\
        \n";

    #[test]
    fn perf_samples_fold_per_process_and_draw() -> io::Result<()> {
        let folded = fold_perf_script(SCRIPT.as_bytes())?;
        let mut lines: Vec<&str> = folded.lines().collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "benchfsd-4242;main;benchfs_core::server::serve 1",
                "benchfsd-4242;main;io_submit_sqes_[k] 1",
            ]
        );
        let svg = flame_graph_svg(&folded, "server 0", Some("2 samples"))?;
        assert!(svg.starts_with("<?xml") && svg.contains("io_submit_sqes"));
        assert!(svg.contains("server 0"));
        Ok(())
    }

    #[test]
    fn nothing_to_draw_is_an_error_not_a_panic() {
        assert!(flame_graph_svg("", "empty", None).is_err());
    }
}
