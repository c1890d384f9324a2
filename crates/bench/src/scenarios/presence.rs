//! Presence at scale (issue #15), through the server: many members in one channel (on
//! several nodes sharing Redis when one process cannot hold them), `presence_stats` and a
//! page of 1,000 members over the wire, what a join costs, and how many `presence` pushes a
//! mass reconnect makes.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::{tungstenite::Message, MaybeTlsStream, WebSocketStream};

use super::{percentiles, round, Monitor, Target};
use crate::{
    client::Transport,
    fleet::{Fleet, Totals},
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct PresenceArgs {
    /// Members of the big channel, one WebSocket connection each (more than about 15,000
    /// need `--nodes`: one process holds about 20,000 descriptors here).
    #[arg(long, default_value_t = 10_000)]
    pub members: usize,
    /// Sizes of the channels whose clients all reconnect at once, counting join/leave
    /// pushes (comma-separated; 0 skips it).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub reconnect: Vec<usize>,
    /// `presence_stats` calls, and joins, timed (enough joins for the server's CPU, read in
    /// 10 ms ticks, to tell).
    #[arg(long, default_value_t = 3_000)]
    pub calls: usize,
}

/// The server's presence settings for the run: the defaults, written out.
const WINDOW: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(5);
const THRESHOLD: usize = 1000;

pub async fn run(args: PresenceArgs, common: &Common) -> anyhow::Result<Outcome> {
    if common.generic.client_url.is_some() || common.url.is_some() {
        bail!("bench presence measures a Herald it starts itself (it configures its namespaces)");
    }
    if common.generic_client {
        bail!("bench presence reads presence with Herald's own client: --generic-client finds only stamps");
    }
    let config = tempfile::NamedTempFile::new()?;
    std::fs::write(
        config.path(),
        format!(
            r#"
[client]
# The probe times thousands of commands on one connection.
max_commands_per_second = 0

[presence]
join_leave_window = "{window}ms"
grace = "{grace}s"
join_leave_max_members = {THRESHOLD}

[namespaces.room]
presence = true
join_leave = true
"#,
            window = WINDOW.as_millis(),
            grace = GRACE.as_secs(),
        ),
    )?;
    let mut common = common.clone();
    common.server_args.push("--config".into());
    common.server_args.push(config.path().display().to_string());
    let target = Target::start(&common).await?;
    let mut outcome = Outcome {
        scenario: "presence".into(),
        tables: vec![crowd(&args, &common, &target).await?],
        notes: vec![
            "one WebSocket connection per member; the probe is one more connection that is not a member; latencies are round trips over loopback, medians and 99th percentiles".into(),
            format!(
                "a join is a subscribe into the channel, timed to its answer, then an unsubscribe (the leave); the same on a channel without presence shows what presence adds. CPU is the server's ({}) over {} joins and leaves",
                if common.nodes > 1 { "every node and Redis" } else { "one process" },
                args.calls
            ),
        ],
        series: Vec::new(),
        bars: Vec::new(),
    };
    if common.nodes > 1 {
        outcome.notes.push(format!(
            "{} Herald nodes on one address (SO_REUSEPORT) sharing presence through Redis: members counted in Redis, store memory is Redis's used_memory growth per member",
            common.nodes
        ));
    } else {
        outcome.notes.push("one node with the memory presence store: store memory per member is not separable from RSS here (the Criterion bench `cargo bench -p herald-broker --bench presence` gives it)".into());
    }
    if args.reconnect.iter().any(|n| *n > 0) {
        let mut table = Table::new(
            "presence: every client of a channel with join/leave reconnects at once",
            &[
                "phase",
                "clients",
                "presence pushes",
                "pushes per client",
                "joins+leaves listed",
                "MB pushed",
                "one message per join or leave would be",
                "members after",
            ],
        );
        for &n in args.reconnect.iter().filter(|n| **n > 0) {
            reconnect(n, &common, &target, &mut table).await?;
        }
        outcome.tables.push(table);
        outcome.notes.push(format!(
            "join/leave: batches every {} ms per channel per node, none for a channel of more than {THRESHOLD} members; grace {} s (the defaults). \"One message per join or leave\" is what a server that sends each join and leave to every member would send: N(N-1)/2 while joining, 2N(N-1) for a reconnect as new clients. A batch lists every member that joined or left in its window, so below the threshold the joins and leaves listed (and the bytes) still grow with N²: batching bounds the messages, the threshold bounds the rest",
            WINDOW.as_millis(),
            GRACE.as_secs()
        ));
    }
    Ok(outcome)
}

/// The big channel: members join, then the probe asks and joins.
async fn crowd(args: &PresenceArgs, common: &Common, target: &Target) -> anyhow::Result<Table> {
    let channel = super::fresh_channel("room:crowd");
    let redis_before = redis_used_memory(target).await;
    let mut monitor = Monitor::new(target, "presence members");
    let started = Instant::now();
    let (fleet, joined) = super::launch_and_join(
        target.clients(&Transport::Ws, vec![channel.clone()], args.members, 0.0),
        common.workers,
        &mut monitor,
        "members",
    )
    .await?;
    let connected_in = started.elapsed();
    let members = joined.connected;
    let mut probe = Probe::open(&target.server.url).await?;
    // Every subscription is answered after its member is in the store; this only waits for
    // the count to agree.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = probe
            .call("presence_stats", json!({"channel": channel}))
            .await?;
        if stats["clients"].as_u64() == Some(members) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "presence_stats says {stats} with {members} members connected (of {} started; errors: {:?})",
                args.members,
                fleet.totals().errors
            );
        }
        monitor.observe(&fleet.totals());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    monitor.say("timing presence_stats");
    let mut stats_hist = histogram();
    for _ in 0..args.calls {
        let at = Instant::now();
        let stats = probe
            .call("presence_stats", json!({"channel": channel}))
            .await?;
        stats_hist.saturating_record(at.elapsed().as_micros() as u64);
        if stats["clients"].as_u64() != Some(members) {
            bail!("presence_stats says {stats} with {members} members");
        }
    }
    monitor.say("paging through every member");
    let mut page_hist = histogram();
    let mut seen = HashSet::new();
    let mut listed = 0u64;
    let mut cursor: Option<String> = None;
    let walk = Instant::now();
    loop {
        let mut params = json!({"channel": channel, "limit": 1000});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let at = Instant::now();
        let page = probe.call("presence", params).await?;
        page_hist.saturating_record(at.elapsed().as_micros() as u64);
        for m in page["members"].as_array().context("members")? {
            listed += 1;
            seen.insert(m["client"].as_str().unwrap_or_default().to_string());
        }
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let walked_in = walk.elapsed();
    monitor.say("timing joins");
    let with = joins(&mut probe, target, &channel, args.calls).await?;
    let without = joins(
        &mut probe,
        target,
        &super::fresh_channel("plain:bench"),
        args.calls,
    )
    .await?;
    let rss = target.server.sample().map(|s| s.rss_bytes);
    let redis_after = redis_used_memory(target).await;
    monitor.say("stopping members");
    let (totals, _) = fleet.stop().await?;
    monitor.finish();
    let [s50, _, s99, _] = percentiles(&stats_hist);
    let [p50, _, p99, _] = percentiles(&page_hist);
    let [j50, _, j99, _] = percentiles(&with.latency);
    let [b50, _, _, _] = percentiles(&without.latency);
    let mut t = Table::new(
        format!(
            "presence: {members} members in one channel, {} node{}",
            common.nodes,
            if common.nodes > 1 { "s on Redis" } else { "" }
        ),
        &[
            "members",
            "connected in s",
            "join/leave pushes per member",
            "presence_stats p50 ms",
            "presence_stats p99 ms",
            "page of 1000 p50 ms",
            "page of 1000 p99 ms",
            "every member paged (s)",
            "members listed / distinct",
            "join p50 ms",
            "join p99 ms",
            "join without presence p50 ms",
            "server CPU µs per join+leave",
            "without presence",
            "store B per member",
            "server RSS KiB per member",
        ],
    );
    t.push(vec![
        json!(members),
        round(connected_in.as_secs_f64(), 1),
        round(totals.presence_pushes as f64 / members.max(1) as f64, 2),
        s50,
        s99,
        p50,
        p99,
        round(walked_in.as_secs_f64(), 2),
        json!(format!("{listed} / {}", seen.len())),
        j50,
        j99,
        b50,
        with.cpu_us.map_or(Value::Null, |v| round(v, 1)),
        without.cpu_us.map_or(Value::Null, |v| round(v, 1)),
        match (redis_before, redis_after) {
            (Some(a), Some(b)) if members > 0 => {
                round((b.saturating_sub(a)) as f64 / members as f64, 0)
            }
            _ => Value::Null,
        },
        rss.map_or(Value::Null, |r| {
            round(r as f64 / 1024.0 / members.max(1) as f64, 2)
        }),
    ]);
    if listed != members || seen.len() as u64 != members {
        bail!(
            "paging listed {listed} members ({} distinct) of {members}",
            seen.len()
        );
    }
    Ok(t)
}

struct Joins {
    latency: Histogram<u64>,
    /// Server CPU per join and leave, µs.
    cpu_us: Option<f64>,
}

/// `calls` subscribes to `channel` and unsubscribes, one after the other on the probe.
async fn joins(
    probe: &mut Probe,
    target: &Target,
    channel: &str,
    calls: usize,
) -> anyhow::Result<Joins> {
    let mut latency = histogram();
    let cpu0 = target.server.sample();
    for _ in 0..calls {
        let at = Instant::now();
        probe.call("subscribe", json!({"channel": channel})).await?;
        latency.saturating_record(at.elapsed().as_micros() as u64);
        probe
            .call("unsubscribe", json!({"channel": channel}))
            .await?;
    }
    let cpu1 = target.server.sample();
    let cpu_us = match (cpu0, cpu1) {
        (Some(a), Some(b)) if calls > 0 => {
            Some((b.cpu_seconds - a.cpu_seconds) * 1e6 / calls as f64)
        }
        _ => None,
    };
    Ok(Joins { latency, cpu_us })
}

/// A channel of `n` clients with join/leave pushes: they join, then all reconnect at once,
/// first sending their first client id back (within the grace), then as new clients.
async fn reconnect(
    n: usize,
    common: &Common,
    target: &Target,
    table: &mut Table,
) -> anyhow::Result<()> {
    let channel = super::fresh_channel("room:reconnect");
    let mut monitor = Monitor::new(target, "presence reconnect");
    let mut spec = target.clients(&Transport::Ws, vec![channel.clone()], n, 0.0);
    spec.presence = true;
    let (mut fleet, _) =
        super::launch_and_join(spec, common.workers, &mut monitor, "clients").await?;
    let limit = super::join_limit(n);
    let mut probe = Probe::open(&target.server.url).await?;
    let mut before = settle(&fleet, &mut monitor).await;
    let members = wait_members(&mut probe, &channel, n as u64).await?;
    table.push(row(
        "joining",
        n,
        &Totals::default(),
        &before,
        n * n.saturating_sub(1) / 2,
        members,
    ));
    for resume in [true, false] {
        monitor.say(if resume {
            "reconnecting with the first client id"
        } else {
            "reconnecting as new clients"
        });
        let accepted = before.accepted;
        fleet.reconnect(resume).await?;
        fleet
            .wait_for(
                "reconnects",
                limit,
                |t| t.accepted >= accepted + n as u64 && t.connected as usize >= n,
                |t| monitor.observe(t),
            )
            .await?;
        // Leaves come after the grace: count until then and a window more, and until quiet.
        tokio::time::sleep(GRACE + WINDOW).await;
        let after = settle(&fleet, &mut monitor).await;
        let members = wait_members(&mut probe, &channel, n as u64).await?;
        let naive = if resume {
            0
        } else {
            2 * n * n.saturating_sub(1)
        };
        table.push(row(
            if resume {
                "reconnect, same clients (first client id sent back)"
            } else {
                "reconnect, new clients (every member leaves and joins)"
            },
            n,
            &before,
            &after,
            naive,
            members,
        ));
        before = after;
    }
    fleet.stop().await?;
    monitor.finish();
    Ok(())
}

fn row(
    phase: &str,
    n: usize,
    before: &Totals,
    after: &Totals,
    naive: usize,
    members: u64,
) -> Vec<Value> {
    let pushes = after.presence_pushes - before.presence_pushes;
    vec![
        json!(phase),
        json!(n),
        json!(pushes),
        round(pushes as f64 / n.max(1) as f64, 2),
        json!(after.presence_changes - before.presence_changes),
        round(
            (after.presence_bytes - before.presence_bytes) as f64 / 1e6,
            2,
        ),
        json!(naive),
        json!(members),
    ]
}

/// Waits until no push has arrived for two windows and a second (pushes from every node
/// have landed), then returns the totals.
async fn settle(fleet: &Fleet, monitor: &mut Monitor) -> Totals {
    let quiet = WINDOW * 2 + Duration::from_secs(1);
    let mut last = fleet.totals();
    let mut since = Instant::now();
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = fleet.totals();
        monitor.observe(&now);
        if now.presence_pushes != last.presence_pushes {
            since = Instant::now();
        }
        last = now;
        if since.elapsed() >= quiet || Instant::now() > give_up {
            return last;
        }
    }
}

/// Waits until the channel counts `n` members (held memberships may still be leaving).
async fn wait_members(probe: &mut Probe, channel: &str, n: u64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + GRACE * 4;
    loop {
        let stats = probe
            .call("presence_stats", json!({"channel": channel}))
            .await?;
        let clients = stats["clients"].as_u64().unwrap_or(0);
        if clients == n || Instant::now() > deadline {
            return Ok(clients);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds are valid")
}

/// Redis's `used_memory`, when the nodes share one.
async fn redis_used_memory(target: &Target) -> Option<u64> {
    let url = target.server.redis_url.as_deref()?;
    let mut redis = redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut redis)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

/// One WebSocket connection that sends commands and waits for each answer.
struct Probe {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Probe {
    async fn open(server: &str) -> anyhow::Result<Self> {
        let url = format!("{}/connection/websocket", server.replacen("http", "ws", 1));
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .context("probe connection")?;
        Ok(Self { ws, next: 1 })
    }

    /// Sends `{"id": N, method: params}` and returns the answer's result; an error answer
    /// is an error.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next;
        self.next += 1;
        let mut command = json!({ "id": id });
        command[method] = params;
        self.ws.send(Message::text(command.to_string())).await?;
        let start = format!("{{\"id\":{id},");
        loop {
            let frame = self.ws.next().await.context("probe connection closed")??;
            let Message::Text(text) = frame else { continue };
            if let Some(line) = text.as_str().lines().find(|l| l.starts_with(&start)) {
                let mut answer: Value = serde_json::from_str(line)?;
                if let Some(error) = answer.get("error") {
                    bail!("{method}: {error}");
                }
                return Ok(answer[method].take());
            }
        }
    }
}
