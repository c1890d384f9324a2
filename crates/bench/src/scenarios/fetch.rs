//! Study 4's load test (a WebSocket messaging system beside an HTTP backend): a new client
//! every 2 s, each asking for a 130 KB JSON document every second, which the server fetches
//! from the application's backend; until the server degrades. Herald fetches through its rpc
//! hook (`rpc` command → `hooks.rpc_url`); the backend runs in this process, on a thread of
//! its own, and serves one document prepared at the start.
//!
//! Held means: in a window (10 s), every ask was answered, none failed, none was skipped
//! because the previous one was still out, and the 99th percentile stayed under
//! `--max-latency`; the server's memory stayed under `--memory-mb`. The run stops at the first
//! window that is not held and reports the last one that was.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::{ms, percentiles, round, Target};
use crate::{
    procstat,
    report::{Outcome, Point, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct FetchArgs {
    /// Size of the JSON document the backend serves, bytes (the study's: 130 KB).
    #[arg(long, default_value_t = 130_000)]
    pub document: usize,
    /// A new client every this long (the study: 2 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub arrive_every: Duration,
    /// Clients connected at the start, before arrivals begin (0: the study's ramp from none;
    /// more skips the part of the ramp that is known to be held).
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Each client asks for the document every this long (the study: 1 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub ask_every: Duration,
    /// A window whose 99th percentile is above this is not held.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub max_latency: Duration,
    /// A window in which the server's memory is above this is not held (the study's machine
    /// had 4 GB).
    #[arg(long, default_value_t = 4096)]
    pub memory_mb: u64,
    /// Each window is judged held or not.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub window: Duration,
    /// Stop here even if still held.
    #[arg(long, default_value_t = 5000)]
    pub max_clients: usize,
    /// Where the backend listens (default: a free loopback port). A server given by `--url`
    /// must have its rpc hook pointed at `http://THIS/rpc`.
    #[arg(long)]
    pub backend_listen: Option<SocketAddr>,
}

/// What every client adds to, read and reset once per window.
#[derive(Default)]
struct Stats {
    connected: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    dropped: AtomicU64,
    bytes: AtomicU64,
    latency_us: Mutex<Option<Histogram<u64>>>,
}

impl Stats {
    fn record(&self, latency: Duration) {
        let mut h = self.latency_us.lock().expect("not poisoned");
        let h = h.get_or_insert_with(|| Histogram::new_with_max(60_000_000, 3).expect("bounds"));
        let _ = h.record(latency.as_micros() as u64);
    }

    /// This window's figures; the counters start again from zero.
    fn take(&self) -> Window {
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        Window {
            answered: take(&self.answered),
            failed: take(&self.failed),
            skipped: take(&self.skipped),
            dropped: take(&self.dropped),
            bytes: take(&self.bytes),
            latency_us: self
                .latency_us
                .lock()
                .expect("not poisoned")
                .take()
                .unwrap_or_else(|| Histogram::new(3).expect("bounds")),
            clients: 0,
            seconds: 0.0,
            server_cpu_percent: 0.0,
            server_rss_mb: 0.0,
            load_cpu_percent: 0.0,
        }
    }
}

struct Window {
    clients: u64,
    answered: u64,
    failed: u64,
    skipped: u64,
    dropped: u64,
    bytes: u64,
    latency_us: Histogram<u64>,
    seconds: f64,
    server_cpu_percent: f64,
    server_rss_mb: f64,
    load_cpu_percent: f64,
}

impl Window {
    fn problem(&self, args: &FetchArgs) -> Option<String> {
        let p99 = self.latency_us.value_at_quantile(0.99);
        if self.failed > 0 {
            Some(format!("{} asks failed", self.failed))
        } else if self.dropped > 0 {
            Some(format!("{} clients were disconnected", self.dropped))
        } else if self.skipped > 0 {
            Some(format!(
                "{} asks skipped: the previous one was still out",
                self.skipped
            ))
        } else if p99 > args.max_latency.as_micros() as u64 {
            Some(format!("p99 {:.0} ms", p99 as f64 / 1000.0))
        } else if self.server_rss_mb > args.memory_mb as f64 {
            Some(format!("server memory {:.0} MB", self.server_rss_mb))
        } else {
            None
        }
    }

    fn row(&self, verdict: &str) -> Vec<Value> {
        let [p50, _, p99, max] = percentiles(&self.latency_us);
        vec![
            json!(self.clients),
            round(self.answered as f64 / self.seconds, 1),
            round(self.bytes as f64 / self.seconds / 1e6, 1),
            p50,
            p99,
            max,
            round(self.server_cpu_percent, 0),
            round(self.server_rss_mb, 0),
            round(self.load_cpu_percent, 0),
            json!(verdict),
        ]
    }
}

pub async fn run(args: FetchArgs, common: &Common) -> anyhow::Result<Outcome> {
    let document = document(args.document);
    let backend = Backend::start(args.backend_listen, document)?;
    let mut common = common.clone();
    let _config = if common.url.is_none() {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            format!("[hooks]\nrpc_url = \"{}/rpc\"\n", backend.url),
        )?;
        common.server_args.push("--config".into());
        common.server_args.push(path.display().to_string());
        Some(dir)
    } else {
        eprintln!(
            "backend on {}: the server's rpc hook must point at {}/rpc",
            backend.url, backend.url
        );
        None
    };
    let target = Target::start(&common).await?;
    let url = format!(
        "{}/connection/websocket",
        target.server.url.replacen("http", "ws", 1)
    );
    let stats = Arc::new(Stats::default());
    let (stop_tx, stop) = watch::channel(false);
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(200));

    let mut clients = 0usize;
    let arrive = |clients: &mut usize| {
        let key = *clients;
        *clients += 1;
        tokio::spawn(client(
            url.clone(),
            key,
            args.ask_every,
            stats.clone(),
            stop.clone(),
        ));
    };
    for _ in 0..args.start {
        arrive(&mut clients);
    }
    let mut table = Table::new(
        format!(
            "fetch: a new client every {}, each asking for a {} KB document every {} (held: no failure, none skipped, p99 under {} ms)",
            humantime::format_duration(args.arrive_every),
            args.document / 1000,
            humantime::format_duration(args.ask_every),
            args.max_latency.as_millis()
        ),
        &[
            "clients",
            "answers/s",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "server CPU %",
            "server MB",
            "bench CPU %",
            "window",
        ],
    );
    let mut points = Vec::new();
    let mut last_held: Option<Window> = None;
    let mut verdict = String::from("stopped at --max-clients while held");
    let started = Instant::now();
    let mut arrivals = tokio::time::interval_at(
        tokio::time::Instant::now() + args.arrive_every,
        args.arrive_every,
    );
    let mut windows =
        tokio::time::interval_at(tokio::time::Instant::now() + args.window, args.window);
    let mut server_before = target.server.sample();
    let mut load_before = procstat::sample(std::process::id()).ok();
    // The first window starts with the clients of --start still connecting: not judged.
    let mut first = true;
    stats.take();
    loop {
        tokio::select! {
            _ = arrivals.tick() => {
                if clients < args.max_clients {
                    arrive(&mut clients);
                }
            }
            _ = windows.tick() => {
                let mut w = stats.take();
                w.clients = stats.connected.load(Ordering::Relaxed);
                w.seconds = args.window.as_secs_f64();
                let server_now = target.server.sample();
                if let (Some(a), Some(b)) = (server_before, server_now) {
                    w.server_cpu_percent = (b.cpu_seconds - a.cpu_seconds) / b.at.duration_since(a.at).as_secs_f64() * 100.0;
                    w.server_rss_mb = b.rss_bytes as f64 / 1e6;
                }
                let load_now = procstat::sample(std::process::id()).ok();
                if let (Some(a), Some(b)) = (load_before, load_now) {
                    w.load_cpu_percent = (b.cpu_seconds - a.cpu_seconds) / b.at.duration_since(a.at).as_secs_f64() * 100.0;
                }
                (server_before, load_before) = (server_now, load_now);
                points.push(Point {
                    t: started.elapsed().as_secs_f64(),
                    cpu_percent: w.server_cpu_percent,
                    rss_mb: w.server_rss_mb,
                    connections: w.clients,
                    received_per_s: w.answered as f64 / w.seconds,
                    p99_ms: w.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
                });
                bar.set_message(format!(
                    "{} clients, {:.1} MB/s, p99 {:.0} ms, server {:.0}% CPU {:.0} MB",
                    w.clients,
                    w.bytes as f64 / w.seconds / 1e6,
                    w.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
                    w.server_cpu_percent,
                    w.server_rss_mb
                ));
                if std::mem::take(&mut first) {
                    continue;
                }
                if let Some(problem) = w.problem(&args) {
                    table.push(w.row(&format!("not held: {problem}")));
                    verdict = format!("degraded at {} clients: {problem}", w.clients);
                    break;
                }
                let done = clients >= args.max_clients && w.clients as usize >= args.max_clients;
                last_held = Some(w);
                if done {
                    break;
                }
            }
        }
    }
    let _ = stop_tx.send(true);
    bar.finish_and_clear();
    if let Some(w) = &last_held {
        table.rows.insert(0, w.row("held (the last such window)"));
    }
    let mut outcome = Outcome {
        scenario: "fetch".into(),
        tables: vec![table],
        notes: vec![
            verdict,
            format!(
                "the backend (in the bench process, serving one prepared {}-byte document) and the clients count as bench CPU",
                args.document
            ),
            "the study: 304 clients at about 46 MB/s on 2 CPUs / 4 GB before memory ran out".into(),
        ],
        series: vec![("fetch".into(), points)],
        bars: Vec::new(),
    };
    if let Some(w) = &last_held {
        outcome.notes.push(format!(
            "held: {} clients, {:.1} MB/s, p99 {} ms",
            w.clients,
            w.bytes as f64 / w.seconds / 1e6,
            ms(w.latency_us.value_at_quantile(0.99))
        ));
    }
    Ok(outcome)
}

/// One client: connects, then asks every `every` (skipping a turn while its previous ask is
/// still out), timing each answer.
async fn client(
    url: String,
    key: usize,
    every: Duration,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok((ws, _)) = tokio_tungstenite::connect_async(url.as_str()).await else {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    stats.connected.fetch_add(1, Ordering::Relaxed);
    let (mut tx, mut rx) = ws.split();
    // Clients that start together ask at spread-out moments, as clients that arrive one by
    // one do.
    let offset = every.mul_f64((key % 100) as f64 / 100.0);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
    let mut id = 0u64;
    // When the ask out was sent, and how its answer starts.
    let mut out: Option<(Instant, String)> = None;
    let ended = loop {
        tokio::select! {
            _ = ticks.tick() => {
                if out.is_some() {
                    stats.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                id += 1;
                let ask = format!(r#"{{"id":{id},"rpc":{{"method":"conversation","data":{{"key":"conv-{key}"}}}}}}"#);
                if tx.send(Message::text(ask)).await.is_err() {
                    break true;
                }
                out = Some((Instant::now(), format!(r#"{{"id":{id},"#)));
            }
            frame = rx.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    stats.bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
                    for line in text.as_str().lines() {
                        // `{"id":N,"rpc":…}` or `{"id":N,"error":…}`: the start says which.
                        let head = line.get(..40).unwrap_or(line);
                        if !out.as_ref().is_some_and(|(_, start)| head.starts_with(start.as_str())) {
                            continue;
                        }
                        if let Some((at, _)) = out.take() {
                            if head.contains(r#""error""#) {
                                stats.failed.fetch_add(1, Ordering::Relaxed);
                            } else {
                                stats.answered.fetch_add(1, Ordering::Relaxed);
                                stats.record(at.elapsed());
                            }
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break true,
                Some(Ok(_)) => {}
            },
            _ = stop.changed() => break false,
        }
    };
    stats.connected.fetch_sub(1, Ordering::Relaxed);
    if ended {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// A conversation's messages as JSON, about `size` bytes: the kind of document the study's
/// clients fetched.
fn document(size: usize) -> String {
    let mut messages = Vec::new();
    let mut length = 0;
    let mut n = 0u64;
    while length < size {
        let m = json!({
            "id": n,
            "from": format!("user-{}", n % 17),
            "at": 1_795_000_000 + n * 37,
            "text": "Are we still on for the release review this afternoon? I have moved the numbers into the shared sheet.",
            "read": n.is_multiple_of(3),
        })
        .to_string();
        length += m.len() + 1;
        messages.push(m);
        n += 1;
    }
    format!(
        r#"{{"conversation":"conv","messages":[{}]}}"#,
        messages.join(",")
    )
}

/// The application's backend: answers the rpc hook with the document, on a thread and
/// runtime of its own so that it never waits behind the clients.
struct Backend {
    url: String,
    _thread: std::thread::JoinHandle<()>,
}

impl Backend {
    fn start(listen: Option<SocketAddr>, document: String) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(
            listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .context("binding the backend")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let answer = Bytes::from(format!(r#"{{"result":{{"data":{document}}}}}"#));
        let thread = std::thread::Builder::new()
            .name("backend".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    let app = axum::Router::new().route(
                        "/rpc",
                        axum::routing::post(move || {
                            let answer = answer.clone();
                            async move { ([("content-type", "application/json")], answer) }
                        }),
                    );
                    let _ = axum::serve(listener, app).await;
                });
            })?;
        Ok(Self {
            url,
            _thread: thread,
        })
    }
}
