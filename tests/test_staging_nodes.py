"""Staging across the job's nodes (`benchfs stage-in --nodes`, `stage-out --nodes`, `stop
--stage-out --stage-nodes`): four
nodes in their own network namespaces, each running a server and a client; every node's
process copies its share of a tree (largest files first, shares balanced by bytes) and its
bytes cross that node's own link; one manifest names the node of every file; the tree comes
back out the same way, byte for byte."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchfs import schemas
from benchfs.lifecycle.spread import shares
from benchfs.lifecycle.stage import Entry
from benchfs.results import read_json
from test_lifecycle import BIN
from test_netns_nodes import link_bytes, netns_job

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"
)

TAG = f"st{os.getpid() % 100000}"
NODES = ("n1", "n2", "n3", "n4")


def test_shares_are_balanced_largest_first() -> None:
    sizes = [64, 64, 64, 48, 30, 20, 10, 5, 5, 1, 0]
    todo = [Entry(f"f{i}", "file", s, 0o644, 0) for i, s in enumerate(sizes)]
    out = shares(todo, ["a", "b", "c"])
    assert sorted(e.path for v in out.values() for e in v) == sorted(e.path for e in todo)
    loads = {n: sum(e.size for e in v) for n, v in out.items()}
    # The three largest go one to each; each next file to the least loaded node.
    assert loads == {"a": 64 + 48, "b": 64 + 30 + 5 + 1, "c": 64 + 20 + 10 + 5 + 0}
    assert [e.size for e in out["a"]] == sorted((e.size for e in out["a"]), reverse=True)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[dict[str, str]]:
    with netns_job(tmp_path, TAG, "--servers", "4", "--clients", "4") as env:
        yield env


def benchfs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "benchfs"), *args], env=env, capture_output=True, text=True, timeout=300
    )


LOCATE = """
import json, sys
from pathlib import Path
from benchfs.client import Client
offsets = json.load(sys.stdin)
with Client(sys.argv[1], Path(sys.argv[2]).read_text()) as c:
    json.dump({p: [c.locate(p, o) for o in offs] for p, offs in offsets.items()}, sys.stdout)
"""


def bound_elsewhere(job: dict[str, str], root: str, staged: dict[str, Any]) -> dict[str, int]:
    """Per node, the bytes of the files it staged whose chunks live on another node's server:
    what its copying process must have sent through its own link (a chunk for its own server
    goes over loopback). Chunk placement depends on the order the copiers created the files
    in each directory (each directory's files take consecutive stripe starts), a race between
    the nodes, so it is read back from the servers (`Client.locate`), from the job's network."""
    membership = read_json(Path(job["BENCHFS_JOB_DIR"]) / "manifest.json")["membership"]
    node_of = {m["id"]: m["node"] for m in membership}
    offsets = {
        f"{root}/{f['path']}": list(range(0, f["size"], f["chunk_size"])) for f in staged["files"]
    }
    done = subprocess.run(
        [sys.executable, "-c", LOCATE, job["BENCHFS_REGISTRY"], job["BENCHFS_CONFIG"]],
        input=json.dumps(offsets),
        env={**job, "BENCHFS_NETNS": f"{TAG}-n1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    servers = json.loads(done.stdout)
    out = dict.fromkeys(NODES, 0)
    for f in staged["files"]:
        size, chunk = f["size"], f["chunk_size"]
        for k, server in enumerate(servers[f"{root}/{f['path']}"]):
            if node_of[server] != f["node"]:
                out[f["node"]] += min(chunk, size - k * chunk)
    return out


@pytest.mark.timeout(400)
def test_every_node_stages_its_share(job: dict[str, str], tmp_path: Path) -> None:
    rng = random.Random(7)
    src = tmp_path / "src"
    (src / "deep" / "er").mkdir(parents=True)
    # Each node's largest file spans two 4 MiB chunks (n4's: 4 MiB + 256 KiB), which stripe
    # onto two different servers: whatever the placement, every node has bytes to send to
    # another node's server.
    sizes = [8 << 20, 6 << 20, 5 << 20, (4 << 20) + (256 << 10), 3 << 20]
    sizes += [rng.randrange(0, 300_000) for _ in range(40)]
    for i, size in enumerate(sizes):
        where = src if i % 3 == 0 else src / "deep" if i % 3 == 1 else src / "deep" / "er"
        (where / f"f{i:02d}").write_bytes(rng.randbytes(size))
    os.symlink("deep/er", src / "link")
    sent = {n: link_bytes(f"{TAG}-{n}")[1] for n in NODES}
    done = benchfs(job, "stage-in", "--nodes", str(src), "/data")
    assert done.returncode == 0, done.stderr
    staging = Path(job["BENCHFS_JOB_DIR"]) / "staging"
    manifest_path = next(staging.glob("stage-in-*.json"))
    manifest = read_json(manifest_path)
    schemas.check(manifest, schemas.STAGE_MANIFEST, manifest_path)
    assert manifest["status"] == "ok" and manifest["files_copied"] == len(sizes)
    assert [link["path"] for link in manifest["links"]] == ["link"]
    by_node = Counter(f["node"] for f in manifest["files"])
    assert set(by_node) == set(NODES), by_node
    logs = next(staging.glob("shares-*"))
    for n in NODES:
        assert f"{by_node[n]}/{by_node[n]} files" in (logs / f"{n}.log").read_text(), n
    # Each node's process copied its files (its log ends with them all) and sent, through its
    # own link, every byte of them bound for another node's server. (Not a fixed share of the
    # tree: with 4 MiB chunks, most of its bytes are in a few chunks, and when the copiers'
    # race puts several of them on their copier's own server, under half the tree crosses
    # the links, in a few runs in a hundred.)
    moved = {n: link_bytes(f"{TAG}-{n}")[1] - sent[n] for n in NODES}
    elsewhere = bound_elsewhere(job, "/data", manifest)
    for n in NODES:
        assert elsewhere[n] > 0, (n, elsewhere)  # see the sizes above
        assert moved[n] >= elsewhere[n], (n, moved, elsewhere)

    out = tmp_path / "out"
    back = benchfs(job, "stage-out", "--nodes", "/data", str(out))
    assert back.returncode == 0, back.stderr
    assert "fsynced in" in back.stderr
    assert subprocess.run(["diff", "-r", "--no-dereference", str(src), str(out)]).returncode == 0
    out_manifest = read_json(next(staging.glob("stage-out-*.json")))
    assert set(Counter(f["node"] for f in out_manifest["files"])) == set(NODES)

    # The job's last stage-out, by `benchfs stop`, across the nodes too.
    last = tmp_path / "last"
    stopped = benchfs(job, "stop", "--stage-out", str(last), "--stage-nodes")
    assert stopped.returncode == 0, stopped.stderr
    # Everything under BenchFS's /: the tree staged in is /data.
    assert sorted(p.name for p in last.iterdir()) == ["data"]
    assert (
        subprocess.run(["diff", "-r", "--no-dereference", str(src), str(last / "data")]).returncode
        == 0
    )
    final = [read_json(p) for p in staging.glob("stage-out-*.json")]
    final = [m for m in final if m["destination"] == str(last)]
    assert len(final) == 1 and set(Counter(f["node"] for f in final[0]["files"])) == set(NODES)
