"""`benchfs status`: is the job's cluster up, is every server answering, how full is it.

Processes are checked by their recorded pid and start time (on the host that started the
job); servers by the registry and by asking each for its capacity with short timeouts, so a
dead or hung server is named within seconds instead of hanging the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchfs.client import Client
from benchfs.config import with_overrides
from benchfs.launch import this_host
from benchfs.lifecycle.state import JobState
from benchfs.mount import is_mounted
from benchfs.procs import ProcessRef

#: Timeouts of the status client: a server that does not answer in this time is reported.
STATUS_TIMEOUT_S = 3.0


def _alive(record: dict[str, Any], here: bool) -> bool | None:
    """Whether a recorded process runs (None: not knowable from this host)."""
    if not here:
        return None
    start = record.get("start")
    return start is not None and ProcessRef(record["pid"], start).alive()


def _mount_state(path: str, process_alive: bool | None) -> str:
    """The mount's state: mounted, disconnected (still in the mount table, its process
    gone: every access fails) or not mounted."""
    if not is_mounted(path):
        return "not mounted"
    return "disconnected" if process_alive is False else "mounted"


SHORT_FILES_LISTED = 100
"""`status` lists at most this many files short of copies (and counts them all)."""


def unanswering(capacity: dict[str, Any]) -> list[int]:
    """The ids of the servers that did not answer a statfs."""
    return sorted(s["id"] for s in capacity["servers"] if s.get("error") is not None)


def copies_status(client: Client, capacity: dict[str, Any]) -> dict[str, Any]:
    """Servers declared lost, repaired and not answering; when any is lost, the files with
    fewer live copies than they asked for (from the metadata owners that answer)."""
    record = client.lost_servers()
    # A repaired server's copies are on the servers standing in for it.
    lost = sorted((set(unanswering(capacity)) | set(record["lost"])) - set(record["repaired"]))
    out: dict[str, Any] = {**record, "not_answering": unanswering(capacity), "files_short": None}
    if not lost:
        return out
    files, missing = client.reachable_files("/")
    short: list[dict[str, Any]] = []
    count = 0
    lefts = client.copies_left([p for p, _ in files], lost)
    for (path, _), left in zip(files, lefts, strict=True):
        if isinstance(left, OSError):
            continue
        asked, fewest = left
        if fewest is not None and fewest < asked:
            count += 1
            if len(short) < SHORT_FILES_LISTED:
                short.append({"path": path, "asked": asked, "left": fewest})
    out.update(
        files_short=short,
        files_short_count=count,
        owners_not_answering=[message for _, message in missing],
    )
    return out


def job_status(job_dir: Path) -> dict[str, Any]:
    """The job's status: `state` is "running" (every server answers), "degraded" (some do
    not), "down" (none does) or "stopped"; per server its process, registration and
    capacity; the mount; the cluster's capacity."""
    state = JobState.load(job_dir)
    state.use_network()
    here = state.host == this_host()
    registry = Path(state.registry)
    out: dict[str, Any] = {
        "job": str(job_dir),
        "host": state.host,
        "started": state.started,
        "stopped": state.stopped,
        "exports": state.exports,
        "mount": None,
        "capacity": None,
        "copies": None,
        "error": None,
    }
    servers: dict[int, dict[str, Any]] = {}
    for record in state.processes:
        if record.get("role") == "benchfsd":
            servers[record["server_id"]] = {
                "id": record["server_id"],
                "node": record["node"],
                "pid": record["pid"],
                "process_alive": _alive(record, here),
                "registered": (registry / f"server-{record['server_id']}.json").exists(),
                "error": None,
            }
        elif record.get("role") == "benchfs-mount":
            alive = _alive(record, here)
            mounted = _mount_state(record["mountpoint"], alive) if here else None
            out["mount"] = {"path": record["mountpoint"], "node": record["node"],
                            "process_alive": alive, "mounted": mounted}  # fmt: skip
    out["servers"] = [servers[k] for k in sorted(servers)]
    if state.stopped is not None:
        out["state"] = "stopped"
        return out
    config = with_overrides(
        Path(state.config).read_text(),
        [
            f"cluster.connect_timeout_s={STATUS_TIMEOUT_S}",
            f"client.request_timeout_s={STATUS_TIMEOUT_S}",
            "client.max_retries=0",
            "telemetry.trace=false",
            "telemetry.enabled=false",
        ],
    )
    try:
        with Client(registry, config) as client:
            capacity = client.statfs()
            out["copies"] = copies_status(client, capacity)
    except (OSError, ValueError, TimeoutError) as e:
        out["error"] = str(e)
        capacity = None
    if capacity is not None:
        out["capacity"] = {k: v for k, v in capacity.items() if k != "servers"}
        for s in capacity["servers"]:
            entry = servers.setdefault(s["id"], {"id": s["id"], "node": s["node"]})
            entry.update({k: v for k, v in s.items() if k not in ("id", "node")})
    answered = [s for s in out["servers"] if s.get("error") is None and "total_bytes" in s]
    if capacity is None or not answered:
        out["state"] = "down"
    elif len(answered) < state.servers:
        out["state"] = "degraded"
    else:
        out["state"] = "running"
    return out
