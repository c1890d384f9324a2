//! A gauge read when scraped from a count its owner keeps anyway, instead of written on
//! every change: a count changed by several threads many times a second (long-poll
//! sessions parked by the hub's threads and taken up by the workers) would otherwise move
//! one cache line between them on every change.

use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder},
    metrics::{MetricType, TypedMetric},
};

type Read = Box<dyn Fn() -> Option<i64> + Send + Sync>;

/// A gauge whose value is read from its owner when asked; 0 while it has none.
#[derive(Clone, Default)]
pub struct Reading(Arc<RwLock<Option<Read>>>);

impl Reading {
    /// Reads `count` of `owner` from now on, while `owner` lives.
    pub fn follow<T: Send + Sync + 'static>(&self, owner: Weak<T>, count: fn(&T) -> usize) {
        *self.0.write() = Some(Box::new(move || owner.upgrade().map(|o| count(&o) as i64)));
    }

    /// The value now.
    pub fn get(&self) -> i64 {
        self.0.read().as_ref().and_then(|read| read()).unwrap_or(0)
    }
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Reading").field(&self.get()).finish()
    }
}

impl TypedMetric for Reading {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for Reading {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_owner_while_it_lives() {
        let reading = Reading::default();
        assert_eq!(reading.get(), 0);
        let owner = Arc::new(vec![1, 2, 3]);
        reading.follow(Arc::downgrade(&owner), Vec::len);
        assert_eq!(reading.get(), 3);
        drop(owner);
        assert_eq!(reading.get(), 0);
    }
}
