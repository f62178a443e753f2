"""The outside tools every BenchFS tool uses, one module each: find the program, build its
command, parse its output (a `ParseError` naming the file on malformed or truncated input).

- `fio`: fio jobs and their JSON output.
- `iostat`: sysstat's iostat (JSON, per device, per interval) and its summaries.
- `mdraid`: md RAID state from /proc/mdstat and sysfs, and the members of a device.
- `smart`: smartctl and nvme-cli health.
- `triage`: the first-minute look at a node (loadavg, vmstat, mpstat, free, df, dmesg).
- `perftest`: ucx_perftest, server and client.
- `system`: the machine itself (page cache, free space, CPU time, tool versions).

analysis, diagnose, bench and the workloads build on these and on each other's results
files, never on each other's modules (the import contract in pyproject.toml).
"""
