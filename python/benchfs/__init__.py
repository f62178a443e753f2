"""BenchFS: an ad-hoc distributed file system for HPC burst buffers, and the tools around it.

`Client` and `File` are the Python API (see `benchfs.client`); `Server` runs a chunk server
in this process. The native module `benchfs._core` is private.
"""

from benchfs.native import use_ucx_settings

# Before benchfs._core loads UCX, which reads them then (benchfs/native.py says why).
use_ucx_settings()

from benchfs._core import Server, __version__  # noqa: E402 (after the settings)
from benchfs.client import Client, File, Stat  # noqa: E402

__all__ = ["Client", "File", "Server", "Stat", "__version__"]
