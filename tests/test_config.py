"""The one configuration: defaults, precedence (file < env < overrides), clear errors, docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchfs import _core
from benchfs.config import config_hash, load_config, parse_config, resolve_config_text

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"

DEFAULTS = {
    "cluster": {"registry_dir": "", "expected_servers": 0, "connect_timeout_s": 30.0},
    "client": {"chunk_size": 4194304, "max_inflight": 16, "request_timeout_s": 30.0},
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
    documented = set(re.findall(r"`([a-z_]+\.[a-z_0-9]+)`", text))
    for section, values in load_config().items():
        for key in values:
            assert f"{section}.{key}" in documented, f"{section}.{key} missing from docs/config.md"
            env = f"BENCHFS_{section.upper()}_{key.upper()}"
            assert env in text, f"{env} missing from docs/config.md"


def test_precedence_defaults_file_env_override(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "benchfs.toml"
    path.write_text("[client]\nchunk_size = 65536\nmax_inflight = 4\nrequest_timeout_s = 9.0\n")

    config = load_config(path)
    assert config["client"] == {**config["client"], "chunk_size": 65536, "max_inflight": 4}
    assert config["client"]["request_timeout_s"] == 9.0
    assert config["server"]["max_in_service"] == 32  # untouched keys keep their defaults

    monkeypatch.setenv("BENCHFS_CLIENT_MAX_INFLIGHT", "8")
    monkeypatch.setenv("BENCHFS_CLIENT_REQUEST_TIMEOUT_S", "3.5")
    config = load_config(path)
    assert config["client"]["chunk_size"] == 65536  # from the file
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
            "client.chunk_size=1024",
            "client.request_timeout_s=2.5",
        ],
    )
    assert config["run"]["results_root"] == "out dir"
    assert config["run"]["scratch_dir"] == "123"
    assert config["client"]["chunk_size"] == 1024
    assert config["client"]["request_timeout_s"] == 2.5


def test_effective_text_round_trips_and_hashes(tmp_path: Path) -> None:
    text = resolve_config_text(None, ["client.chunk_size=8192"])
    path = tmp_path / "effective.toml"
    path.write_text(text)
    # Reading the effective config back gives the same effective config.
    assert resolve_config_text(path) == text
    assert parse_config(text)["client"]["chunk_size"] == 8192
    assert config_hash(text) == config_hash(resolve_config_text(path))
    assert config_hash(text) != config_hash(resolve_config_text())
    assert re.fullmatch(r"[0-9a-f]{64}", config_hash(text))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[client]\nchunk_sise = 1\n", "chunk_sise"),
        ("[nosuch]\nkey = 1\n", "nosuch"),
        ('[client]\nchunk_size = "big"\n', "chunk_size"),
        ("[client\nchunk_size = 1\n", "TOML"),
        ("[client]\nchunk_size = 0\n", "chunk_size"),
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
    monkeypatch.setenv("BENCHFS_CLIENT_CHUNK_SIZE", "lots")
    with pytest.raises(ValueError, match="BENCHFS_CLIENT_CHUNK_SIZE"):
        load_config()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("client.nope=1", "client.nope"),
        ("client.chunk_size=big", "chunk_size"),
        ("chunk_size=1", "section.key=value"),
        ("client.chunk_size", "section.key=value"),
    ],
)
def test_bad_override_is_a_clear_value_error(override: str, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        _core.resolve_config(None, [override])
