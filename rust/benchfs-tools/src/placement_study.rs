//! The placement study: BenchFS's stored layouts (the very code of `benchfs_core::placement`)
//! against hash placements and the naive stripe mapping, over a simulated creation of files;
//! `studies/placement/` drives it through `benchfs._core.PlacementStudy`, and
//! docs/namespace.md gives its numbers.

use benchfs_core::placement::{directory_rotation, metadata_owner, Domains, Layout, LayoutAllocator};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The naive stripe mapping `start + chunk mod n` (for the study only: it falls into the trap).
pub fn naive_stripe_index(start: u32, chunk: u64, n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    ((start as u64 + chunk) % n as u64) as u32
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
                        replicas: 1,
                        ..Layout::NONE
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

    /// The server indexes of the `replicas` copies of chunk `chunk` of file number `file` under
    /// BenchFS's default scheme (stored layouts), over `domains`: what the clients compute. None
    /// for a bad file index.
    pub fn copies(&self, file: usize, chunk: u64, replicas: u8, domains: &Domains) -> Option<Vec<usize>> {
        let f = self.files.get(file)?;
        let layout = Layout { replicas, ..f.layout };
        Some(domains.replica_servers(&layout, chunk, &[]))
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
    use benchfs_core::placement::stripe_index;

    /// 736 ranks with blocks of 16 (or 256) chunks on 16 servers, each rank on its k-th chunk
    /// at once: the naive mapping sends them all to one server, BenchFS's spreads them.
    #[test]
    fn the_naive_mapping_falls_into_the_strided_trap() {
        for block in [16u64, 32, 256, 4096] {
            for k in [0u64, 1, 7] {
                let mut ours = [0u32; 16];
                let mut naive = [0u32; 16];
                for rank in 0..736u64 {
                    ours[stripe_index(3, rank * block + k, 16) as usize] += 1;
                    naive[naive_stripe_index(3, rank * block + k, 16) as usize] += 1;
                }
                assert_eq!(naive.iter().max(), Some(&736));
                assert!(
                    *ours.iter().max().unwrap_or(&0) <= 51,
                    "block {block} step {k}: {ours:?}"
                );
            }
        }
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
