//! What only the Python tools call, beside the file system: the storage engine's bench, the
//! built-in IOR's transfer loop, the native client's access baseline, the placement study and
//! the tools' configuration sections. The daemon, the C library and the mount do not link it.

pub mod config;
pub mod ior;
pub mod placement_study;
pub mod profile;
pub mod storage_bench;
pub mod synthetic;
pub mod transfer;
