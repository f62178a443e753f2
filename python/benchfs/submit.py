"""Batch job scripts for Slurm, PBS and NQSV: render them from `jobs/templates/` and submit them.

`benchfs-run submit` renders one script per job. The script calls the `benchfs-run` that rendered
it (by absolute path, so no environment has to be activated on the compute node), writes the
allocation's nodes file, and runs the pipeline with the job directory as its results root.
Excluded hosts (benchfs-diagnose's `excluded.txt`/`excluded.json`) become Slurm's `--exclude`;
PBS and NQSV cannot exclude at submission, so their scripts filter the allocation's node file.
See docs/submit.md.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import string
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import click

from benchfs.errors import SubmitError
from benchfs.nodes import Exclusion, write_exclusions
from benchfs.results import write_json_atomic, write_text_atomic

__all__ = [
    "SCHEDULERS",
    "JobSpec",
    "Submission",
    "SubmitError",
    "bb_lua_directives",
    "find_benchfs_run",
    "format_time_limit",
    "parse_time_limit",
    "render",
    "submit",
    "templates_dir",
]

SCHEDULERS = ("slurm", "pbs", "nqsv")
JOB_SCRIPT = "job.sh"
SUBMIT_JSON = "submit.json"
SUBMIT_TIMEOUT_S = 120.0

# Scheduler names, accounts, queues: one token that is safe in a directive comment line.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._@:+=/,%-]+$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TIME_RE = re.compile(r"^(\d+)([smhd])$")


class _JobTemplate(string.Template):
    """`@{name}` placeholders only: job scripts are full of `$VAR`, `${VAR}` and `"$@"`."""

    delimiter = "@"
    pattern = r"""
    @(?:
      (?P<escaped>(?!))
      | (?P<named>(?!))
      | \{(?P<braced>[a-z_][a-z0-9_]*)\}
      | (?P<invalid>\{)
    )
    """


def templates_dir() -> Path:
    """`$BENCHFS_JOBS_DIR/templates`, else the repository's `jobs/templates/`."""
    base = os.environ.get("BENCHFS_JOBS_DIR")
    if base:
        return Path(base) / "templates"
    return Path(__file__).resolve().parents[2] / "jobs" / "templates"


def find_benchfs_run(name: str = "benchfs-run") -> str:
    """The absolute path of this environment's `benchfs-run` (or `benchfs`), beside this
    Python first."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside.absolute())
    found = shutil.which(name)
    if found is None:
        raise SubmitError("ENOENT", f"{name} not found beside this Python nor on PATH")
    return str(Path(found).absolute())


def parse_time_limit(text: str) -> int:
    """Seconds from `90`/`90m` (minutes, Slurm's convention for a bare number), `30s`, `2h`,
    `1d`, `MM:SS`, `HH:MM:SS` or `D-HH:MM:SS`; ValueError says what is accepted."""
    value = text.strip()
    days = 0
    try:
        if "-" in value:
            d, value = value.split("-", 1)
            days = int(d)
        if ":" in value:
            parts = [int(p) for p in value.split(":")]
            if len(parts) > 3 or any(p < 0 for p in parts):
                raise ValueError
            while len(parts) < 3:
                parts.insert(0, 0)
            h, m, s = parts
            seconds = days * 86400 + h * 3600 + m * 60 + s
        elif days:
            seconds = days * 86400 + int(value) * 3600  # D-HH
        else:
            match = _TIME_RE.match(value)
            if match:
                unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
                seconds = int(match.group(1)) * unit
            else:
                seconds = int(value) * 60
    except ValueError:
        raise ValueError(
            f"invalid time limit {text!r}: use minutes (90), 30s, 90m, 2h, 1d, MM:SS, HH:MM:SS "
            "or D-HH:MM:SS"
        ) from None
    if seconds <= 0:
        raise ValueError(f"invalid time limit {text!r}: must be positive")
    return seconds


def format_time_limit(seconds: int) -> str:
    """HH:MM:SS (hours may exceed 24), which Slurm, PBS walltime and NQSV elapstim_req take."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


@dataclass
class JobSpec:
    """One job to render: where, on how many nodes, for how long, running which pipeline."""

    scheduler: str
    nodes: int
    pipeline_args: Sequence[str]
    job_dir: Path
    benchfs_run: str
    time_limit_s: int | None = None
    queue: str | None = None
    account: str | None = None
    excluded: Sequence[Exclusion] = ()
    cpus_per_node: int | None = None
    """CPUs to ask per node on PBS (ncpus and mpiprocs per chunk) and NQSV (--cpunum-lhost);
    None leaves it to the site's default. Slurm's --nodes allocation needs none."""
    scratch: str = "/tmp"
    job_name: str = "benchfs"
    extra_directives: Sequence[str] = field(default_factory=tuple)
    run_command: str | None = None
    """The burst-buffer shape: `benchfs start PIPELINE_ARGS`, stage in, this shell command,
    stage out, `benchfs stop` (always); None runs the benchmark pipeline."""
    stage_in: str | None = None
    stage_out: str | None = None
    stage_nodes: bool = False
    """Stage in and out on every client node, each its share (`benchfs stage-in --nodes`)."""
    benchfs: str = ""
    """The `benchfs` command, by absolute path (with `run_command`)."""
    bb_lua: Sequence[str] | None = None
    """Slurm's burst buffer instead of inline commands: these `#BB_LUA` directives (from
    `bb_lua_directives`), then `run_command`."""

    def validate(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise SubmitError(
                "EINVAL", f"unknown scheduler {self.scheduler!r} (one of {', '.join(SCHEDULERS)})"
            )
        if self.nodes < 1:
            raise SubmitError("EINVAL", f"--nodes must be at least 1 (got {self.nodes})")
        for what, value in (
            ("--queue/--partition", self.queue),
            ("--account", self.account),
            ("--job-name", self.job_name),
        ):
            if value is not None and not _TOKEN_RE.match(value):
                raise SubmitError(
                    "EINVAL", f"{what} {value!r}: one word of letters, digits and ._@:+=/,%-"
                )
        for e in self.excluded:
            if not _HOST_RE.match(e.host):
                raise SubmitError("EINVAL", f"excluded host {e.host!r} is not a host name")
        if re.search(r"\s", str(self.job_dir)):
            # Directives (#SBATCH --output=..., #PBS -o ...) are not shell-quoted.
            raise SubmitError(
                "EINVAL",
                f"results root {self.job_dir.parent} contains whitespace; job "
                "schedulers cannot take it in a directive",
            )
        if self.bb_lua is not None and (self.scheduler != "slurm" or self.run_command is None):
            raise SubmitError("EINVAL", "--bb-lua goes with --scheduler slurm and --run COMMAND")
        if self.bb_lua is not None and self.stage_nodes:
            raise SubmitError("EINVAL", "--stage-nodes is not for --bb-lua: Slurm stages")
        if self.run_command is None and (self.stage_in or self.stage_out):
            raise SubmitError("EINVAL", "--stage-in and --stage-out go with --run COMMAND")
        if self.stage_nodes and not (self.stage_in or self.stage_out):
            raise SubmitError("EINVAL", "--stage-nodes goes with --stage-in or --stage-out")
        if self.run_command is not None and not self.run_command.strip():
            raise SubmitError("EINVAL", "--run needs a command")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise SubmitError(
                "EINVAL", f"--cpus-per-node must be at least 1 ({self.cpus_per_node})"
            )
        ours = {directive_key(self.scheduler, d) for d in self.own_directives()}
        for d in self.extra_directives:
            if "\n" in d or not d.strip():
                raise SubmitError("EINVAL", f"--directive {d!r} must be one non-empty line")
            key = directive_key(self.scheduler, d)
            if key in ours:
                raise SubmitError(
                    "EINVAL",
                    f"--directive {d!r} sets {key}, which the job script sets already "
                    "(use the submit option for it)",
                )
        if not os.path.isabs(self.scratch):
            raise SubmitError("EINVAL", f"--scratch {self.scratch!r} is not an absolute path")
        for arg in self.pipeline_args:
            if arg == "--results-root" or arg.startswith("--results-root="):
                raise SubmitError(
                    "EINVAL",
                    "give --results-root to `submit`, not after `--`: the job directory is the "
                    "pipeline's results root",
                )

    def own_directives(self) -> list[str]:
        """Every directive the script sets itself: the template's and the options'."""
        fixed = {
            "slurm": ["#SBATCH --job-name=x", "#SBATCH --nodes=1", "#SBATCH --output=x"],
            "pbs": ["#PBS -N x", "#PBS -V", "#PBS -l select=1", "#PBS -l place=x", "#PBS -j oe",
                    "#PBS -o x"],
            "nqsv": ["#PBS -N x", "#PBS -V", "#PBS --exclusive", "#PBS -b 1", "#PBS -o x",
                     "#PBS -e x", "#PBS --cpunum-lhost=1"],
        }[self.scheduler]  # fmt: skip
        return fixed + self.directives(extra=False)

    def directives(self, extra: bool = True) -> list[str]:
        """The scheduler directives beyond the template's fixed ones (with the user's
        --directive lines unless `extra` is False)."""
        lines: list[str] = []
        limit = None if self.time_limit_s is None else format_time_limit(self.time_limit_s)
        excluded = ",".join(e.host for e in self.excluded)
        if self.scheduler == "slurm":
            if limit:
                lines.append(f"#SBATCH --time={limit}")
            if self.queue:
                lines.append(f"#SBATCH --partition={self.queue}")
            if self.account:
                lines.append(f"#SBATCH --account={self.account}")
            if excluded:
                lines.append(f"#SBATCH --exclude={excluded}")
            lines += [f"#SBATCH {d}" for d in self.extra_directives if extra]
        else:
            if limit:
                key = "walltime" if self.scheduler == "pbs" else "elapstim_req"
                lines.append(f"#PBS -l {key}={limit}")
            if self.queue:
                lines.append(f"#PBS -q {self.queue}")
            if self.account:
                lines.append(f"#PBS -A {self.account}")
            lines += [f"#PBS {d}" for d in self.extra_directives if extra]
        return lines


def directive_key(scheduler: str, line: str) -> str:
    """What a directive line sets, to find one given twice: `--name` (or `-x`) for Slurm and
    flags, `-l name` for PBS resources (`-l select=...` and `-l place=...` differ)."""
    text = line.split(None, 1)[1] if line.startswith("#") else line
    text = text.strip()
    if scheduler != "slurm" and text.startswith("-l"):
        resource = text[2:].strip()
        return "-l " + re.split(r"[=:]", resource, maxsplit=1)[0]
    return re.split(r"[=\s]", text, maxsplit=1)[0]


def slurm_node_names(timeout_s: float = 30.0) -> list[str] | None:
    """Every node name Slurm knows (`sinfo -h -N -o %N`), or None when sinfo cannot say."""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})


def check_exclusions(
    excluded: Sequence[Exclusion], known: Sequence[str] | None
) -> tuple[list[Exclusion], list[str]]:
    """The exclusions as the scheduler names its nodes, and a note per change: a name it
    knows stays; a fully-qualified or short name matching exactly one known node by its
    short name becomes that node; a name it does not know is left out with a note (sbatch
    rejects a whole job for one unknown name). `known` None (the scheduler could not be
    asked): everything stays, with one note."""
    if not excluded:
        return [], []
    if known is None:
        return list(excluded), ["could not list the scheduler's nodes: exclusions not checked"]
    names = set(known)
    out: list[Exclusion] = []
    notes: list[str] = []
    for e in excluded:
        if e.host in names:
            out.append(e)
            continue
        short = e.host.split(".")[0]
        matches = [n for n in known if n.split(".")[0] == short]
        if len(matches) == 1:
            out.append(Exclusion(matches[0], e.reasons))
            notes.append(f"excluded host {e.host} is the scheduler's node {matches[0]}")
        elif matches:
            notes.append(
                f"excluded host {e.host} matches several nodes ({', '.join(matches)}): "
                "left out of the exclusions"
            )
        else:
            notes.append(f"excluded host {e.host} is not a node of the scheduler: left out")
    return out, notes


def render(spec: JobSpec, templates: Path | None = None) -> str:
    """The job script for `spec`, from `<templates>/<scheduler>.sh`, `prologue.sh`, the body
    (`body.sh`, or `lifecycle.sh` with a run command) and `nodefile.sh`; SubmitError names a
    missing template or placeholder."""
    spec.validate()
    base = templates or templates_dir()
    across = " --nodes" if spec.stage_nodes else ""

    def load(name: str) -> _JobTemplate:
        path = base / name
        try:
            return _JobTemplate(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise SubmitError("ENOENT", f"job template {path}: {e.strerror or e}") from e

    cpus = spec.cpus_per_node
    values = {
        "job_name": spec.job_name,
        "nodes": str(spec.nodes),
        # PBS: mpiprocs=C lists the host C times in PBS_NODEFILE (one node each in nodes.toml).
        "chunk": "" if cpus is None else f":ncpus={cpus}:mpiprocs={cpus}",
        "cpunum": "" if cpus is None else f"\n#PBS --cpunum-lhost={cpus}",
        "job_dir": str(spec.job_dir),
        "directives": "\n".join(spec.directives()),
        "benchfs_run": shlex.quote(spec.benchfs_run),
        "scratch": shlex.quote(spec.scratch),
        "excluded_hosts": " ".join(shlex.quote(e.host) for e in spec.excluded),
        "pipeline_args": shlex.join(spec.pipeline_args),
        "benchfs": shlex.quote(spec.benchfs),
        "start_args": shlex.join(spec.pipeline_args),
        "run_command": spec.run_command or "",
        "stage_in": "" if not spec.stage_in
        else f'"$BENCHFS" stage-in{across} {shlex.quote(spec.stage_in)} / || exit 1',
        "stop_args": "" if not spec.stage_out
        else f"--stage-out {shlex.quote(spec.stage_out)}" + (" --stage-nodes" if across else ""),
    }  # fmt: skip
    body = "body.sh" if spec.run_command is None else "lifecycle.sh"
    if spec.bb_lua is not None:
        values["bb_directives"] = "\n".join(f"#BB_LUA {d}" for d in spec.bb_lua)
        return load("slurm-bb-lua.sh").substitute(values)
    try:
        values["prologue"] = load("prologue.sh").substitute(values).rstrip("\n")
        values["body"] = load(body).substitute(values).rstrip("\n")
        values["nodefile"] = (base / "nodefile.sh").read_text(encoding="utf-8").rstrip("\n")
        return load(f"{spec.scheduler}.sh").substitute(values)
    except OSError as e:
        raise SubmitError("ENOENT", f"job template {base / 'nodefile.sh'}: {e}") from e
    except (KeyError, ValueError) as e:
        raise SubmitError("EINVAL", f"job templates in {base}: bad placeholder {e}") from e


BB_LUA_KEYS = ("layout.", "client.")
"""The configuration a burst-buffer job sets itself (the site sets the rest)."""


def bb_lua_directives(
    start: click.Context, stage_in: str | None, stage_out: str | None
) -> list[str]:
    """`#BB_LUA` directives (without the prefix) for `benchfs start`'s parsed options and the
    submit's stage-in and stage-out; SubmitError names an option with no directive."""
    from click.core import ParameterSource

    params = dict(start.params)
    out: list[str] = []
    if params.pop("servers_per_node") is not None:
        out.append(f"servers_per_node {start.params['servers_per_node']}")
    mount = params.pop("mount")
    if mount:
        out.append(f"mount {os.path.abspath(mount)}")
    for setting in params.pop("sets"):
        key, _, value = setting.partition("=")
        if key == "layout.replicas":
            out.append(f"replicas {value}")
        elif key.startswith(BB_LUA_KEYS):
            out.append(f"set {key}={value}")
        else:
            raise SubmitError(
                "EINVAL",
                f"--set {setting}: a burst-buffer job sets only layout.* and client.* keys "
                "(the site's burst_buffer.lua sets the rest)",
            )
    screen, screen_args = params.pop("screen"), params.pop("screen_args")
    if screen:
        if screen_args not in (None, "--quick"):
            raise SubmitError("EINVAL", "--bb-lua screens with no --screen-args or --quick")
        out.append("screen quick" if screen_args == "--quick" else "screen")
    for source in (stage_in, params.pop("stage_in")):
        if source:
            out.append(f"stage_in {os.path.abspath(source)} /")
    if stage_out:
        out.append(f"stage_out / {os.path.abspath(stage_out)}")
    for name in params:
        if start.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            flag = "--" + name.replace("_", "-").removesuffix("-path")
            raise SubmitError(
                "EINVAL",
                f"{flag} has no burst-buffer directive: Slurm starts BenchFS on the job's "
                "nodes (servers_per_node, mount, set, replicas, screen, stage_in, stage_out)",
            )
    spaced = [
        v for v in (mount, stage_in, stage_out, *start.params["sets"]) if v and re.search(r"\s", v)
    ]
    if spaced:
        raise SubmitError(
            "EINVAL", f"{spaced[0]!r}: directives take paths and values without spaces"
        )
    return out


def new_job_dir_path(root: str | os.PathLike[str], scheduler: str) -> Path:
    """`<root>/<UTC timestamp>-<scheduler>-<short id>` (absolute, not created yet)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(root).absolute() / f"{stamp}-{scheduler}-{secrets.token_hex(3)}"


@dataclass
class Submission:
    """A submitted job: the scheduler's id and the directory its results will appear in."""

    job_id: str
    job_dir: Path
    script: Path
    command: list[str]


def _submit_command(scheduler: str, script: Path) -> list[str]:
    tool = "sbatch" if scheduler == "slurm" else "qsub"
    found = shutil.which(tool)
    if found is None:
        raise SubmitError(
            "ENOENT", f"{tool} not found on PATH: submit from a {scheduler} login node"
        )
    if scheduler == "slurm":
        return [found, "--parsable", str(script)]
    return [found, str(script)]


def parse_job_id(scheduler: str, stdout: str) -> str:
    """The job id from the submit command's output.

    sbatch --parsable prints `<id>[;<cluster>]`; PBS's qsub prints `<id>.<server>`; NQSV's
    prints `Request <id>.<host> submitted to queue: <queue>.`
    """
    text = stdout.strip()
    if scheduler == "slurm":
        match = re.match(r"^(\d+)", text.splitlines()[-1] if text else "")
    elif scheduler == "nqsv":
        match = re.search(r"Request\s+(\S+?)\s+submitted", text)
    else:
        match = re.match(r"^(\S+)", text.splitlines()[-1] if text else "")
    if match is None:
        raise SubmitError("EIO", f"no job id in the output of the submit command: {text!r}")
    return match.group(1)


def submit(spec: JobSpec, templates: Path | None = None) -> Submission:
    """Create the job directory, write the script (and the exclusions), submit it."""
    script_text = render(spec, templates)
    try:
        spec.job_dir.mkdir(parents=True)
    except OSError as e:
        raise SubmitError("EIO", f"cannot create the job directory {spec.job_dir}: {e}") from e
    script = spec.job_dir / JOB_SCRIPT
    write_text_atomic(script, script_text, mode=0o755)
    if spec.excluded:
        write_exclusions(spec.job_dir, list(spec.excluded))
    command = _submit_command(spec.scheduler, script)
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=SUBMIT_TIMEOUT_S,
            cwd=spec.job_dir,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise SubmitError(
            "ETIMEDOUT", f"`{shlex.join(command)}` did not return in {SUBMIT_TIMEOUT_S:.0f} s"
        ) from e
    if out.returncode != 0:
        raise SubmitError(
            "EIO",
            f"`{shlex.join(command)}` failed (exit status {out.returncode}): "
            f"{(out.stderr or out.stdout).strip()}",
        )
    job_id = parse_job_id(spec.scheduler, out.stdout)
    write_json_atomic(
        spec.job_dir / SUBMIT_JSON,
        {
            "scheduler": spec.scheduler,
            "job_id": job_id,
            "submitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": command,
            "nodes": spec.nodes,
            "time_limit_s": spec.time_limit_s,
            "queue": spec.queue,
            "account": spec.account,
            "excluded": [e.to_json() for e in spec.excluded],
            "pipeline_args": list(spec.pipeline_args),
        },
    )
    return Submission(job_id, spec.job_dir, script, command)
