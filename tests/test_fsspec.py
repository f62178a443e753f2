"""`benchfs://` through fsspec (docs/python.md) on real daemons: fsspec's own abstract test
suites (copy, get, put, open, pipe; shipped in the fsspec wheel), the calls the suites do not
reach, and pandas writing and reading CSV and Parquet."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")
from fsspec.tests.abstract import AbstractFixtures  # noqa: E402
from fsspec.tests.abstract.copy import AbstractCopyTests  # noqa: E402
from fsspec.tests.abstract.get import AbstractGetTests  # noqa: E402
from fsspec.tests.abstract.open import AbstractOpenTests  # noqa: E402
from fsspec.tests.abstract.pipe import AbstractPipeTests  # noqa: E402
from fsspec.tests.abstract.put import AbstractPutTests  # noqa: E402

from benchfs.cluster import LocalCluster  # noqa: E402
from benchfs.fsspec import BenchFileSystem  # noqa: E402
from conftest import config_text  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster.start_in(
        tmp_path_factory.mktemp("fsspec"), config_text(), ["fs-0", "fs-1"], 15.0
    )
    yield started
    started.stop(grace_s=5.0)
    assert started.leftover_pids() == []


@pytest.fixture(scope="module")
def benchfs_fs(cluster: LocalCluster) -> BenchFileSystem:
    assert cluster.config_path is not None
    return BenchFileSystem(
        registry=str(cluster.registry_dir),
        config=cluster.config_path.read_text(),
        skip_instance_cache=True,
    )


class BenchFSFixtures(AbstractFixtures):
    @pytest.fixture
    def fs(self, benchfs_fs: BenchFileSystem) -> BenchFileSystem:
        return benchfs_fs

    @pytest.fixture
    def fs_path(self, benchfs_fs: BenchFileSystem) -> str:
        # Test ids hold glob characters ("**"): a plain name instead.
        path = f"/suite/{uuid.uuid4().hex}"
        benchfs_fs.makedirs(path, exist_ok=True)
        return path


class TestCopy(AbstractCopyTests, BenchFSFixtures):
    pass


class TestGet(AbstractGetTests, BenchFSFixtures):
    pass


class TestPut(AbstractPutTests, BenchFSFixtures):
    pass


class TestOpen(AbstractOpenTests, BenchFSFixtures):
    pass


class TestPipe(AbstractPipeTests, BenchFSFixtures):
    pass


def test_names_listing_and_ranges(benchfs_fs: BenchFileSystem) -> None:
    fs = benchfs_fs
    fs.makedirs("benchfs://calls/a/b", exist_ok=True)
    data = bytes(range(256)) * 1000
    fs.pipe_file("benchfs:///calls/a/b/f.bin", data)
    fs.pipe_file("/calls/a/g.txt", b"hello")
    assert fs.info("/calls/a/b/f.bin")["size"] == len(data)
    assert fs.info("/calls/a")["type"] == "directory"
    assert fs.ls("/calls/a", detail=False) == ["/calls/a/b", "/calls/a/g.txt"]
    assert fs.find("/calls") == ["/calls/a/b/f.bin", "/calls/a/g.txt"]
    assert fs.find("/calls", withdirs=True) == [
        "/calls", "/calls/a", "/calls/a/b", "/calls/a/b/f.bin", "/calls/a/g.txt"
    ]  # fmt: skip
    assert fs.find("/calls", maxdepth=2) == ["/calls/a/g.txt"]
    assert fs.glob("/calls/**/*.bin") == ["/calls/a/b/f.bin"]
    assert fs.du("/calls") == len(data) + 5
    assert fs.cat_file("/calls/a/b/f.bin", start=1000, end=1010) == data[1000:1010]
    assert fs.cat_file("/calls/a/b/f.bin", start=-10) == data[-10:]
    assert fs.cat_file("/calls/a/b/f.bin", start=len(data) + 5) == b""
    with fs.open("/calls/a/b/f.bin", "rb") as f:
        f.seek(255_000)
        assert f.read(10) == data[255_000:255_010]
    with fs.open("/calls/a/t.txt", "w") as f:
        f.write("text mode\n")
    assert fs.cat("/calls/a/t.txt") == b"text mode\n"
    fs.mv("/calls/a/t.txt", "/calls/a/b")
    assert fs.exists("/calls/a/b/t.txt") and not fs.exists("/calls/a/t.txt")
    fs.mv("/calls/a/b", "/calls/moved", recursive=True)
    assert fs.find("/calls/moved") == ["/calls/moved/f.bin", "/calls/moved/t.txt"]
    assert fs.modified("/calls/moved/f.bin").tzinfo is not None
    with pytest.raises(FileNotFoundError):
        fs.info("/calls/none")
    with pytest.raises(FileExistsError):
        fs.makedirs("/calls/a")
    with pytest.raises(NotADirectoryError):
        fs.makedirs("/calls/a/g.txt/below")
    fs.rm("/calls", recursive=True)
    assert not fs.exists("/calls")


def test_links_list_as_fsspec_local_lists_them(benchfs_fs: BenchFileSystem, tmp_path: Path) -> None:
    """The same tree of links through benchfs:// and fsspec's LocalFileSystem: types, sizes,
    islink, destination and removal agree."""
    local_fs = fsspec.filesystem("file")
    local = str(tmp_path / "links")
    for fs, root in ((benchfs_fs, "/links"), (local_fs, local)):
        fs.makedirs(f"{root}/d", exist_ok=True)
        fs.pipe_file(f"{root}/d/f", b"hello")
    for target, name in (("d/f", "tofile"), ("d", "todir"), ("nowhere", "dangling")):
        benchfs_fs.client.symlink(target, f"/links/{name}")
        os.symlink(target, f"{local}/{name}")

    def shape(fs: object, root: str) -> object:
        assert isinstance(fs, fsspec.AbstractFileSystem)
        # Sizes of directories differ (the local one's is its blocks).
        listed = {
            e["name"].rsplit("/", 1)[1]: (
                e["type"],
                e["size"] if e["name"].endswith(("tofile", "dangling")) else None,
                e["islink"],
                e.get("destination"),
            )
            for e in fs.ls(root, detail=True)
        }
        infos = {
            n: (fs.info(f"{root}/{n}")["type"], fs.info(f"{root}/{n}")["islink"])
            for n in ("tofile", "todir")
        }
        return (
            listed,
            infos,
            [fs.islink(f"{root}/{n}") for n in ("d", "tofile", "dangling")],
            fs.lexists(f"{root}/dangling"),
        )

    assert shape(benchfs_fs, "/links") == shape(local_fs, local)
    assert benchfs_fs.cat_file("/links/tofile") == b"hello"
    assert not benchfs_fs.exists("/links/dangling")
    with pytest.raises(FileNotFoundError):
        benchfs_fs.info("/links/dangling")
    # Removing a tree removes its links, never what they point to.
    benchfs_fs.rm("/links/todir")
    assert benchfs_fs.exists("/links/d/f")
    benchfs_fs.rm("/links", recursive=True)
    assert not benchfs_fs.exists("/links")


def test_pandas_csv_and_parquet_round_trip(benchfs_fs: BenchFileSystem) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pd.DataFrame(
        {"rank": range(1000), "mib_s": [i * 1.5 for i in range(1000)], "node": ["n0", "n1"] * 500}
    )
    options = {"registry": benchfs_fs._options[0], "config": benchfs_fs._options[1]}
    frame.to_csv("benchfs:///frames/t.csv", index=False, storage_options=options)
    frame.to_parquet("benchfs:///frames/t.parquet", storage_options=options)
    pd.testing.assert_frame_equal(
        pd.read_csv("benchfs:///frames/t.csv", storage_options=options), frame
    )
    pd.testing.assert_frame_equal(
        pd.read_parquet("benchfs:///frames/t.parquet", storage_options=options), frame
    )
    assert benchfs_fs.cat_file("/frames/t.parquet", start=0, end=4) == b"PAR1"
    benchfs_fs.rm("/frames", recursive=True)


def test_the_protocol_is_registered_and_finds_the_cluster_from_the_environment(
    cluster: LocalCluster,
) -> None:
    """What `benchfs start` exports is enough: fsspec finds `benchfs://` by its entry point,
    in a fresh interpreter."""
    script = (
        "import fsspec\n"
        "with fsspec.open('benchfs:///env.txt', 'wb') as f:\n"
        "    f.write(b'from the environment')\n"
        "fs = fsspec.filesystem('benchfs')\n"
        "print(type(fs).__module__, fs.cat('/env.txt').decode())\n"
        "fs.rm('/env.txt')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
    assert cluster.config_path is not None
    env["BENCHFS_CONFIG"] = str(cluster.config_path)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert (out.returncode, out.stdout) == (0, "benchfs.fsspec from the environment\n"), out.stderr


def test_pickled_and_forked_instances_connect_their_own_client(
    benchfs_fs: BenchFileSystem,
) -> None:
    """Dask and multiprocessing ship file systems to workers by pickling or by fork."""
    import multiprocessing
    import pickle

    benchfs_fs.pipe_file("/shipped/a.txt", b"shipped")
    again = pickle.loads(pickle.dumps(benchfs_fs))
    assert again.cat_file("/shipped/a.txt") == b"shipped"
    fork = multiprocessing.get_context("fork")
    answers = fork.SimpleQueue()

    def read() -> None:  # in the child, on the object it inherited
        try:
            answers.put(benchfs_fs.cat_file("/shipped/a.txt"))
        except OSError as e:
            answers.put(str(e))

    child = fork.Process(target=read)
    child.start()
    child.join(30)
    assert (child.exitcode, answers.get()) == (0, b"shipped")
    benchfs_fs.rm("/shipped", recursive=True)


def test_no_cluster_is_one_clear_error(tmp_path: Path) -> None:
    fs = BenchFileSystem(
        registry=str(tmp_path / "none"),
        config=config_text("cluster.connect_timeout_s=0.5", "cluster.expected_servers=2"),
        skip_instance_cache=True,
    )
    with pytest.raises(OSError) as caught:
        fs.ls("/")
    assert "servers" in str(caught.value) or "registry" in str(caught.value)
