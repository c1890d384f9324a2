//! ④ The per-connection queue: what the hub has handed to one connection and its
//! transport has not written yet.
//!
//! Bounded by bytes. A push never waits: when a connection falls behind past the bound the
//! queue drops everything, marks itself overflowed and wakes its transport, which closes
//! the connection with "slow" (3003) so the client reconnects and resumes from history.
//! An idle queue holds no allocation.

use std::{collections::VecDeque, sync::Arc};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A publication encoded once by the hub and shared by every subscriber's queue.
#[derive(Debug)]
pub struct Delivery {
    /// The channel.
    pub channel: ChannelName,
    /// The stream epoch the offset belongs to.
    pub epoch: Epoch,
    /// The publication's offset.
    pub offset: u64,
    /// The encoded push, one JSON line without the newline.
    pub json: Bytes,
}

/// A connection's outbound queue.
#[derive(Debug)]
pub struct Queue {
    inner: Mutex<Inner>,
    wake: Notify,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    items: VecDeque<Arc<Delivery>>,
    bytes: usize,
    overflowed: bool,
}

impl Queue {
    /// An empty queue that overflows past `max_bytes` of encoded publications.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::default(),
            wake: Notify::new(),
            max_bytes,
        }
    }

    /// Adds a delivery; never blocks. Returns false if the queue has overflowed.
    pub fn push(&self, delivery: Arc<Delivery>) -> bool {
        let (wake, accepted) = {
            let mut inner = self.inner.lock();
            if inner.overflowed {
                return false;
            }
            inner.bytes += delivery.json.len();
            if inner.bytes > self.max_bytes {
                inner.overflowed = true;
                inner.items = VecDeque::new();
                inner.bytes = 0;
                (true, false)
            } else {
                inner.items.push_back(delivery);
                // One wake-up per batch: the transport drains everything queued meanwhile.
                (inner.items.len() == 1, true)
            }
        };
        if wake {
            self.wake.notify_one();
        }
        accepted
    }

    /// Waits until something is queued (or the queue overflowed).
    pub async fn ready(&self) {
        if self.has_work() {
            return;
        }
        self.wake.notified().await;
    }

    fn has_work(&self) -> bool {
        let inner = self.inner.lock();
        inner.overflowed || !inner.items.is_empty()
    }

    /// Takes queued deliveries, oldest first, until about `max_bytes` are taken.
    /// `Err(Overflowed)` once the queue has overflowed.
    pub fn take(&self, max_bytes: usize, out: &mut Vec<Arc<Delivery>>) -> Result<(), Overflowed> {
        let mut inner = self.inner.lock();
        if inner.overflowed {
            return Err(Overflowed);
        }
        let mut taken = 0;
        while taken < max_bytes {
            let Some(d) = inner.items.pop_front() else {
                break;
            };
            taken += d.json.len();
            out.push(d);
        }
        inner.bytes -= taken;
        if inner.items.is_empty() && inner.items.capacity() > 64 {
            // Give back a burst's memory once it has drained.
            inner.items = VecDeque::new();
        }
        Ok(())
    }
}

/// The queue overflowed: the connection fell too far behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflowed;

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(offset: u64, size: usize) -> Arc<Delivery> {
        Arc::new(Delivery {
            channel: ChannelName::new("c").unwrap(),
            epoch: Epoch::new("e"),
            offset,
            json: Bytes::from(vec![b'x'; size]),
        })
    }

    #[tokio::test]
    async fn takes_in_order_in_bounded_batches() {
        let q = Queue::new(1000);
        for i in 1..=5 {
            assert!(q.push(delivery(i, 10)));
        }
        q.ready().await;
        let mut out = Vec::new();
        q.take(25, &mut out).unwrap();
        assert_eq!(out.iter().map(|d| d.offset).collect::<Vec<_>>(), [1, 2, 3]);
        out.clear();
        q.take(1000, &mut out).unwrap();
        assert_eq!(out.iter().map(|d| d.offset).collect::<Vec<_>>(), [4, 5]);
    }

    #[tokio::test]
    async fn overflow_drops_everything_and_wakes_the_reader() {
        let q = Arc::new(Queue::new(100));
        assert!(q.push(delivery(1, 60)));
        let mut out = Vec::new();
        q.take(usize::MAX, &mut out).unwrap();
        assert!(q.push(delivery(2, 60)));
        assert!(!q.push(delivery(3, 60)), "past the bound");
        assert!(!q.push(delivery(4, 1)), "stays overflowed");
        q.ready().await;
        assert_eq!(q.take(usize::MAX, &mut out), Err(Overflowed));
    }
}
