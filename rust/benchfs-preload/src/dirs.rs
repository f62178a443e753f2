//! Directory streams of BenchFS directories. glibc's `opendir` opens and reads with internal
//! calls this library cannot see, so for a BenchFS directory the stream is ours: a `DIR *`
//! that points at a [`Dir`], known by address to `readdir`, `closedir` and the rest, which
//! pass any other stream to libc. `scandir` is done here over those streams likewise.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_long, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use benchfs_core::namespace::Kind;

use crate::fds;
use crate::names::Target;
use crate::{entry, real, set_errno, with_client};

/// An open stream: its descriptor, the entries read at open (or rewind), and the record
/// `readdir` hands out (valid until the next call on the stream, as POSIX allows).
struct Dir {
    fd: c_int,
    path: String,
    entries: Vec<(String, Kind)>,
    pos: usize,
    record: libc::dirent64,
}

// The streams are addressed by the `DIR *` handed out (the address of a boxed `Dir`).
static STREAMS: Mutex<Option<HashMap<usize, Box<Dir>>>> = Mutex::new(None);
/// How many streams are ours: while 0, a stream call goes to libc without a lookup.
static OPEN: AtomicUsize = AtomicUsize::new(0);

fn streams() -> MutexGuard<'static, Option<HashMap<usize, Box<Dir>>>> {
    STREAMS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ours(dir: *mut libc::DIR) -> bool {
    OPEN.load(Ordering::Acquire) > 0
        && streams()
            .as_ref()
            .is_some_and(|m| m.contains_key(&(dir as usize)))
}

fn list(path: &str) -> Result<Vec<(String, Kind)>, c_int> {
    let listed = with_client("readdir", path, |c| c.readdir(path))?;
    let mut entries = vec![(".".to_string(), Kind::Dir), ("..".to_string(), Kind::Dir)];
    entries.extend(listed.into_iter().map(|e| (e.name, e.kind)));
    Ok(entries)
}

/// A stream over the directory open at our descriptor `fd`, which it now owns.
fn stream(fd: c_int) -> Result<*mut libc::DIR, c_int> {
    let f = fds::lookup(fd).ok_or(libc::EBADF)?;
    if !f.is_dir() {
        return Err(libc::ENOTDIR);
    }
    let entries = list(&f.path)?;
    let mut dir = Box::new(Dir {
        fd,
        path: f.path.clone(),
        entries,
        pos: 0,
        // SAFETY: all-zero is a valid dirent64.
        record: unsafe { std::mem::zeroed() },
    });
    let key = (&mut *dir as *mut Dir) as usize;
    streams().get_or_insert_with(HashMap::new).insert(key, dir);
    OPEN.fetch_add(1, Ordering::AcqRel);
    Ok(key as *mut libc::DIR)
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    // SAFETY: forwarded contract.
    match unsafe { crate::names::resolve(libc::AT_FDCWD, path) } {
        Ok(Target::Local) => unsafe { real::opendir(path) },
        // SAFETY: an absolute path of ours, alive for the call.
        Ok(Target::LocalAt(abs)) => unsafe { real::opendir(abs.as_ptr()) },
        Ok(Target::Ours(_)) => {
            // SAFETY: as above; the open family decides again (the same answer).
            let fd = unsafe {
                crate::files::benchfs_preload_openat(
                    libc::AT_FDCWD,
                    path,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            if fds::lookup(fd).is_none() {
                // A link led outside BenchFS: the kernel opened it.
                // SAFETY: the kernel's descriptor, now the stream's.
                return unsafe { real::fdopendir(fd) };
            }
            let made = entry(std::ptr::null_mut(), || stream(fd));
            if made.is_null() {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                // SAFETY: our descriptor.
                unsafe { crate::files::close(fd) };
                set_errno(e);
            }
            made
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::fdopendir(fd) };
    }
    entry(std::ptr::null_mut(), || stream(fd))
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(dirp: *mut libc::DIR) -> *mut libc::dirent64 {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::readdir64(dirp) };
    }
    let mut map = streams();
    let Some(dir) = map.as_mut().and_then(|m| m.get_mut(&(dirp as usize))) else {
        set_errno(libc::EBADF);
        return std::ptr::null_mut();
    };
    let Some((name, kind)) = dir.entries.get(dir.pos) else {
        return std::ptr::null_mut(); // the end: errno unchanged
    };
    let bytes = name.as_bytes();
    let r = &mut dir.record;
    let len = bytes.len().min(r.d_name.len() - 1);
    for (d, s) in r.d_name.iter_mut().zip(bytes[..len].iter()) {
        *d = *s as c_char;
    }
    r.d_name[len] = 0;
    r.d_ino = crate::names::ino_of(&crate::paths::join(&dir.path, name));
    r.d_type = if *kind == Kind::Symlink {
        libc::DT_LNK
    } else if *kind == Kind::Dir {
        libc::DT_DIR
    } else {
        libc::DT_REG
    };
    r.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    dir.pos += 1;
    r.d_off = dir.pos as i64;
    &mut dir.record as *mut libc::dirent64
}

#[no_mangle]
pub unsafe extern "C" fn readdir(dirp: *mut libc::DIR) -> *mut libc::dirent64 {
    // SAFETY: forwarded (dirent and dirent64 are one layout on 64-bit Linux).
    unsafe { readdir64(dirp) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(dirp: *mut libc::DIR) -> c_int {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::closedir(dirp) };
    }
    let dir = streams().as_mut().and_then(|m| m.remove(&(dirp as usize)));
    let Some(dir) = dir else {
        set_errno(libc::EBADF);
        return -1;
    };
    OPEN.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: the stream's own descriptor.
    unsafe { crate::files::close(dir.fd) }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(dirp: *mut libc::DIR) -> c_int {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::dirfd(dirp) };
    }
    streams()
        .as_ref()
        .and_then(|m| m.get(&(dirp as usize)))
        .map_or(-1, |d| d.fd)
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(dirp: *mut libc::DIR) {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::rewinddir(dirp) };
    }
    let path = streams()
        .as_ref()
        .and_then(|m| m.get(&(dirp as usize)))
        .map(|d| d.path.clone());
    let Some(path) = path else { return };
    // Rewinding shows the directory as it is now (what a real rewinddir does).
    if let Ok(entries) = list(&path) {
        if let Some(d) = streams().as_mut().and_then(|m| m.get_mut(&(dirp as usize))) {
            d.entries = entries;
            d.pos = 0;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn telldir(dirp: *mut libc::DIR) -> c_long {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::telldir(dirp) };
    }
    streams()
        .as_ref()
        .and_then(|m| m.get(&(dirp as usize)))
        .map_or(-1, |d| d.pos as c_long)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(dirp: *mut libc::DIR, pos: c_long) {
    if !ours(dirp) {
        // SAFETY: forwarded.
        return unsafe { real::seekdir(dirp, pos) };
    }
    if let Some(d) = streams().as_mut().and_then(|m| m.get_mut(&(dirp as usize))) {
        d.pos = usize::try_from(pos).unwrap_or(0);
    }
}

/// glibc's `scandir` reads with internal calls this library cannot see: for a BenchFS
/// directory it is done here, with this library's streams (the same contract: an array and
/// its entries from malloc, filtered, sorted, the count returned).
#[no_mangle]
pub unsafe extern "C" fn scandir64(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>,
    compar: Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>,
) -> c_int {
    // SAFETY: forwarded contract.
    match unsafe { crate::names::resolve(libc::AT_FDCWD, path) } {
        Ok(Target::Local) => unsafe { real::scandir64(path, list, filter, compar) },
        // SAFETY: an absolute path of ours, alive for the call.
        Ok(Target::LocalAt(abs)) => unsafe { real::scandir64(abs.as_ptr(), list, filter, compar) },
        Ok(Target::Ours(_)) => unsafe { scan_ours(path, list, filter, compar) },
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn scandir(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>,
    compar: Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>,
) -> c_int {
    // SAFETY: forwarded (dirent and dirent64 are one layout on 64-bit Linux).
    unsafe { scandir64(path, list, filter, compar) }
}

unsafe fn scan_ours(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>,
    compar: Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>,
) -> c_int {
    if list.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: forwarded.
    let dir = unsafe { opendir(path) };
    if dir.is_null() {
        return -1;
    }
    let mut found: Vec<*mut libc::dirent64> = Vec::new();
    let size = std::mem::size_of::<libc::dirent64>();
    let fail = |found: &[*mut libc::dirent64], e: c_int| {
        for &p in found {
            // SAFETY: entries this call malloc'ed.
            unsafe { libc::free(p.cast()) };
        }
        set_errno(e);
        -1
    };
    loop {
        // SAFETY: our stream.
        let ent = unsafe { readdir64(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: the filter is the caller's; the entry is valid until the next readdir.
        if let Some(f) = filter {
            if unsafe { f(ent) } == 0 {
                continue;
            }
        }
        // SAFETY: a copy the caller frees with free(), as glibc's scandir hands out.
        let copy = unsafe { libc::malloc(size) }.cast::<libc::dirent64>();
        if copy.is_null() {
            unsafe { closedir(dir) };
            return fail(&found, libc::ENOMEM);
        }
        // SAFETY: both are one dirent64 long.
        unsafe { std::ptr::copy_nonoverlapping(ent, copy, 1) };
        found.push(copy);
    }
    // SAFETY: our stream.
    unsafe { closedir(dir) };
    if let Some(c) = compar {
        // SAFETY: the comparator is the caller's, called with pointers to two entries.
        found.sort_by(|a, b| {
            let (mut a, mut b) = (*a as *const libc::dirent64, *b as *const libc::dirent64);
            unsafe { c(&mut a, &mut b) }.cmp(&0)
        });
    }
    // SAFETY: an array the caller frees with free().
    let array = unsafe { libc::malloc(found.len().max(1) * std::mem::size_of::<*mut libc::dirent64>()) }
        .cast::<*mut libc::dirent64>();
    if array.is_null() {
        return fail(&found, libc::ENOMEM);
    }
    // SAFETY: `array` holds found.len() pointers; `list` is writable by contract.
    unsafe {
        std::ptr::copy_nonoverlapping(found.as_ptr(), array, found.len());
        *list = array;
    }
    found.len() as c_int
}

/// glibc's `glob_t` (posix/glob.h, the same layout for `glob64_t` on 64-bit Linux), whose GNU
/// extension `GLOB_ALTDIRFUNC` makes `glob` read directories and stat names through the
/// functions in it instead of glibc's internal calls, which pass by this library.
#[repr(C)]
pub struct GlobT {
    pathc: libc::size_t,
    pathv: *mut *mut c_char,
    offs: libc::size_t,
    flags: c_int,
    closedir: Option<unsafe extern "C" fn(*mut c_void)>,
    readdir: Option<unsafe extern "C" fn(*mut c_void) -> *mut libc::dirent64>,
    opendir: Option<unsafe extern "C" fn(*const c_char) -> *mut c_void>,
    lstat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
    stat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
}

/// posix/glob.h.
const GLOB_ALTDIRFUNC: c_int = 1 << 9;

unsafe extern "C" fn glob_closedir(d: *mut c_void) {
    // SAFETY: a stream glob opened with glob_opendir.
    unsafe { closedir(d.cast()) };
}

unsafe extern "C" fn glob_readdir(d: *mut c_void) -> *mut libc::dirent64 {
    // SAFETY: as above.
    unsafe { readdir64(d.cast()) }
}

unsafe extern "C" fn glob_opendir(path: *const c_char) -> *mut c_void {
    // SAFETY: glob passes a NUL-terminated name.
    unsafe { opendir(path).cast() }
}

/// `glob` with this library's directory streams and stat (each serves local names from libc),
/// unless the caller brought its own (`GLOB_ALTDIRFUNC` already set).
#[no_mangle]
pub unsafe extern "C" fn glob(
    pattern: *const c_char,
    flags: c_int,
    errfunc: Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>,
    pglob: *mut GlobT,
) -> c_int {
    let mut flags = flags;
    // SAFETY: the caller's glob_t, valid by contract.
    if let Some(g) = unsafe { pglob.as_mut() } {
        if flags & GLOB_ALTDIRFUNC == 0 {
            g.closedir = Some(glob_closedir);
            g.readdir = Some(glob_readdir);
            g.opendir = Some(glob_opendir);
            g.lstat = Some(crate::names::lstat);
            g.stat = Some(crate::names::stat);
            flags |= GLOB_ALTDIRFUNC;
        }
    }
    // SAFETY: forwarded.
    unsafe { real::glob(pattern, flags, errfunc, pglob) }
}

#[no_mangle]
pub unsafe extern "C" fn glob64(
    pattern: *const c_char,
    flags: c_int,
    errfunc: Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>,
    pglob: *mut GlobT,
) -> c_int {
    // SAFETY: the same structure and call on 64-bit Linux.
    unsafe { glob(pattern, flags, errfunc, pglob) }
}

/// `nftw`'s `struct FTW` (ftw.h).
#[repr(C)]
pub struct Ftw {
    base: c_int,
    level: c_int,
}

pub type NftwFn = unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int, *mut Ftw) -> c_int;
pub type FtwFn = unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int) -> c_int;

// ftw.h.
const FTW_F: c_int = 0;
const FTW_D: c_int = 1;
const FTW_DNR: c_int = 2;
const FTW_NS: c_int = 3;
const FTW_DP: c_int = 5;
const FTW_CHDIR: c_int = 4;
const FTW_DEPTH: c_int = 8;
const FTW_ACTIONRETVAL: c_int = 16;
const FTW_CONTINUE: c_int = 0;
const FTW_SKIP_SUBTREE: c_int = 2;
const FTW_SKIP_SIBLINGS: c_int = 3;

/// A walk of a BenchFS tree in `nftw`'s order: `visit(path, stat, type, base, level)` for
/// every name, directories before their entries (after them with `depth`). Names come from
/// this library's streams and stat, so relative roots resolve from the emulated working
/// directory. A non-zero answer stops the walk and is returned, except with `actions`
/// (`FTW_ACTIONRETVAL`), where FTW_SKIP_SUBTREE and FTW_SKIP_SIBLINGS skip.
struct Walk<'a> {
    depth: bool,
    actions: bool,
    visit: &'a mut dyn FnMut(&CStr, *const libc::stat64, c_int, c_int, c_int) -> c_int,
}

impl Walk<'_> {
    fn go(&mut self, path: &CStr, base: usize, level: c_int) -> c_int {
        // SAFETY: zeroed stat is plain data; path is NUL-terminated.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        if unsafe { crate::names::stat(path.as_ptr(), &mut st) } != 0 {
            return (self.visit)(path, &st, FTW_NS, base as c_int, level);
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return (self.visit)(path, &st, FTW_F, base as c_int, level);
        }
        // SAFETY: as above.
        let dir = unsafe { opendir(path.as_ptr()) };
        if dir.is_null() {
            return (self.visit)(path, &st, FTW_DNR, base as c_int, level);
        }
        let mut names = Vec::new();
        loop {
            // SAFETY: our open stream.
            let e = unsafe { readdir64(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: readdir's entry holds a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name.to_owned());
            }
        }
        // SAFETY: opened above, closed once.
        unsafe { closedir(dir) };
        if !self.depth {
            match (self.visit)(path, &st, FTW_D, base as c_int, level) {
                FTW_CONTINUE => {}
                FTW_SKIP_SUBTREE if self.actions => return FTW_CONTINUE,
                r => return r,
            }
        }
        let slash = if path.to_bytes().ends_with(b"/") { "" } else { "/" };
        for name in names {
            let mut child = path.to_bytes().to_vec();
            child.extend_from_slice(slash.as_bytes());
            let child_base = child.len();
            child.extend_from_slice(name.to_bytes());
            let Ok(child) = std::ffi::CString::new(child) else {
                continue;
            };
            match self.go(&child, child_base, level + 1) {
                FTW_CONTINUE => {}
                FTW_SKIP_SIBLINGS if self.actions => break,
                r => return r,
            }
        }
        if self.depth {
            return (self.visit)(path, &st, FTW_DP, base as c_int, level);
        }
        FTW_CONTINUE
    }
}

/// Where the last component of `path` starts.
fn base_of(path: &CStr) -> usize {
    let b = path.to_bytes();
    let trimmed = b.len() - b.iter().rev().take_while(|&&c| c == b'/').count();
    b[..trimmed].iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1)
}

fn path_is_ours(path: *const c_char) -> bool {
    // SAFETY: the caller's NUL-terminated path.
    matches!(
        unsafe { crate::names::resolve(libc::AT_FDCWD, path) },
        Ok(Target::Ours(_))
    )
}

#[no_mangle]
pub unsafe extern "C" fn nftw64(path: *const c_char, f: Option<NftwFn>, fds: c_int, flags: c_int) -> c_int {
    if path.is_null() || !path_is_ours(path) {
        // SAFETY: forwarded.
        return unsafe { real::nftw64(path, f, fds, flags) };
    }
    let Some(f) = f else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if flags & FTW_CHDIR != 0 {
        // The walk would have to change the emulated working directory for the callback.
        set_errno(libc::ENOTSUP);
        return -1;
    }
    // SAFETY: the caller's NUL-terminated path.
    let root = unsafe { CStr::from_ptr(path) };
    let mut visit = |p: &CStr, st: *const libc::stat64, kind: c_int, base: c_int, level: c_int| {
        let mut ftw = Ftw { base, level };
        // SAFETY: the caller's callback with what nftw passes.
        unsafe { f(p.as_ptr(), st, kind, &mut ftw) }
    };
    let mut walk = Walk {
        depth: flags & FTW_DEPTH != 0,
        actions: flags & FTW_ACTIONRETVAL != 0,
        visit: &mut visit,
    };
    walk.go(root, base_of(root), 0)
}

#[no_mangle]
pub unsafe extern "C" fn nftw(path: *const c_char, f: Option<NftwFn>, fds: c_int, flags: c_int) -> c_int {
    // SAFETY: the same structures on 64-bit Linux.
    unsafe { nftw64(path, f, fds, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn ftw64(path: *const c_char, f: Option<FtwFn>, fds: c_int) -> c_int {
    if path.is_null() || !path_is_ours(path) {
        // SAFETY: forwarded.
        return unsafe { real::ftw64(path, f, fds) };
    }
    let Some(f) = f else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: the caller's NUL-terminated path.
    let root = unsafe { CStr::from_ptr(path) };
    // SAFETY: the caller's callback with what ftw passes.
    let mut visit = |p: &CStr, st: *const libc::stat64, kind: c_int, _: c_int, _: c_int| unsafe {
        f(p.as_ptr(), st, kind)
    };
    let mut walk = Walk {
        depth: false,
        actions: false,
        visit: &mut visit,
    };
    walk.go(root, base_of(root), 0)
}

#[no_mangle]
pub unsafe extern "C" fn ftw(path: *const c_char, f: Option<FtwFn>, fds: c_int) -> c_int {
    // SAFETY: the same structures on 64-bit Linux.
    unsafe { ftw64(path, f, fds) }
}
