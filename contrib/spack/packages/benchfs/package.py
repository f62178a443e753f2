# Spack package for BenchFS, written for Spack 0.23 (spack.package API). Not run by the test
# suite (Spack cannot run there): it checks that this file compiles and that the install
# command below succeeds into a temporary prefix (tests/test_install.py).

from spack.package import *  # noqa: F403 (Spack's package DSL)


class Benchfs(MakefilePackage):  # noqa: F405
    """An ad-hoc distributed file system that pools a job's node-local storage into one
    namespace for the job's lifetime, with the tools that launch it, screen nodes and explain
    its performance (benchfs, benchfs-run, benchfs-analyze, benchfs-diagnose)."""

    homepage = "https://github.com/benchfs/benchfs"
    git = "https://github.com/benchfs/benchfs.git"
    maintainers("benchfs")
    license("Apache-2.0")

    version("main", branch="main")

    variant("mount", default=True, description="Run the FUSE mount as a user (fusermount3)")
    variant(
        "analysis",
        default=True,
        description="pandas and matplotlib for benchfs-run, -analyze, -bench and -diagnose",
    )

    depends_on("rust@1.82:", type="build")
    depends_on("llvm", type="build")  # libclang: bindgen reads UCX's headers
    depends_on("pkgconfig", type="build")
    depends_on("gmake", type="build")
    depends_on("python@3.11:", type=("build", "run"))
    depends_on("py-pip", type="build")
    depends_on("fuse@3:", type="run", when="+mount")

    # The build fetches its Rust crates (crates.io) and Python wheels, UCX 1.22 among them
    # (PyPI): Spack's build environment must allow it.

    def install(self, spec, prefix):
        # System packages come from Spack, not apt-get (scripts/bootstrap).
        env["BENCHFS_SYSTEM_PACKAGES"] = "skip"
        make(  # noqa: F405
            "install",
            f"PREFIX={prefix}",
            f"PYTHON={spec['python'].command.path}",
            f"EXTRAS={'analysis' if '+analysis' in spec else ''}",
        )
