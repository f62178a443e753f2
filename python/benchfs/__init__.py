"""BenchFS: an ad-hoc distributed file system for HPC burst buffers, and the tools around it.

`Client` and `File` are the Python API (see `benchfs.client`); `Server` runs a chunk server
in this process. The native module `benchfs._core` is private.
"""

import os

# UCX logs to stdout by default, which would corrupt what the tools print there (JSON, the
# export lines of `benchfs start`); its library reads this when benchfs._core loads it.
os.environ.setdefault("UCX_LOG_FILE", "stderr")

from benchfs._core import Server, __version__
from benchfs.client import Client, File, Stat

__all__ = ["Client", "File", "Server", "Stat", "__version__"]
