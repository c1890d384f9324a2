//! Study 1's client experiment: two clients each say "this is a chat message!" every 2.5 s for
//! 60 s over each transport in turn. Bytes are counted at the client sockets; packets by the
//! kernel's per-socket TCP segment counters (TCP_INFO), which need no capture.

use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::{percentiles, round, transport_list, Monitor, Target};
use crate::{
    fleet::Fleet,
    record::Speak,
    report::{BarMetric, Bars, Outcome, Table},
    Common,
};

/// TCP/IP headers a capture would add per packet on loopback: IPv4 20 + TCP 32 (timestamps)
/// + a 14-byte link header.
const HEADERS_PER_PACKET: u64 = 66;

#[derive(Debug, Args, Clone)]
pub struct TransportsArgs {
    /// Transports, in order.
    #[arg(long, default_value = "poll@1s,longpoll,sse,stream,ws")]
    pub transports: String,
    /// Clients speaking.
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Each client speaks this often.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2.5s")]
    pub every: Duration,
    /// For how long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub duration: Duration,
    #[arg(long, default_value = "this is a chat message!")]
    pub text: String,
}

pub async fn run(args: TransportsArgs, common: &Common) -> anyhow::Result<Outcome> {
    let mut t = Table::new(
        format!(
            "transports: {} clients speaking every {:?} for {:?}",
            args.clients, args.every, args.duration
        ),
        &[
            "transport",
            "packets",
            "bytes",
            "bytes/s",
            "bytes/packet",
            "packets per 60 s",
            "bytes per 60 s",
            "payload bytes",
            "client→server packets",
            "server→client packets",
            "client→server bytes",
            "server→client bytes",
            "messages received",
            "p50 ms",
            "p99 ms",
        ],
    );
    // Per transport, for the comparison chart.
    let mut measured: Vec<Measured> = Vec::new();
    let per_minute = 60.0 / args.duration.as_secs_f64().max(1e-3);
    for transport in transport_list(&args.transports)? {
        // A fresh server for each transport, so nothing carries over.
        let target = Target::start(common).await?;
        let mut monitor = Monitor::new(&target, &format!("transports {}", transport.label()))
            .lasting(args.duration);
        let mut spec = target.clients(
            &transport,
            vec!["chat:bench-room".into()],
            args.clients,
            0.0,
        );
        spec.speakers = args.clients;
        spec.speak = Some(Speak {
            every_ms: args.every.as_millis() as u64,
            // Spread the speakers over the period, as two people typing would be.
            offset_ms: 0,
            text: args.text.clone(),
        });
        // One worker: the speakers' offsets are relative to its start.
        let fleet = Fleet::launch(spec, 1).await?;
        let deadline = std::time::Instant::now() + args.duration;
        monitor.watch_until(&fleet, deadline).await;
        let (totals, hist) = fleet.stop().await?;
        monitor.finish();
        let packets = totals.packets_in + totals.packets_out;
        let payload = totals.bytes_in + totals.bytes_out;
        let wire = payload + packets * HEADERS_PER_PACKET;
        let [p50, _, p99, _] = percentiles(&hist);
        t.push(vec![
            json!(transport.label()),
            json!(packets),
            json!(wire),
            round(wire as f64 / args.duration.as_secs_f64(), 0),
            round(wire as f64 / packets.max(1) as f64, 1),
            round(packets as f64 * per_minute, 0),
            round(wire as f64 * per_minute, 0),
            json!(payload),
            json!(totals.packets_out),
            json!(totals.packets_in),
            json!(totals.bytes_out),
            json!(totals.bytes_in),
            json!(totals.received),
            p50,
            p99.clone(),
        ]);
        measured.push((
            transport.label(),
            packets as f64 * per_minute,
            wire as f64 * per_minute,
            p99.as_f64(),
        ));
    }
    let mut study = Table::new(
        "published (study 1: two browsers, 60 s, packet sniffer)",
        &["transport", "packets", "bytes", "bytes/s", "bytes/packet"],
    );
    for (name, _, packets, bytes, per_s, per_packet) in STUDY {
        study.push(vec![
            json!(name),
            json!(packets),
            json!(bytes),
            json!(per_s),
            json!(per_packet),
        ]);
    }
    let study_of = |label: &str| {
        let kind = label.split('@').next().unwrap_or(label);
        STUDY.iter().find(|row| row.1 == kind)
    };
    let categories: Vec<String> = measured.iter().map(|m| m.0.clone()).collect();
    let ours = |get: fn(&Measured) -> Option<f64>| measured.iter().map(get).collect::<Vec<_>>();
    let theirs = |get: fn(&StudyRow) -> f64| {
        categories
            .iter()
            .map(|c| study_of(c).map(get))
            .collect::<Vec<_>>()
    };
    let bars = Bars {
        name: "comparison".into(),
        title: format!(
            "{} clients speaking every {:?}: Herald (run {:?}, scaled to 60 s) beside study 1 (60 s)",
            args.clients, args.every, args.duration
        ),
        categories: categories.clone(),
        sources: vec!["Herald".into(), "study 1 (published)".into()],
        metrics: vec![
            BarMetric {
                label: "packets per 60 s".into(),
                values: vec![ours(|m| Some(m.1)), theirs(|r| r.2 as f64)],
            },
            BarMetric {
                label: "kilobytes per 60 s".into(),
                values: vec![ours(|m| Some(m.2 / 1000.0)), theirs(|r| r.3 as f64 / 1000.0)],
            },
            BarMetric {
                label: "p99 latency, ms (the study gives none)".into(),
                values: vec![ours(|m| m.3), vec![None; categories.len()]],
            },
        ],
    };
    Ok(Outcome {
        scenario: "transports".into(),
        tables: vec![t, study],
        notes: vec![
            "packets: the kernel's per-socket TCP segment counters (TCP_INFO tcpi_segs_in/out) on every client socket, pure ACKs included, read as each socket closes (no capture needed)".into(),
            format!("bytes: TCP payload counted at the client sockets, plus {HEADERS_PER_PACKET} bytes of link/IP/TCP headers per packet, as a capture on loopback would count them; 'payload bytes' is without headers"),
            "speaking: WebSocket clients publish over the socket; the others POST /connection/send; polling asks every 1 s with a cursor, so nothing is fetched twice".into(),
            format!("'per 60 s' scales this run's {:?} to the study's 60 s, so the two tables compare", args.duration),
        ],
        // Two clients speaking every few seconds: a line over time says nothing the
        // comparison does not.
        series: Vec::new(),
        bars: vec![bars],
    })
}

/// A transport's label, packets and bytes per 60 s, and p99 ms.
type Measured = (String, f64, f64, Option<f64>);

/// One row of study 1's table: its name, the bench transport it matches, packets, bytes,
/// bytes/s, bytes/packet (two browsers, 60 s, packet sniffer).
type StudyRow = (&'static str, &'static str, u64, u64, u64, f64);

const STUDY: [StudyRow; 4] = [
    ("polling", "poll", 918, 302_211, 5037, 329.2),
    ("long polling", "longpoll", 555, 245_338, 4088, 442.2),
    ("streaming (SSE)", "sse", 1396, 186_046, 3100, 133.3),
    ("WebSocket", "ws", 568, 138_492, 2300, 243.8),
];
