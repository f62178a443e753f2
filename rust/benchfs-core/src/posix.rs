//! The POSIX words every face shares: open(2) flags as namespace flags, and which errnos are a
//! metadata owner's answer about a path (not a server failing).

use crate::protocol::meta::{CREATE, EXCLUSIVE, NO_FOLLOW, TRUNCATE};

/// The errors a metadata owner answers about a path (anything else is about the server).
pub const NAMESPACE_ERRNOS: [i32; 12] = [
    libc::ENOENT,
    libc::EEXIST,
    libc::EISDIR,
    libc::ENOTDIR,
    libc::ENOTEMPTY,
    libc::ENAMETOOLONG,
    libc::EINVAL,
    libc::EBUSY,
    libc::EXDEV,
    libc::ELOOP,
    // An inline file's: the path names another file now, or it changed under a rename.
    libc::ESTALE,
    // An inline file's: a truncate past `layout.inline_max` (its bytes move into chunks first).
    libc::EFBIG,
];

/// Whether `errno` is an answer about a path or an operation the file system does not offer
/// (a face reports these to its caller without logging them).
pub fn is_path_answer(errno: i32) -> bool {
    NAMESPACE_ERRNOS.contains(&errno) || errno == libc::EOPNOTSUPP
}

/// The namespace flags for open(2) `flags`: O_CREAT, O_EXCL (with O_CREAT), O_TRUNC and
/// O_NOFOLLOW; the access mode and other bits are not the namespace's concern.
pub fn namespace_flags(flags: i32) -> u32 {
    let mut ns = 0;
    if flags & libc::O_CREAT != 0 {
        ns |= CREATE;
        if flags & libc::O_EXCL != 0 {
            ns |= EXCLUSIVE;
        }
    }
    if flags & libc::O_TRUNC != 0 {
        ns |= TRUNCATE;
    }
    if flags & libc::O_NOFOLLOW != 0 {
        ns |= NO_FOLLOW;
    }
    ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_map_to_namespace_flags() {
        assert_eq!(namespace_flags(libc::O_RDONLY), 0);
        assert_eq!(namespace_flags(libc::O_WRONLY | libc::O_CREAT), CREATE);
        assert_eq!(namespace_flags(libc::O_CREAT | libc::O_EXCL), CREATE | EXCLUSIVE);
        assert_eq!(
            namespace_flags(libc::O_EXCL),
            0,
            "O_EXCL without O_CREAT is ignored"
        );
        assert_eq!(namespace_flags(libc::O_RDWR | libc::O_TRUNC), TRUNCATE);
        assert_eq!(namespace_flags(libc::O_NOFOLLOW), NO_FOLLOW);
        assert!(is_path_answer(libc::ENOENT) && is_path_answer(libc::EOPNOTSUPP));
        assert!(!is_path_answer(libc::EIO));
    }
}
