"""BenchFS as Slurm's burst buffer: `burst_buffer.lua` (this package's copy is what
`benchfs-config --slurm-bb-lua` prints) reads a job's `#BB_LUA` directives and calls `benchfs
bb PHASE` for each stage Slurm runs: setup and data-in while the job is pending, pre-run once
it has nodes (start BenchFS on them, stage in), post-run and data-out when it ends (stage out),
teardown (stop, delete node-local data only when nothing is lost), status for `scontrol show
bbstat`.

Modules, one job each: `slurmjob` (what `scontrol` says about a job), `record` (the per-job
directory and its record, which every phase reads and the next one continues from), `phases`
(the phases). docs/burst-buffer.md is the manual.
"""

from pathlib import Path

LUA_SCRIPT = Path(__file__).with_name("burst_buffer.lua")
"""The script a site installs as burst_buffer.lua beside slurm.conf."""

__all__ = ["LUA_SCRIPT"]
