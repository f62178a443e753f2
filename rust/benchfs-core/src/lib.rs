//! BenchFS core: everything the daemon, the Python module, the C library and the FUSE mount
//! share. Front-ends stay thin; the behaviour lives here.

pub mod buffer;
pub mod chunking;
pub mod client;
pub mod config;
pub mod error;
pub mod locktable;
pub mod lost;
pub mod metadata_copies;
pub mod metadb;
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
