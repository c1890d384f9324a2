//! Idle connections of one transport until a target or the first failure: process memory
//! (and kernel socket memory) per connection, and the CPU idle connections cost.

use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::{median_of, round, Monitor, Target};
use crate::{
    client::Transport,
    fleet::Fleet,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct CapacityArgs {
    /// Connections to open (stops earlier at the first failure).
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// ws, sse, stream, iframe, longpoll, poll or poll@INTERVAL.
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
    /// New connections per second; 0 = as fast as they connect.
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// How long to hold them before measuring idle CPU.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub hold: Duration,
}

pub async fn run(args: CapacityArgs, common: &Common) -> anyhow::Result<Outcome> {
    median_of(
        common.repeat,
        |o| o.tables[0].rows[0][3].as_f64().unwrap_or(f64::MAX),
        || once(args.clone(), common),
    )
    .await
}

async fn once(args: CapacityArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let mut monitor = Monitor::new(&target, "capacity");
    // The server's own footprint before any connection, after it has settled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = target.server.sample();
    let channels: Vec<String> = (0..100)
        .map(|c| super::fresh_channel(&format!("bench:capacity-{c}")))
        .collect();
    let fleet = Fleet::launch(
        target.clients(
            &args.transport,
            channels,
            args.connections,
            args.connect_rate,
        ),
        common.workers,
    )
    .await?;
    let limit = Duration::from_secs_f64(
        60.0 + args.connections as f64 / args.connect_rate.max(100.0) * 2.0,
    );
    let reached = fleet
        .wait_for(
            "connections",
            limit,
            |t| {
                t.connected as usize >= args.connections
                    || t.error_count > 0 && t.accepted + t.error_count >= t.started
            },
            |t| monitor.observe(t),
        )
        .await
        .unwrap_or_else(|_| fleet.totals());
    let first_failure = reached.first_error_s;
    monitor.say("holding");
    let hold_start = target.server.sample();
    monitor
        .watch_until(&fleet, std::time::Instant::now() + args.hold)
        .await;
    let held = target.server.sample();
    let connected = fleet.totals().connected;
    monitor.say("closing");
    let (totals, _) = fleet.stop().await?;
    monitor.finish();
    let per_conn = |a: Option<u64>, b: Option<u64>| -> Value {
        match (a, b) {
            (Some(a), Some(b)) if connected > 0 => {
                round((b as f64 - a as f64) / connected as f64 / 1024.0, 2)
            }
            _ => Value::Null,
        }
    };
    let idle_cpu = match (hold_start, held) {
        (Some(a), Some(b)) => round(
            (b.cpu_seconds - a.cpu_seconds) / b.at.duration_since(a.at).as_secs_f64().max(1e-3)
                * 100.0,
            1,
        ),
        _ => Value::Null,
    };
    let mut t = Table::new(
        format!("capacity: idle {} connections", args.transport.label()),
        &[
            "transport",
            "target",
            "connected",
            "KB per connection (process)",
            "KB per connection (kernel TCP)",
            "server RSS MB",
            "idle CPU %",
            "threads",
            "errors",
            "first failure s",
        ],
    );
    t.push(vec![
        json!(args.transport.label()),
        json!(args.connections),
        json!(connected),
        per_conn(base.map(|s| s.rss_bytes), held.map(|s| s.rss_bytes)),
        per_conn(
            base.map(|s| s.tcp_kernel_bytes),
            held.map(|s| s.tcp_kernel_bytes),
        ),
        held.map_or(Value::Null, |s| round(s.rss_bytes as f64 / 1e6, 1)),
        idle_cpu,
        held.map_or(Value::Null, |s| json!(s.threads)),
        json!(totals.error_count),
        first_failure.map_or(Value::Null, |s| round(s, 1)),
    ]);
    let mut notes = vec![
        "process memory = (server RSS with the connections held - RSS before any) / connections; kernel TCP = the change of /proc/net/sockstat's TCP mem (system-wide: both ends of loopback connections)".into(),
    ];
    notes.extend(super::error_notes(&totals));
    Ok(Outcome {
        scenario: "capacity".into(),
        tables: vec![t],
        notes,
        series: vec![(args.transport.label(), monitor.points)],
        bars: Vec::new(),
    })
}
