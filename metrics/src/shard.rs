//! Single-writer counters and histograms.
//!
//! A [`Cell`] is written by one thread only (a target worker, an initiator session's I/O task),
//! so an increment is a relaxed load and a relaxed store: no locked instruction, no contention.
//! Readers (the scrape) load whenever they like and see some recent value; every value a reader
//! sees is one the writer stored, so a counter never goes backwards.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::buckets::{bound_seconds, bucket_index, BUCKETS};

/// A counter or gauge that one thread writes and any thread reads.
#[derive(Debug, Default)]
pub struct Cell(AtomicU64);

impl Cell {
    /// A cell holding zero.
    pub const fn new() -> Cell {
        Cell(AtomicU64::new(0))
    }

    /// Adds `count`. Only the cell's one writer may call this.
    #[inline]
    pub fn add(&self, count: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(count), Ordering::Relaxed);
    }

    /// Sets the value (a gauge). Only the cell's one writer may call this.
    #[inline]
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }

    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One writer's latency histogram: a count per bucket of [`crate::buckets`] and the sum.
#[derive(Debug)]
pub struct HistogramShard {
    buckets: [Cell; BUCKETS],
    sum_ns: Cell,
}

impl Default for HistogramShard {
    fn default() -> HistogramShard {
        HistogramShard { buckets: std::array::from_fn(|_| Cell::new()), sum_ns: Cell::new() }
    }
}

impl HistogramShard {
    /// Records one value in nanoseconds. Only the shard's one writer may call this.
    #[inline]
    pub fn record_ns(&self, value_ns: u64) {
        self.buckets[bucket_index(value_ns)].add(1);
        self.sum_ns.add(value_ns);
    }

    /// Adds this shard's counts to `into`.
    pub fn merge_into(&self, into: &mut HistogramSnapshot) {
        for (total, bucket) in into.buckets.iter_mut().zip(&self.buckets) {
            *total += bucket.get();
        }
        into.sum_ns = into.sum_ns.wrapping_add(self.sum_ns.get());
    }
}

/// Counts summed over shards, for encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Values per bucket (not cumulative).
    pub buckets: [u64; BUCKETS],
    /// Sum of the values, in nanoseconds.
    pub sum_ns: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> HistogramSnapshot {
        HistogramSnapshot { buckets: [0; BUCKETS], sum_ns: 0 }
    }
}

impl HistogramSnapshot {
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Sum in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// (upper bound in seconds, values in that bucket) for every bucket, `+Inf` last: what
    /// `MetricEncoder::encode_histogram` takes.
    pub fn encoder_buckets(&self) -> Vec<(f64, u64)> {
        self.buckets.iter().enumerate().map(|(index, &count)| (bound_seconds(index), count)).collect()
    }

    /// Encodes it as one histogram sample set of a family.
    pub fn encode(&self, encoder: &mut prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::NoLabelSet;
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds(), self.count(), &self.encoder_buckets(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_merge_into_one_snapshot() {
        let shards: Vec<HistogramShard> = (0..3).map(|_| HistogramShard::default()).collect();
        shards[0].record_ns(0);
        shards[0].record_ns(1024);
        shards[1].record_ns(1025);
        shards[1].record_ns(50_000);
        shards[2].record_ns(u64::MAX / 2);
        let mut merged = HistogramSnapshot::default();
        for shard in &shards {
            shard.merge_into(&mut merged);
        }
        assert_eq!(merged.count(), 5);
        assert_eq!(merged.buckets[0], 2);
        assert_eq!(merged.buckets[1], 1);
        assert_eq!(merged.buckets[bucket_index(50_000)], 1);
        assert_eq!(merged.buckets[BUCKETS - 1], 1);
        assert_eq!(merged.sum_ns, 1024 + 1025 + 50_000 + u64::MAX / 2);
        let buckets = merged.encoder_buckets();
        assert_eq!(buckets.len(), BUCKETS);
        assert_eq!(buckets[0], (1.024e-6, 2));
        assert_eq!(buckets[BUCKETS - 1], (f64::INFINITY, 1));
    }

    #[test]
    fn cells_add_and_set() {
        let cell = Cell::new();
        cell.add(3);
        cell.add(4);
        assert_eq!(cell.get(), 7);
        cell.set(2);
        assert_eq!(cell.get(), 2);
    }
}
