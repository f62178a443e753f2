# ---- common body (jobs/templates/body.sh) ----
# Nothing is activated by magic: the benchfs-run found when this script was rendered is called by
# its absolute path, and everything it writes goes to the job directory.
set -uo pipefail
BENCHFS_RUN=@{benchfs_run}
JOB_DIR=@{job_dir}
SCRATCH=@{scratch}
EXCLUDED_HOSTS=(@{excluded_hosts})
cd "$JOB_DIR" || exit 1
echo "benchfs job: $SCHEDULER job ${SLURM_JOB_ID:-${PBS_JOBID:-?}} on $(hostname) at $(date -u +%FT%TZ)"

CHILD=
cleanup() {
  # Forward the scheduler's SIGTERM (cancel, time limit) to the pipeline, which stops the servers
  # and clients it started and deletes their data, and wait for it to finish doing so.
  if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
  fi
}
trap 'echo "benchfs job: terminated; stopping the pipeline" >&2; cleanup; exit 143' TERM INT HUP
trap cleanup EXIT

if [ "$SCHEDULER" != slurm ]; then
  # PBS and NQSV cannot exclude hosts at submission: drop them from the node file here.
  benchfs_filter_nodefile "${PBS_NODEFILE:-}" "$JOB_DIR/nodefile" "${EXCLUDED_HOSTS[@]}" || exit 1
  export PBS_NODEFILE="$JOB_DIR/nodefile"
fi

# The allocation as a nodes file (docs/nodes.md), excluded hosts left out.
NODES_ARGS=(nodes --from-allocation --scratch "$SCRATCH" --output "$JOB_DIR/nodes.toml")
for host in "${EXCLUDED_HOSTS[@]}"; do NODES_ARGS+=(--exclude "$host"); done
"$BENCHFS_RUN" "${NODES_ARGS[@]}" || { echo "benchfs job: cannot write nodes.toml" >&2; exit 1; }

# The pipeline on the allocation's nodes, through the scheduler's launcher.
PIPELINE=("$BENCHFS_RUN" launch --nodes-file "$JOB_DIR/nodes.toml" --launcher "$LAUNCHER")
"${PIPELINE[@]}" @{pipeline_args} --results-root "$JOB_DIR" &
CHILD=$!
wait "$CHILD"
STATUS=$?
CHILD=
echo "benchfs job: pipeline exited with status $STATUS at $(date -u +%FT%TZ)"
exit "$STATUS"
