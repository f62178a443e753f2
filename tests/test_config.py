"""The one configuration: defaults, precedence (file < env < overrides), clear errors, docs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs import _core
from benchfs.config import (
    config_hash,
    load_config,
    parse_config,
    resolve_config_text,
    with_overrides,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"

DEFAULTS = {
    "cluster": {
        "registry_dir": "",
        "expected_servers": 0,
        "connect_timeout_s": 30.0,
        "connect_parallel": 64,
    },
    "layout": {"chunk_size": 4194304},
    "client": {"max_inflight": 16, "request_timeout_s": 30.0},
    "server": {"max_in_service": 32, "max_queued": 1024},
    "run": {
        "servers": 2,
        "clients": 2,
        "file_size": 67108864,
        "transfer_size": 1048576,
        "results_root": "results",
        "scratch_dir": "",
    },
}


def test_defaults() -> None:
    config = load_config()
    for section, values in DEFAULTS.items():
        for key, value in values.items():
            assert config[section][key] == value, f"{section}.{key}"
    assert config["storage"]["buffer_count"] == 32


def test_every_key_is_documented() -> None:
    text = DOCS.read_text()
    assert resolve_config_text().splitlines()[0] in text  # the effective file's first line
    documented = set(re.findall(r"`([a-z_]+\.[a-z_0-9]+)`", text))
    for section, values in load_config().items():
        for key in values:
            assert f"{section}.{key}" in documented, f"{section}.{key} missing from docs/config.md"
            env = f"BENCHFS_{section.upper()}_{key.upper()}"
            assert env in text, f"{env} missing from docs/config.md"


def test_precedence_defaults_file_env_override(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "benchfs.toml"
    path.write_text(
        "[layout]\nchunk_size = 65536\n[client]\nmax_inflight = 4\nrequest_timeout_s = 9.0\n"
    )

    config = load_config(path)
    assert config["layout"]["chunk_size"] == 65536
    assert config["client"] == {**config["client"], "max_inflight": 4}
    assert config["client"]["request_timeout_s"] == 9.0
    assert config["server"]["max_in_service"] == 32  # untouched keys keep their defaults

    monkeypatch.setenv("BENCHFS_CLIENT_MAX_INFLIGHT", "8")
    monkeypatch.setenv("BENCHFS_CLIENT_REQUEST_TIMEOUT_S", "3.5")
    config = load_config(path)
    assert config["layout"]["chunk_size"] == 65536  # from the file
    assert config["client"]["max_inflight"] == 8  # env beats file
    assert config["client"]["request_timeout_s"] == 3.5

    config = load_config(path, ["client.max_inflight=2"])
    assert config["client"]["max_inflight"] == 2  # override beats env
    assert config["client"]["request_timeout_s"] == 3.5


def test_config_file_from_environment(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "env.toml"
    path.write_text("[run]\nservers = 3\n")
    monkeypatch.setenv("BENCHFS_CONFIG", str(path))
    assert load_config()["run"]["servers"] == 3
    other = tmp_path / "explicit.toml"
    other.write_text("[run]\nservers = 5\n")
    assert load_config(other)["run"]["servers"] == 5  # an explicit path wins


def test_short_environment_names(monkeypatch) -> None:
    monkeypatch.setenv("BENCHFS_REGISTRY", "/tmp/reg")
    monkeypatch.setenv("BENCHFS_RESULTS", "/tmp/res")
    monkeypatch.setenv("BENCHFS_EXPECTED_SERVERS", "7")
    config = load_config()
    assert config["cluster"]["registry_dir"] == "/tmp/reg"
    assert config["run"]["results_root"] == "/tmp/res"
    assert config["cluster"]["expected_servers"] == 7


def test_override_values_take_the_type_of_their_key() -> None:
    """String keys take the text as it is, so paths never need quoting (even "123")."""
    config = load_config(
        None,
        [
            "run.results_root=out dir",
            "run.scratch_dir=123",
            "layout.chunk_size=1024",
            "client.request_timeout_s=2.5",
        ],
    )
    assert config["run"]["results_root"] == "out dir"
    assert config["run"]["scratch_dir"] == "123"
    assert config["layout"]["chunk_size"] == 1024
    assert config["client"]["request_timeout_s"] == 2.5


def test_effective_text_round_trips_and_hashes(tmp_path: Path) -> None:
    text = resolve_config_text(None, ["layout.chunk_size=8192"])
    path = tmp_path / "effective.toml"
    path.write_text(text)
    # Reading the effective config back gives the same effective config.
    assert resolve_config_text(path) == text
    assert parse_config(text)["layout"]["chunk_size"] == 8192
    assert config_hash(text) == config_hash(resolve_config_text(path))
    assert config_hash(text) != config_hash(resolve_config_text())
    assert re.fullmatch(r"[0-9a-f]{64}", config_hash(text))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[client]\nchunk_sise = 1\n", "chunk_sise"),
        ("[nosuch]\nkey = 1\n", "nosuch"),
        ('[layout]\nchunk_size = "big"\n', "chunk_size"),
        ("[client\nchunk_size = 1\n", "TOML"),
        ("[layout]\nchunk_size = 0\n", "chunk_size"),
    ],
)
def test_bad_file_is_a_clear_value_error(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        load_config(path)


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.toml"):
        load_config(tmp_path / "nope.toml")


def test_bad_environment_value_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("BENCHFS_LAYOUT_CHUNK_SIZE", "lots")
    with pytest.raises(ValueError, match="BENCHFS_LAYOUT_CHUNK_SIZE"):
        load_config()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("client.nope=1", "client.nope"),
        ("layout.chunk_size=big", "chunk_size"),
        ("chunk_size=1", "section.key=value"),
        ("layout.chunk_size", "section.key=value"),
    ],
)
def test_bad_override_is_a_clear_value_error(override: str, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        _core.resolve_config(None, [override])


# --- sizes as people write them, enums, and errors that name the key and its source --------


def test_sizes_in_every_source(tmp_path: Path, monkeypatch) -> None:
    """The examples of README.md and docs/python.md, as written."""
    job = tmp_path / "job.toml"
    job.write_text('[layout]\nchunk_size = "2M"\n[run]\nfile_size = "1GiB"\n')
    config = load_config(job)
    assert (config["layout"]["chunk_size"], config["run"]["file_size"]) == (2 << 20, 1 << 30)
    text = resolve_config_text(job, ["layout.chunk_size=4M"])
    assert parse_config(text)["layout"]["chunk_size"] == 4 << 20
    assert "chunk_size = 4194304" in text  # the effective text holds plain bytes
    monkeypatch.setenv("BENCHFS_LAYOUT_CHUNK_SIZE", "1M")
    monkeypatch.setenv("BENCHFS_RUN_TRANSFER_SIZE", "64KiB")
    config = load_config()
    assert (config["layout"]["chunk_size"], config["run"]["transfer_size"]) == (1 << 20, 65536)
    assert load_config(None, ["network.rndv_threshold=8k"])["network"]["rndv_threshold"] == 8192


def test_the_environment_can_be_left_out(tmp_path: Path, monkeypatch) -> None:
    """A recorded configuration is read as recorded: no variable, no $BENCHFS_CONFIG."""
    recorded = tmp_path / "config.toml"
    recorded.write_text(resolve_config_text(None, ["insights.slow_op_ms=7"]))
    monkeypatch.setenv("BENCHFS_INSIGHTS_SLOW_OP_MS", "99")
    monkeypatch.setenv("BENCHFS_CONFIG", str(tmp_path / "missing.toml"))
    text = _core.resolve_config(str(recorded), [], environment=False)
    assert parse_config(text)["insights"]["slow_op_ms"] == 7.0
    # An effective configuration is never combined with the variables, even when asked.
    assert parse_config(_core.resolve_config(str(recorded), []))["insights"]["slow_op_ms"] == 7.0
    # Without a path: the defaults, not $BENCHFS_CONFIG's file.
    assert load_config(None, [], environment=False)["insights"]["slow_op_ms"] == 100.0
    with pytest.raises(FileNotFoundError):
        load_config()
    # A file without the header is a base: the variables apply over it.
    recorded.write_text(recorded.read_text().split("\n", 1)[1])
    assert load_config(recorded)["insights"]["slow_op_ms"] == 99.0
    later = with_overrides(resolve_config_text(recorded), ["run.clients=9"])
    assert parse_config(later)["run"]["clients"] == 9
    assert parse_config(later)["insights"]["slow_op_ms"] == 99.0


def test_the_old_chunk_size_name_still_works_with_one_notice(tmp_path: Path) -> None:
    """client.chunk_size is now layout.chunk_size: accepted from a file, a variable and an
    override, with one line on stderr per process."""
    code = (
        "from benchfs.config import load_config\n"
        "import sys\n"
        f"a = load_config({str(tmp_path / 'old.toml')!r})\n"
        "b = load_config(None, ['client.chunk_size=1M'])\n"
        "print(a['layout']['chunk_size'], b['layout']['chunk_size'])\n"
    )
    (tmp_path / "old.toml").write_text("[client]\nchunk_size = 65536\n")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "BENCHFS_CLIENT_CHUNK_SIZE": "2M"},
    )
    assert done.stdout.split() == ["2097152", "1048576"]  # the variable beats the file
    notices = done.stderr.strip().splitlines()
    assert len(notices) == 1 and "client.chunk_size" in notices[0], done.stderr
    assert "layout.chunk_size" in notices[0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "client.max_inflight=-5",
            "client.max_inflight = -5 (from override): must not be negative",
        ),
        ("run.file_size=-5", 'run.file_size = "-5" (from override): a size must not be negative'),
        ("layout.chunk_size=1X", 'layout.chunk_size = "1X" (from override): unknown suffix "x"'),
        (
            "storage.layout=striped",
            "storage.layout (from override): `striped` is not one of `chunkfile`, `packed`, "
            "`discard`",
        ),
        ("storage.submit_policy=timer", "unknown key storage.submit_policy (from override)"),
    ],
)
def test_errors_name_the_key_the_value_and_the_source(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(None, [override])


def test_errors_name_the_file_and_the_variable(tmp_path: Path, monkeypatch) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[client]\nmax_retries = -1\n")
    with pytest.raises(ValueError, match=re.escape(f"client.max_retries = -1 (from {bad})")):
        load_config(bad)
    bad.write_text('[storage]\nlayout = "flat"\n')
    with pytest.raises(
        ValueError, match=re.escape(f"storage.layout (from {bad}): `flat` is not one of")
    ):
        load_config(bad)
    monkeypatch.setenv("BENCHFS_RUN_FILE_SIZE", "12Q")
    with pytest.raises(ValueError, match=re.escape("(from BENCHFS_RUN_FILE_SIZE): unknown suffix")):
        load_config()
