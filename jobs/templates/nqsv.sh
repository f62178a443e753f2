#!/bin/bash
# BenchFS job for NEC NQSV, rendered by `benchfs-run submit --scheduler nqsv` (jobs/templates/nqsv.sh).
# NQSV's qsub takes #PBS directives: -b is the number of nodes (batch jobs), --exclusive the
# nodes for this request alone, --cpunum-lhost the CPUs per node (with --cpus-per-node),
# elapstim_req the elapsed-time limit (see docs/submit.md for the sources).
#PBS -N @{job_name}
#PBS -V
#PBS --exclusive
#PBS -b @{nodes}@{cpunum}
#PBS -o @{job_dir}/job.out
#PBS -e @{job_dir}/job.err
@{directives}
SCHEDULER=nqsv
LAUNCHER=mpiexec  # the pipeline places processes on the nodes with mpiexec
# NQSV names each of the request's batch jobs <index>:<request id>; only job 0 runs the pipeline.
case "${PBS_JOBID:-}" in
  *:*) if [ "${PBS_JOBID%%:*}" != "0" ]; then exit 0; fi ;;
esac
@{nodefile}
@{prologue}
@{body}
