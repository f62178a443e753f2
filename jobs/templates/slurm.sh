#!/bin/bash
# BenchFS job for Slurm, rendered by `benchfs-run submit --scheduler slurm` (jobs/templates/slurm.sh).
#SBATCH --job-name=@{job_name}
#SBATCH --nodes=@{nodes}
#SBATCH --output=@{job_dir}/job-%j.out
@{directives}
# Excluded hosts (benchfs-diagnose) are left out by Slurm itself, through --exclude above.
SCHEDULER=slurm
LAUNCHER=srun  # the pipeline starts servers and ranks as job steps
@{prologue}
@{body}
