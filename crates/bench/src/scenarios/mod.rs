//! The scenarios, and what they share: the target, the publisher, the monitor that samples
//! the server while load runs, and the progress bar.

pub mod burst;
pub mod capacity;
pub mod churn;
pub mod delta;
pub mod fanout;
pub mod fetch;
pub mod payload;
pub mod presence;
pub mod pushpull;
pub mod ramp;
pub mod transports;

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::{
    client::{Generic, Transport},
    fleet::Totals,
    procstat::ProcSample,
    report::{Outcome, Point},
    target::{Publisher, Server, BENCH_API_KEY},
    worker::WorkerSpec,
    Common, Scenario,
};

pub async fn run(scenario: Scenario, common: &Common) -> anyhow::Result<Outcome> {
    match scenario {
        Scenario::Fanout(a) => fanout::run(a, common).await,
        Scenario::Capacity(a) => capacity::run(a, common).await,
        Scenario::Ramp(a) => ramp::run(a, common).await,
        Scenario::Transports(a) => transports::run(a, common).await,
        Scenario::Pushpull(a) => pushpull::run(a, common).await,
        Scenario::Payload(a) => payload::run(a, common).await,
        Scenario::Burst(a) => burst::run(a, common).await,
        Scenario::Churn(a) => churn::run(a, common).await,
        Scenario::Delta(a) => delta::run(a, common).await,
        Scenario::Fetch(a) => fetch::run(a, common).await,
        Scenario::Presence(a) => presence::run(a, common).await,
    }
}

/// The server under test and how to publish to it.
pub struct Target {
    pub server: Server,
    pub publisher: Publisher,
    pub generic: Option<Generic>,
    pub is_herald: bool,
    /// Herald read by the generic client (`--generic-client`).
    pub generic_client: bool,
    pub api_key: String,
    /// Clients offer permessage-deflate.
    deflate: bool,
    /// Herald's WebSocket clients speak Protobuf.
    protobuf: bool,
    /// Herald's WebSocket clients take deltas.
    delta: bool,
}

impl Target {
    pub async fn start(common: &Common) -> anyhow::Result<Self> {
        let pusher = common
            .pusher_app
            .as_deref()
            .map(crate::target::PusherApp::parse)
            .transpose()?;
        let place = crate::cores::Placement {
            cores: common.server_cores.clone(),
            cgroup: common.server_cgroup.clone(),
        };
        // A server started here would inherit this tool's own cores, the clients' with
        // `--client-cores`, and share them with the clients: unless it is given cores, it
        // gets every core online (where a quota, `--server-cgroup`, leaves it).
        let started = crate::cores::Placement {
            cores: place.cores.clone().or_else(|| {
                common
                    .client_cores
                    .as_ref()
                    .and_then(|_| crate::cores::online())
            }),
            cgroup: place.cgroup.clone(),
        };
        let server = match &common.url {
            Some(url) => Server::external(url, &common.pid),
            None if common.floor => Server::floor(&common.bun, &started)?,
            None => {
                // The Pusher app, for a Herald started here to serve.
                let env: Vec<(String, String)> = match &pusher {
                    Some(app) => vec![(
                        "HERALD_PUSHER__APPS".into(),
                        format!(
                            r#"[{{ id = "{}", key = "{}", secret = "{}" }}]"#,
                            app.id, app.key, app.secret
                        ),
                    )],
                    None => Vec::new(),
                };
                let mut server = Server::spawn(
                    &common.server_args,
                    common.nodes,
                    common.redis_url.as_deref(),
                    common.nats_url.as_deref(),
                    &env,
                    &started,
                )?;
                // Counted with it: the Redis servers it was pointed at, say.
                server.pids.extend(&common.pid);
                server
            }
        };
        // Moves the processes `--pid` names; a server started here is there already.
        place.apply(&server.pids)?;
        let api_key = common
            .api_key
            .clone()
            .unwrap_or_else(|| BENCH_API_KEY.into());
        let g = &common.generic;
        let publisher = match (&pusher, &g.publish_url) {
            (Some(app), _) => Publisher::pusher(&server.url, app.clone()),
            (None, None) if common.floor => {
                Publisher::generic(&format!("{}/pub/{{channel}}", server.url), "{data}", &[])?
            }
            (None, Some(url)) => Publisher::generic(url, &g.publish_body, &g.publish_header)?,
            (None, None) => Publisher::herald(&server.url, &api_key),
        };
        let generic = match &pusher {
            // A Pusher client: connected once it is told its socket id, then subscribed.
            Some(app) => Some(Generic {
                url: format!(
                    "{}{}/app/{}?protocol=7",
                    server.url.replacen("http", "ws", 1),
                    if common.pusher_resume {
                        "/resume/bench-page-{random}"
                    } else {
                        ""
                    },
                    app.key
                ),
                subscribe: vec![
                    r#"{"event":"pusher:subscribe","data":{"channel":"{channel_dashed}"}}"#.into(),
                ],
                wait_for: vec!["pusher:connection_established".into()],
                heartbeat: None,
                heartbeat_ms: 0,
                ping_pong: None,
            }),
            // The floor: subscribed by the path it opens, nothing said.
            None if common.floor => Some(Generic {
                url: format!("{}/ws/{{channel}}", server.url.replacen("http", "ws", 1)),
                subscribe: Vec::new(),
                wait_for: Vec::new(),
                heartbeat: None,
                heartbeat_ms: 0,
                ping_pong: None,
            }),
            None => g.client_url.as_ref().map(|url| Generic {
                url: url.clone(),
                subscribe: g.subscribe_frame.clone(),
                wait_for: g.wait_for.clone(),
                heartbeat: g.heartbeat_frame.clone(),
                heartbeat_ms: g.heartbeat_interval.as_millis() as u64,
                ping_pong: g.ping_frame.clone().zip(g.pong_frame.clone()),
            }),
        };
        Ok(Self {
            is_herald: generic.is_none(),
            generic_client: common.generic_client,
            server,
            publisher: publisher.with_content(common.content),
            generic,
            api_key,
            deflate: common.deflate,
            protobuf: common.protocol == "protobuf",
            delta: common.delta,
        })
    }

    /// A worker template: `clients` clients of `transport`, round-robin over `channels`.
    pub fn clients(
        &self,
        transport: &Transport,
        channels: Vec<String>,
        clients: usize,
        rate: f64,
    ) -> WorkerSpec {
        WorkerSpec {
            url: self.server.url.clone(),
            transport: transport.clone(),
            channels,
            clients,
            sources: Vec::new(),
            rate,
            speak: None,
            speakers: 0,
            generic: self.generic.clone().or_else(|| {
                self.generic_client
                    .then(|| herald_read_alike(&self.server.url, transport))
                    .flatten()
            }),
            histogram: Default::default(),
            lifetime_ms: None,
            presence: false,
            deflate: self.deflate,
            protobuf: self.protobuf,
            delta: self.delta,
        }
    }

    /// Herald's own counters, when the target is Herald.
    pub async fn info(&self) -> Option<Value> {
        if !self.is_herald {
            return None;
        }
        self.server.info(&self.api_key).await
    }
}

/// Herald's WebSocket or SSE endpoint as the generic client reads any server's: subscribed
/// by a frame or by the URL, each push searched for its stamp.
fn herald_read_alike(url: &str, transport: &Transport) -> Option<Generic> {
    let (url, subscribe) = match transport {
        Transport::Ws => (
            format!("{}/connection/websocket", url.replacen("http", "ws", 1)),
            vec![r#"{"id":1,"subscribe":{"channel":"{channel}"}}"#.to_string()],
        ),
        Transport::Sse => (
            format!("{url}/connection/sse?channel={{channel}}"),
            Vec::new(),
        ),
        _ => return None,
    };
    Some(Generic {
        url,
        subscribe,
        wait_for: Vec::new(),
        heartbeat: None,
        heartbeat_ms: 0,
        ping_pong: None,
    })
}

/// Samples the server and the load every half second for the charts, and drives the progress bar.
pub struct Monitor {
    started: Instant,
    last: Option<ProcSample>,
    last_received: u64,
    pub points: Vec<Point>,
    bar: ProgressBar,
    pids: Vec<u32>,
}

impl Monitor {
    pub fn new(target: &Target, what: &str) -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {prefix}: {msg}")
                .expect("valid template"),
        );
        bar.set_prefix(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Self {
            started: Instant::now(),
            last: target.server.sample(),
            last_received: 0,
            points: Vec::new(),
            bar,
            pids: target.server.pids.clone(),
        }
    }

    /// Called often; records a point at most every 500 ms.
    pub fn observe(&mut self, t: &Totals) {
        let now = self.sample_due();
        let Some(now) = now else { return };
        let (cpu, rss) = match (self.last, now.1) {
            (Some(a), Some(b)) => {
                let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
                (
                    (b.cpu_seconds - a.cpu_seconds) / secs * 100.0,
                    b.rss_bytes as f64 / 1e6,
                )
            }
            (_, Some(b)) => (0.0, b.rss_bytes as f64 / 1e6),
            _ => (0.0, 0.0),
        };
        let dt = self.points.last().map_or(now.0, |p| now.0 - p.t).max(1e-3);
        let point = Point {
            t: now.0,
            cpu_percent: cpu,
            rss_mb: rss,
            connections: t.connected,
            received_per_s: (t.received.saturating_sub(self.last_received)) as f64 / dt,
            p99_ms: t.interval_p99_us as f64 / 1000.0,
        };
        self.last_received = t.received;
        if now.1.is_some() {
            self.last = now.1;
        }
        self.bar
            .set_position(self.started.elapsed().as_millis() as u64);
        self.bar.set_message(format!(
            "{} connected, {} errors, {:.0} msg/s, p99 {:.1} ms, server {:.0}% CPU {:.0} MB",
            t.connected,
            t.error_count,
            point.received_per_s,
            point.p99_ms,
            point.cpu_percent,
            point.rss_mb
        ));
        self.points.push(point);
    }

    fn sample_due(&self) -> Option<(f64, Option<ProcSample>)> {
        let t = self.started.elapsed().as_secs_f64();
        if self.points.last().is_some_and(|p| t - p.t < 0.5) {
            return None;
        }
        Some((t, crate::procstat::sample_all(&self.pids)))
    }

    /// Keeps observing `fleet` until `deadline`.
    pub async fn watch_until(&mut self, fleet: &crate::fleet::Fleet, deadline: Instant) {
        while Instant::now() < deadline {
            self.observe(&fleet.totals());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Turns the spinner into a bar that fills over `expected` (scenarios of known length).
    pub fn lasting(self, expected: Duration) -> Self {
        self.bar.set_length(expected.as_millis() as u64);
        self.bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {percent:>3}% {prefix}: {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        self
    }

    pub fn say(&self, message: &str) {
        self.bar.set_message(message.to_string());
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Starts the clients of `spec` and waits until every one is connected, or has failed
/// (allowing 30 s and a second more per 500 clients).
pub async fn launch_and_join(
    spec: WorkerSpec,
    workers: usize,
    monitor: &mut Monitor,
    what: &str,
) -> anyhow::Result<(crate::fleet::Fleet, Totals)> {
    let n = spec.clients;
    let fleet = crate::fleet::Fleet::launch(spec, workers).await?;
    let joined = fleet
        .wait_for(
            what,
            join_limit(n),
            |t| t.connected as usize >= n || t.accepted + t.error_count >= n as u64,
            |t| monitor.observe(t),
        )
        .await?;
    Ok((fleet, joined))
}

/// How long `n` clients may take to connect.
pub fn join_limit(n: usize) -> Duration {
    Duration::from_secs(30 + n as u64 / 500)
}

pub fn ms(us: u64) -> Value {
    json!((us as f64 / 10.0).round() / 100.0)
}

pub fn percentiles(h: &Histogram<u64>) -> [Value; 4] {
    if h.is_empty() {
        return [Value::Null, Value::Null, Value::Null, Value::Null];
    }
    [
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    ]
}

pub fn round(v: f64, places: i32) -> Value {
    let f = 10f64.powi(places);
    json!((v * f).round() / f)
}

/// Runs `once` `repeat` times and keeps the run whose `key` is the median (a whole run, so
/// its figures stay consistent with each other); says so in the notes.
pub async fn median_of<F, Fut>(
    repeat: usize,
    key: impl Fn(&Outcome) -> f64,
    mut once: F,
) -> anyhow::Result<Outcome>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Outcome>>,
{
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        runs.push(once().await?);
    }
    let keys: Vec<f64> = runs.iter().map(&key).collect();
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|a, b| keys[*a].total_cmp(&keys[*b]));
    let mid = order[order.len() / 2];
    let mut chosen = runs.swap_remove(mid);
    if repeat > 1 {
        let mut sorted = keys.clone();
        sorted.sort_by(f64::total_cmp);
        chosen.notes.push(format!(
            "median of {repeat} runs by its main figure; all runs: {}",
            sorted
                .iter()
                .map(|k| format!("{k:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(chosen)
}

/// A channel name of its own for this run: a server that keeps a buffer per channel
/// (Nchan replays it to new subscribers by default) must not hand one run's messages to the next.
/// Notes about a run's failed connections: each kind with its count and, when the server
/// refused clients (429, 503), which limits those are and how to measure past them.
pub fn error_notes(totals: &crate::fleet::Totals) -> Vec<String> {
    if totals.errors.is_empty() {
        return Vec::new();
    }
    let mut notes = vec![format!("errors by kind: {:?}", totals.errors)];
    if totals.errors.keys().any(|k| k.contains("refused: ")) {
        notes.push(
            "the server refused clients (429: too fast, error 111; 503: too many held, error 106). \
             This tool's clients come from a few loopback addresses (127.0.0.2, 127.0.0.3, …), so \
             a Herald's per-address limits (limits.connections_per_address 1000, \
             limits.connection_rate_per_address 200/s) meet them long before its capacity: \
             start the server with HERALD_LIMITS__CONNECTIONS_PER_ADDRESS=0 and \
             HERALD_LIMITS__CONNECTION_RATE_PER_ADDRESS=0, as the Herald this tool starts is, \
             or raise max_connections; its /metrics (herald_refusals_total) names the limit \
             that refused. Refused clients back off (100 ms, doubling to 5 s) before trying again"
                .into(),
        );
    }
    notes
}

pub fn fresh_channel(base: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUN: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!("{base}-{started}-{}", RUN.fetch_add(1, Ordering::Relaxed))
}

pub fn transport_list(list: &str) -> anyhow::Result<Vec<Transport>> {
    list.split(',')
        .map(|t| Transport::parse(t.trim()))
        .collect()
}
