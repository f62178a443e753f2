//! This process's resources as the kernel sees them: the descriptor limit (raised where
//! servers start, as each holds about two sockets per client), core dumps, and what is in use.

/// Lets a crash leave a core dump where the kernel's `core_pattern` says (the launchers start
/// daemons in a directory of the run for that): the soft limit up to the hard one.
pub fn allow_core_dumps() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_CORE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_CORE, &limit);
        }
    }
}

/// Raises the soft limit on open descriptors to the hard limit; returns the limit now in force.
pub fn raise_descriptor_limit() -> std::io::Result<u64> {
    ensure_descriptor_limit(u64::MAX)
}

/// Raises the soft limit on open descriptors to the hard limit if it is below `needed`;
/// returns the limit now in force.
pub fn ensure_descriptor_limit(needed: u64) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max && limit.rlim_cur < needed {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
    }
    Ok(limit.rlim_cur)
}

/// Open descriptors of this process (entries of /proc/self/fd; 0 if it cannot be read).
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1) as u64)
}

/// This process's resident memory in bytes (/proc/self/statm; 0 if it cannot be read).
pub fn resident_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// CPU time this process has used, user and system, in nanoseconds (0 if it cannot be read).
pub fn cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only `usage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec.max(0) as u64 * 1_000_000_000 + t.tv_usec.max(0) as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}
