"""Command-line tools (click): benchfs-run, benchfs-analyze, benchfs-bench, benchfs-diagnose."""
