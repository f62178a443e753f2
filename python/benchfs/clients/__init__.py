"""Client programs the tools start as child processes and drive over JSON lines
(`benchfs.procs.LineProcess`): `calls` (timed calls: bandwidth, round trips, load) and
`range_reader` (ranged reads of one file), both on `lines` (the child side of the protocol)."""
