//! Study 2: a provider publishes at a fixed interval; clients get the messages by interval
//! polling, long-polling, streaming, SSE or WebSocket. Per run: messages received (with
//! repeats), unique messages, trip time, server CPU, packets per client.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::{percentiles, round, transport_list, Monitor, Target};
use crate::{
    client::Transport,
    fleet::Fleet,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct PushpullArgs {
    /// Transports (poll@INTERVAL polls at that interval).
    #[arg(long, default_value = "poll@1s,poll@5s,longpoll,stream,sse,ws")]
    pub transports: String,
    /// Publish intervals, comma-separated.
    #[arg(long, default_value = "1s")]
    pub intervals: String,
    /// Client counts, comma-separated.
    #[arg(long, default_value = "10,100")]
    pub clients: String,
    /// Messages per run.
    #[arg(long, default_value_t = 10)]
    pub messages: u64,
}

pub async fn run(args: PushpullArgs, common: &Common) -> anyhow::Result<Outcome> {
    let intervals: Vec<Duration> = args
        .intervals
        .split(',')
        .map(|s| humantime::parse_duration(s.trim()))
        .collect::<Result<_, _>>()?;
    let counts: Vec<usize> = args
        .clients
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let mut t = Table::new(
        format!("push vs pull: {} messages per run", args.messages),
        &[
            "transport",
            "publish every",
            "clients",
            "received per client",
            "unique per client",
            "trip p50 ms",
            "trip max ms",
            "server CPU ms",
            "packets per client",
        ],
    );
    let mut series = Vec::new();
    for transport in transport_list(&args.transports)? {
        for interval in &intervals {
            for &clients in &counts {
                let label = format!("{} every {:?} x{clients}", transport.label(), interval);
                let target = Target::start(common).await?;
                let mut monitor = Monitor::new(&target, &label);
                let channel = super::fresh_channel("bench:quotes");
                let fleet = Fleet::launch(
                    target.clients(&transport, vec![channel.clone()], clients, 0.0),
                    common.workers,
                )
                .await?;
                fleet
                    .wait_for(
                        "clients",
                        Duration::from_secs(30),
                        |t| t.connected as usize >= clients,
                        |t| monitor.observe(t),
                    )
                    .await?;
                let cpu0 = target.server.sample();
                let start = Instant::now();
                for seq in 0..args.messages {
                    tokio::time::sleep_until((start + *interval * seq as u32).into()).await;
                    target.publisher.publish(&channel, seq, 120).await?;
                    monitor.observe(&fleet.totals());
                }
                // Give pollers one more interval (and a little) to come back.
                let grace = match transport {
                    Transport::Poll { ms } => {
                        Duration::from_millis(ms) + Duration::from_millis(500)
                    }
                    _ => Duration::from_secs(1),
                };
                let expected = args.messages * clients as u64;
                let _ = fleet
                    .wait_for(
                        "deliveries",
                        grace.max(*interval),
                        |t| t.received >= expected,
                        |t| monitor.observe(t),
                    )
                    .await;
                let cpu1 = target.server.sample();
                let (totals, hist) = fleet.stop().await?;
                monitor.finish();
                let [p50, _, _, max] = percentiles(&hist);
                let n = clients.max(1) as f64;
                t.push(vec![
                    json!(transport.label()),
                    json!(humantime::format_duration(*interval).to_string()),
                    json!(clients),
                    round((totals.received + totals.duplicates) as f64 / n, 1),
                    round(totals.received as f64 / n, 1),
                    p50,
                    max,
                    match (cpu0, cpu1) {
                        (Some(a), Some(b)) => round((b.cpu_seconds - a.cpu_seconds) * 1000.0, 0),
                        _ => Value::Null,
                    },
                    round((totals.packets_in + totals.packets_out) as f64 / n, 1),
                ]);
                series.push((label, monitor.points));
            }
        }
    }
    Ok(Outcome {
        scenario: "pushpull".into(),
        tables: vec![t],
        notes: vec![
            "unique = publications delivered once each by offset; received counts repeats too (Herald's cursor means a poller never gets one twice)".into(),
            "trip time = publish request sent to receipt; packets from TCP_INFO segment counters on the client sockets".into(),
            "study 2 (2011): 1 s polling got up to 184 messages for 10 published, 5 s polling lost up to 70 %, long-polling 10/10 with 243-946 ms trips, streaming lost 1-2 with 505-2,005 ms trips".into(),
        ],
        series,
        bars: Vec::new(),
    })
}
