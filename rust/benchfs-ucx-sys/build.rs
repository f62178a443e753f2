//! Generates bindings against the UCX that BenchFS links, so the ABI always matches the
//! library (the headers' struct layouts change between UCX releases).
//!
//! Which UCX: `BENCHFS_UCX_PREFIX` if set, else the one scripts/bootstrap puts at `.venv/ucx`
//! (UCX 1.22 from its PyPI wheel), else the system's (pkg-config). The binaries find the
//! libraries at run time through the rpaths in the repository's `.cargo/config.toml`.
use std::env;
use std::path::PathBuf;

/// Include directories of the UCX to build against (and its library directory, linked).
fn locate_ucx() -> Vec<PathBuf> {
    println!("cargo:rerun-if-env-changed=BENCHFS_UCX_PREFIX");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let bootstrap = manifest.join("../../.venv/ucx");
    println!("cargo:rerun-if-changed={}", bootstrap.display());
    let prefix = env::var_os("BENCHFS_UCX_PREFIX").map(PathBuf::from).or_else(|| {
        bootstrap
            .join("include/ucp/api/ucp.h")
            .exists()
            .then_some(bootstrap)
    });
    if let Some(prefix) = prefix {
        let lib = prefix.join("lib");
        assert!(
            lib.join("libucp.so").exists(),
            "UCX prefix {} has no lib/libucp.so",
            prefix.display()
        );
        println!("cargo:rustc-link-search=native={}", lib.display());
        return vec![prefix.join("include")];
    }
    pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
        .expect("UCX not found: run scripts/bootstrap (it installs UCX into .venv/ucx)")
        .include_paths
}

fn main() {
    let include_paths = locate_ucx();
    // The `ucx` package covers ucp, uct, ucs; make sure ucp and ucs are linked explicitly.
    println!("cargo:rustc-link-lib=ucp");
    println!("cargo:rustc-link-lib=ucs");
    println!("cargo:rerun-if-changed=wrapper.h");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*|ucs_status_string")
        .allowlist_type("ucp_.*|ucs_.*")
        .allowlist_var("UCP_.*|UCS_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for path in &include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder.generate().expect("bindgen failed on <ucp/api/ucp.h>");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write UCX bindings");
}
