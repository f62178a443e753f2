//! Log-linear histograms: a value's bucket, bucket bounds, and the histogram a worker records into.

use std::cell::Cell;

/// Sub-buckets per power of two, as a number of bits: 2 bits = 4 sub-buckets, so a bucket is
/// at most 25% as wide as its lower bound.
pub const SUB_BUCKET_BITS: u32 = 2;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Buckets of every [`Histogram`]: together they cover all of `u64` (`0..=u64::MAX`).
pub const BUCKETS: usize = (65 - SUB_BUCKET_BITS as usize) * SUB_BUCKETS;

/// The bucket that holds `v`.
///
/// Log-linear buckets: values below `2^(SUB_BUCKET_BITS+1)` (0 to 7) have a bucket each; above
/// that, each power-of-two range `[2^e, 2^(e+1))` is split into `2^SUB_BUCKET_BITS` equal
/// buckets of width `2^(e-SUB_BUCKET_BITS)`. Index `i >= 4` covers
/// `[2^e + s*2^(e-2), 2^e + (s+1)*2^(e-2) - 1]` with `e = i/4 + 1`, `s = i%4`.
#[inline(always)]
pub fn bucket_index(v: u64) -> usize {
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // floor(log2 v) >= SUB_BUCKET_BITS
    let sub = (v >> (e - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1);
    (e - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS + sub
}

/// Smallest value of bucket `i` (indices past the last bucket mean the last bucket).
pub fn bucket_lo(i: usize) -> u64 {
    let i = i.min(BUCKETS - 1);
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let e = (i / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    let s = (i % SUB_BUCKETS) as u64;
    (1u64 << e) + (s << (e - SUB_BUCKET_BITS))
}

/// Largest value of bucket `i` (inclusive; `u64::MAX` for the last bucket).
pub fn bucket_hi(i: usize) -> u64 {
    let i = i.min(BUCKETS - 1);
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let e = (i / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    bucket_lo(i) + ((1u64 << (e - SUB_BUCKET_BITS)) - 1)
}

/// A fixed log-linear histogram over `u64` (see [`bucket_index`]), for one thread.
///
/// Exact for 0 to 7 (queue depths 1, 2, 3 stay apart); relative bucket width at most 25%
/// beyond; covers every `u64`, so nanosecond latencies of any length fit. `sum` wraps modulo
/// 2^64 (584 years of nanoseconds).
pub struct Histogram {
    counts: [Cell<u64>; BUCKETS],
    count: Cell<u64>,
    sum: Cell<u64>,
    min: Cell<u64>,
    max: Cell<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("sum", &self.sum())
            .field("min", &self.min())
            .field("max", &self.max())
            .finish()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: std::array::from_fn(|_| Cell::new(0)),
            count: Cell::new(0),
            sum: Cell::new(0),
            min: Cell::new(u64::MAX),
            max: Cell::new(0),
        }
    }

    /// Counts one value.
    #[inline(always)]
    pub fn record(&self, v: u64) {
        let c = &self.counts[bucket_index(v)];
        c.set(c.get() + 1);
        self.count.set(self.count.get() + 1);
        self.sum.set(self.sum.get().wrapping_add(v));
        if v < self.min.get() {
            self.min.set(v);
        }
        if v > self.max.get() {
            self.max.set(v);
        }
    }

    /// Counts `n` occurrences of one value (same as `n` calls of [`record`](Self::record)).
    #[inline(always)]
    pub fn record_n(&self, v: u64, n: u64) {
        if n == 0 {
            return;
        }
        let c = &self.counts[bucket_index(v)];
        c.set(c.get() + n);
        self.count.set(self.count.get() + n);
        self.sum.set(self.sum.get().wrapping_add(v.wrapping_mul(n)));
        if v < self.min.get() {
            self.min.set(v);
        }
        if v > self.max.get() {
            self.max.set(v);
        }
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count.get()
    }

    /// Sum of the values recorded (wrapping).
    pub fn sum(&self) -> u64 {
        self.sum.get()
    }

    /// Smallest value recorded, 0 if none.
    pub fn min(&self) -> u64 {
        if self.count() == 0 {
            0
        } else {
            self.min.get()
        }
    }

    /// Largest value recorded, 0 if none.
    pub fn max(&self) -> u64 {
        self.max.get()
    }

    /// Mean of the values recorded, 0.0 if none.
    pub fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum() as f64 / n as f64,
        }
    }

    /// Count in bucket `i` (0 for `i >= BUCKETS`).
    pub fn bucket_count(&self, i: usize) -> u64 {
        self.counts.get(i).map_or(0, Cell::get)
    }

    /// Smallest value of bucket `i`.
    pub fn bucket_lo(i: usize) -> u64 {
        bucket_lo(i)
    }

    /// Largest value of bucket `i` (inclusive).
    pub fn bucket_hi(i: usize) -> u64 {
        bucket_hi(i)
    }

    /// `(bucket index, count)` of the non-empty buckets, in increasing order of value.
    pub fn nonzero_buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.get()))
            .filter(|&(_, c)| c > 0)
    }

    /// The value at quantile `q` (0.0 to 1.0, clamped), 0 if empty.
    ///
    /// The value of rank `r = ceil(q * count)` (at least 1): the minimum for `r = 1`, the
    /// maximum for `r = count`, otherwise the midpoint of the bucket holding rank `r`, clamped
    /// to `[min, max]`. Exact in the exact buckets (0 to 7), otherwise within half a bucket
    /// (at most 12.5%) of the true value.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        if rank == 1 {
            return self.min();
        }
        if rank == n {
            return self.max();
        }
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.get();
            if seen >= rank {
                let (lo, hi) = (bucket_lo(i), bucket_hi(i));
                let mid = lo + (hi - lo) / 2;
                return mid.clamp(self.min(), self.max());
            }
        }
        self.max()
    }

    /// Adds everything `other` recorded to this histogram.
    pub fn merge_from(&self, other: &Histogram) {
        if other.count() == 0 {
            return;
        }
        for (mine, theirs) in self.counts.iter().zip(other.counts.iter()) {
            mine.set(mine.get() + theirs.get());
        }
        self.count.set(self.count.get() + other.count());
        self.sum.set(self.sum.get().wrapping_add(other.sum()));
        self.min.set(self.min.get().min(other.min()));
        self.max.set(self.max.get().max(other.max()));
    }

    /// Makes this histogram a copy of `other`.
    pub fn copy_from(&self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter().zip(other.counts.iter()) {
            mine.set(theirs.get());
        }
        self.count.set(other.count.get());
        self.sum.set(other.sum.get());
        self.min.set(other.min.get());
        self.max.set(other.max.get());
    }

    /// Forgets everything recorded.
    pub fn reset(&self) {
        for c in &self.counts {
            c.set(0);
        }
        self.count.set(0);
        self.sum.set(0);
        self.min.set(u64::MAX);
        self.max.set(0);
    }
}
