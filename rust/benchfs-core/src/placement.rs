//! Where chunks go. BenchFS stores a layout in each file's metadata when the file is created
//! (like Lustre's stripe layouts), so balance comes by construction: each metadata owner hands
//! out stripe starts from its own counter, staggered across owners. The other schemes here
//! exist for the placement study (`studies/placement/`), which drives this very code through
//! `benchfs._core.placement_servers`; docs/namespace.md gives the study's numbers.

use xxhash_rust::xxh3::xxh3_64_with_seed;

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
}

impl Layout {
    pub fn server_index(&self, chunk: u64) -> u32 {
        stripe_index(self.start, chunk, self.stripe_count)
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
/// round number. The rotation breaks the seed's trap: without it, IOR ranks whose blocks are a
/// multiple of `n` chunks (or `n`², ...) would all hit the same server on each step.
pub fn stripe_index(start: u32, chunk: u64, n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let n64 = n as u64;
    ((start as u64 + chunk % n64 + digit_sum(chunk / n64, n64)) % n64) as u32
}

/// The naive stripe mapping `start + chunk mod n` (for the study only: it falls into the trap).
pub fn naive_stripe_index(start: u32, chunk: u64, n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    ((start as u64 + chunk) % n as u64) as u32
}

/// Hands out layouts for the files one metadata owner creates: a per-owner counter, staggered
/// so that owners start at different servers. No global state is involved.
#[derive(Debug, Clone)]
pub struct LayoutAllocator {
    next: u64,
    stripe_count: u32,
    chunk_size: u64,
}

impl LayoutAllocator {
    /// Owner `owner` of `owners` metadata owners, striping over `stripe_count` servers.
    pub fn new(owner: u32, owners: u32, stripe_count: u32, chunk_size: u64) -> LayoutAllocator {
        let stagger = (owner as u64 * stripe_count as u64) / owners.max(1) as u64;
        LayoutAllocator {
            next: stagger,
            stripe_count,
            chunk_size,
        }
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

/// Jump consistent hash (Lamping and Veach): `key` to a bucket in `[0, buckets)`.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < buckets as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u32
}

/// The placement schemes the study compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// BenchFS's default: stored layouts; a new file starts where its directory's owner says
    /// (the directory's rotation plus its entry count), rounds rotated by digit sums.
    Layout,
    /// Stored layouts whose starts come from each inode owner's own staggered counter.
    LayoutOwner,
    /// Stored layouts with the naive `start + chunk mod n` mapping.
    LayoutNaive,
    /// `hash(file, chunk) mod n`.
    HashMod,
    /// Jump consistent hash of `hash(file, chunk)`.
    Jump,
    /// Rendezvous (highest random weight) hashing of `(file, chunk)` over the servers.
    Rendezvous,
    /// The original system: a byte-summing 32-bit path hash plus the chunk index, multiplied
    /// by the golden ratio (`((h + chunk) * 0x9e3779b9) >> 32 mod n`).
    Original,
}

impl Scheme {
    pub const ALL: [Scheme; 7] = [
        Scheme::Layout,
        Scheme::LayoutOwner,
        Scheme::LayoutNaive,
        Scheme::HashMod,
        Scheme::Jump,
        Scheme::Rendezvous,
        Scheme::Original,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::Layout => "layout",
            Scheme::LayoutOwner => "layout-owner",
            Scheme::LayoutNaive => "layout-naive",
            Scheme::HashMod => "hash-mod",
            Scheme::Jump => "jump",
            Scheme::Rendezvous => "rendezvous",
            Scheme::Original => "original",
        }
    }

    pub fn from_name(name: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The original's path hash: the sum of the path's bytes (equal for permuted names).
pub fn byte_sum_hash(path: &str) -> u32 {
    path.bytes().fold(0u32, |h, b| h.wrapping_add(b as u32))
}

/// One file as the study sees it: its path and, for stored layouts, the layout its metadata
/// owner assigned at create time.
struct StudyFile {
    key: u64,
    byte_sum: u32,
    /// The layout by directory sequence (the default) and by owner counter.
    layout: Layout,
    owner_layout: Layout,
}

/// A simulated creation of `paths` (in order) on `servers` servers with one metadata owner per
/// server, then chunk lookups by `scheme`. The same code as the servers and clients run.
pub struct Study {
    scheme: Scheme,
    servers: u32,
    files: Vec<StudyFile>,
}

impl Study {
    pub fn new(scheme: Scheme, servers: u32, paths: &[String]) -> Study {
        let servers = servers.max(1);
        let mut owners: Vec<LayoutAllocator> = (0..servers)
            .map(|o| LayoutAllocator::new(o, servers, servers, 1))
            .collect();
        let mut added: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        let files = paths
            .iter()
            .map(|p| {
                let dir = p
                    .rsplit_once('/')
                    .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
                let seq = added.entry(dir).or_insert(0);
                let start = ((directory_rotation(dir, servers) as u64 + *seq) % servers as u64) as u32;
                *seq += 1;
                StudyFile {
                    key: xxh3_64_with_seed(p.as_bytes(), 0x6669_6C65),
                    byte_sum: byte_sum_hash(p),
                    layout: Layout {
                        chunk_size: 1,
                        stripe_count: servers,
                        start,
                    },
                    owner_layout: owners[metadata_owner(p, servers) as usize].allocate(),
                }
            })
            .collect();
        Study {
            scheme,
            servers,
            files,
        }
    }

    /// Adds servers after the files were created (for the moved-data fraction).
    pub fn with_servers(&self, servers: u32) -> Study {
        Study {
            scheme: self.scheme,
            servers: servers.max(1),
            files: self
                .files
                .iter()
                .map(|f| StudyFile {
                    key: f.key,
                    byte_sum: f.byte_sum,
                    layout: f.layout,
                    owner_layout: f.owner_layout,
                })
                .collect(),
        }
    }

    /// The server index of chunk `chunk` of file number `file`, or None for a bad file index.
    pub fn server(&self, file: usize, chunk: u64) -> Option<u32> {
        let f = self.files.get(file)?;
        let n = self.servers;
        let chunk_key = || xxh3_64_with_seed(&chunk.to_le_bytes(), f.key);
        Some(match self.scheme {
            Scheme::Layout => f.layout.server_index(chunk),
            Scheme::LayoutOwner => f.owner_layout.server_index(chunk),
            Scheme::LayoutNaive => naive_stripe_index(f.layout.start, chunk, f.layout.stripe_count),
            Scheme::HashMod => (chunk_key() % n as u64) as u32,
            Scheme::Jump => jump_hash(chunk_key(), n),
            Scheme::Rendezvous => {
                let k = chunk_key();
                (0..n)
                    .max_by_key(|&s| xxh3_64_with_seed(&s.to_le_bytes(), k))
                    .unwrap_or(0)
            }
            Scheme::Original => {
                let key = f.byte_sum.wrapping_add(chunk as u32) as u64;
                (((key.wrapping_mul(0x9e37_79b9)) >> 32) % n as u64) as u32
            }
        })
    }
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

    /// The seed's trap: 736 ranks with blocks of 16 (or 256) chunks on 16 servers, each rank on
    /// its k-th chunk at once. The naive mapping sends them all to one server; ours spreads them.
    #[test]
    fn strided_steps_are_spread() {
        for block in [16u64, 32, 256, 4096] {
            for k in [0u64, 1, 7] {
                let mut ours = [0u32; 16];
                let mut naive = [0u32; 16];
                for rank in 0..736u64 {
                    ours[stripe_index(3, rank * block + k, 16) as usize] += 1;
                    naive[naive_stripe_index(3, rank * block + k, 16) as usize] += 1;
                }
                assert_eq!(naive.iter().max(), Some(&736));
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

    #[test]
    fn jump_hash_is_consistent() {
        let mut moved = 0;
        for key in 0..10_000u64 {
            let k = xxh3_64_with_seed(&key.to_le_bytes(), 1);
            let (a, b) = (jump_hash(k, 10), jump_hash(k, 11));
            assert!(a < 10 && b < 11);
            if a != b {
                assert_eq!(b, 10, "jump hash only moves keys to the new bucket");
                moved += 1;
            }
        }
        assert!((500..1400).contains(&moved), "moved {moved} of 10000");
    }

    #[test]
    fn byte_sum_collides_where_ids_must_not() {
        assert_eq!(byte_sum_hash("file.mdtest.3.7"), byte_sum_hash("file.mdtest.7.3"));
        assert_eq!(byte_sum_hash("/d/ab"), byte_sum_hash("/d/ba"));
    }
}
