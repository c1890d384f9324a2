//! A load-generating process. `herald bench` starts several (one process may hold only about
//! 20,000 sockets here, and one source address runs out of ports near 28,000), hands each a
//! [`WorkerSpec`], and reads one JSON [`Report`] line from it every 250 ms.

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, Write},
    net::IpAddr,
    ops::Deref,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use hdrhistogram::{
    serialization::{Serializer, V2Serializer},
    Histogram,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    client::{self, ClientSpec, Generic, Transport},
    netinfo::Wire,
};

/// Clients that speak (publish) every `every_ms`, the first after `offset_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Speak {
    pub every_ms: u64,
    pub offset_ms: u64,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub url: String,
    pub transport: Transport,
    /// Client `i` subscribes to `channels[i % len]`.
    pub channels: Vec<String>,
    pub clients: usize,
    /// Source addresses, used round-robin (127.0.0.x: each has its own 28k ports).
    pub sources: Vec<IpAddr>,
    /// New clients per second; 0 = as fast as they connect.
    pub rate: f64,
    /// The first `speakers` clients speak like this.
    pub speak: Option<Speak>,
    pub speakers: usize,
    pub generic: Option<Generic>,
    /// Where the latency histogram goes at the end.
    pub histogram: PathBuf,
    /// Churn: each client leaves after this long and a new one takes its place.
    pub lifetime_ms: Option<u64>,
    /// Presence runs (WebSocket): see [`ClientSpec::presence`].
    #[serde(default)]
    pub presence: bool,
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

    fn report(&self, started: u64, done: bool) -> Report {
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

    fn histogram_bytes(&self) -> Vec<u8> {
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

/// How long a churning client waits after a failed connection: 100 ms, doubling up to 5 s,
/// with jitter so that refused clients do not come back in step.
#[derive(Debug)]
struct BackOff {
    client: usize,
    failures: u32,
}

impl BackOff {
    fn new(client: usize) -> Self {
        Self {
            client,
            failures: 0,
        }
    }

    fn next(&mut self) -> Duration {
        let base = Duration::from_millis(100) * 2u32.pow(self.failures.min(6));
        self.failures += 1;
        let base = base.min(Duration::from_secs(5));
        // Spread by client and attempt (no randomness needed: clients only need to differ).
        let spread = (self.client as u64 * 7919 + u64::from(self.failures) * 104_729) % 1000;
        base / 2 + base.mul_f64(spread as f64 / 2000.0)
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

/// The worker process's main: reads its spec (one JSON argument), runs its clients until a
/// `stop` line (or the end of stdin), then writes its histogram and a final report.
pub fn main(spec_json: &str) -> anyhow::Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec_json)?;
    crate::procstat::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(spec))
}

async fn run(spec: WorkerSpec) -> anyhow::Result<()> {
    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Arc::new(AtomicU64::new(0));
    let (reconnect_tx, reconnect_rx) = watch::channel(client::Reconnect::default());
    // Stdin: the parent's `stop` and `reconnect [resume]`, read on a thread (blocking I/O).
    let (quit_tx, mut quit_rx) = tokio::sync::mpsc::channel::<()>(1);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref().map(str::trim) {
                Ok("stop") | Err(_) => break,
                Ok(l) if l.starts_with("reconnect") => {
                    reconnect_tx.send_modify(|r| {
                        r.generation += 1;
                        r.resume = l.ends_with("resume");
                    });
                }
                Ok(_) => continue,
            }
        }
        let _ = quit_tx.blocking_send(());
    });
    let launcher = {
        let (rec, spec, started, stop_rx, reconnect_rx) = (
            rec.clone(),
            spec.clone(),
            started.clone(),
            stop_rx.clone(),
            reconnect_rx.clone(),
        );
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            let gap = (spec.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / spec.rate));
            let t0 = tokio::time::Instant::now();
            for i in 0..spec.clients {
                if *stop_rx.borrow() {
                    break;
                }
                if let Some(gap) = gap {
                    tokio::time::sleep_until(t0 + gap * i as u32).await;
                } else if i % 256 == 255 {
                    // Let the connections already started make progress.
                    tokio::task::yield_now().await;
                }
                let client = ClientSpec {
                    url: spec.url.clone(),
                    transport: spec.transport.clone(),
                    channel: spec.channels[i % spec.channels.len()].clone(),
                    source: spec.sources[i % spec.sources.len()],
                    generic: spec.generic.clone(),
                    presence: spec.presence,
                };
                let speak = (i < spec.speakers).then(|| spec.speak.clone()).flatten();
                started.fetch_add(1, Relaxed);
                let (rec, mut stop_rx, started) = (rec.clone(), stop_rx.clone(), started.clone());
                let reconnect_rx = reconnect_rx.clone();
                let lifetime = spec.lifetime_ms.map(Duration::from_millis);
                tasks.spawn(async move {
                    let Some(lifetime) = lifetime else {
                        return client::run(client, speak, rec, stop_rx, reconnect_rx).await;
                    };
                    // Churn: stay a while, leave, come back as a new connection. A client
                    // that ended before its lifetime failed (refused, cut): it waits before
                    // coming back, longer each time, as a real client backs off, so that a
                    // server that refuses is not hammered by a retry loop.
                    let mut backoff = BackOff::new(i);
                    loop {
                        let lived = tokio::time::timeout(
                            lifetime,
                            client::run(
                                client.clone(),
                                speak.clone(),
                                rec.clone(),
                                stop_rx.clone(),
                                reconnect_rx.clone(),
                            ),
                        )
                        .await
                        .is_err();
                        if *stop_rx.borrow_and_update() {
                            return;
                        }
                        if lived {
                            backoff = BackOff::new(i);
                        } else if tokio::time::timeout(backoff.next(), stop_rx.wait_for(|s| *s))
                            .await
                            .is_ok()
                        {
                            return;
                        }
                        started.fetch_add(1, Relaxed);
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        })
    };
    let mut every = tokio::time::interval(Duration::from_millis(250));
    let stdout = std::io::stdout();
    loop {
        tokio::select! {
            _ = every.tick() => {
                let line = serde_json::to_string(&rec.report(started.load(Relaxed), false))?;
                let mut out = stdout.lock();
                writeln!(out, "{line}")?;
                out.flush()?;
            }
            _ = quit_rx.recv() => break,
        }
    }
    let _ = stop_tx.send(true);
    // Clients end at once when told; their sockets report TCP segment counts as they drop.
    let _ = tokio::time::timeout(Duration::from_secs(10), launcher).await;
    // Connection tasks aborted with their clients are dropped on the scheduler's next turns;
    // their sockets add their packet counts then.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&spec.histogram, rec.histogram_bytes())?;
    let line = serde_json::to_string(&rec.report(started.load(Relaxed), true))?;
    let mut out = stdout.lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}
