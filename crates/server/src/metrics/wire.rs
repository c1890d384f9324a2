//! One transport's connections: open and accepted, pushes written, their bytes, bytes
//! waiting in queues, and how long a publication took from the hub to the socket (sampled). A
//! connection's queue holds its transport's [`Wire`] and counts as it hands pushes over, a
//! batch at a time; every count is a [`Sharded`] add, so fan-out threads never share a
//! cache line for it.

use std::{cell::Cell, time::Instant};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

use super::{sharded::Sharded, Durations};

/// One write in this many (per thread) has its latency observed: a histogram observation
/// takes a lock, which must not happen per delivery.
const SAMPLE_EVERY: u32 = 64;

thread_local! {
    static UNTIL_SAMPLE: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread's next write is the sampled one.
fn sample_now() -> bool {
    UNTIL_SAMPLE.with(|left| match left.get() {
        0 => {
            left.set(SAMPLE_EVERY - 1);
            true
        }
        n => {
            left.set(n - 1);
            false
        }
    })
}

/// One transport's counters.
#[derive(Debug)]
pub struct Wire {
    pub(super) transport: &'static str,
    pub(super) pushes: Sharded,
    pub(super) bytes: Sharded,
    pub(super) queued: Sharded,
    latency: Durations,
    /// Shared with the `connections` and `connections_accepted` families: opening a
    /// connection takes no lock.
    open: Gauge,
    accepted: Counter,
}

impl Wire {
    pub(super) fn new(
        transport: &'static str,
        latency: Durations,
        open: Gauge,
        accepted: Counter,
    ) -> Self {
        Self {
            transport,
            pushes: Sharded::default(),
            bytes: Sharded::default(),
            queued: Sharded::default(),
            latency,
            open,
            accepted,
        }
    }

    pub(super) fn opened(&self) {
        self.accepted.inc();
        self.open.inc();
    }

    pub(super) fn closed(&self) {
        self.open.dec();
    }

    /// `pushes` pushes of `bytes` (encoded, before the transport's framing) were handed to
    /// the socket; the oldest reached the hub at `oldest`.
    pub fn written(&self, pushes: usize, bytes: usize, oldest: Instant) {
        self.pushes.add(pushes as i64);
        self.bytes.add(bytes as i64);
        if sample_now() {
            self.latency.observe(oldest.elapsed());
        }
    }

    /// Bytes entered (positive) or left (negative) a queue of this transport.
    pub fn queued(&self, bytes: i64) {
        self.queued.add(bytes);
    }
}
