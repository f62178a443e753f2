#!/bin/bash
# BenchFS job for PBS Pro / OpenPBS, rendered by `benchfs-run submit --scheduler pbs`
# (jobs/templates/pbs.sh). One chunk per node, each on its own host and the job's alone
# (place=scatter:excl; the chunk's ncpus and mpiprocs come with --cpus-per-node); -V passes the
# submitting environment (PATH to mpiexec, BENCHFS_* settings) to the job, as sbatch does.
#PBS -N @{job_name}
#PBS -V
#PBS -l select=@{nodes}@{chunk}
#PBS -l place=scatter:excl
#PBS -j oe
#PBS -o @{job_dir}/job.out
@{directives}
SCHEDULER=pbs
LAUNCHER=mpiexec  # the pipeline places processes on the nodes with mpiexec
@{nodefile}
@{prologue}
@{body}
