//! The cluster's capacity: every worker of every server asked for the file system holding
//! its data, summed with each file system (host, id) counted once.

use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::error::{Error, Result};
use crate::protocol::capacity::{Capacity, CAPACITY_LEN};
use crate::protocol::{Header, Op};
use crate::telemetry::OpKind;

use super::Client;

/// What one server reported: its workers' names summed, its file system once; or why it
/// did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCapacity {
    pub id: u32,
    pub node: String,
    pub host: String,
    pub capacity: std::result::Result<Capacity, String>,
    /// How long its slowest worker took to answer.
    pub latency: Duration,
}

/// The cluster's capacity (`total.fs_id` is 0) and each server's part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterCapacity {
    pub total: Capacity,
    pub servers: Vec<ServerCapacity>,
}

impl ClusterCapacity {
    /// Servers that did not answer.
    pub fn unreachable(&self) -> usize {
        self.servers.iter().filter(|s| s.capacity.is_err()).count()
    }
}

impl Client {
    /// Asks every server for its capacity. A server that does not answer is listed with the
    /// reason and left out of the total; only if none answers is this an error.
    pub fn statfs(&self) -> Result<ClusterCapacity> {
        let _call = self.telemetry_call(OpKind::Meta);
        let servers = self.run(async {
            let asks = (0..self.server_count()).map(|index| self.server_capacity(index));
            Ok(join_all(asks).await)
        })?;
        let mut total = Capacity::default();
        let mut seen = std::collections::HashSet::new();
        for s in &servers {
            if let Ok(c) = &s.capacity {
                total.inodes += c.inodes;
                if seen.insert((s.host.clone(), c.fs_id)) {
                    total.total_bytes += c.total_bytes;
                    total.free_bytes += c.free_bytes;
                    total.avail_bytes += c.avail_bytes;
                }
            }
        }
        if let Some(first) = servers.first().filter(|_| seen.is_empty()) {
            return Err(Error::Protocol(format!(
                "statfs: no server answered (server {}: {})",
                first.id,
                first.capacity.as_ref().err().map_or("", String::as_str)
            )));
        }
        Ok(ClusterCapacity { total, servers })
    }

    async fn server_capacity(&self, index: usize) -> ServerCapacity {
        let entry = &self.membership[index];
        let started = Instant::now();
        let asks = (0..self.workers(index)).map(|worker| async move {
            let mut body = [0u8; CAPACITY_LEN];
            let header = Header::request(Op::Statfs, 0, 0, 0, 0, 0);
            let reply = self
                .call((index, worker), header, &[], Some(&mut body[..]), Instant::now())
                .await?;
            Capacity::decode(&body[..(reply.length as usize).min(CAPACITY_LEN)])
                .ok_or_else(|| Error::Protocol(format!("malformed statfs reply of {} bytes", reply.length)))
        });
        let answers = join_all(asks).await;
        let capacity = answers.into_iter().try_fold(None::<Capacity>, |sum, answer| {
            let c = answer.map_err(|e| e.to_string())?;
            Ok(Some(match sum {
                None => c,
                Some(s) => Capacity {
                    inodes: s.inodes + c.inodes,
                    ..s
                },
            }))
        });
        ServerCapacity {
            id: entry.id,
            node: entry.node.clone(),
            host: entry.host.clone(),
            capacity: capacity.and_then(|c| c.ok_or_else(|| "no workers".to_string())),
            latency: started.elapsed(),
        }
    }
}
