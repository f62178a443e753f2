//! Symbolic links: making and reading them, and resolving paths through them.
//!
//! A link is an inode at its path's owner holding its target as written. An operation is
//! tried on its path as given first, so paths without links cost nothing more; only when it
//! fails as a link could explain (ENOENT or ENOTDIR for a link among the directories, ELOOP
//! for a link in the last place that the operation follows) does the client walk the path,
//! one lookup per component, and try again on the path resolved. A relative target is taken
//! from the link's directory. An absolute one is a host path, as a program wrote it through
//! the mount or the interposition library: under one of the [`link_roots`] it is followed
//! inside BenchFS, and elsewhere it leads outside ([`Error::LinkOutside`]), which the
//! interposition library hands to the kernel (docs/namespace.md).

use std::collections::VecDeque;
use std::future::Future;

use crate::error::{Error, Result};
use crate::namespace::{self, Attr, Kind};
use crate::protocol::meta::{self, MetaRequest};
use crate::protocol::Op;
use crate::telemetry::OpKind;

use super::Client;

/// Links followed in one resolution before ELOOP (Linux's MAXSYMLINKS).
pub const MAX_LINKS: u32 = 40;

/// The host directories where this namespace is seen, longest first: those configured
/// (`client.link_roots`), the mount point (`$BENCHFS_MOUNT`), and the interposition
/// library's prefix (`$BENCHFS_PRELOAD_PREFIX`, else `/benchfs`, its default).
pub fn link_roots(configured: &str) -> Vec<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let prefix = var("BENCHFS_PRELOAD_PREFIX").unwrap_or_else(|| "/benchfs".into());
    let mut roots: Vec<String> = configured
        .split(':')
        .map(str::to_string)
        .chain(var("BENCHFS_MOUNT"))
        .chain([prefix])
        .filter(|r| r.starts_with('/'))
        .filter_map(|r| namespace::normalize(&r).ok())
        .collect();
    roots.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    roots.dedup();
    roots
}

/// The BenchFS path of the normalized host path `host` when it is under one of `roots`.
fn inside_roots(roots: &[String], host: &str) -> Option<String> {
    roots.iter().find_map(|root| {
        if root == "/" {
            return Some(host.to_string());
        }
        match host.strip_prefix(root.as_str())? {
            "" => Some("/".to_string()),
            rest if rest.starts_with('/') => Some(rest.to_string()),
            _ => None,
        }
    })
}

fn path_error(op: &'static str, path: &str, errno: i32) -> Error {
    Error::Path {
        op,
        path: path.into(),
        errno,
    }
}

impl Client {
    /// Makes a symbolic link at `path` to `target` (kept as given, resolved when followed):
    /// the entry in its parent, then the link at its owner.
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("symlink", path)?;
        if target.is_empty() || target.len() >= namespace::PATH_MAX || target.contains('\0') {
            let errno = if target.is_empty() {
                libc::ENOENT
            } else if target.contains('\0') {
                libc::EINVAL
            } else {
                libc::ENAMETOOLONG
            };
            // Named by the link's path: a target too long to use is too long to print.
            return Err(path_error("symlink", &path, errno));
        }
        self.run(self.through_links("symlink", &path, false, |path| async move {
            let added = self
                .dir_add("symlink", &path, Kind::Symlink, libc::EEXIST, 0)
                .await?;
            if added.is_none() {
                return Err(path_error("symlink", &path, libc::EEXIST));
            }
            let mut req = MetaRequest::new(&path);
            req.target = target.to_string();
            if let Err(e) = self.meta(Op::Symlink, "symlink", &req).await {
                // Undo our half; the original error is what matters.
                let _ = self.dir_remove("symlink", &path).await;
                return Err(e);
            }
            Ok(())
        }))
    }

    /// The target of the symbolic link at `path` (EINVAL if it is not one); links among its
    /// directories are followed.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("readlink", path)?;
        self.run(self.through_links("readlink", &path, false, |path| async move {
            self.readlink_at(&path).await
        }))
    }

    /// The attribute of `path` itself: a link's own, not its target's.
    pub fn lstat(&self, path: &str) -> Result<Attr> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("lstat", path)?;
        self.run(self.through_links(
            "lstat",
            &path,
            false,
            |path| async move { self.lookup(&path).await },
        ))
    }

    /// Sets the modification time of the symbolic link at `path` itself (lutimes; EINVAL if
    /// it is not a link).
    pub fn set_link_time(&self, path: &str, mtime_ns: u64) -> Result<Attr> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("setattr", path)?;
        self.run(self.through_links("setattr", &path, false, |path| async move {
            let mut req = MetaRequest::new(&path);
            req.flags = meta::SET_MTIME | meta::SET_LINK;
            req.arg = mtime_ns;
            Ok(self.meta_attr(Op::SetAttr, "setattr", &req).await?.0)
        }))
    }

    /// `path` with every symbolic link in it resolved (realpath(3)): ENOENT when it leads
    /// nowhere, EXDEV ([`Error::LinkOutside`]) when it leads outside BenchFS.
    pub fn realpath(&self, path: &str) -> Result<String> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("realpath", path)?;
        self.run(async {
            let resolved = self.resolve("realpath", &path, true).await?;
            self.lookup(&resolved).await?;
            Ok(resolved)
        })
    }

    /// One lookup at `path`'s owner, links not followed.
    pub(super) async fn lookup(&self, path: &str) -> Result<Attr> {
        Ok(self.meta_attr(Op::Stat, "stat", &MetaRequest::new(path)).await?.0)
    }

    pub(super) async fn readlink_at(&self, path: &str) -> Result<String> {
        let (_, body) = self
            .meta(Op::Readlink, "readlink", &MetaRequest::new(path))
            .await?;
        String::from_utf8(body).map_err(|_| Error::Protocol(format!("the target of {path} is not UTF-8")))
    }

    /// `path` (normalized) with every link among its directories resolved, and the last
    /// component's too when `follow`. A missing last component is left for the operation to
    /// report; a missing or non-directory one before it is ENOENT or ENOTDIR, and more than
    /// [`MAX_LINKS`] links ELOOP.
    pub(super) async fn resolve(&self, what: &'static str, path: &str, follow: bool) -> Result<String> {
        // Names exist only under existing directories, so if the parent is a directory at its
        // own path, no link is among the directories: one lookup settles most failures (a
        // genuinely missing name), and only a link in the last place needs the walk.
        if let Some((parent, _)) = namespace::split_parent(path) {
            if matches!(self.lookup(parent).await, Ok(a) if a.kind == Kind::Dir) {
                let last_is_link =
                    follow && matches!(self.lookup(path).await, Ok(a) if a.kind == Kind::Symlink);
                if !last_is_link {
                    return Ok(path.to_string());
                }
            }
        }
        let mut links = 0;
        let mut todo: VecDeque<String> = components(path);
        let mut done = String::from("/");
        while let Some(name) = todo.pop_front() {
            let here = namespace::child_path(&done, &name);
            let last = todo.is_empty();
            if last && !follow {
                return Ok(here);
            }
            match self.lookup(&here).await {
                Ok(a) if a.kind == Kind::Symlink => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(path_error(what, path, libc::ELOOP));
                    }
                    let target = self.readlink_at(&here).await?;
                    let rest: Vec<String> = todo.drain(..).collect();
                    let resolved = self.through_target(what, path, &done, &target, &rest.join("/"))?;
                    todo = components(&resolved);
                    done = String::from("/");
                }
                Ok(a) if a.kind != Kind::Dir && !last => return Err(path_error(what, path, libc::ENOTDIR)),
                Ok(_) => done = here,
                Err(Error::Path {
                    errno: libc::ENOENT, ..
                }) if last => return Ok(here),
                Err(Error::Path { errno, .. }) => return Err(path_error(what, path, errno)),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// The path in BenchFS that a link in directory `dir` with `target` leads to, with `rest`
    /// (the components after the link) appended; `path` names the operation's path in errors.
    fn through_target(
        &self,
        what: &'static str,
        path: &str,
        dir: &str,
        target: &str,
        rest: &str,
    ) -> Result<String> {
        let normalized = |p: String| namespace::normalize(&p).map_err(|errno| path_error(what, path, errno));
        if !target.starts_with('/') {
            return normalized(format!("{dir}/{target}/{rest}"));
        }
        let host = normalized(format!("{target}/{rest}"))?;
        inside_roots(&self.link_roots, &host).ok_or_else(|| Error::LinkOutside {
            op: what,
            path: path.into(),
            host,
        })
    }

    /// Whether this client resolves links in the paths it is given (on by default). A face
    /// whose caller resolves them turns it off: the mount, whose paths come from the kernel,
    /// which follows links itself; its failed lookups then cost no walk.
    pub fn set_resolve_links(&self, on: bool) {
        self.resolve_links.set(on);
    }

    /// Runs `op` on `path`, and again on the path resolved (see [`Self::resolve`]) when it
    /// failed as a link could explain and the resolved path differs (and this client resolves
    /// links).
    pub(super) async fn through_links<T, F, Fut>(
        &self,
        what: &'static str,
        path: &str,
        follow: bool,
        op: F,
    ) -> Result<T>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        match op(path.to_string()).await {
            Err(e @ Error::Path { errno, .. })
                if self.resolve_links.get() && errno == libc::ENOENT
                    || errno == libc::ENOTDIR
                    || (follow && errno == libc::ELOOP) =>
            {
                let resolved = self.resolve(what, path, follow).await?;
                if resolved == path {
                    return Err(e);
                }
                op(resolved).await
            }
            r => r,
        }
    }

    /// The attribute `path` leads to: its own, or its link's target's.
    /// A link found at a path by its own lookup is at that very path (inodes are kept by
    /// their paths, links resolved), so its target is taken from its directory at once: a
    /// readlink and a lookup per link, not a walk from `/`.
    pub(super) async fn stat_following(&self, path: &str) -> Result<Attr> {
        let mut here = path.to_string();
        for _ in 0..=MAX_LINKS {
            let attr = self
                .through_links("stat", &here, true, |p| async move { self.lookup(&p).await })
                .await?;
            if attr.kind != Kind::Symlink {
                return Ok(attr);
            }
            let target = self.readlink_at(&here).await?;
            let dir = namespace::split_parent(&here).map_or("/", |(parent, _)| parent);
            here = self.through_target("stat", path, dir, &target, "")?;
        }
        Err(path_error("stat", path, libc::ELOOP))
    }
}

/// The components of a normalized path.
fn components(path: &str) -> VecDeque<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_targets_are_inside_under_a_root_only() {
        let roots = vec!["/mnt/bfs".to_string(), "/benchfs".to_string()];
        assert_eq!(inside_roots(&roots, "/benchfs").as_deref(), Some("/"));
        assert_eq!(inside_roots(&roots, "/benchfs/a/b").as_deref(), Some("/a/b"));
        assert_eq!(inside_roots(&roots, "/mnt/bfs/x").as_deref(), Some("/x"));
        assert_eq!(inside_roots(&roots, "/benchfsX/a"), None);
        assert_eq!(inside_roots(&roots, "/usr/bin/python3"), None);
        assert_eq!(inside_roots(&["/".to_string()], "/d").as_deref(), Some("/d"));
    }

    #[test]
    fn roots_are_normalized_longest_first_and_the_prefix_default_is_kept() {
        let roots = link_roots("/a/b/:relative::/a//b:/");
        assert!(roots.windows(2).all(|w| w[0].len() >= w[1].len()));
        assert_eq!(roots.iter().filter(|r| r.as_str() == "/a/b").count(), 1);
        assert_eq!(roots.last().map(String::as_str), Some("/"));
        assert!(!roots.iter().any(|r| r == "relative"));
    }
}
