# ---- common prologue (jobs/templates/prologue.sh) ----
# Nothing is activated by magic: the benchfs-run found when this script was rendered is called by
# its absolute path, and everything it writes goes to the job directory.
set -uo pipefail
BENCHFS_RUN=@{benchfs_run}
JOB_DIR=@{job_dir}
SCRATCH=@{scratch}
EXCLUDED_HOSTS=(@{excluded_hosts})
cd "$JOB_DIR" || exit 1
echo "benchfs job: $SCHEDULER job ${SLURM_JOB_ID:-${PBS_JOBID:-?}} on $(hostname) at $(date -u +%FT%TZ)"

if [ "$SCHEDULER" != slurm ]; then
  # PBS and NQSV cannot exclude hosts at submission: drop them from the node file here.
  benchfs_filter_nodefile "${PBS_NODEFILE:-}" "$JOB_DIR/nodefile" "${EXCLUDED_HOSTS[@]}" || exit 1
  export PBS_NODEFILE="$JOB_DIR/nodefile"
fi

# The allocation as a nodes file (docs/nodes.md), excluded hosts left out.
NODES_ARGS=(nodes --from-allocation --scratch "$SCRATCH" --output "$JOB_DIR/nodes.toml")
for host in "${EXCLUDED_HOSTS[@]}"; do NODES_ARGS+=(--exclude "$host"); done
"$BENCHFS_RUN" "${NODES_ARGS[@]}" || { echo "benchfs job: cannot write nodes.toml" >&2; exit 1; }

