# ---- burst-buffer body (jobs/templates/lifecycle.sh): start, stage in, your command, stage out, stop ----
# `benchfs stop` always runs (normal end, failure, cancel or time limit): it stages out what is
# there, unmounts, stops the servers and deletes their node-local data.
BENCHFS=@{benchfs}
STOPPED=
stop_benchfs() {
  if [ -z "$STOPPED" ] && [ -n "${BENCHFS_JOB_DIR:-}" ]; then
    STOPPED=1
    "$BENCHFS" stop @{stop_args}
  fi
}
trap 'echo "benchfs job: terminated; stopping BenchFS" >&2; stop_benchfs; exit 143' TERM INT HUP
trap stop_benchfs EXIT

EXPORTS=$("$BENCHFS" start --nodes-file "$JOB_DIR/nodes.toml" --launcher "$LAUNCHER" \
  --results-root "$JOB_DIR" @{start_args}) || { echo "benchfs job: benchfs start failed" >&2; exit 1; }
eval "$EXPORTS"
@{stage_in}
# Your command, with BENCHFS_MOUNT, BENCHFS_CONFIG and the rest exported.
( @{run_command} )
STATUS=$?
echo "benchfs job: command exited with status $STATUS at $(date -u +%FT%TZ)"
stop_benchfs || { [ "$STATUS" -eq 0 ] && STATUS=1; }
exit "$STATUS"
