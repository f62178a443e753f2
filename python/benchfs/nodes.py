"""The one nodes file, and the one node-exclusion shape (see docs/nodes.md).

A nodes file (TOML) lists the machines a run or a screen uses, so that one host can stand in
for several nodes in tests:

    [[node]]
    name = "n1"                       # unique; BENCHFS_NODE_NAME of the node's processes
    host = "bnode045"                 # where it runs (a hostname; may repeat for simulated nodes)
    scratch = "/scr"                  # node-local scratch directory
    devices = ["nvme0n1", "nvme1n1"]  # optional: block devices behind the scratch directory
    prefix = ["taskset", "-c", "1"]   # optional: command prefix of its processes
    netns = "bfs-n1"                  # optional: its network namespace (benchfs-run nodes --netns)
    domain = "rack3"                  # optional: its failure domain (default: its host)

On a cluster it is generated from the allocation (`from_allocation`: SLURM_JOB_NODELIST through
`scontrol show hostnames`, or PBS_NODEFILE). Exclusions are a list of `{host, reasons}`
(`excluded.json`, the manifest's `excluded`) plus `excluded.txt`, one host per line, for
schedulers (`sbatch --exclude=$(paste -sd, excluded.txt)`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.errors import InputError
from benchfs.results import EXCLUDED_JSON, EXCLUDED_TXT, write_json_atomic, write_text_atomic

__all__ = [
    "Exclusion",
    "Node",
    "NodesFileError",
    "dump_nodes",
    "from_allocation",
    "from_hostnames",
    "load_nodes",
    "read_exclusions",
    "write_exclusions",
    "write_nodes",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DEVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
_KEYS = {"name", "host", "scratch", "devices", "prefix", "netns", "domain"}


class NodesFileError(InputError):
    """A nodes or exclusion file is missing something or malformed; the message names the file
    and the key."""


@dataclass(frozen=True)
class Node:
    """One node: where it runs, its scratch directory, devices and command prefix."""

    name: str
    host: str
    scratch: str
    devices: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    netns: str = ""
    """The node's network namespace: its processes run under `ip netns exec`, except MPI ranks,
    whose BenchFS client enters it after MPI has started (`BENCHFS_NETNS`)."""
    domain: str = ""
    """The node's failure domain, when not its host: copies of a chunk (`layout.replicas`) go
    to servers of distinct domains."""

    @property
    def failure_domain(self) -> str:
        """Where a fault takes everything down at once: the domain given, else the host."""
        return self.domain or self.host

    @property
    def command_prefix(self) -> list[str]:
        """What runs a command on this node: into its namespace, then under its prefix."""
        return [*(("ip", "netns", "exec", self.netns) if self.netns else ()), *self.prefix]

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as this node runs it: in its namespace, under its prefix (a cgroup...)."""
        return [*self.command_prefix, *argv]

    def to_toml_table(self) -> dict[str, Any]:
        table: dict[str, Any] = {"name": self.name, "host": self.host, "scratch": self.scratch}
        if self.devices:
            table["devices"] = list(self.devices)
        if self.prefix:
            table["prefix"] = list(self.prefix)
        if self.netns:
            table["netns"] = self.netns
        if self.domain:
            table["domain"] = self.domain
        return table


def _string_list(value: Any, where: str, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise NodesFileError(f"{where} must be a list of non-empty strings, not {value!r}")
    if pattern is not None:
        for v in value:
            if not pattern.match(v):
                raise NodesFileError(f"{where}: {v!r} is not a device name (like nvme0n1)")
    return tuple(value)


def _node(entry: Any, where: str) -> Node:
    if not isinstance(entry, Mapping):
        raise NodesFileError(f"{where} must be a table")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise NodesFileError(
            f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_KEYS))})"
        )
    values: dict[str, str] = {}
    for key in ("name", "host", "scratch"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise NodesFileError(f"{where}.{key} is missing or not a non-empty string")
        values[key] = value
    if not _NAME_RE.match(values["name"]):
        raise NodesFileError(
            f"{where}.name {values['name']!r}: use letters, digits, '.', '_' and '-'"
        )
    if not os.path.isabs(values["scratch"]):
        raise NodesFileError(f"{where}.scratch {values['scratch']!r} is not an absolute path")
    devices = _string_list(entry.get("devices", []), f"{where}.devices", _DEVICE_RE)
    prefix = _string_list(entry.get("prefix", []), f"{where}.prefix")
    netns = entry.get("netns", "")
    if not isinstance(netns, str) or (netns and not _NAME_RE.match(netns)):
        raise NodesFileError(f"{where}.netns {netns!r}: a namespace name (`ip netns list`)")
    domain = entry.get("domain", "")
    if not isinstance(domain, str) or (domain and not _NAME_RE.match(domain)):
        raise NodesFileError(f"{where}.domain {domain!r}: use letters, digits, '.', '_' and '-'")
    return Node(values["name"], values["host"], values["scratch"], devices, prefix, netns, domain)


def parse_nodes(text: str, source: str) -> list[Node]:
    """Nodes from nodes-file text; NodesFileError names `source` and the key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise NodesFileError(f"{source}: malformed TOML: {e}") from e
    unknown = sorted(set(doc) - {"node"})
    if unknown:
        raise NodesFileError(f"{source}: unknown key {unknown[0]!r} (nodes are [[node]] tables)")
    entries = doc.get("node")
    if not isinstance(entries, list) or not entries:
        raise NodesFileError(f"{source}: no [[node]] tables")
    nodes = [_node(e, f"{source}: node[{i}]") for i, e in enumerate(entries)]
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name in seen:
            raise NodesFileError(
                f"{source}: node[{i}].name {n.name!r} repeats node[{seen[n.name]}].name"
            )
        seen[n.name] = i
    return nodes


def load_nodes(path: str | os.PathLike[str]) -> list[Node]:
    """Read a nodes file; FileNotFoundError or NodesFileError naming the file and key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"nodes file {p} does not exist") from e
    except UnicodeDecodeError as e:
        raise NodesFileError(f"{p}: not UTF-8 text: {e}") from e
    return parse_nodes(text, str(p))


def _toml_string(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def dump_nodes(nodes: Iterable[Node]) -> str:
    """Nodes-file text for `nodes` (what `write_nodes` writes)."""
    parts = []
    for n in nodes:
        lines = ["[[node]]"]
        for key, value in n.to_toml_table().items():
            if isinstance(value, list):
                rendered = "[" + ", ".join(_toml_string(v) for v in value) + "]"
            else:
                rendered = _toml_string(value)
            lines.append(f"{key} = {rendered}")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def write_nodes(path: str | os.PathLike[str], nodes: Iterable[Node]) -> None:
    write_text_atomic(path, dump_nodes(nodes))


def from_hostnames(hosts: Iterable[str], scratch: str, devices: Sequence[str] = ()) -> list[Node]:
    """One node per distinct host (in order), named after it, all with the same scratch."""
    seen: list[str] = []
    for h in hosts:
        h = h.strip()
        if h and h not in seen:
            seen.append(h)
    return [Node(h, h, scratch, tuple(devices)) for h in seen]


def from_allocation(
    scratch: str, devices: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> list[Node]:
    """Nodes of the current batch allocation: Slurm (SLURM_JOB_NODELIST; ranges like
    `b[1-4]` expanded by `scontrol show hostnames`) or PBS (the hosts of PBS_NODEFILE, which
    repeats a host once per slot). Raises NodesFileError when neither is there or the
    expansion fails."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        if "[" not in nodelist:
            # Plain names (a,b,c) need no expansion, and no Slurm configuration to do it.
            return from_hostnames(nodelist.split(","), scratch, devices)
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            raise NodesFileError(
                f"SLURM_JOB_NODELIST={nodelist!r} needs `scontrol show hostnames` to "
                "expand, and scontrol is not on PATH"
            )
        out = subprocess.run(
            [scontrol, "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise NodesFileError(
                f"`scontrol show hostnames {nodelist}` failed: {out.stderr.strip()}"
            )
        return from_hostnames(out.stdout.split(), scratch, devices)
    nodefile = env.get("PBS_NODEFILE")
    if nodefile:
        try:
            hosts = Path(nodefile).read_text().split()
        except OSError as e:
            raise NodesFileError(f"PBS_NODEFILE {nodefile}: {e}") from e
        if not hosts:
            raise NodesFileError(f"PBS_NODEFILE {nodefile} lists no host")
        return from_hostnames(hosts, scratch, devices)
    raise NodesFileError(
        "no allocation found: SLURM_JOB_NODELIST and PBS_NODEFILE are unset "
        "(write a nodes file instead, see docs/nodes.md)"
    )


@dataclass(frozen=True)
class Exclusion:
    """A node left out, and why: the one exclusion shape ({"host", "reasons"})."""

    host: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "reasons": list(self.reasons)}


def write_exclusions(directory: str | os.PathLike[str], excluded: Sequence[Exclusion]) -> None:
    """Write `excluded.json` and `excluded.txt` (one host per line) into `directory`."""
    d = Path(directory)
    write_json_atomic(d / EXCLUDED_JSON, [e.to_json() for e in excluded])
    write_text_atomic(d / EXCLUDED_TXT, "".join(f"{e.host}\n" for e in excluded))


def read_exclusions(path: str | os.PathLike[str]) -> list[Exclusion]:
    """Read exclusions from `excluded.json`, `excluded.txt`, or a directory holding either
    (the JSON preferred, since it has the reasons). Blank lines and `#` comments in the text
    form are ignored; a host there has no recorded reason."""
    p = Path(path)
    if p.is_dir():
        for name in (EXCLUDED_JSON, EXCLUDED_TXT):
            if (p / name).exists():
                return read_exclusions(p / name)
        raise FileNotFoundError(f"{p}: no excluded.json or excluded.txt")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"exclusion file {p} does not exist") from e
    except UnicodeDecodeError as e:
        raise NodesFileError(f"{p}: not a text file (byte {e.start} is not UTF-8)") from e
    if p.suffix != ".json":
        hosts = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        return [Exclusion(h) for h in hosts if h]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise NodesFileError(f"{p}: malformed JSON: {e}") from e
    if not isinstance(doc, list):
        raise NodesFileError(f"{p}: expected a list of {{host, reasons}}, not {type(doc).__name__}")
    out = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("host"), str):
            raise NodesFileError(f"{p}: [{i}].host is missing or not a string")
        reasons = entry.get("reasons", [])
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise NodesFileError(f"{p}: [{i}].reasons must be a list of strings")
        out.append(Exclusion(entry["host"], tuple(reasons)))
    return out
