//! The payload of a capacity reply (`Op::Statfs`): what one server worker reports about the
//! file system holding its data directory, and how many names it owns. The client sums the
//! workers and servers, counting a file system shared by several of them once.

/// Bytes on the wire.
pub const CAPACITY_LEN: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Size of the file system holding the data directory, in bytes.
    pub total_bytes: u64,
    /// Bytes free there (`f_bfree`): used = total - free.
    pub free_bytes: u64,
    /// Bytes an unprivileged writer may still use there (`f_bavail`).
    pub avail_bytes: u64,
    /// That file system's id on its host (`f_fsid`).
    pub fs_id: u64,
    /// Files and directories whose metadata the worker owns.
    pub inodes: u64,
}

impl Capacity {
    /// The capacity of the file system holding `dir`, with `inodes` names owned there.
    pub fn of_dir(dir: &std::path::Path, inodes: u64) -> std::io::Result<Capacity> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: statvfs fills the zeroed struct from a NUL-terminated path we own.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let unit = s.f_frsize as u64;
        Ok(Capacity {
            total_bytes: (s.f_blocks as u64).saturating_mul(unit),
            free_bytes: (s.f_bfree as u64).saturating_mul(unit),
            avail_bytes: (s.f_bavail as u64).saturating_mul(unit),
            fs_id: s.f_fsid as u64,
            inodes,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        [
            self.total_bytes,
            self.free_bytes,
            self.avail_bytes,
            self.fs_id,
            self.inodes,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }

    /// None unless `b` is exactly one encoded capacity.
    pub fn decode(b: &[u8]) -> Option<Capacity> {
        if b.len() != CAPACITY_LEN {
            return None;
        }
        let at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(a)
        };
        Some(Capacity {
            total_bytes: at(0),
            free_bytes: at(1),
            avail_bytes: at(2),
            fs_id: at(3),
            inodes: at(4),
        })
    }

    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.free_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_lengths() {
        let c = Capacity {
            total_bytes: 1 << 40,
            free_bytes: 3,
            avail_bytes: 2,
            fs_id: u64::MAX,
            inodes: 7,
        };
        assert_eq!(Capacity::decode(&c.encode()), Some(c));
        assert_eq!(Capacity::decode(&c.encode()[1..]), None);
        assert_eq!(Capacity::decode(&[0; CAPACITY_LEN + 1]), None);
        assert_eq!(c.used_bytes(), (1 << 40) - 3);
    }

    #[test]
    fn a_directory_reports_its_file_system() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let c = Capacity::of_dir(dir.path(), 4)?;
        assert!(c.total_bytes > 0 && c.free_bytes <= c.total_bytes && c.avail_bytes <= c.free_bytes);
        assert_eq!(c.inodes, 4);
        assert!(Capacity::of_dir(&dir.path().join("missing"), 0).is_err());
        Ok(())
    }
}
