"""`benchfs repair`: re-create the chunk copies lost servers held, on live servers, and catch
up the lost servers that answer again.

Servers that do not answer are declared lost first (no client places copies on, or reads
from, them until they rejoin); then every file the answering metadata owners hold is repaired by
the core (`Client.repair`): each chunk a lost server held is read from a copy left, written to
the server standing in for the lost one, and to a declared server that answers again
(restarted, resumed), and checked against its source's checksum. Only a repair that reached
every file, with no chunk left without a copy, records the servers as repaired, and those
that answer again as rejoined: clients use them again. docs/lifecycle.md, "Copies".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchfs.client import Client
from benchfs.lifecycle.state import JobState
from benchfs.lifecycle.status import unanswering

__all__ = ["RepairReport", "repair_job"]

BATCH = 256
"""Files handed to the core at once (each batch's chunks are copied in parallel)."""


@dataclass
class RepairReport:
    """What a repair did: the servers it found lost, the files it went through, the copies
    and bytes it wrote, and what it could not do."""

    lost: list[int] = field(default_factory=list)
    rejoining: list[int] = field(default_factory=list)
    """Declared lost and answering again: caught up, then used again."""
    files: int = 0
    metadata_records: int = 0
    """Records of the metadata copied to copies standing in or catching up."""
    copies: int = 0
    bytes: int = 0
    lost_chunks: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    owners_not_answering: list[tuple[int, str]] = field(default_factory=list)
    """Metadata owners that did not answer: their files were not reached. With one copy of
    the metadata (`layout.replicas` 1), those of the lost servers are lost with them."""

    @property
    def unreached(self) -> list[str]:
        """Owners not answering that are not among the lost servers: files a repair missed."""
        return [m for sid, m in self.owners_not_answering if sid not in self.lost]

    @property
    def complete(self) -> bool:
        return not (self.failed or self.lost_chunks or self.unreached)

    def as_dict(self) -> dict[str, object]:
        return {
            "lost": self.lost,
            "rejoining": self.rejoining,
            "files": self.files,
            "metadata_records": self.metadata_records,
            "copies": self.copies,
            "bytes": self.bytes,
            "lost_chunks": self.lost_chunks,
            "failed": [{"path": p, "error": e} for p, e in self.failed],
            "owners_not_answering": [m for _, m in self.owners_not_answering],
            "unreached": self.unreached,
            "complete": self.complete,
        }


def repair_job(job_dir: Path, say: Callable[[str], None] = lambda _: None) -> RepairReport:
    """Repairs the job's files (see the module comment)."""
    state = JobState.load(job_dir)
    state.use_network()
    with Client(state.registry, Path(state.config).read_text()) as client:
        return repair(client, say)


def repair(client: Client, say: Callable[[str], None] = lambda _: None) -> RepairReport:
    """Repairs every file `client` reaches (see the module comment)."""
    report = RepairReport()
    gone = unanswering(client.statfs())
    if gone:
        say(f"declaring servers {', '.join(map(str, gone))} lost: they do not answer")
        client.declare_lost(gone)
    record = client.lost_servers()
    report.rejoining = sorted(set(record["lost"]) - set(gone))
    report.lost = sorted(set(record["lost"]) - set(record["repaired"]) - set(report.rejoining))
    if not report.lost and not report.rejoining:
        say("no server is lost: nothing to repair")
        return report
    # Copies of the metadata: the servers caught up take its changes from now on, then
    # every copy standing in or catching up gets the serving copy's state.
    client.record_joining(report.rejoining)
    try:
        report.metadata_records = client.catch_up_metadata()
    except OSError as e:
        report.failed.append(("(metadata)", str(e)))
    files, report.owners_not_answering = client.reachable_files("/")
    paths = [p for p, _ in files]
    if report.lost:
        say(f"repairing {len(paths)} files of servers {', '.join(map(str, report.lost))}")
    if report.rejoining:
        say(f"catching up servers {', '.join(map(str, report.rejoining))}: they answer again")
    for start in range(0, len(paths), BATCH):
        batch = paths[start : start + BATCH]
        for path, done in zip(batch, client.repair(batch, report.rejoining), strict=True):
            report.files += 1
            if isinstance(done, OSError):
                report.failed.append((path, str(done)))
                continue
            report.copies += done["copies"]
            report.bytes += done["bytes"]
            report.lost_chunks += done["lost_chunks"]
    if report.complete:
        client.record_repaired(report.lost)
        client.record_rejoined(report.rejoining)
    return report
