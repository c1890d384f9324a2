//! A histogram of durations that observes without a lock: fixed buckets doubling from
//! 50 µs to about 3.3 s and one for the rest, each an atomic count, and
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

impl Durations {
    pub fn observe(&self, took: Duration) {
        let nanos = took.as_nanos().min(u64::MAX as u128) as u64;
        self.0.buckets[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Each bucket's own count (not running sums).
    fn counts(&self) -> Vec<u64> {
        self.0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

impl TypedMetric for Durations {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Durations {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // The encoder takes each bucket's own count and writes the running sums.
        let counts = self.counts();
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
}
