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
        "ior",
        default=False,
        description="IOR and mdtest with the BENCHFS backend (contrib/ior/build-ior.sh)",
    )
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
    depends_on("mpi", when="+ior")
    depends_on("autoconf", type="build", when="+ior")
    depends_on("automake", type="build", when="+ior")

    # The IOR the backend was checked against (docs/ior.md).
    resource(  # noqa: F405
        name="ior",
        git="https://github.com/hpc/ior.git",
        commit="5fcf0ba995fd92164d50e344597e2d8203298c08",
        placement="ior-source",
        when="+ior",
    )

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
        if "+ior" in spec:
            # ior and mdtest into the same prefix, against the benchfs.pc just installed.
            env["PKG_CONFIG_PATH"] = join_path(prefix.lib, "pkgconfig")  # noqa: F405
            build_ior = Executable(join_path("contrib", "ior", "build-ior.sh"))  # noqa: F405
            build_ior("ior-source", prefix)
