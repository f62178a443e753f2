"""A real one-node Slurm on this machine, for the submit tests.

`LocalSlurm` starts munged (as the munge user, on a private socket with a private key),
slurmctld and slurmd (in the foreground, as processes this object owns) from Debian's slurm-wlm,
configured under a temporary directory on free ports with no accounting, waits until the node
is idle, and stops every daemon it started by pid (SIGTERM, bounded wait, SIGKILL). Every
client command gets `SLURM_CONF` through `env()`.
"""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from benchfs.procs import pid_alive

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scancel", "scontrol", "sinfo")
STOP_GRACE_S = 10.0


def missing_binaries() -> list[str]:
    """Slurm and munge programs that are not installed (bootstrap installs them)."""
    found = []
    for name in (*DAEMONS, *CLIENTS):
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists():
            found.append(name)
    try:
        pwd.getpwnam("munge")
    except KeyError:
        found.append("user munge")
    return found


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports that were free a moment ago, chosen below the kernel's ephemeral
    range: a port the kernel handed out (bind to 0) can be handed out again to an outgoing
    connection (srun, the previous test's daemons) before slurmctld binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = random.sample(range(10000, max(10000 + 4 * n, low)), k=min(200, low - 10000))
    found: list[int] = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise SlurmError(f"no {n} free ports below {low}")


class SlurmError(RuntimeError):
    pass


class LocalSlurm:
    """One-node Slurm under `base`; use as a context manager or call start()/stop()."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.host = socket.gethostname().split(".", 1)[0]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # munged runs as the munge user, which cannot enter pytest's 0700 tmp directories.
        self.munge_dir = Path(tempfile.mkdtemp(prefix="benchfs-munge-"))
        self.socket = self.munge_dir / "munge.socket"
        self.conf = base / "slurm.conf"
        self.log_dir = base / "log"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client_prefix(self) -> list[str]:
        """What a client command runs under (where the controller can be reached)."""
        return []

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            [*self.client_prefix(), _which(argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            check=False,
        )

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        os.chmod(self.munge_dir, 0o755)  # munged: clients must reach the socket
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))  # a private key: this cluster trusts only itself
        os.chmod(key, 0o400)
        for p in (self.munge_dir, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        log = open(self.log_dir / "munged.out", "ab")
        self.procs["munged"] = subprocess.Popen(
            [
                _which("munged"),
                "--foreground",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={self.munge_dir / 'munged.pid'}",
                f"--log-file={self.munge_dir / 'munged.log'}",
                f"--seed-file={self.munge_dir / 'munged.seed'}",
            ],
            user=munge.pw_uid,
            group=munge.pw_gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait(lambda: self.socket.exists(), 10, "munged to create its socket", "munged")

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = free_ports(2)
        state = self.base / "state"
        spool = self.base / "spool"
        for d in (state, spool, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=benchfs-test",
                    f"SlurmctldHost={self.host}({self.ctld_addr})",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/builtin",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "MailProg=/bin/true",
                    f"StateSaveLocation={state}",
                    f"SlurmdSpoolDir={spool}{self.per_node}",
                    f"SlurmctldPidFile={self.base / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.base / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "MinJobAge=300",
                    "KillWait=15",  # cancelled jobs get this long to tear down before SIGKILL
                    "Waittime=0",
                    *self.conf_lines(),
                    "",
                ]
            )
        )

    ctld_addr = "127.0.0.1"
    per_node = ""
    """What tells several slurmd's spool directories apart (none with one: PMIx's socket
    paths under it are at most 107 bytes)."""

    def conf_lines(self) -> list[str]:
        """The nodes, the partition and anything else of this cluster's slurm.conf."""
        cpus = os.cpu_count() or 1
        return [
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]

    def _daemon(self, name: str, *args: str, prefix: tuple[str, ...] = ()) -> None:
        self._spawn(name, [*prefix, _which(name), "-D", *args])

    def _spawn(self, key: str, argv: list[str]) -> None:
        """A daemon this object owns, its output in log/KEY.out."""
        log = open(self.log_dir / f"{key}.out", "ab")
        self.procs[key] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )
        log.close()

    def _wait(self, ready: object, timeout: float, what: str, daemon: str | None = None) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(
                        f"{name} exited with status {proc.returncode} while waiting for "
                        f"{what}:\n{self.logs()}"
                    )
            if ready():
                return
            time.sleep(0.2)
        raise SlurmError(f"timed out after {timeout} s waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in [*sorted(self.log_dir.glob("*")), self.munge_dir / "munged.log"]:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)

    def node_state(self) -> str:
        out = self.run("sinfo", "--noheader", "-n", self.host, "-o", "%T")
        return out.stdout.strip() if out.returncode == 0 else ""

    def start(self, timeout: float = 30.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self.start_daemons(timeout)

    def start_daemons(self, timeout: float) -> None:
        self._daemon("slurmctld", "-i")
        self._daemon("slurmd", "-N", self.host)
        self._wait(lambda: self.node_state() == "idle", timeout, f"node {self.host} to be idle")

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(JobState, ExitCode) from `scontrol show job` (no accounting needed)."""
        out = self.run("scontrol", "show", "job", job_id)
        if out.returncode != 0:
            raise SlurmError(f"scontrol show job {job_id}: {out.stderr.strip()}")
        state = re.search(r"JobState=(\S+)", out.stdout)
        code = re.search(r"ExitCode=(\S+)", out.stdout)
        return (state.group(1) if state else "?", code.group(1) if code else "?")

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        """Poll until the job leaves PENDING/RUNNING/COMPLETING; (state, exit code)."""
        deadline = time.monotonic() + timeout
        while True:
            state, code = self.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state, code
            if time.monotonic() >= deadline:
                self.run("scancel", job_id)
                raise SlurmError(f"job {job_id} still {state} after {timeout} s:\n{self.logs()}")
            time.sleep(0.5)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def stop(self) -> None:
        """SIGTERM every daemon this started (slurmd, slurmctld, munged), bounded wait, then
        SIGKILL; remove the private munge directory."""
        order = [k for k in self.procs if k.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_GRACE_S)
        shutil.rmtree(self.munge_dir, ignore_errors=True)

    def leftover(self) -> list[int]:
        return [pid for pid in self.pids() if pid_alive(pid)]

    def __enter__(self) -> LocalSlurm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NamespacedSlurm(LocalSlurm):
    """Slurm on nodes that are apart: each slurmd in its node's network namespace (as
    `benchfs-run nodes --netns` makes them) and a UTS namespace of its own, whose host name
    is the node's; slurmctld in another node's network namespace, so the controller's host is
    none of the job's nodes. Mount namespaces stay the host's (`nsenter --net`, not `ip netns
    exec`), so a job on a node sees the mounts its burst buffer made. Client commands run in
    the controller's network, as on a login node; `as_user` runs them as that user."""

    def __init__(
        self,
        base: Path,
        compute: dict[str, tuple[str, str]],
        controller: tuple[str, str],
        extra: list[str] | None = None,
    ) -> None:
        """`compute`: node name -> (network namespace, address); `controller`: (namespace,
        address) of the controller's host."""
        super().__init__(base)
        self.compute = compute
        self.ctl_ns, self.ctld_addr = controller
        self.extra = extra or []
        self.user: str | None = None
        self.per_node = "/%n"

    def client_prefix(self) -> list[str]:
        prefix = ["nsenter", f"--net=/run/netns/{self.ctl_ns}"]
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            prefix += ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}"]
            prefix += ["--clear-groups"]
        return prefix

    def as_user(
        self, user: str | None, *argv: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        saved, self.user = self.user, user
        try:
            return self.run(*argv, timeout=timeout)
        finally:
            self.user = saved

    def conf_lines(self) -> list[str]:
        cpus = os.cpu_count() or 1
        names = ",".join(self.compute)
        return [
            *(
                f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN"
                for name, (_, addr) in self.compute.items()
            ),
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
            *self.extra,
        ]

    def start_daemons(self, timeout: float) -> None:
        self._daemon("slurmctld", "-i", prefix=("nsenter", f"--net=/run/netns/{self.ctl_ns}"))
        for name, (ns, _) in self.compute.items():
            self.start_node(name, ns)
        self.wait_idle(timeout)

    def start_node(self, name: str, ns: str) -> None:
        """slurmd of node `name` in its namespaces, its host name `name`."""
        inner = f"hostname {name} && exec {_which('slurmd')} -D -N {name}"
        netns = ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c", inner]
        self._spawn(f"slurmd-{name}", netns)

    def states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "-N", "-o", "%N %T")
        found = {}
        for line in out.stdout.splitlines():
            words = line.split()
            if len(words) == 2:
                found[words[0]] = words[1]
        return found

    def wait_idle(self, timeout: float) -> None:
        self._wait(
            lambda: (
                all(s == "idle" for s in self.states().values())
                and set(self.states()) == set(self.compute)
            ),
            timeout,
            f"nodes {', '.join(self.compute)} to be idle",
        )
