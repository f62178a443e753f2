//! A process's life around BenchFS files: `exit` publishes what was written (sizes are
//! published at close, and a program may exit without closing); `fork` seals the shared
//! offset regions (the child's clients are its own: the pool notices the fork); `execve` and `posix_spawn` hand the descriptors that stay open (and a
//! working directory inside BenchFS) to the new program, which takes them up when this
//! library loads in it.
//!
//! The hand-over is two environment variables the new program removes once read:
//! `BENCHFS_PRELOAD_FDS` (per descriptor: number, status flags, the memfd and slot of its
//! shared offset, the offset, directory or not, the hex-encoded path) and
//! `BENCHFS_PRELOAD_CWD`. A descriptor is taken up only if it still is what this library
//! reserved (an `O_PATH` descriptor of `/`).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Once};

use crate::fds::{self, OpenFile};
use crate::offsets::{self, Position};
use crate::{maps, names, real, say, set_errno, stdio};

const FDS_VAR: &str = "BENCHFS_PRELOAD_FDS";
const CWD_VAR: &str = "BENCHFS_PRELOAD_CWD";

extern "C" {
    static mut environ: *const *const c_char;
}

/// Registers the exit and fork handlers, once per process.
pub fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: handlers with the C signatures; registration cannot corrupt anything.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(Some(before_fork), None, None);
        }
    });
}

/// At exit: every stream's bytes go to their files, and every file's size is published. On
/// a thread of its own, because the exiting thread's thread-local state (which the client's
/// event loop uses) is already gone when exit handlers run.
extern "C" fn at_exit() {
    let work = || {
        let _ = catch_unwind(|| {
            // Streams first: their bytes go to BenchFS descriptors still in the table.
            // SAFETY: NULL flushes every output stream.
            unsafe { libc::fflush(std::ptr::null_mut()) };
            for (_, f) in fds::all() {
                let _ = f.publish();
            }
        });
    };
    if fds::all().is_empty() {
        return;
    }
    match std::thread::Builder::new()
        .name("benchfs-exit".into())
        .spawn(work)
    {
        Ok(t) => {
            let _ = t.join();
        }
        Err(e) => say(&format!("cannot publish sizes at exit: {e}")),
    }
}

extern "C" fn before_fork() {
    offsets::seal();
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// What `execve` or `posix_spawn` passes instead of the caller's environment, and the memfds
/// made inheritable for it (made close-on-exec again if the call fails or returns).
pub struct Handoff {
    _env: Vec<CString>,
    ptrs: Vec<*const c_char>,
    opened: Vec<c_int>,
}

impl Handoff {
    pub fn envp(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        for &fd in &self.opened {
            // SAFETY: our memfd; only its close-on-exec flag changes.
            unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as usize as *mut libc::c_void) };
        }
    }
}

fn cloexec(fd: c_int) -> bool {
    // SAFETY: F_GETFD has no argument and no effect.
    let flags = unsafe { real::fcntl(fd, libc::F_GETFD, std::ptr::null_mut()) };
    flags < 0 || flags & libc::FD_CLOEXEC != 0
}

/// The hand-over for a new program started with `envp`; None when there is nothing to hand
/// over (the caller's environment is then used unchanged).
pub unsafe fn handoff(envp: *const *const c_char) -> Option<Handoff> {
    let kept: Vec<(c_int, Arc<OpenFile>)> = fds::all().into_iter().filter(|(fd, _)| !cloexec(*fd)).collect();
    let cwd = names::bfs_cwd();
    if kept.is_empty() && cwd.is_none() {
        return None;
    }
    let mut entries = Vec::with_capacity(kept.len());
    let mut opened = Vec::new();
    for (fd, f) in &kept {
        // The new program opens its own handle: it must find the size this one wrote.
        if let Err(e) = f.publish() {
            say(&format!(
                "{}: size not published before exec: {}",
                f.path,
                std::io::Error::from_raw_os_error(e)
            ));
        }
        let (memfd, slot) = f.position.share();
        if let Some(m) = memfd {
            if !opened.contains(&m) && cloexec(m) {
                // SAFETY: our memfd; the new program maps it to share the offset.
                unsafe { real::fcntl(m, libc::F_SETFD, std::ptr::null_mut()) };
                opened.push(m);
            }
        }
        entries.push(format!(
            "{fd},{},{},{slot},{},{},{}",
            f.flags.load(std::sync::atomic::Ordering::Relaxed),
            memfd.unwrap_or(-1),
            f.position.get(),
            u8::from(f.dir),
            hex(&f.path)
        ));
    }
    let mut env: Vec<CString> = Vec::new();
    let mut preloaded = false;
    let mut p = envp;
    // SAFETY: a NULL-terminated array of strings by the caller's contract (or NULL).
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            let item = CStr::from_ptr(*p);
            let bytes = item.to_bytes();
            if !bytes.starts_with(b"BENCHFS_PRELOAD_FDS=") && !bytes.starts_with(b"BENCHFS_PRELOAD_CWD=") {
                preloaded |=
                    bytes.starts_with(b"LD_PRELOAD=") && bytes.windows(15).any(|w| w == b"benchfs_preload");
                env.push(item.to_owned());
            }
            p = p.add(1);
        }
    }
    if !kept.is_empty() {
        if !preloaded {
            say("a program started without LD_PRELOAD of this library inherits BenchFS descriptors; its I/O on them fails with EBADF");
        }
        env.push(CString::new(format!("{FDS_VAR}={}", entries.join(";"))).ok()?);
    }
    if let Some(dir) = cwd {
        env.push(CString::new(format!("{CWD_VAR}={}", hex(&dir))).ok()?);
    }
    let mut ptrs: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Some(Handoff {
        _env: env,
        ptrs,
        opened,
    })
}

/// True when `fd` is still a descriptor this library reserved: an `O_PATH` descriptor of `/`.
fn reserved(fd: c_int) -> bool {
    // SAFETY: F_GETFL has no argument and no effect.
    let flags = unsafe { real::fcntl(fd, libc::F_GETFL, std::ptr::null_mut()) };
    if flags < 0 || flags & libc::O_PATH == 0 {
        return false;
    }
    // SAFETY: all-zero stat64s are valid; the calls fill them.
    let (mut a, mut b): (libc::stat64, libc::stat64) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid out pointers and path.
    unsafe {
        real::fstat64(fd, &mut a) == 0
            && real::fstatat64(libc::AT_FDCWD, c"/".as_ptr(), &mut b, 0) == 0
            && (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    }
}

/// Takes up what the previous program handed over (run when the library loads).
fn take_over() {
    let _inside = crate::inside();
    if let Ok(v) = std::env::var(CWD_VAR) {
        std::env::remove_var(CWD_VAR);
        if let Some(dir) = unhex(&v) {
            names::set_bfs_cwd(Some(dir));
        }
    }
    let Ok(list) = std::env::var(FDS_VAR) else { return };
    std::env::remove_var(FDS_VAR);
    setup();
    let pool = match crate::the_pool() {
        Ok(p) => p,
        Err(_) => return, // said by the pool; the descriptors' I/O fails with EBADF
    };
    let mut regions = HashMap::new();
    for entry in list.split(';').filter(|e| !e.is_empty()) {
        let parts: Vec<&str> = entry.split(',').collect();
        let parsed = (|| {
            let [fd, flags, memfd, slot, offset, dir, path] = parts.as_slice() else {
                return None;
            };
            Some((
                fd.parse::<c_int>().ok()?,
                flags.parse::<c_int>().ok()?,
                memfd.parse::<c_int>().ok()?,
                slot.parse::<usize>().ok()?,
                offset.parse::<u64>().ok()?,
                *dir == "1",
                unhex(path)?,
            ))
        })();
        let Some((fd, flags, memfd, slot, offset, dir, path)) = parsed else {
            say(&format!("{FDS_VAR}: a malformed entry {entry:?} is ignored"));
            continue;
        };
        if !reserved(fd) {
            continue; // closed or replaced before the exec: nothing to take up
        }
        let position = if memfd >= 0 {
            let region = match regions.get(&memfd) {
                Some(r) => Some(Arc::clone(r)),
                None => offsets::inherited_region(memfd).ok().inspect(|r| {
                    // SAFETY: the memfd is ours again; it need not outlive this program.
                    unsafe {
                        real::fcntl(
                            memfd,
                            libc::F_SETFD,
                            libc::FD_CLOEXEC as usize as *mut libc::c_void,
                        )
                    };
                    regions.insert(memfd, Arc::clone(r));
                }),
            };
            region.and_then(|r| Position::inherited(r, slot))
        } else {
            None
        };
        let position = match position {
            Some(p) => p,
            None => match Position::new(offset) {
                Ok(p) => p,
                Err(_) => continue,
            },
        };
        let file = OpenFile::inherited(path, dir, flags, position, pool.clone());
        fds::insert(fd, Arc::new(file));
        stdio::after_std_change(fd);
    }
}

extern "C" fn on_load() {
    crate::mark_loaded();
    if catch_unwind(AssertUnwindSafe(take_over)).is_err() {
        say("internal error while taking up inherited BenchFS descriptors");
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

// ---- the exec family ----

/// As [`maps::exec_path`] for a name that has a `/`; one without is searched for in `PATH`
/// by glibc, through the kernel (which sees BenchFS only through a mount).
unsafe fn searched_or_exec_path(file: *const c_char) -> Result<Option<CString>, c_int> {
    // SAFETY: NUL-terminated by the caller's contract.
    if file.is_null() || !unsafe { CStr::from_ptr(file) }.to_bytes().contains(&b'/') {
        return Ok(None);
    }
    // SAFETY: forwarded.
    unsafe { maps::exec_path(file) }
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        let mounted = match maps::exec_path(path) {
            Ok(m) => m,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        let h = handoff(envp);
        let path = mounted.as_ref().map_or(path, |p| p.as_ptr());
        real::execve(path, argv, h.as_ref().map_or(envp, Handoff::envp))
    }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded; `environ` is the process's environment.
    unsafe { execve(path, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        let mounted = match searched_or_exec_path(file) {
            Ok(m) => m,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        let h = handoff(envp);
        let file = mounted.as_ref().map_or(file, |p| p.as_ptr());
        real::execvpe(file, argv, h.as_ref().map_or(envp, Handoff::envp))
    }
}

/// `system` and `popen` start `sh -c` with glibc's internal `posix_spawn`, past this
/// library's wrappers: the hand-over goes through the environment they pass, the process's
/// own, which is swapped for the call (a thread calling `getenv` meanwhile sees the same
/// variables and the two hand-over ones).
unsafe fn with_handoff_environ<R>(start: impl FnOnce() -> R) -> R {
    // SAFETY: `environ` is the process's environment; restored before returning.
    unsafe {
        let original = environ;
        let h = handoff(original);
        if let Some(h) = &h {
            environ = h.envp();
        }
        let r = start();
        environ = original;
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    // SAFETY: forwarded; NULL asks whether a shell exists and hands nothing over.
    unsafe {
        if command.is_null() {
            return real::system(command);
        }
        with_handoff_environ(|| real::system(command))
    }
}

#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded.
    unsafe { with_handoff_environ(|| real::popen(command, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { execvpe(file, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    if let Some(f) = fds::lookup(fd) {
        // A BenchFS program: executed by its path (maps::exec_path says how).
        let Ok(path) = maps::mounted_path(&f.path) else {
            set_errno(libc::EBADF);
            return -1;
        };
        // SAFETY: forwarded; the path lives for the call.
        return unsafe { execve(path.as_ptr(), argv, envp) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        let h = handoff(envp);
        real::fexecve(fd, argv, h.as_ref().map_or(envp, Handoff::envp))
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: forwarded contract; the hand-over lives until the child is started.
    unsafe {
        let mounted = match maps::exec_path(path) {
            Ok(m) => m,
            Err(e) => return e,
        };
        let h = handoff(envp.cast());
        real::posix_spawn(
            pid,
            mounted.as_ref().map_or(path, |p| p.as_ptr()),
            actions,
            attr,
            argv,
            h.as_ref().map_or(envp, |h| h.envp().cast()),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: as for posix_spawn.
    unsafe {
        let mounted = match searched_or_exec_path(file) {
            Ok(m) => m,
            Err(e) => return e,
        };
        let h = handoff(envp.cast());
        real::posix_spawnp(
            pid,
            mounted.as_ref().map_or(file, |p| p.as_ptr()),
            actions,
            attr,
            argv,
            h.as_ref().map_or(envp, |h| h.envp().cast()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_any_path() {
        for p in ["/", "/a b/c,d;e", "/ünï/🙂"] {
            assert_eq!(unhex(&hex(p)).as_deref(), Some(p));
        }
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }
}
