//! One error type for every layer, each variant with an errno so that Python, C and FUSE
//! front-ends can report it the POSIX way.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("registry entry {path}: {reason}")]
    Registry { path: PathBuf, reason: String },
    #[error(
        "timed out after {waited_s:.1}s waiting for {expected} servers: found {found:?}, missing {missing:?}"
    )]
    MissingServers {
        expected: usize,
        found: Vec<u32>,
        missing: Vec<u32>,
        waited_s: f64,
    },
    #[error("request {op} to server {server} timed out after {timeout_s:.1}s ({waiting})")]
    Timeout {
        op: &'static str,
        server: u32,
        timeout_s: f64,
        /// What had not come when the time ran out: "no reply", "the reply's data" (the reply
        /// came, its payload did not) or "the request still sending".
        waiting: &'static str,
    },
    #[error("server {server} unreachable: {reason}")]
    ServerLost { server: u32, reason: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("server {server} answered {op} with errno {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Remote {
        server: u32,
        op: &'static str,
        errno: i32,
    },
    #[error("{op} {path}: {}", std::io::Error::from_raw_os_error(*errno))]
    Path {
        op: &'static str,
        path: String,
        errno: i32,
    },
    #[error("{op} {path}: a symbolic link leads outside BenchFS, to {host}")]
    LinkOutside {
        op: &'static str,
        path: String,
        /// The host path it leads to (the link's absolute target and the rest of the path).
        host: String,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("UCX: {0}")]
    Ucx(#[from] benchfs_ucx::UcxError),
    #[error("stopped")]
    Stopped,
    #[error("I/O operation on a closed {0}")]
    Closed(&'static str),
    #[error("this client was made before the fork that made this process: a forked child connects clients of its own")]
    Forked,
}

impl Error {
    /// The POSIX errno that best describes this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Config(_) | Error::InvalidArgument(_) => libc::EINVAL,
            Error::Registry { .. } | Error::Protocol(_) => libc::EPROTO,
            Error::MissingServers { .. } | Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::ServerLost { .. } => libc::EHOSTDOWN,
            Error::Ucx(_) => libc::ECONNRESET,
            Error::Remote { errno, .. } | Error::Path { errno, .. } => *errno,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::LinkOutside { .. } => libc::EXDEV,
            Error::Stopped => libc::ESHUTDOWN,
            Error::Closed(_) => libc::EBADF,
            Error::Forked => libc::EBADFD,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
