"""Long: 400,000 mdtest-hard-style files written, read back and verified on a local cluster
(`make test-long`). Distinct ids mean no two files share chunks, which the data proves."""

from __future__ import annotations

import os

import pytest

from benchfs import Client

RANKS, PER_RANK = 400, 1000


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_400k_mdtest_hard_files(inproc_cluster) -> None:
    cluster = inproc_cluster(4, "layout.chunk_size=65536")
    with Client(str(cluster.registry), config=cluster.config) as client:
        client.mkdir("/mdtest")
        ids = set()
        for rank in range(RANKS):
            for i in range(PER_RANK):
                path = f"/mdtest/file.mdtest.{rank}.{i}"
                with client.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL) as f:
                    f.pwrite(path.encode(), 0)
                    ids.add(f.id)
        assert len(ids) == RANKS * PER_RANK
        assert len(client.readdir("/mdtest")) == RANKS * PER_RANK
        for rank in range(RANKS):
            for i in range(PER_RANK):
                path = f"/mdtest/file.mdtest.{rank}.{i}"
                with client.open(path) as f:
                    assert f.pread(100, 0) == path.encode(), path
