//! Study 5's churn: clients connect, stay a while, leave and are replaced, while a publisher
//! keeps publishing; connection rate, errors, and the server's CPU and memory over time.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::{percentiles, round, Monitor, Target};
use crate::{
    client::Transport,
    fleet::Fleet,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct ChurnArgs {
    /// Clients present at once.
    #[arg(long, default_value_t = 400)]
    pub clients: usize,
    /// How long each connection lives before it is replaced.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub lifetime: Duration,
    /// How long the run lasts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub duration: Duration,
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
}

pub async fn run(args: ChurnArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let mut monitor = Monitor::new(&target, "churn").lasting(args.duration);
    let channel = super::fresh_channel("bench:churn");
    let mut spec = target.clients(&args.transport, vec![channel.clone()], args.clients, 0.0);
    spec.lifetime_ms = Some(args.lifetime.as_millis() as u64);
    let fleet = Fleet::launch(spec, common.workers).await?;
    let start = Instant::now();
    let cpu0 = target.server.sample();
    let mut seq = 0;
    while start.elapsed() < args.duration {
        target.publisher.publish(&channel, seq, 64).await?;
        seq += 1;
        let next = start + Duration::from_secs(seq);
        monitor.watch_until(&fleet, next).await;
    }
    let cpu1 = target.server.sample();
    let (totals, hist) = fleet.stop().await?;
    monitor.finish();
    let [p50, _, p99, _] = percentiles(&hist);
    let secs = start.elapsed().as_secs_f64();
    let mut t = Table::new(
        format!(
            "churn: {} clients, each replaced after {:?}, for {:?}",
            args.clients, args.lifetime, args.duration
        ),
        &[
            "transport",
            "connections made",
            "connections/s",
            "errors",
            "received",
            "p50 ms",
            "p99 ms",
            "server CPU %",
            "server RSS MB",
        ],
    );
    t.push(vec![
        json!(args.transport.label()),
        json!(totals.accepted),
        round(totals.accepted as f64 / secs, 1),
        json!(totals.error_count),
        json!(totals.received),
        p50,
        p99,
        match (cpu0, cpu1) {
            (Some(a), Some(b)) => round((b.cpu_seconds - a.cpu_seconds) / secs * 100.0, 1),
            _ => Value::Null,
        },
        cpu1.map_or(Value::Null, |s| round(s.rss_bytes as f64 / 1e6, 1)),
    ]);
    Ok(Outcome {
        scenario: "churn".into(),
        tables: vec![t],
        notes: std::iter::once("a publication every second; a client that is between connections misses what is published meanwhile (it resumes nothing: churn measures connection handling)".to_string())
            .chain(super::error_notes(&totals))
            .collect(),
        series: vec![(args.transport.label(), monitor.points)],
        bars: Vec::new(),
    })
}
