"""Device health: `smartctl --json -a /dev/X` or `nvme smart-log -o json /dev/X`.

Read by key name: critical warnings (the NVMe bit field, decoded), media errors, temperature
(Celsius; nvme-cli reports Kelvin), percentage used, SMART overall status and the ATA
reallocation counters. A device without SMART (a loop device, a virtual disk) has no health
record, which is not a warning.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchfs.errors import ParseError

__all__ = ["Health", "parse_nvme_smart_log", "parse_smartctl_json", "probe_health"]

CRITICAL_BITS = (
    "available spare below threshold",
    "temperature above or below threshold",
    "reliability degraded (media or internal errors)",
    "media in read-only mode",
    "volatile memory backup failed",
    "persistent memory region read-only",
)
ATA_BAD = {5: "reallocated sectors", 197: "pending sectors", 198: "offline uncorrectable sectors"}
NO_DEVICE_BITS = 0b011
"""smartctl exit status bits 0 (command line) and 1 (device open failed / no SMART)."""


@dataclass
class Health:
    """One device's health; `warnings` say what is wrong (empty: healthy)."""

    device: str
    tool: str
    passed: bool | None = None
    critical_warning: int = 0
    media_errors: int | None = None
    temperature_c: float | None = None
    percentage_used: float | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _loads(text: str, source: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"{source}: truncated or malformed JSON ({e})") from e
    if not isinstance(doc, Mapping):
        raise ParseError(f"{source}: expected a JSON object, not {type(doc).__name__}")
    return doc


def _int(value: Any, source: str, key: str) -> int:
    if isinstance(value, Mapping):  # nvme-cli 2.x may wrap values: {"value": 0, ...}
        value = value.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParseError(f"{source}: {key} is not a number: {value!r}")
    return int(value)


def _critical(health: Health, bits: int) -> None:
    health.critical_warning = bits
    for i, what in enumerate(CRITICAL_BITS):
        if bits & (1 << i):
            health.warnings.append(f"NVMe critical warning bit {i}: {what}")
    unknown = bits >> len(CRITICAL_BITS)
    if unknown:
        health.warnings.append(f"NVMe critical warning 0x{bits:02x}")


def _common(health: Health) -> None:
    if health.media_errors:
        health.warnings.append(f"{health.media_errors} media errors")
    if health.percentage_used is not None and health.percentage_used >= 100:
        health.warnings.append(f"{health.percentage_used:g}% of rated endurance used")


def parse_smartctl_json(text: str, source: str, device: str = "") -> Health:
    """Health from `smartctl --json -a`; ParseError if the output is not smartctl's JSON."""
    doc = _loads(text, source)
    if "smartctl" not in doc and "json_format_version" not in doc:
        raise ParseError(f"{source}: not smartctl JSON (no 'smartctl' or 'json_format_version')")
    name = device or str((doc.get("device") or {}).get("name", "?"))
    health = Health(name, "smartctl")
    status = doc.get("smart_status")
    if isinstance(status, Mapping) and isinstance(status.get("passed"), bool):
        health.passed = status["passed"]
        if not health.passed:
            health.warnings.append("SMART overall health self-assessment FAILED")
    nvme = doc.get("nvme_smart_health_information_log")
    if isinstance(nvme, Mapping):
        where = f"{source}: nvme_smart_health_information_log"
        _critical(health, _int(nvme.get("critical_warning", 0), where, "critical_warning"))
        if "media_errors" in nvme:
            health.media_errors = _int(nvme["media_errors"], where, "media_errors")
        if "percentage_used" in nvme:
            health.percentage_used = float(_int(nvme["percentage_used"], where, "percentage_used"))
        if "temperature" in nvme:
            health.temperature_c = float(_int(nvme["temperature"], where, "temperature"))
    temp = doc.get("temperature")
    if health.temperature_c is None and isinstance(temp, Mapping) and "current" in temp:
        health.temperature_c = float(_int(temp["current"], source, "temperature.current"))
    table = (doc.get("ata_smart_attributes") or {}).get("table")
    if isinstance(table, list):
        for attr in table:
            if not isinstance(attr, Mapping) or attr.get("id") not in ATA_BAD:
                continue
            raw = attr.get("raw")
            value = _int(raw, source, f"ATA attribute {attr.get('id')}.raw") if raw else 0
            if value > 0:
                health.warnings.append(f"{value} {ATA_BAD[int(attr['id'])]}")
    _common(health)
    return health


def parse_nvme_smart_log(text: str, source: str, device: str = "") -> Health:
    """Health from `nvme smart-log -o json` (temperature in Kelvin, `percent_used`)."""
    doc = _loads(text, source)
    if "critical_warning" not in doc:
        raise ParseError(f"{source}: not `nvme smart-log` JSON (no critical_warning)")
    health = Health(device or "?", "nvme")
    _critical(health, _int(doc["critical_warning"], source, "critical_warning"))
    if "media_errors" in doc:
        health.media_errors = _int(doc["media_errors"], source, "media_errors")
    used = doc.get("percent_used", doc.get("percentage_used"))
    if used is not None:
        health.percentage_used = float(_int(used, source, "percent_used"))
    if "temperature" in doc:
        kelvin = _int(doc["temperature"], source, "temperature")
        health.temperature_c = float(kelvin - 273) if kelvin > 200 else float(kelvin)
    _common(health)
    return health


def probe_health(
    device: str, prefix: Sequence[str] = (), timeout_s: float = 60.0
) -> tuple[Health | None, str, str]:
    """Health of /dev/`device`: (health or None without SMART, the command, its raw output).

    smartctl is preferred; `nvme smart-log` is used for nvme devices when smartctl is absent.
    """
    smartctl = shutil.which("smartctl")
    nvme = shutil.which("nvme")
    if smartctl:
        argv = [*prefix, smartctl, "--json", "-a", f"/dev/{device}"]
        parse = parse_smartctl_json
    elif nvme and device.startswith("nvme"):
        argv = [*prefix, nvme, "smart-log", "-o", "json", f"/dev/{device}"]
        parse = parse_nvme_smart_log
    else:
        return None, "", "no smartctl or nvme-cli on PATH"
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    command = " ".join(argv)
    raw = out.stdout or out.stderr
    if parse is parse_smartctl_json:
        # Exit status bits 0-1: the device could not be opened or has no SMART; bits 2+ are
        # about the device's state and the JSON is still complete.
        if out.returncode & NO_DEVICE_BITS:
            return None, command, raw
    elif out.returncode != 0:
        return None, command, raw
    return parse(out.stdout, f"`{command}`", device), command, raw
