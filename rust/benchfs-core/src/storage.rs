//! The chunk store: one file per chunk under `<data_dir>/chunks/<2 hex>/<file id>.<chunk>`, with
//! data moved by io_uring. On-disk names come only from file ids, never from user paths.
//! (The storage-engine work measures this layout against packed files and adds a handle cache.)

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::buffer::IoBuffer;
use crate::chunking::FileId;
use crate::error::{Error, Result};
use crate::runtime::Reactor;

pub struct ChunkStore {
    root: PathBuf,
    reactor: Rc<Reactor>,
}

impl ChunkStore {
    /// Creates the directory tree (256 fan-out directories, made once, not per write).
    pub fn open(data_dir: &Path, reactor: Rc<Reactor>) -> Result<ChunkStore> {
        let root = data_dir.join("chunks");
        for i in 0..256 {
            let dir = root.join(format!("{i:02x}"));
            fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }
        Ok(ChunkStore { root, reactor })
    }

    fn chunk_path(&self, file: FileId, chunk: u64) -> PathBuf {
        let hex = file.hex();
        self.root.join(&hex[..2]).join(format!("{hex}.{chunk}"))
    }

    /// Writes `len` bytes of `buf` at `offset` within the chunk. Returns the bytes written and
    /// the buffer (for reuse).
    pub async fn write(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        buf: IoBuffer,
        len: usize,
    ) -> (io::Result<usize>, IoBuffer) {
        let f = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.chunk_path(file, chunk))
        {
            Ok(f) => f,
            Err(e) => return (Err(e), buf),
        };
        let mut done = 0usize;
        let mut buf = buf;
        while done < len {
            // Short writes to regular files are rare but legal: continue where it stopped.
            let (res, b) = self
                .reactor
                .write_at(f.as_raw_fd(), buf, done, len - done, offset + done as u64)
                .await;
            buf = b;
            match res {
                Ok(0) => return (Err(io::Error::from_raw_os_error(libc::EIO)), buf),
                Ok(n) => done += n,
                Err(e) => return (Err(e), buf),
            }
        }
        drop(f);
        (Ok(done), buf)
    }

    /// Reads up to `len` bytes at `offset` within the chunk into `buf`. A chunk never written
    /// reads as 0 bytes (the client turns holes inside the file size into zeros).
    pub async fn read(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        buf: IoBuffer,
        len: usize,
    ) -> (io::Result<usize>, IoBuffer) {
        let f = match File::open(self.chunk_path(file, chunk)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (Ok(0), buf),
            Err(e) => return (Err(e), buf),
        };
        let (res, buf) = self.reactor.read_at(f.as_raw_fd(), buf, len, offset).await;
        drop(f);
        (res, buf)
    }
}
