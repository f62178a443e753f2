//! Where things live, in one place for the client and the servers: a path's metadata owner, a
//! chunk's server (by the file's layout) and worker. BenchFS stores a layout in each file's
//! metadata when the file is created (like Lustre's stripe layouts), so balance comes by
//! construction: each metadata owner hands out stripe starts from its own counter, staggered
//! across owners. The placement study
//! (`benchfs_tools::placement_study`) compares this very code with other schemes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::lost::Event;

use crate::chunking::FileId;

/// A worker of a server: (server index in the membership, worker index on that server).
pub type Target = (usize, usize);

/// A file's data layout, decided at create time and never changed: chunk `c` lives on the
/// server at index [`Layout::server_index`] among the first `stripe_count` servers of the
/// membership (ordered by id). A server added later is not in existing layouts, so adding one
/// moves no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub chunk_size: u64,
    pub stripe_count: u32,
    /// Index of the server holding chunk 0.
    pub start: u32,
    /// Copies of each chunk, on that many servers of distinct failure domains
    /// ([`Domains::replica_servers`]); 1 to [`MAX_REPLICAS`].
    pub replicas: u8,
    /// The file's bytes are kept with its inode at its metadata owner, not in chunks (a small
    /// file: `layout.inline_max`); they move into chunks, once, when the file outgrows it.
    pub inline: bool,
    /// Which chunks hold the file's bytes: 0 for a file made with chunks, else the move out
    /// of its inode that succeeded (each attempt writes chunks of its own, see
    /// [`crate::namespace::Attr::data_id`]); at most [`MAX_GENERATION`].
    pub generation: u16,
}

/// The largest chunk generation (15 bits: an attribute keeps it with the inline flag).
pub const MAX_GENERATION: u16 = 0x7fff;

/// The most copies of a chunk a layout may ask for.
pub const MAX_REPLICAS: u8 = 3;

impl Layout {
    /// The layout of what has no data of its own (directories, links).
    pub const NONE: Layout = Layout {
        chunk_size: 0,
        stripe_count: 0,
        start: 0,
        replicas: 0,
        inline: false,
        generation: 0,
    };

    pub fn server_index(&self, chunk: u64) -> u32 {
        stripe_index(self.start, chunk, self.stripe_count)
    }
}

/// The servers' failure domains, as placement sees them: a ring of the server indexes in which
/// the domains take turns (the first server of each domain, then the second of each, ...), so
/// that a server's next one on the ring is in another domain whenever the domains are of equal
/// size. A chunk's copies are its primary server and the next servers on the ring of domains
/// not yet used; since "next" is a one-to-one map, the copies spread as evenly as the
/// primaries do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domains {
    /// Server index -> its domain's number.
    domain: Vec<u32>,
    /// The ring: server indexes, domains taking turns.
    ring: Vec<u32>,
    /// Server index -> its position on the ring.
    position: Vec<u32>,
}

impl Domains {
    /// From each server's domain name, in membership order.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Domains {
        let mut numbers: Vec<&str> = Vec::new();
        let mut members: Vec<Vec<u32>> = Vec::new();
        let domain: Vec<u32> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let d = match numbers.iter().position(|&m| m == n.as_ref()) {
                    Some(d) => d,
                    None => {
                        numbers.push(n.as_ref());
                        members.push(Vec::new());
                        numbers.len() - 1
                    }
                };
                members[d].push(i as u32);
                d as u32
            })
            .collect();
        let rounds = members.iter().map(Vec::len).max().unwrap_or(0);
        let ring: Vec<u32> = (0..rounds)
            .flat_map(|k| members.iter().filter_map(move |m| m.get(k).copied()))
            .collect();
        let mut position = vec![0u32; names.len()];
        for (p, &s) in ring.iter().enumerate() {
            position[s as usize] = p as u32;
        }
        Domains {
            domain,
            ring,
            position,
        }
    }

    /// Every server in a domain of its own.
    pub fn distinct(servers: usize) -> Domains {
        let names: Vec<String> = (0..servers).map(|i| i.to_string()).collect();
        Domains::new(&names)
    }

    /// How many domains the servers span.
    pub fn count(&self) -> usize {
        self.domain.iter().max().map_or(0, |&d| d as usize + 1)
    }

    /// The domain number of the server at `index`.
    pub fn of(&self, index: usize) -> u32 {
        self.domain.get(index).copied().unwrap_or(0)
    }

    /// The servers holding the copies of `chunk`, primary first: walking the ring from the
    /// primary, servers of the stripe not in `skip` (servers declared lost) whose domain no
    /// copy has yet; when the domains run out, servers of used domains not yet chosen. Fewer
    /// than `layout.replicas` only when the stripe has fewer servers outside `skip`. A layout
    /// of one copy ignores `skip`: its chunk is on its primary or nowhere.
    pub fn replica_servers(&self, layout: &Layout, chunk: u64, skip: &[usize]) -> Vec<usize> {
        let want = layout.replicas.max(1) as usize;
        let primary = layout.server_index(chunk) as usize;
        // One copy has nowhere else to be: its server, lost or not.
        if want == 1 || primary >= self.ring.len() {
            return vec![primary];
        }
        let placed = self.walk(layout, primary, &[], Vec::new(), want);
        if !placed.iter().any(|s| skip.contains(s)) {
            return placed;
        }
        // The copies left keep their places and come first (they hold every byte written
        // before the loss); stand-ins follow.
        let left = placed.into_iter().filter(|s| !skip.contains(s)).collect();
        self.walk(layout, primary, skip, left, want)
    }

    /// The servers keeping the copies of the metadata of the owners on server `owner_server`
    /// (`replicas` of them: the server itself and the next ones on the ring of domains, as a
    /// chunk whose primary is that server), after the record of lost servers' `events`, in the
    /// order they serve. A server declared lost leaves; the next server on the ring not yet a
    /// copy stands in for it and takes changes from then on (`joining`); a `repaired` line
    /// (written once a repair handed the joining copies the serving copy's state) makes the
    /// stand-ins then joining complete. A declared server being caught up (`joining`) takes
    /// changes; `rejoined`, it is a complete copy again in its place, and its stand-in leaves.
    /// `complete` hold every change (the first serves): the original copies left in their
    /// order, then the stand-ins repaired, in the order they came.
    pub fn metadata_servers(&self, owner_server: usize, replicas: u8, events: &[Event]) -> MetadataCopies {
        let layout = Layout {
            chunk_size: 1,
            stripe_count: self.ring.len() as u32,
            start: owner_server as u32,
            replicas: replicas.clamp(1, MAX_REPLICAS),
            inline: false,
            generation: 0,
        };
        let original = self.replica_servers(&layout, 0, &[]);
        if layout.replicas == 1 {
            return MetadataCopies {
                complete: original,
                joining: Vec::new(),
            };
        }
        // (server, complete, the original copy it stands in for)
        let mut members: Vec<(usize, bool, Option<usize>)> =
            original.iter().map(|&s| (s, true, None)).collect();
        let mut lost: Vec<usize> = Vec::new();
        let mut returning: Vec<usize> = Vec::new();
        for event in events {
            match *event {
                Event::Lost(id) => {
                    let x = id as usize;
                    if !lost.contains(&x) {
                        lost.push(x);
                    }
                    returning.retain(|&r| r != x);
                    if let Some(i) = members.iter().position(|m| m.0 == x) {
                        let left = members.remove(i);
                        let stands_for = left.2.unwrap_or(x);
                        let next = self
                            .replica_servers(&layout, 0, &lost)
                            .into_iter()
                            .find(|s| members.iter().all(|m| m.0 != *s));
                        if let Some(s) = next {
                            members.push((s, false, Some(stands_for)));
                        }
                    }
                }
                Event::Repaired(_) => members.iter_mut().for_each(|m| m.1 = true),
                Event::Joining(id) => {
                    let x = id as usize;
                    if lost.contains(&x) && original.contains(&x) && !returning.contains(&x) {
                        returning.push(x);
                    }
                }
                Event::Rejoined(id) => {
                    let x = id as usize;
                    lost.retain(|&l| l != x);
                    returning.retain(|&r| r != x);
                    if original.contains(&x) && members.iter().all(|m| m.0 != x) {
                        members.retain(|m| m.2 != Some(x));
                        members.push((x, true, None));
                    }
                }
            }
        }
        // Originals first, in their order; then stand-ins in the order they came.
        let rank = |s: usize| original.iter().position(|&o| o == s).unwrap_or(usize::MAX);
        members.sort_by_key(|m| (m.2.is_some(), if m.2.is_none() { rank(m.0) } else { 0 }));
        let complete = members.iter().filter(|m| m.1).map(|m| m.0).collect();
        let mut joining: Vec<usize> = members.iter().filter(|m| !m.1).map(|m| m.0).collect();
        joining.extend(returning);
        MetadataCopies { complete, joining }
    }

    /// `out` completed to `want` servers from the ring, starting at `primary`.
    fn walk(
        &self,
        layout: &Layout,
        primary: usize,
        skip: &[usize],
        mut out: Vec<usize>,
        want: usize,
    ) -> Vec<usize> {
        let n = self.ring.len();
        let from = self.position[primary] as usize;
        let in_stripe = |s: usize| s < layout.stripe_count.max(1) as usize && !skip.contains(&s);
        for distinct_domains in [true, false] {
            for k in 0..n {
                if out.len() == want {
                    return out;
                }
                let s = self.ring[(from + k) % n] as usize;
                if !in_stripe(s) || out.contains(&s) {
                    continue;
                }
                if distinct_domains && out.iter().any(|&o| self.domain[o] == self.domain[s]) {
                    continue;
                }
                out.push(s);
            }
        }
        out
    }
}

/// Where a metadata owner's copies are ([`Domains::metadata_servers`]): server indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataCopies {
    /// Copies holding every change; the first serves the owner's requests (none: every copy
    /// is declared lost).
    pub complete: Vec<usize>,
    /// Servers standing in for declared copies: they take changes, never serve.
    pub joining: Vec<usize>,
}

impl MetadataCopies {
    /// The server serving the owner's requests.
    pub fn serving(&self) -> Option<usize> {
        self.complete.first().copied()
    }

    /// Every copy but the serving one: where its changes are mirrored.
    pub fn mirrors(&self) -> impl Iterator<Item = usize> + '_ {
        self.complete.iter().skip(1).chain(&self.joining).copied()
    }
}

/// Sum of the base-`n` digits of `x`, modulo `n`.
fn digit_sum(mut x: u64, n: u64) -> u64 {
    let mut sum = 0u64;
    while x > 0 {
        sum += x % n;
        x /= n;
    }
    sum % n
}

/// The stripe mapping: consecutive chunks take consecutive servers (every run of `n` chunks
/// touches each server once), and each round of `n` chunks is rotated by the digit sum of its
/// round number. The rotation breaks a trap: without it, IOR ranks whose blocks are a
/// multiple of `n` chunks (or `n`², ...) would all hit the same server on each step.
pub fn stripe_index(start: u32, chunk: u64, n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let n64 = n as u64;
    ((start as u64 + chunk % n64 + digit_sum(chunk / n64, n64)) % n64) as u32
}

/// The worker (event loop) of the chosen server that serves a chunk: a file's consecutive
/// chunks on one server rotate over its workers.
pub fn chunk_worker(file: FileId, chunk: u64, servers: usize, workers: usize) -> usize {
    if servers == 0 || workers == 0 {
        return 0;
    }
    let mixed = ((file.0 >> 64) as u64).rotate_left(17) ^ (file.0 as u64);
    ((chunk / servers as u64 + mixed % workers as u64) % workers as u64) as usize
}

/// Where chunk `chunk` of file `id` with `layout` lives, among `servers` servers of
/// `workers_of(server)` workers each.
pub fn chunk_target(
    id: FileId,
    layout: &Layout,
    chunk: u64,
    servers: usize,
    workers_of: impl Fn(usize) -> usize,
) -> Target {
    let s = layout.server_index(chunk) as usize;
    (s, chunk_worker(id, chunk, servers, workers_of(s)))
}

/// The worker that owns `path`'s metadata among `servers` servers of `workers` workers each
/// (every worker is one metadata owner).
pub fn metadata_target(path: &str, servers: usize, workers: usize) -> Target {
    let w = workers.max(1);
    let o = metadata_owner(path, (servers * w) as u32) as usize;
    (o / w, o % w)
}

/// The worker that keeps the advisory locks of file `id` among `servers` servers of `workers`
/// workers each: from the id, not the path, so that a rename does not move them.
pub fn lock_target(id: FileId, servers: usize, workers: usize) -> Target {
    let w = workers.max(1);
    let o = (xxhash_rust::xxh3::xxh3_64(&id.0.to_le_bytes()) % (servers.max(1) * w) as u64) as usize;
    (o / w, o % w)
}

/// Hands out layouts for the files one metadata owner creates: a per-owner counter, staggered
/// so that owners start at different servers. No global state is involved.
#[derive(Debug, Clone)]
pub struct LayoutAllocator {
    next: u64,
    stripe_count: u32,
    chunk_size: u64,
    replicas: u8,
}

impl LayoutAllocator {
    /// Owner `owner` of `owners` metadata owners, striping over `stripe_count` servers.
    pub fn new(owner: u32, owners: u32, stripe_count: u32, chunk_size: u64) -> LayoutAllocator {
        let stagger = (owner as u64 * stripe_count as u64) / owners.max(1) as u64;
        LayoutAllocator {
            next: stagger,
            stripe_count,
            chunk_size,
            replicas: 1,
        }
    }

    /// Layouts handed out from now on keep `replicas` copies of each chunk.
    pub fn with_replicas(mut self, replicas: u8) -> LayoutAllocator {
        self.replicas = replicas.clamp(1, MAX_REPLICAS);
        self
    }

    pub fn stripe_count(&self) -> u32 {
        self.stripe_count
    }

    /// The layout starting at `start`, or None when `start` is not a server of the stripe.
    pub fn at(&self, start: u32) -> Option<Layout> {
        (start < self.stripe_count.max(1)).then_some(Layout {
            chunk_size: self.chunk_size,
            stripe_count: self.stripe_count,
            start,
            replicas: self.replicas,
            inline: false,
            generation: 0,
        })
    }

    pub fn allocate(&mut self) -> Layout {
        let n = self.stripe_count.max(1) as u64;
        let start = (self.next % n) as u32;
        self.next = self.next.wrapping_add(1);
        Layout {
            chunk_size: self.chunk_size,
            stripe_count: self.stripe_count,
            start,
            replicas: self.replicas,
            inline: false,
            generation: 0,
        }
    }
}

/// Where a directory's files start striping: a per-directory rotation, so that small
/// directories do not all start at server 0.
pub fn directory_rotation(dir: &str, servers: u32) -> u32 {
    (xxh3_64_with_seed(dir.as_bytes(), 0x726F_7461) % servers.max(1) as u64) as u32
}

/// The metadata owner of `path` among `owners` (every server worker is one owner).
pub fn metadata_owner(path: &str, owners: u32) -> u32 {
    if owners <= 1 {
        return 0;
    }
    (xxh3_64_with_seed(path.as_bytes(), 0x6D65_7461) % owners as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_of_n_chunks_touches_every_server_once() {
        for n in [1u32, 2, 3, 16, 17, 64] {
            for start in [0, 1, n.saturating_sub(1)] {
                for round in [0u64, 1, 5, n as u64, (n as u64).pow(2)] {
                    let mut seen: Vec<u32> = (0..n as u64)
                        .map(|i| stripe_index(start, round * n as u64 + i, n))
                        .collect();
                    seen.sort_unstable();
                    assert_eq!(
                        seen,
                        (0..n).collect::<Vec<_>>(),
                        "n={n} start={start} round={round}"
                    );
                }
            }
        }
    }

    /// The trap of a naive `start + chunk mod n`: 736 ranks with blocks of 16 (or 256) chunks
    /// on 16 servers, each rank on its k-th chunk at once, would all hit one server; ours
    /// spreads them (the placement study shows the naive mapping falling in).
    #[test]
    fn strided_steps_are_spread() {
        for block in [16u64, 32, 256, 4096] {
            for k in [0u64, 1, 7] {
                let mut ours = [0u32; 16];
                for rank in 0..736u64 {
                    ours[stripe_index(3, rank * block + k, 16) as usize] += 1;
                }
                let max = *ours.iter().max().unwrap_or(&0) as f64;
                assert!(max / 46.0 <= 1.10, "block {block} step {k}: {ours:?}");
            }
        }
    }

    #[test]
    fn owners_are_staggered_and_count_on() {
        let mut a = LayoutAllocator::new(0, 16, 16, 1 << 20);
        let mut b = LayoutAllocator::new(5, 16, 16, 1 << 20);
        assert_eq!((a.allocate().start, a.allocate().start), (0, 1));
        assert_eq!(b.allocate().start, 5);
        let mut c = LayoutAllocator::new(3, 32, 16, 1 << 20);
        assert_eq!(c.allocate().start, 1);
    }

    fn layout(stripe: u32, replicas: u8) -> Layout {
        Layout {
            chunk_size: 1,
            stripe_count: stripe,
            start: 0,
            replicas,
            ..Layout::NONE
        }
    }

    /// Copies go to distinct domains; the load of 16 servers on 4 nodes (ids consecutive per
    /// node) stays even; a skipped server's copies move to the next server of another domain.
    #[test]
    fn copies_are_on_distinct_domains_and_spread_evenly() {
        let names: Vec<String> = (0..16).map(|i| format!("node{}", i / 4)).collect();
        let d = Domains::new(&names);
        assert_eq!(d.count(), 4);
        let l = layout(16, 2);
        let mut load = [0u32; 16];
        for c in 0..16_000u64 {
            let r = d.replica_servers(&l, c, &[]);
            assert_eq!(r.len(), 2);
            assert_ne!(d.of(r[0]), d.of(r[1]), "chunk {c}: {r:?}");
            assert_eq!(r[0], l.server_index(c) as usize);
            for s in r {
                load[s] += 1;
            }
        }
        assert!(load.iter().all(|&n| n == 2000), "{load:?}");
        let r3 = layout(16, 3);
        for c in 0..100 {
            let r = d.replica_servers(&r3, c, &[5]);
            assert_eq!(r.len(), 3);
            assert!(!r.contains(&5));
            let mut doms: Vec<u32> = r.iter().map(|&s| d.of(s)).collect();
            doms.dedup();
            assert_eq!(doms.len(), 3, "chunk {c}: {r:?}");
        }
    }

    /// One domain for all (one host): copies on distinct servers; more copies than servers:
    /// as many as there are.
    #[test]
    fn too_few_domains_fall_back_to_distinct_servers() {
        let d = Domains::new(&["a", "a", "a"]);
        let r = d.replica_servers(&layout(3, 2), 2, &[]);
        assert_eq!(r, vec![2, 0]);
        assert_eq!(d.replica_servers(&layout(2, 3), 0, &[]), vec![0, 1]);
        assert_eq!(d.replica_servers(&layout(3, 1), 1, &[]), vec![1]);
        assert_eq!(d.replica_servers(&layout(3, 2), 1, &[1]), vec![2, 0]);
    }

    /// Domains of unequal size (three servers on one node, one on another): a lost copy's
    /// stand-in never goes before the copy left, which alone holds the bytes written before.
    #[test]
    fn the_copy_left_comes_before_its_stand_in() {
        let d = Domains::new(&["a", "a", "b", "a"]);
        for c in 0..4 {
            let placed = d.replica_servers(&layout(4, 2), c, &[]);
            for &lost in &placed {
                let now = d.replica_servers(&layout(4, 2), c, &[lost]);
                let left = placed.iter().find(|&&s| s != lost).copied();
                assert_eq!(
                    now.first().copied(),
                    left,
                    "chunk {c}, {placed:?} without {lost}: {now:?}"
                );
                assert_eq!(now.len(), 2);
                assert!(!now.contains(&lost));
            }
        }
    }

    /// A metadata owner's copies: its own server first, then other domains; a declared copy's
    /// stand-in takes changes but never serves until repaired, and the copy left serves; a
    /// declared copy being caught up takes changes and serves once rejoined; a stand-in
    /// repaired stays complete when the other copy is lost later.
    #[test]
    fn metadata_copies_follow_the_record() {
        use crate::lost::Event::{Joining, Lost, Rejoined, Repaired};
        let d = Domains::new(&["a", "a", "b", "b"]);
        for owner in 0..4 {
            let c = d.metadata_servers(owner, 2, &[]);
            assert_eq!(c.serving(), Some(owner));
            assert_eq!(c.complete.len(), 2);
            assert_ne!(d.of(c.complete[0]), d.of(c.complete[1]), "{c:?}");
            assert!(c.joining.is_empty());
            let (me, other) = (owner as u32, c.complete[1]);
            let after = d.metadata_servers(owner, 2, &[Lost(me)]);
            assert_eq!(after.complete, vec![other], "owner {owner} lost");
            assert_eq!(after.joining.len(), 1);
            let stand_in = after.joining[0];
            assert!(stand_in != owner && stand_in != other);
            assert_eq!(after.mirrors().collect::<Vec<_>>(), after.joining);
            let repaired = d.metadata_servers(owner, 2, &[Lost(me), Repaired(me)]);
            assert_eq!(repaired.complete, vec![other, stand_in]);
            let second = d.metadata_servers(owner, 2, &[Lost(me), Repaired(me), Lost(other as u32)]);
            assert_eq!(second.serving(), Some(stand_in), "{second:?}");
            let back = d.metadata_servers(owner, 2, &[Lost(me), Joining(me)]);
            assert_eq!(back.complete, vec![other]);
            assert_eq!(back.joining, vec![stand_in, owner]);
            let rejoined = d.metadata_servers(owner, 2, &[Lost(me), Joining(me), Rejoined(me)]);
            assert_eq!(rejoined.complete, vec![owner, other]);
            assert!(rejoined.joining.is_empty());
            let none = d.metadata_servers(owner, 2, &[Lost(me), Lost(other as u32)]);
            assert_eq!(none.serving(), None);
        }
        assert_eq!(d.metadata_servers(3, 1, &[Lost(3)]).complete, vec![3]);
    }

    #[test]
    fn a_servers_chunks_rotate_over_its_workers() {
        let f = FileId(0x1234_5678_9abc_def0_1122_3344_5566_7788);
        let (servers, workers) = (3u32, 4);
        let mut per_worker = vec![0; workers];
        for c in (0..120).filter(|&c| stripe_index(0, c, servers) == 0) {
            per_worker[chunk_worker(f, c, servers as usize, workers)] += 1;
        }
        assert_eq!(per_worker, vec![10; 4]);
    }
}
