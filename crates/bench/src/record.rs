//! What a worker's clients record (arrivals, latency, errors, bytes) and what it reports to
//! its parent: shared by the clients that record and the worker that reports.

use std::{
    collections::{BTreeMap, HashMap},
    ops::Deref,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::Instant,
};

use hdrhistogram::{
    serialization::{Serializer, V2Serializer},
    Histogram,
};
use serde::{Deserialize, Serialize};

use crate::netinfo::Wire;

/// Clients that speak (publish) every `every_ms`, the first after `offset_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Speak {
    pub every_ms: u64,
    pub offset_ms: u64,
    pub text: String,
}

/// What a worker tells its parent, every 250 ms and once at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub elapsed_s: f64,
    pub started: u64,
    pub connected: u64,
    pub accepted: u64,
    pub dropped: u64,
    pub received: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub errors: BTreeMap<String, u64>,
    pub first_error_s: Option<f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub packets_in: u64,
    pub packets_out: u64,
    /// Latency (µs) of what arrived since the previous report.
    pub interval_p50_us: u64,
    pub interval_p99_us: u64,
    pub interval_max_us: u64,
    /// Per publication (`seq`) updated since the previous report: (seq, count, min µs, max µs).
    pub seqs: Vec<(u64, u64, u64, u64)>,
    /// `presence` pushes received, the joins and leaves they listed, and their bytes.
    #[serde(default)]
    pub presence_pushes: u64,
    #[serde(default)]
    pub presence_changes: u64,
    #[serde(default)]
    pub presence_bytes: u64,
    pub done: bool,
}

/// Everything one worker's clients record.
pub struct Recorder {
    pub wire: Arc<Wire>,
    started: Instant,
    connected: AtomicU64,
    accepted: AtomicU64,
    dropped: AtomicU64,
    received: AtomicU64,
    duplicates: AtomicU64,
    gaps: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    first_error: Mutex<Option<f64>>,
    latency: Mutex<(Histogram<u64>, Histogram<u64>)>,
    seqs: Mutex<HashMap<u64, (u64, u64, u64, bool)>>,
    presence_pushes: AtomicU64,
    presence_changes: AtomicU64,
    presence_bytes: AtomicU64,
}

impl Recorder {
    pub fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds are valid");
        Self {
            wire: Arc::default(),
            started: Instant::now(),
            connected: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            received: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            errors: Mutex::default(),
            first_error: Mutex::default(),
            latency: Mutex::new((h(), h())),
            seqs: Mutex::default(),
            presence_pushes: AtomicU64::new(0),
            presence_changes: AtomicU64::new(0),
            presence_bytes: AtomicU64::new(0),
        }
    }

    pub fn received(&self, latency_ns: u64, seq: Option<u64>) {
        self.received.fetch_add(1, Relaxed);
        let us = (latency_ns / 1000).clamp(1, 600_000_000);
        {
            let mut l = self.latency.lock().unwrap();
            l.0.saturating_record(us);
            l.1.saturating_record(us);
        }
        if let Some(seq) = seq {
            let mut seqs = self.seqs.lock().unwrap();
            let e = seqs.entry(seq).or_insert((0, u64::MAX, 0, true));
            e.0 += 1;
            e.1 = e.1.min(us);
            e.2 = e.2.max(us);
            e.3 = true;
        }
    }

    /// A `presence` push: each member it lists (joined or left) carries one `"client"`.
    pub fn presence_push(&self, line: &str) {
        self.presence_pushes.fetch_add(1, Relaxed);
        self.presence_changes
            .fetch_add(line.matches("\"client\":").count() as u64, Relaxed);
        self.presence_bytes.fetch_add(line.len() as u64, Relaxed);
    }

    pub fn received_unstamped(&self) {
        self.received.fetch_add(1, Relaxed);
    }

    pub fn duplicate(&self) {
        self.duplicates.fetch_add(1, Relaxed);
    }

    pub fn gap(&self, missing: u64) {
        self.gaps.fetch_add(missing, Relaxed);
    }

    fn error(&self, kind: &str) {
        *self.errors.lock().unwrap().entry(kind.into()).or_default() += 1;
        self.first_error
            .lock()
            .unwrap()
            .get_or_insert(self.started.elapsed().as_secs_f64());
    }

    pub(crate) fn report(&self, started: u64, done: bool) -> Report {
        let (p50, p99, max) = {
            let mut l = self.latency.lock().unwrap();
            let r = (
                l.1.value_at_quantile(0.5),
                l.1.value_at_quantile(0.99),
                l.1.max(),
            );
            l.1.reset();
            r
        };
        let seqs = {
            let mut seqs = self.seqs.lock().unwrap();
            let mut out = Vec::new();
            for (seq, e) in seqs.iter_mut() {
                if e.3 || done {
                    out.push((*seq, e.0, e.1, e.2));
                    e.3 = false;
                }
            }
            out
        };
        Report {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            started,
            connected: self.connected.load(Relaxed),
            accepted: self.accepted.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            received: self.received.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            gaps: self.gaps.load(Relaxed),
            errors: self.errors.lock().unwrap().clone(),
            first_error_s: *self.first_error.lock().unwrap(),
            bytes_in: self.wire.bytes_in.load(Relaxed),
            bytes_out: self.wire.bytes_out.load(Relaxed),
            packets_in: self.wire.packets_in.load(Relaxed),
            packets_out: self.wire.packets_out.load(Relaxed),
            interval_p50_us: p50,
            interval_p99_us: p99,
            interval_max_us: max,
            seqs,
            presence_pushes: self.presence_pushes.load(Relaxed),
            presence_changes: self.presence_changes.load(Relaxed),
            presence_bytes: self.presence_bytes.load(Relaxed),
            done,
        }
    }

    pub(crate) fn histogram_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        V2Serializer::new()
            .serialize(&self.latency.lock().unwrap().0, &mut out)
            .expect("serialises into memory");
        out
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

/// One client's view of the recorder: knows whether this client got connected, so that a
/// failure is counted as a refused connection or as a drop.
pub struct Tracker {
    rec: Arc<Recorder>,
    up: AtomicBool,
}

impl Tracker {
    pub fn new(rec: Arc<Recorder>) -> Self {
        Self {
            rec,
            up: AtomicBool::new(false),
        }
    }

    /// The client is connected and subscribed.
    pub fn connected(&self) {
        if !self.up.swap(true, Relaxed) {
            self.rec.connected.fetch_add(1, Relaxed);
            self.rec.accepted.fetch_add(1, Relaxed);
        }
    }

    pub fn ended(&self, error: Option<anyhow::Error>) {
        let was_up = self.up.swap(false, Relaxed);
        if was_up {
            self.rec.connected.fetch_sub(1, Relaxed);
        }
        if let Some(e) = error {
            if std::env::var_os("HERALD_BENCH_DEBUG").is_some() {
                eprintln!(
                    "client {}: {e:#}",
                    if was_up { "dropped" } else { "failed" }
                );
            }
            if was_up {
                self.rec.dropped.fetch_add(1, Relaxed);
            }
            self.rec.error(&classify(&e, was_up));
        }
    }
}

impl Drop for Tracker {
    /// A client cut short (churn's timeout) still leaves the connected count.
    fn drop(&mut self) {
        if self.up.swap(false, Relaxed) {
            self.rec.connected.fetch_sub(1, Relaxed);
        }
    }
}

impl Deref for Tracker {
    type Target = Recorder;
    fn deref(&self) -> &Recorder {
        &self.rec
    }
}

/// A short name for a failure, for the errors-by-kind table. Refusals by the server's
/// limits are named by their status: they say the bench, not the server, is the problem.
fn classify(e: &anyhow::Error, was_up: bool) -> String {
    let text = format!("{e:#}").to_lowercase();
    let kind = if text.contains("too many open files") {
        "fd limit"
    } else if text.contains("address not available") || text.contains("cannot assign") {
        "no source port"
    } else if text.starts_with("bind") {
        "bind"
    } else if text.contains("refused") {
        "refused"
    } else if text.contains("timed out") || text.contains("timeout") {
        "timeout"
    } else if text.contains("429") || text.contains("too many requests") {
        "refused: 429 too fast"
    } else if text.contains("503") || text.contains("limit") {
        "refused: 503 limit"
    } else if text.contains("handshake") || text.contains("http ") {
        "handshake"
    } else if text.contains("reset") || text.contains("closed") || text.contains("ended") {
        "closed"
    } else {
        "other"
    };
    format!("{}{kind}", if was_up { "dropped: " } else { "" })
}
