//! A counter spread over cache lines, so that threads adding to it at once do not contend
//! for one: each thread adds to its own slot (threads are dealt slots in turn), and a
//! scrape sums them. For counts taken per delivery, where one shared atomic would bounce
//! between the cores fanning out.

use std::{
    cell::Cell,
    sync::atomic::{AtomicI64, AtomicUsize, Ordering},
};

const SLOTS: usize = 16;

/// A slot alone on its cache line (128 bytes: two lines, for CPUs that fetch pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Slot(AtomicI64);

/// A sum that many threads add to without sharing a cache line. Signed, so it also serves
/// as a gauge (queued bytes go up and down, possibly on different threads).
#[derive(Debug, Default)]
pub struct Sharded([Slot; SLOTS]);

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn my_slot() -> usize {
    MY_SLOT.with(|slot| {
        slot.get().unwrap_or_else(|| {
            let mine = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
            slot.set(Some(mine));
            mine
        })
    })
}

impl Sharded {
    /// Adds `n` (negative to take away).
    pub fn add(&self, n: i64) {
        self.0[my_slot()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The sum of every thread's additions (not a snapshot across threads: each slot is
    /// read once, so additions made meanwhile may or may not be in it).
    pub fn sum(&self) -> i64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sums_what_every_thread_added() {
        let counter = Arc::new(Sharded::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        c.add(3);
                    }
                    c.add(-1);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.sum(), 8 * 30_000 - 8);
    }
}
