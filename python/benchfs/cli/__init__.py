"""Command-line tools (click): `benchfs-run` now, more as later issues add them."""
