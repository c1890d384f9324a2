//! Study 1's load test: users arrive at a fixed rate for a fixed time, each connects,
//! subscribes and stays. A probe publishes every few seconds and times delivery to the first
//! and the last subscriber ("full-load response time"). MTBF = seconds until the first failure.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::{median_of, ms, round, Monitor, Target};
use crate::{
    client::Transport,
    fleet::Fleet,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct RampArgs {
    /// Arrivals per second.
    #[arg(long, default_value_t = 80.0)]
    pub rate: f64,
    /// How long users keep arriving.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300s")]
    pub duration: Duration,
    /// ws, sse, stream, iframe, longpoll, poll or poll@INTERVAL.
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
    /// Time between probe publications.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub probe_every: Duration,
    /// The channel every user joins.
    #[arg(long, default_value = "chat:ramp")]
    pub channel: String,
}

pub async fn run(args: RampArgs, common: &Common) -> anyhow::Result<Outcome> {
    median_of(
        common.repeat,
        |o| o.tables[0].rows[0][6].as_f64().unwrap_or(f64::MAX),
        || once(args.clone(), common),
    )
    .await
}

async fn once(args: RampArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let users = (args.rate * args.duration.as_secs_f64()).round() as usize;
    let mut monitor = Monitor::new(&target, "ramp").lasting(args.duration + args.probe_every * 2);
    let fleet = Fleet::launch(
        target.clients(
            &args.transport,
            vec![args.channel.clone()],
            users,
            args.rate,
        ),
        common.workers,
    )
    .await?;
    let start = Instant::now();
    let mut probes: Vec<(f64, u64)> = Vec::new();
    let mut seq = 0u64;
    // Arrivals, then one more probe interval at full load.
    let end = args.duration + args.probe_every * 2;
    while start.elapsed() < end {
        let due = start + args.probe_every * (seq as u32 + 1);
        monitor.watch_until(&fleet, due).await;
        let connected = fleet.totals().connected;
        target.publisher.publish(&args.channel, seq, 64).await?;
        probes.push((start.elapsed().as_secs_f64(), connected));
        seq += 1;
    }
    // Let the last probe land everywhere.
    let _ = fleet
        .wait_for(
            "the last probe",
            Duration::from_secs(10),
            |_| false,
            |t| monitor.observe(t),
        )
        .await;
    let totals = fleet.totals();
    let results: Vec<_> = probes
        .iter()
        .enumerate()
        .map(|(i, (at, connected))| (*at, *connected, fleet.seq_latency(i as u64)))
        .collect();
    monitor.say("closing");
    let (_, _) = fleet.stop().await?;
    monitor.finish();
    let full = results.iter().rev().find(|r| r.2.is_some());
    // Users whose connection neither succeeded nor failed by the end (a server out of
    // descriptors leaves them in its backlog): failures too, of the quietest kind.
    let unanswered = totals
        .started
        .saturating_sub(totals.accepted + totals.error_count);
    let worst = results.iter().filter_map(|r| r.2.map(|l| l.1)).max();
    let mut t = Table::new(
        format!(
            "ramp: {} users/s for {:?} over {}",
            args.rate,
            args.duration,
            args.transport.label()
        ),
        &[
            "arrivals/s",
            "users",
            "connections accepted",
            "errors",
            "no answer",
            "error rate %",
            "full-load response ms (last subscriber)",
            "first subscriber ms",
            "worst probe ms",
            "MTBF s",
        ],
    );
    t.push(vec![
        round(args.rate, 1),
        json!(totals.started),
        json!(totals.accepted),
        json!(totals.error_count),
        json!(unanswered),
        round(
            (totals.error_count + unanswered) as f64 * 100.0 / totals.started.max(1) as f64,
            2,
        ),
        full.and_then(|r| r.2).map_or(Value::Null, |l| ms(l.1)),
        full.and_then(|r| r.2).map_or(Value::Null, |l| ms(l.0)),
        worst.map_or(Value::Null, ms),
        totals.first_error_s.map_or(json!("-"), |s| round(s, 0)),
    ]);
    let mut study = Table::new(
        "published (study 1: Tsung against Phoenix, 80 users/s for 300 s, 1 vCPU)",
        &[
            "arrivals/s",
            "server",
            "requests",
            "connections",
            "errors",
            "full-load response ms",
            "MTBF s",
        ],
    );
    for (rate, server, req, conns, errs, resp, mtbf) in [
        (10, "Phoenix", 2963, 2963, 0, 210, "-"),
        (20, "Phoenix", 5915, 5915, 0, 834, "-"),
        (40, "Phoenix", 11314, 11313, 1, 1194, "-"),
        (80, "Phoenix", 23215, 20686, 546, 5692, "220"),
    ] {
        study.push(vec![
            json!(rate),
            json!(server),
            json!(req),
            json!(conns),
            json!(errs),
            json!(resp),
            json!(mtbf),
        ]);
    }
    let mut probes_table = Table::new("probes", &["at s", "subscribers", "first ms", "last ms"]);
    for (at, connected, lat) in &results {
        probes_table.push(vec![
            round(*at, 1),
            json!(connected),
            lat.map_or(Value::Null, |l| ms(l.0)),
            lat.map_or(Value::Null, |l| ms(l.1)),
        ]);
    }
    let mut notes = vec![
        "full-load response = publish through the HTTP API to receipt by the last subscriber, for the last probe at full load".into(),
    ];
    notes.extend(super::error_notes(&totals));
    Ok(Outcome {
        scenario: "ramp".into(),
        tables: vec![t, study, probes_table],
        notes,
        series: vec![(args.transport.label(), monitor.points)],
        bars: Vec::new(),
    })
}
