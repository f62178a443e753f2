"""SQLite from two nodes that are apart: a cluster on four network-namespace nodes
(`benchfs-run nodes --netns 4`, `benchfs start --server-nodes 2 --mount DIR`), and one sqlite3
writer on each client node, each row its own transaction, at once on one database. Each node
has its own mount (DIR/n3, DIR/n4) or its own interposition library; nothing but the job's
locks keeps the two writers apart. Every row must be there and the database must check."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchfs.native import preload_env
from test_netns_nodes import link_bytes, netns_job

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("sqlite3") is None,
    reason="network namespaces need root and ip; the test needs sqlite3",
)

TAG = f"sq{os.getpid() % 100000}"
WRITERS = ("n3", "n4")

WRITER = r"""
db=$1; table=$2; who=$3; n=$4
for i in $(seq 1 "$n"); do echo "insert into $table values ($who, $i);"; done > "$OUT/ins-$who.sql"
sqlite3 -cmd ".timeout 120000" "$db" < "$OUT/ins-$who.sql"
"""


@dataclass
class Job:
    env: dict[str, str]
    mounts: Path
    """DIR: node n's mount is DIR/n."""
    prefix: Path
    """The interposition library's prefix where no mount serves it."""


def netns(node: str) -> str:
    return f"{TAG}-{node}"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    base = tmp_path_factory.mktemp("sqlite-nodes")
    with netns_job(base, TAG, "--server-nodes", "2", "--mount", str(base / "mnt")) as env:
        # Each client node mounts at DIR/NODE; the first one's is exported.
        assert env["BENCHFS_MOUNT"] == str(base / "mnt" / "n3")
        yield Job(env, base / "mnt", base / "prefix")
    assert not any(os.path.ismount(mount) for mount in (base / "mnt").iterdir())


def on_node(job: Job, node: str, face: str, out: Path) -> tuple[list[str], dict[str, str], str]:
    """The command prefix, environment and database path of a writer on `node` through `face`:
    the process runs in the node's network namespace, as one started there would."""
    env = {**job.env, "OUT": str(out)}
    mount = job.mounts / node
    if face == "mount":
        db = f"{mount}/m.db"
    elif face == "preload-mount":  # the library at the node's mount point, its default
        env = preload_env({**env, "BENCHFS_MOUNT": str(mount)}, mount)
        db = f"{mount}/pm.db"
    else:  # the library alone
        env = preload_env({**env, "BENCHFS_MOUNT": ""}, job.prefix)
        db = f"{job.prefix}/p.db"
    return ["ip", "netns", "exec", netns(node)], env, db


@pytest.mark.parametrize(
    "rows",
    [pytest.param(100, id="100-rows"), pytest.param(5000, id="5000-rows", marks=pytest.mark.long)],
)
@pytest.mark.parametrize("face", ["mount", "preload", "preload-mount"])
@pytest.mark.timeout(600)
def test_sqlite_writers_on_two_nodes_share_one_database(
    job: Job, face: str, rows: int, tmp_path: Path
) -> None:
    writer = tmp_path / "writer.sh"
    writer.write_text(WRITER)
    first = on_node(job, WRITERS[0], face, tmp_path)
    table = f"t{rows}"
    created = subprocess.run(
        [*first[0], "sqlite3", first[2], f"create table {table}(who, i);"],
        env=first[1], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    sent = {node: link_bytes(netns(node))[1] for node in WRITERS}
    procs = []
    for who, node in enumerate(WRITERS, 1):
        prefix, env, db = on_node(job, node, face, tmp_path)
        argv = [*prefix, "bash", str(writer), db, table, str(who), str(rows)]
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=560)
        assert proc.returncode == 0, out + err
        assert "benchfs-preload" not in err, err
    for node in WRITERS:  # each writer's requests left through its own node's link
        assert link_bytes(netns(node))[1] - sent[node] > rows * 1000, node
    prefix, env, db = on_node(job, WRITERS[1], face, tmp_path)
    query = f"select who, count(distinct i) from {table} group by who; pragma integrity_check;"
    checked = subprocess.run(
        [*prefix, "sqlite3", db, query], env=env, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split() == [f"1|{rows}", f"2|{rows}", "ok"], checked.stdout
