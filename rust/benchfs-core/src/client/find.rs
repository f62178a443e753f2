//! Find on the servers: every metadata owner evaluates the predicates over the names it holds
//! and answers with counts and pages of matches, so a find costs a few requests per owner
//! instead of a readdir plus a stat per name (docs/namespace.md).

use std::time::Instant;

use futures::future::join_all;

use crate::error::{Error, Result};
use crate::protocol::meta::{self, FindRequest, Found};
use crate::protocol::{Header, Op, ReplyValue};
use crate::telemetry::OpKind;

use super::Client;

/// What a find over the whole namespace found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FindResult {
    /// Names under the root the owners examined.
    pub examined: u64,
    /// Names that matched.
    pub matched: u64,
    /// The matches in path order (empty for a count-only find).
    pub found: Vec<Found>,
}

impl Client {
    /// Runs `req` on every metadata owner at once (each pages its matches) and merges the
    /// answers. `req.after` is ignored: each owner is paged from its start.
    pub fn find(&self, req: &FindRequest) -> Result<FindResult> {
        let (all, missing) = self.find_reachable(req, false)?;
        match missing.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(all),
        }
    }

    /// As [`Client::find`], with `partial`: what the owners that answer hold, and for each
    /// owner whose server is gone, the error (its names are not listed). Without `partial`
    /// the first error of any owner.
    pub fn find_reachable(&self, req: &FindRequest, partial: bool) -> Result<(FindResult, Vec<Error>)> {
        let _call = self.telemetry_call(OpKind::Meta);
        let root = self.checked("find", &req.root)?;
        let req = FindRequest {
            root,
            after: String::new(),
            ..req.clone()
        };
        if glob::Pattern::new(&req.name).is_err() || req.name.contains('/') {
            return Err(Error::InvalidArgument(format!(
                "find: name pattern {:?} is not one valid pattern",
                req.name
            )));
        }
        let owners: Vec<(usize, usize)> = (0..self.server_count())
            .flat_map(|s| (0..self.workers(s)).map(move |w| (s, w)))
            .collect();
        let answers =
            self.run(async { Ok(join_all(owners.iter().map(|&o| self.find_on(o, &req))).await) })?;
        let mut all = FindResult::default();
        let mut missing = Vec::new();
        for answer in answers {
            let part = match answer {
                Ok(part) => part,
                Err(e) if partial && super::replicas::is_fault(&e) => {
                    missing.push(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            all.examined += part.examined;
            all.matched += part.matched;
            all.found.extend(part.found);
        }
        all.found.sort_unstable_by(|x, y| x.path.cmp(&y.path));
        Ok((all, missing))
    }

    /// One owner's part, page after page.
    async fn find_on(&self, owner: (usize, usize), req: &FindRequest) -> Result<FindResult> {
        let mut part = FindResult::default();
        let mut page_req = req.clone();
        loop {
            let payload = page_req.encode();
            let (h, reply) = if self.metadata_copies > 1 {
                let index = (owner.0 * self.workers(0) + owner.1) as u32;
                self.meta_with_copies(index, Op::Find, &payload).await?
            } else {
                let header = Header::request(Op::Find, 0, 0, 0, 0, payload.len() as u64);
                let mut room = self.reply_buf();
                let h = self
                    .call(
                        owner,
                        header,
                        &payload,
                        Some(&mut room[..meta::REPLY_MAX]),
                        Instant::now(),
                    )
                    .await?;
                (h, room.body((h.length as usize).min(meta::REPLY_MAX)))
            };
            let (examined, matched, page) =
                meta::decode_found(&reply).ok_or_else(|| Error::Protocol("malformed find reply".into()))?;
            // Every page repeats the owner's counts: keep the first page's.
            if page_req.after.is_empty() {
                part.examined = examined;
                part.matched = matched;
            }
            let more = h.value() == ReplyValue::MoreFollows(true) && !page.is_empty();
            if let Some(last) = page.last() {
                page_req.after = last.path.clone();
            }
            part.found.extend(page);
            if !more {
                return Ok(part);
            }
        }
    }
}
