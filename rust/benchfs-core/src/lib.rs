//! BenchFS core: everything the daemon, the Python module, the C library and the FUSE mount
//! share. Front-ends stay thin; the behaviour lives here.

/// One line to stderr, as `eprintln!` writes it, except that a stderr that cannot be written
/// (a full disk, a closed pipe) loses the line instead of panicking: this code runs inside
/// servers and applications, which must not die of a message.
#[macro_export]
macro_rules! warn_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod buffer;
pub mod chunking;
pub mod client;
pub mod config;
pub mod error;
pub mod locktable;
pub mod lost;
pub mod metadata_copies;
pub mod metadb;
pub mod metajournal;
pub mod namespace;
pub mod placement;
pub mod posix;
pub mod process;
pub mod protocol;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod shared;
pub mod size;
pub mod storage;
pub mod telemetry;

pub use error::{Error, Result};
