//! The registry directory's record of servers declared lost for the job: read by every
//! client (where copies of chunks and metadata are, docs/lifecycle.md "Copies") and by every
//! server keeping copies of metadata (which copy serves a metadata owner now). Appended to,
//! never rewritten, so its length is its epoch: a longer record says more.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::error::{Error, Result};

/// The registry directory's record of servers declared lost (`lost <id>`), repaired
/// (`repaired <id>`: their copies re-created on the servers standing in for them), being
/// caught up (`joining <id>`: still lost, but taking the metadata's changes) and back
/// (`rejoined <id>`: caught up with every change made without them, and used again), one line
/// each, appended.
pub const LOST_FILE: &str = "lost-servers";

/// The servers declared lost now, and those of them whose copies were repaired, by id.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LostServers {
    pub lost: Vec<u32>,
    pub repaired: Vec<u32>,
    /// Of the lost, those being caught up by `repair` (copies of the metadata are handed their
    /// changes; they serve nothing yet).
    pub joining: Vec<u32>,
    /// The record's length in bytes when read (0: no record).
    pub epoch: u64,
    /// Every line, in order (who serves a metadata owner depends on the order of events).
    pub events: Vec<Event>,
}

/// One line of the record: what happened to which server (by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Lost(u32),
    Repaired(u32),
    Joining(u32),
    Rejoined(u32),
}

/// Reads the registry's record of lost servers (none when it has no record), in order: a
/// server is lost from its `lost` line until a later `rejoined` line. Lines it does not know
/// are skipped: a record is only ever appended to.
pub fn read_lost(registry_dir: &std::path::Path) -> Result<LostServers> {
    let path = registry_dir.join(LOST_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LostServers::default()),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    // A line being appended right now is not there yet: only whole lines count.
    let text = &text[..text.rfind('\n').map_or(0, |n| n + 1)];
    let mut out = LostServers {
        epoch: text.len() as u64,
        ..LostServers::default()
    };
    for line in text.lines() {
        let (what, id) = match line.split_once(' ') {
            Some((w, id)) => (w, id.trim().parse::<u32>()),
            None => continue,
        };
        let Ok(id) = id else {
            continue;
        };
        match what {
            "lost" => out.events.push(Event::Lost(id)),
            "repaired" => out.events.push(Event::Repaired(id)),
            "joining" => out.events.push(Event::Joining(id)),
            "rejoined" => out.events.push(Event::Rejoined(id)),
            _ => {}
        }
        let list = match what {
            "lost" => {
                out.joining.retain(|&j| j != id);
                &mut out.lost
            }
            "repaired" => &mut out.repaired,
            "joining" if out.lost.contains(&id) => &mut out.joining,
            "rejoined" => {
                out.lost.retain(|&l| l != id);
                out.repaired.retain(|&r| r != id);
                out.joining.retain(|&j| j != id);
                continue;
            }
            _ => continue,
        };
        if !list.contains(&id) {
            list.push(id);
        }
    }
    Ok(out)
}

/// Appends one line to the registry's record (O_APPEND: lines of concurrent writers do not
/// mix).
pub fn append_lost(registry_dir: &std::path::Path, line: &str) -> Result<()> {
    let path = registry_dir.join(LOST_FILE);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    f.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Error::io(format!("append to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_read_in_order_and_only_whole_lines_count() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        assert_eq!(read_lost(dir.path())?, LostServers::default());
        for line in ["lost 2", "joining 3", "lost 3", "repaired 2", "joining 3"] {
            append_lost(dir.path(), line)?;
        }
        let r = read_lost(dir.path())?;
        assert_eq!((r.lost, r.repaired, r.joining), (vec![2, 3], vec![2], vec![3]));
        append_lost(dir.path(), "rejoined 3")?;
        let path = dir.path().join(LOST_FILE);
        let mut text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", e))?;
        text.push_str("lost 1");
        std::fs::write(&path, &text).map_err(|e| Error::io("write", e))?;
        let r = read_lost(dir.path())?;
        assert_eq!((r.lost, r.joining), (vec![2], vec![]));
        assert_eq!(r.epoch as usize, text.len() - "lost 1".len());
        Ok(())
    }
}
