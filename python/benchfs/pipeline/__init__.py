"""The one `benchfs-run` pipeline, the same for every launcher (local, mpiexec, srun).

    nodes (nodes file, allocation, or simulated) - exclusions - optional screen
    -> node-local job directories -> iostat on every node -> servers, each with its own data
    directory -> the full membership (no fixed sleeps) -> [FUSE mounts] -> the workload
    (built-in rw, ior, mdtest, or a user-named command through the mount or the C library)
    -> teardown: the stages in reverse -> manifest -> analysis

Modules, one job each: `spec` (the request, the report, the progress sink), `roles` (which
node runs what), `context` (what the stages share), `stages` (job directories, iostat,
servers, mounts: each a start and a stop), `screen` (the pre-run screen), `workload` (the
client ranks and their summary), `run` (the `Pipeline` that strings them together).
"""

from benchfs.pipeline.roles import NodeRoles, apply_exclusions, plan_roles
from benchfs.pipeline.run import Pipeline
from benchfs.pipeline.spec import VIA, WORKLOADS, ProgressSink, RunReport, RunSpec

__all__ = [
    "VIA",
    "WORKLOADS",
    "NodeRoles",
    "Pipeline",
    "ProgressSink",
    "RunReport",
    "RunSpec",
    "apply_exclusions",
    "plan_roles",
]
