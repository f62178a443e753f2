"""`benchfs start`: the run pipeline with `RunSpec.serve` (nodes, exclusions, screen, job
directories, iostat, servers, full membership, optional mounts), then the job file, the
environment file and the manifest that let every later command find and stop what it left
running."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchfs.launch import this_host
from benchfs.lifecycle.state import ENV_FILE, JOB_DIR_ENV, JobState
from benchfs.pipeline import Pipeline, ProgressSink, RunReport, RunSpec
from benchfs.pipeline.stages import IostatCapture, JobDirs, Mounts, Servers, Stage
from benchfs.procs import ProcessRef
from benchfs.results import utc_now, write_text_atomic


def _record(record: dict[str, Any], children: Sequence[int] = ()) -> dict[str, Any]:
    """A manifest process record with the start times that identify its processes later."""
    ref = ProcessRef.of(record["pid"])
    kids = [ProcessRef.of(pid) for pid in children]
    return {
        **record,
        "start": None if ref is None else ref.start,
        "children": [[k.pid, k.start] for k in kids if k is not None],
    }


def _job_state(pipeline: Pipeline) -> JobState:
    ctx, report = pipeline.ctx, pipeline.report
    assert ctx is not None and report.run_dir is not None and report.manifest is not None
    run_dir, manifest, spec = report.run_dir, report.manifest, ctx.spec
    processes: list[dict[str, Any]] = []
    servers = 0
    mount_point = None
    stages: list[Stage] = pipeline.left_running
    for stage in stages:
        if isinstance(stage, Servers) and stage.cluster is not None:
            for daemon in stage.cluster.daemons:
                servers += 1
                record = next(p for p in manifest.processes if p.get("pid") == daemon.pid)
                processes.append(_record(record, stage.children.get(daemon.pid, [])))
        elif isinstance(stage, Mounts):
            for started in stage.mounts:
                processes.append(_record(started.record))
                # The first client node's (network-namespace nodes each have their own).
                mount_point = mount_point or started.record["mountpoint"]
        elif isinstance(stage, IostatCapture):
            processes.extend(_record(s.record) for s in stage.captures)
        elif isinstance(stage, JobDirs):
            manifest.scratch_dirs = {name: str(job) for name, (_, job) in stage.dirs.items()}
    manifest.data_kept = spec.keep_data
    exports = {
        JOB_DIR_ENV: str(run_dir.path),
        "BENCHFS_CONFIG": str(run_dir.config_path),
        "BENCHFS_REGISTRY": str(run_dir.registry_dir),
        "BENCHFS_EXPECTED_SERVERS": str(servers),
    }
    if mount_point is not None:
        exports["BENCHFS_MOUNT"] = mount_point
    state = JobState(
        run_dir=str(run_dir.path),
        host=this_host(),
        launcher=spec.launcher,
        mpiexec=spec.mpiexec,
        servers=servers,
        registry=str(run_dir.registry_dir),
        config=str(run_dir.config_path),
        mount_point=mount_point,
        keep_data=spec.keep_data,
        exports=exports,
        processes=processes,
        started=utc_now(),
    )
    state.save()
    write_text_atomic(run_dir.path / ENV_FILE, state.env_text())
    manifest.write(run_dir)
    return state


def start_job(
    spec: RunSpec, command: Sequence[str], progress: ProgressSink
) -> tuple[RunReport, JobState | None]:
    """Bring the cluster of `spec` up and leave it running; the job, or the report's error
    (then nothing is left running)."""
    spec.serve = True
    pipeline = Pipeline(spec, command, progress)
    report = pipeline.execute()
    if report.error is not None or not pipeline.left_running:
        return report, None
    return report, _job_state(pipeline)
