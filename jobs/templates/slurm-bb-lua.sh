#!/bin/bash
# BenchFS job for Slurm's burst buffer, rendered by `benchfs-run submit --bb-lua`
# (jobs/templates/slurm-bb-lua.sh). The #BB_LUA lines are read by the site's burst_buffer.lua
# (docs/burst-buffer.md): Slurm starts BenchFS on the job's nodes and stages in before this
# script runs, stages out and stops BenchFS after it, however it ends.
#SBATCH --job-name=@{job_name}
#SBATCH --nodes=@{nodes}
#SBATCH --output=@{job_dir}/job-%j.out
@{directives}
@{bb_directives}
set -uo pipefail
cd @{job_dir} || exit 1
echo "benchfs job: slurm job ${SLURM_JOB_ID:-?} on $(hostname) at $(date -u +%FT%TZ); BenchFS in ${BENCHFS_JOB_DIR:-?}"
# Your command, with BENCHFS_MOUNT, BENCHFS_CONFIG and the rest in its environment.
( @{run_command} )
STATUS=$?
echo "benchfs job: command exited with status $STATUS at $(date -u +%FT%TZ)"
exit "$STATUS"
