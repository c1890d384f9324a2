//! A load-generating process. `herald bench` starts several (one process may hold only about
//! 20,000 sockets here, and one source address runs out of ports near 28,000), hands each a
//! [`WorkerSpec`], and reads one JSON [`Report`] line from it every 250 ms.

use std::{
    io::{BufRead, Write},
    net::IpAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::client::{self, ClientSpec, Generic, Transport};
pub use crate::record::{Recorder, Report, Speak, Tracker};

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
    /// WebSocket clients offer permessage-deflate: see [`ClientSpec::deflate`].
    #[serde(default)]
    pub deflate: bool,
    /// WebSocket clients speak Protobuf: see [`ClientSpec::protobuf`].
    #[serde(default)]
    pub protobuf: bool,
    /// WebSocket clients take deltas: see [`ClientSpec::delta`].
    #[serde(default)]
    pub delta: bool,
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
                    deflate: spec.deflate,
                    protobuf: spec.protobuf,
                    delta: spec.delta,
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
