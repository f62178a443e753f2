"""BenchFS: an ad-hoc distributed file system for HPC burst buffers, and the tools around it.

The native module `benchfs._core` is private; this package is its typed public face.
"""

from benchfs._core import Client, File, Server, __version__

__all__ = ["Client", "File", "Server", "__version__"]
