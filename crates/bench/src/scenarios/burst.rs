//! Study 5's bursts: a batch of connections at once, every interval, kept open; the server's
//! CPU and memory as they land, and whether any is refused.

use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::{round, Monitor, Target};
use crate::{
    client::Transport,
    fleet::Fleet,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct BurstArgs {
    /// Connections per burst.
    #[arg(long, default_value_t = 600)]
    pub size: usize,
    /// Bursts.
    #[arg(long, default_value_t = 6)]
    pub bursts: usize,
    /// Time between bursts (the study: 120 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub every: Duration,
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
}

pub async fn run(args: BurstArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let mut monitor = Monitor::new(&target, "burst").lasting(args.every * args.bursts as u32);
    let mut fleets = Vec::new();
    let mut t = Table::new(
        format!(
            "bursts of {} {} connections every {:?}",
            args.size,
            args.transport.label(),
            args.every
        ),
        &[
            "burst",
            "connected total",
            "burst landed in ms",
            "errors",
            "server RSS MB",
            "peak CPU %",
        ],
    );
    for b in 0..args.bursts {
        let started = tokio::time::Instant::now();
        let before: u64 = fleets.iter().map(|f: &Fleet| f.totals().connected).sum();
        let fleet = Fleet::launch(
            target.clients(
                &args.transport,
                vec![super::fresh_channel(&format!("bench:burst-{b}"))],
                args.size,
                0.0,
            ),
            1,
        )
        .await?;
        let landed = fleet
            .wait_for(
                "the burst",
                Duration::from_secs(60),
                |t| t.connected as usize + t.error_count as usize >= args.size,
                |t| monitor.observe(t),
            )
            .await?;
        let took = started.elapsed();
        let peak_from = monitor.points.len();
        while started.elapsed() < args.every {
            let mut all = fleet.totals();
            all.connected += before;
            monitor.observe(&all);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let peak = monitor.points[peak_from.saturating_sub(2)..]
            .iter()
            .map(|p| p.cpu_percent)
            .fold(0.0, f64::max);
        t.push(vec![
            json!(b + 1),
            json!(before + landed.connected),
            json!(took.as_millis() as u64),
            json!(landed.error_count),
            target
                .server
                .sample()
                .map_or(Value::Null, |s| round(s.rss_bytes as f64 / 1e6, 1)),
            round(peak, 0),
        ]);
        fleets.push(fleet);
    }
    for f in fleets {
        f.stop().await?;
    }
    monitor.finish();
    Ok(Outcome {
        scenario: "burst".into(),
        tables: vec![t],
        notes: vec!["study 5 ran bursts of 600 every 120 s (peaks of 3,600 and 4,200 connections); the interval is a flag".into()],
        series: vec![(args.transport.label(), monitor.points)],
        bars: Vec::new(),
    })
}
