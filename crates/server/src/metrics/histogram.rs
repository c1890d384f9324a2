//! A histogram of durations that observes without a lock: fixed buckets doubling from
//! 50 µs (the last one holds everything from about 1.6 s up), each an atomic count, and
//! the sum in nanoseconds. prometheus-client's own histogram takes a lock per observation;
//! this one is two atomic adds, and shares its counts by `Arc` like the crate's metrics,
//! so families can hand a clone to whoever observes.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric},
};

/// Upper bounds: 50 µs × 2^i.
const BUCKETS: usize = 17;
const FIRST_NANOS: u64 = 50_000;

#[derive(Debug, Default)]
struct Counts {
    buckets: [AtomicU64; BUCKETS + 1],
    sum_nanos: AtomicU64,
}

/// Durations, bucketed (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Durations(Arc<Counts>);

/// The index of the first bucket whose bound holds `nanos` (the last: beyond every bound).
fn bucket(nanos: u64) -> usize {
    if nanos <= FIRST_NANOS {
        return 0;
    }
    // The smallest i with FIRST << i >= nanos.
    let ratio = nanos.div_ceil(FIRST_NANOS);
    let i = (u64::BITS - (ratio - 1).leading_zeros()) as usize;
    i.min(BUCKETS)
}

fn bound(i: usize) -> f64 {
    (FIRST_NANOS << i) as f64 / 1e9
}

/// A histogram's counts at one moment, for percentiles between two moments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    counts: Vec<u64>,
}

impl Snapshot {
    /// The `q`-quantile (0 < q ≤ 1) of what was observed between `earlier` and this one,
    /// as the upper bound of the bucket it falls in (seconds); `None` when nothing was.
    pub fn quantile_since(&self, earlier: &Snapshot, q: f64) -> Option<f64> {
        let delta: Vec<u64> = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| c - earlier.counts.get(i).copied().unwrap_or(0))
            .collect();
        let total: u64 = delta.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in delta.iter().enumerate() {
            seen += n;
            if seen >= rank {
                // The overflow bucket has no bound: report the last one.
                return Some(bound(i.min(BUCKETS - 1)));
            }
        }
        None
    }
}

impl Durations {
    pub fn observe(&self, took: Duration) {
        let nanos = took.as_nanos().min(u64::MAX as u128) as u64;
        self.0.buckets[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self
                .0
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

impl TypedMetric for Durations {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Durations {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // The encoder takes each bucket's own count and writes the running sums.
        let counts = self.snapshot().counts;
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| (if i < BUCKETS { bound(i) } else { f64::INFINITY }, n))
            .collect();
        let count = counts.iter().sum();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_from_50_microseconds() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(50_000), 0);
        assert_eq!(bucket(50_001), 1);
        assert_eq!(bucket(100_000), 1);
        assert_eq!(bucket(100_001), 2);
        assert_eq!(bucket(FIRST_NANOS << 16), 16);
        assert_eq!(bucket((FIRST_NANOS << 16) + 1), BUCKETS);
        assert_eq!(bucket(u64::MAX), BUCKETS);
    }

    #[test]
    fn encodes_running_sums_up_to_inf() {
        let h = Durations::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(70));
        h.observe(Duration::from_secs(60));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("d", "d", h);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "d_count 3\n",
            "d_bucket{le=\"0.00005\"} 1\n",
            "d_bucket{le=\"0.0001\"} 2\n",
            "d_bucket{le=\"3.2768\"} 2\n",
            "d_bucket{le=\"+Inf\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn quantiles_between_two_snapshots() {
        let h = Durations::default();
        for _ in 0..10 {
            h.observe(Duration::from_millis(5));
        }
        let before = h.snapshot();
        for _ in 0..99 {
            h.observe(Duration::from_micros(40));
        }
        h.observe(Duration::from_millis(3));
        let now = h.snapshot();
        assert_eq!(now.quantile_since(&before, 0.5), Some(0.000_05));
        // 99 of 100 at or under 50 µs; the 100th is 3 ms, in the bucket up to 3.2 ms.
        assert_eq!(now.quantile_since(&before, 0.99), Some(0.000_05));
        assert_eq!(now.quantile_since(&before, 1.0), Some(0.0032));
        assert_eq!(now.quantile_since(&now, 0.5), None);
    }
}
