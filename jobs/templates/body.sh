# ---- benchmark body (jobs/templates/body.sh): one benchfs-run pipeline ----
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

# The pipeline on the allocation's nodes, through the scheduler's launcher.
PIPELINE=("$BENCHFS_RUN" launch --nodes-file "$JOB_DIR/nodes.toml" --launcher "$LAUNCHER")
"${PIPELINE[@]}" @{pipeline_args} --results-root "$JOB_DIR" &
CHILD=$!
wait "$CHILD"
STATUS=$?
CHILD=
echo "benchfs job: pipeline exited with status $STATUS at $(date -u +%FT%TZ)"
exit "$STATUS"
