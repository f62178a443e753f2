"""BenchFS as a burst buffer a job lives in: `benchfs start` brings a cluster up and leaves it
running, `status` reports on it, `stage-in` and `stage-out` copy trees in and out with
checksums, `stop` tears it down and records the job like a run.

Modules, one job each: `state` (the job file that lets any shell of the job find what `start`
left running), `stop` (tearing a started job down by recorded process, also after a crash),
`status` (membership, health, capacity), `stage` (verified, resumable parallel copies).
`start` itself is the run pipeline with `RunSpec.serve` (benchfs.pipeline).
"""

from benchfs.lifecycle.state import ENV_FILE, JOB_DIR_ENV, JOB_FILE, JobState, find_job

__all__ = ["ENV_FILE", "JOB_DIR_ENV", "JOB_FILE", "JobState", "find_job"]
