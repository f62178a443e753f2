"""The I/O limits a node's processes run under: cgroup v1 blkio throttles and cgroup v2
io.max, on the node's devices, in the cgroup the node's command prefix puts them in and every
cgroup above it (a limit on a parent applies to its children).

One shell script run under the node's prefix (so on the node, in the cgroup its probes get)
prints the devices' major:minor numbers and every limit file that is set; parsing is here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from benchfs.units import MIB

__all__ = ["IoLimit", "io_limits", "limits_script", "parse_limits"]

V1_FILES = {
    "blkio.throttle.read_bps_device": ("read", "bytes/s"),
    "blkio.throttle.write_bps_device": ("write", "bytes/s"),
    "blkio.throttle.read_iops_device": ("read", "IOPS"),
    "blkio.throttle.write_iops_device": ("write", "IOPS"),
}
V2_KEYS = {
    "rbps": ("read", "bytes/s"),
    "wbps": ("write", "bytes/s"),
    "riops": ("read", "IOPS"),
    "wiops": ("write", "IOPS"),
}


@dataclass(frozen=True)
class IoLimit:
    cgroup: str
    device: str
    direction: str  # "read" or "write"
    value: int
    unit: str  # "bytes/s" or "IOPS"
    source: str  # "blkio" (v1) or "io.max" (v2)

    def describe(self) -> str:
        if self.unit == "bytes/s":
            amount = f"{self.value / MIB:.1f} MiB/s"
        else:
            amount = f"{self.value} IOPS"
        return (
            f"{self.source} of cgroup {self.cgroup} limits {self.device} {self.direction}s "
            f"to {amount}"
        )


def limits_script(devices: Sequence[str]) -> str:
    """The script: `dev NAME MAJ:MIN` per device, then `CGROUP FILE LINE` per limit line
    (cgroup v2 at /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid hierarchy)."""
    v1 = " ".join(V1_FILES)
    names = " ".join(devices)
    return f"""
for d in {names}; do [ -r /sys/block/$d/dev ] && echo "dev $d $(cat /sys/block/$d/dev)"; done
while IFS=: read -r id ctrl path; do
  case "$ctrl" in
    *blkio*) base=/sys/fs/cgroup/blkio; files="{v1}";;
    "") base=/sys/fs/cgroup; [ -d $base/unified ] && base=$base/unified; files=io.max;;
    *) continue;;
  esac
  p="$path"
  while :; do
    for f in $files; do
      if [ -r "$base$p/$f" ]; then  # cgroup files report size 0: -s would skip them
        while read -r l; do echo "${{p:-/}} $f $l"; done < "$base$p/$f"
      fi
    done
    if [ -z "$p" ] || [ "$p" = / ]; then break; fi
    p=$(dirname "$p")
  done
done < /proc/self/cgroup
"""


def parse_limits(text: str) -> list[IoLimit]:
    """The limits on the listed devices in the script's output (v2 `max` values are none)."""
    devices: dict[str, str] = {}
    rows: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "dev":
            devices[parts[2]] = parts[1]
        elif len(parts) >= 4:
            rows.append((parts[0], parts[1], parts[2:]))
    out: list[IoLimit] = []
    for cgroup, file, fields in rows:
        device = devices.get(fields[0])
        if device is None:
            continue
        if file in V1_FILES and fields[1].isdigit():
            direction, unit = V1_FILES[file]
            out.append(IoLimit(cgroup, device, direction, int(fields[1]), unit, "blkio"))
        elif file == "io.max":
            for item in fields[1:]:
                key, _, value = item.partition("=")
                if key in V2_KEYS and value.isdigit():
                    direction, unit = V2_KEYS[key]
                    out.append(IoLimit(cgroup, device, direction, int(value), unit, "io.max"))
    return out


def io_limits(
    prefix: Sequence[str], devices: Sequence[str], timeout_s: float = 10.0
) -> list[IoLimit]:
    """The limits on `devices` for processes started under `prefix`; OSError, TimeoutExpired
    or a failed script raise (the caller records it as a probe error)."""
    if not devices:
        return []
    out = subprocess.run(
        [*prefix, "sh", "-c", limits_script(devices)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if out.returncode != 0:
        raise OSError(
            f"the cgroup limits script exited {out.returncode}: {out.stderr.strip()[-300:]}"
        )
    return parse_limits(out.stdout)
