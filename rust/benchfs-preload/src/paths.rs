//! Which paths are BenchFS's: those under the prefix, after `.`, `..` and repeated slashes
//! are resolved the way the kernel would (BenchFS has no symbolic links, so resolving them
//! lexically is exact inside the prefix).

/// `path` with `.`, `..` and repeated slashes resolved; `path` is absolute.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut out = String::with_capacity(path.len());
    for p in &parts {
        out.push('/');
        out.push_str(p);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The prefix BenchFS is served under: absolute, normalized, never `/` itself.
#[derive(Debug, Clone)]
pub struct Prefix(String);

impl Prefix {
    pub fn new(raw: &str) -> Result<Prefix, String> {
        if !raw.starts_with('/') {
            return Err(format!("the prefix {raw:?} is not an absolute path"));
        }
        let p = normalize(raw);
        if p == "/" {
            return Err("the prefix cannot be / (every path would be BenchFS's)".into());
        }
        Ok(Prefix(p))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The local form of a BenchFS path (what getcwd shows).
    pub fn outside(&self, bfs: &str) -> String {
        if bfs == "/" {
            self.0.clone()
        } else {
            format!("{}{bfs}", self.0)
        }
    }

    /// The BenchFS path of an absolute, normalized `path` under the prefix.
    pub fn inside(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix(self.0.as_str())?;
        if rest.is_empty() {
            Some("/".into())
        } else if rest.starts_with('/') {
            Some(rest.to_string())
        } else {
            None // "/benchfsX" is not under "/benchfs"
        }
    }
}

/// `rel` resolved against the absolute directory `base`.
pub fn join(base: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        normalize(rel)
    } else {
        normalize(&format!("{base}/{rel}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_resolves_dots_and_slashes() {
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize("//a//b/"), "/a/b");
        assert_eq!(normalize("/a/./b/../c"), "/a/c");
        assert_eq!(normalize("/../.."), "/");
        assert_eq!(normalize("/a/b/../../.."), "/");
    }

    #[test]
    fn inside_is_the_prefix_or_below_it() {
        let p = Prefix::new("/benchfs/").expect("prefix");
        assert_eq!(p.as_str(), "/benchfs");
        assert_eq!(p.inside("/benchfs").as_deref(), Some("/"));
        assert_eq!(p.inside("/benchfs/a/b").as_deref(), Some("/a/b"));
        assert_eq!(p.inside("/benchfsX"), None);
        assert_eq!(p.inside("/tmp/benchfs"), None);
        assert_eq!(p.outside("/a"), "/benchfs/a");
        assert_eq!(p.outside("/"), "/benchfs");
        assert!(Prefix::new("/").is_err());
        assert!(Prefix::new("//..").is_err());
        assert!(Prefix::new("rel").is_err());
    }

    #[test]
    fn join_resolves_relative_names() {
        assert_eq!(join("/benchfs/d", "f"), "/benchfs/d/f");
        assert_eq!(join("/benchfs/d", "../e/./f"), "/benchfs/e/f");
        assert_eq!(join("/x", "/benchfs/f"), "/benchfs/f");
    }
}
