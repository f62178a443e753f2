//! Advisory locks, kept by the server worker chosen from the file's id
//! (`placement::lock_target`): fcntl's record locks (by process or, OFD, by open file
//! description) and flock's whole-file locks, across every client of the job.
//!
//! Taking or releasing a lock is a boundary for the file's bytes: what this client wrote
//! behind is answered first and the size it wrote published, and what it read ahead is
//! dropped, so that a lock protects the bytes as it does on one machine (docs/namespace.md). A request that waits is held by the
//! server a third of `client.request_timeout_s` at a time and sent again, so no timeout ends
//! it; a lock taken before its server restarted is reported lost on the next lock request on
//! that file (ENOLCK).

use std::time::Instant;

use crate::error::{Error, Result};
use crate::placement::lock_target;
use crate::protocol::lock::{LockCmd, LockRequest, LockState};
use crate::protocol::{Header, Op, ReplyValue};
use crate::telemetry::OpKind;

use super::replicas::is_fault;
use super::{Client, FileHandle};

impl Client {
    /// Runs lock request `req` on `file`: `Ok(None)` when it was done (taken, changed,
    /// released; for a test, nothing conflicts), `Ok(Some(lock))` when `lock` conflicts
    /// (`Set` and `Get`). `SetWait` returns only once the lock is taken.
    pub fn lock(&self, file: &FileHandle, req: &LockRequest) -> Result<Option<LockRequest>> {
        if req.cmd != LockCmd::Get {
            // A lock boundary: writes behind answered, the size written published, and
            // nothing read ahead (or brought by the open, for an inline file) used after it.
            self.flush(file)?;
            self.report_size(file)?;
            self.forget_read_ahead(file.attr.id.0);
            file.forget_bytes_at_open();
        }
        let _call = self.telemetry_call(OpKind::Meta);
        self.run(async {
            let (server, worker) = lock_target(file.attr.id, self.server_count(), self.workers(0));
            let payload = req.encode();
            let mut moves = 0;
            loop {
                let target = (self.lock_server(server), worker);
                let header = Header::request(Op::Lock, 0, file.attr.id.0, 0, 0, payload.len() as u64);
                let mut body = [0u8; LockRequest::LEN];
                let reply = match self
                    .call(target, header, &payload, Some(&mut body[..]), Instant::now())
                    .await
                {
                    Ok(reply) => reply,
                    // With copies of the metadata, a lost server's locks move with its names.
                    Err(e)
                        if self.metadata_copies > 1
                            && is_fault(&e)
                            && moves < 2
                            && (self.lock_server(server) != target.0
                                || self.next_copy_answers((target.0 * self.workers(0)) as u32).await) =>
                    {
                        self.declare_lost_because(target.0, "a lock request to it failed");
                        moves += 1;
                        continue;
                    }
                    Err(e) => return Err(lock_error(e, &file.path)),
                };
                let ReplyValue::Lock { state, epoch } = reply.value() else {
                    return Err(Error::Protocol("a lock reply without its state".into()));
                };
                if self.epoch_changed(file, req, epoch) {
                    if state == LockState::Granted && matches!(req.cmd, LockCmd::Set | LockCmd::SetWait) {
                        // Taken from the restarted server: given back, as the caller is told
                        // its locks failed.
                        let undo = LockRequest {
                            kind: crate::protocol::lock::LockType::Unlock,
                            cmd: LockCmd::Set,
                            ..*req
                        };
                        let header = Header::request(Op::Lock, 0, file.attr.id.0, 0, 0, payload.len() as u64);
                        let _ = self.call(target, header, &undo.encode(), None, Instant::now()).await;
                    }
                    return Err(Error::Path {
                        op: "lock",
                        path: format!(
                            "{} (the server keeping its locks restarted or was lost: the locks taken on it before are lost)",
                            file.path
                        ),
                        errno: libc::ENOLCK,
                    });
                }
                match state {
                    LockState::Granted | LockState::Free => return Ok(None),
                    LockState::Waiting => continue,
                    LockState::Conflict => {
                        let held = LockRequest::decode(&body[..(reply.length as usize).min(LockRequest::LEN)])
                            .map_err(|_| Error::Protocol("a lock conflict without the lock".into()))?;
                        return Ok(Some(held));
                    }
                }
            }
        })
    }

    /// The id of the server keeping the locks of the file at `path` now (with copies of the
    /// metadata, the copy serving a lost keeper's names: docs/namespace.md, "Locks").
    pub fn locate_locks(&self, path: &str) -> Result<u32> {
        let attr = self.file_to_locate(path)?;
        self.refresh_declared();
        let (server, _) = lock_target(attr.id, self.server_count(), self.workers(0));
        Ok(self.membership[self.lock_server(server)].id)
    }

    /// Whether the worker keeping `file`'s locks restarted since this client last took a lock
    /// there (its epoch changed): the locks taken before are gone, and the caller is told
    /// once. Records the epoch of each lock taken; forgets it when the file's locks are
    /// released.
    fn epoch_changed(&self, file: &FileHandle, req: &LockRequest, epoch: u32) -> bool {
        let id = file.attr.id.0;
        let mut epochs = self.lock_epochs.borrow_mut();
        let known = epochs.get(&id).copied();
        match req.cmd {
            LockCmd::Release => {
                epochs.remove(&id);
            }
            LockCmd::Set | LockCmd::SetWait => {
                epochs.insert(id, epoch);
            }
            LockCmd::Get => return false,
        }
        known.is_some_and(|k| k != epoch)
    }
}

fn lock_error(e: Error, path: &str) -> Error {
    match e {
        Error::Remote { errno, .. } if errno == libc::ENOLCK || errno == libc::EINVAL => Error::Path {
            op: "lock",
            path: path.into(),
            errno,
        },
        e => e,
    }
}
