"""benchfs-diagnose: find the slow node before and during a run, name the device, exclude it.

- Probes (`fio`, `iostat`, `mdraid`, `smart`, `triage`, `network`): each runs a tool under a
  node's command prefix and parses its output by column or key name, raising `ParseError`
  naming the file on malformed or truncated input.
- `screen`: every probe on every node of a nodes file at once (locally, or one MPI rank per
  node), raw outputs kept in a screen directory.
- `judge`: robust one-sided outliers across nodes (log ratio to the median, MAD-based
  modified z-score and an absolute floor), device rules (md resync, SMART, member asymmetry),
  the kind of slowness, a cap on exclusions, the evidence for every verdict.
- `inrun`: the same questions from a run's iostat captures and server telemetry.

Method, thresholds and outputs: docs/diagnose.md.
"""

from benchfs.errors import DiagnoseError, ParseError

__all__ = ["DiagnoseError", "ParseError"]
