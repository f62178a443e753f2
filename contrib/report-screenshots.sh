#!/bin/sh
# The screenshots of the reports kept in docs/images/: a ~5 s run's report (with a baseline) and
# a sweep's report (a config key x IOR arguments x 3 repetitions), as headless Chromium shows
# them at 1366 pixels wide, and a stamp of the report code they show (the tests check it). Run
# from the repository after `make build`:
#   contrib/report-screenshots.sh [WORK_DIR]
set -eu
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
bin=.venv/bin
mkdir -p "$work" docs/images
shot() {  # shot HTML PNG HEIGHT
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --hide-scrollbars --user-data-dir="$work/profile" --window-size=1366,"$3" \
    --screenshot="$2" "file://$(realpath "$1")" 2>/dev/null
}
run_dir() { "$bin/benchfs-run" launch "$@" --results-root "$work/runs" --json | python3 -c \
  'import json, sys; print(json.load(sys.stdin)["results_dir"])'; }
base=$(run_dir --file-size 256M --set client.max_inflight=4)
run=$(run_dir --file-size 1G)
"$bin/benchfs-analyze" "$run" --baseline "$base" --html "$work/report.html" >/dev/null
shot "$work/report.html" docs/images/report.png 15000
cat > "$work/sweep.toml" <<'TOML'
name = "chunk-size-x-ior-transfer"
repetitions = 3
[sweep]
layout.chunk_size = ["256K", "1M"]
workload_args = ["-w -r -F -t 64k -b 16m", "-w -r -F -t 1m -b 16m"]
TOML
"$bin/benchfs-run" sweep "$work/sweep.toml" --results-root "$work/sweeps" >/dev/null
sweep=$(ls -d "$work"/sweeps/*-sweep-* | tail -1)
"$bin/benchfs-analyze" "$sweep" --html "$work/sweep.html" >/dev/null
shot "$work/sweep.html" docs/images/sweep-report.png 2200
contrib/screenshots-stamp.py --write
echo "docs/images/report.png docs/images/sweep-report.png from $work"
