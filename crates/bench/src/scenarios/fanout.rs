//! N subscribers, M publications at rate R: latency from publish to receipt, loss,
//! duplicates, deliveries per second and the server's CPU per 1,000 deliveries.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::{median_of, percentiles, round, Monitor, Target};
use crate::{
    client::Transport,
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct FanoutArgs {
    /// Subscribers.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: usize,
    /// Channels the subscribers are spread over (publications go round-robin too).
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Publications.
    #[arg(long, default_value_t = 200)]
    pub publications: u64,
    /// Publications per second; 0 = as fast as the API answers (`--publishers` in flight).
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Publish calls in flight at most when `--rate 0` (the "many rooms" study: 16).
    #[arg(long, default_value_t = 8)]
    pub publishers: usize,
    /// Bytes of each publication's data.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// ws, sse, stream, iframe, longpoll, poll or poll@INTERVAL.
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
    /// New connections per second while subscribers join; 0 = as fast as they connect.
    #[arg(long, default_value_t = 0.0)]
    pub connect_rate: f64,
}

/// Clients busier than this (percent of their cores) set the pace themselves.
const CLIENT_BOUND_PERCENT: f64 = 80.0;

pub async fn run(args: FanoutArgs, common: &Common) -> anyhow::Result<Outcome> {
    median_of(
        common.repeat,
        |o| o.tables[0].rows[0][12].as_f64().unwrap_or(f64::MAX),
        || once(args.clone(), common),
    )
    .await
}

pub async fn once(args: FanoutArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let channels: Vec<String> = (0..args.channels.max(1))
        .map(|c| super::fresh_channel(&format!("bench:fanout-{c}")))
        .collect();
    let mut monitor = Monitor::new(&target, "fanout");
    let clients = target.clients(
        &args.transport,
        channels.clone(),
        args.subscribers,
        args.connect_rate,
    );
    // The generic client (any other server's, or Herald's with `--generic-client`) sees no
    // subscription acknowledged in a way it knows.
    let generic_clients = clients.generic.is_some();
    let (fleet, joined) =
        super::launch_and_join(clients, common.workers, &mut monitor, "subscribers").await?;
    let subscribed = joined.connected as usize;
    if generic_clients {
        // Give the last subscriptions a moment to land before publishing.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Subscribers per channel: client i is on channel i % len.
    let per_channel: Vec<u64> = (0..channels.len())
        .map(|c| (0..subscribed).filter(|i| i % channels.len() == c).count() as u64)
        .collect();
    let cpu0 = target.server.sample();
    let clients0 = crate::procstat::sample_all(&fleet.client_pids());
    let received0 = joined.received;
    let publish_start = Instant::now();
    let mut expected = 0u64;
    let mut publish_us: Vec<u64> = Vec::with_capacity(args.publications as usize);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut publishers_max = 0;
    for seq in 0..args.publications {
        let c = (seq as usize) % channels.len();
        expected += per_channel[c];
        if args.rate > 0.0 {
            let due = publish_start + Duration::from_secs_f64(seq as f64 / args.rate);
            tokio::time::sleep_until(due.into()).await;
        } else if in_flight.len() >= args.publishers.max(1) {
            if let Some(took) = in_flight.join_next().await.transpose()?.transpose()? {
                publish_us.push(took);
            }
        }
        let (p, ch, size) = (target.publisher.clone(), channels[c].clone(), args.payload);
        in_flight.spawn(async move {
            let began = Instant::now();
            p.publish(&ch, seq, size).await?;
            Ok::<_, anyhow::Error>(began.elapsed().as_micros() as u64)
        });
        // At a rate, a publication goes when it is due, whatever the earlier ones' answers:
        // a slow publish API gets more publishers in flight, not fewer publications.
        while let Some(done) = in_flight.try_join_next() {
            publish_us.push(done??);
        }
        publishers_max = publishers_max.max(in_flight.len());
        monitor.observe(&fleet.totals());
    }
    let last_sent = publish_start.elapsed();
    while let Some(r) = in_flight.join_next().await {
        publish_us.push(r??);
    }
    publish_us.sort_unstable();
    // The publish API's answer time, as the publisher saw it (its HTTP round trip).
    let publish_ms = |q: f64| {
        publish_us
            .get(((publish_us.len() as f64 - 1.0) * q).round() as usize)
            .map_or(serde_json::Value::Null, |us| round(*us as f64 / 1000.0, 2))
    };
    let published_in = publish_start.elapsed();
    let drained = fleet
        .wait_for(
            "deliveries",
            Duration::from_secs(30),
            |t| t.received - received0 + t.gaps >= expected,
            |t| monitor.observe(t),
        )
        .await
        .unwrap_or_else(|_| fleet.totals());
    let delivered_in = publish_start.elapsed();
    let cpu1 = target.server.sample();
    let clients1 = crate::procstat::sample_all(&fleet.client_pids());
    let info = target.info().await;
    let mut last_subscriber_max = 0u64;
    // Per publication: when its first subscriber had it (how soon the server starts a
    // fan-out) and how long after that its last one did (the pace of the server's writes
    // or of the clients' reads, whichever is slower).
    let (mut firsts, mut spreads) = (Vec::new(), Vec::new());
    for seq in 0..args.publications {
        if let Some((first, last)) = fleet.seq_latency(seq) {
            last_subscriber_max = last_subscriber_max.max(last);
            firsts.push(first);
            spreads.push(last.saturating_sub(first));
        }
    }
    let median_ms = |mut us: Vec<u64>| {
        us.sort_unstable();
        us.get(us.len() / 2)
            .map_or(serde_json::Value::Null, |m| super::ms(*m))
    };
    // How long after it was sent the last publication reached its last subscriber.
    let lag = fleet
        .seq_latency(args.publications.saturating_sub(1))
        .map_or(delivered_in.saturating_sub(last_sent), |(_, last)| {
            Duration::from_micros(last)
        });
    monitor.say("stopping clients");
    let (totals, hist) = fleet.stop().await?;
    monitor.finish();
    let deliveries = drained.received - received0;
    let cpu_ms_per_1000 = match (cpu0, cpu1) {
        (Some(a), Some(b)) if deliveries > 0 => {
            Some((b.cpu_seconds - a.cpu_seconds) * 1e6 / deliveries as f64)
        }
        _ => None,
    };
    // How busy the clients' cores were: near 100 %, the rate and the latency are the
    // clients' as much as the server's, and a faster server cannot show it.
    let clients_busy = match (clients0, clients1) {
        (Some(a), Some(b)) => Some(crate::procstat::busy_percent(&a, &b)),
        _ => None,
    };
    let [p50, p90, p99, max] = percentiles(&hist);
    // Equal load: a server held the rate when everything arrived, the last publication
    // within a second (or a period) of being sent. One that fell behind carried less than
    // it was given: its latency is not comparable with a server's that held it.
    let loss = expected.saturating_sub(deliveries);
    let allowed = Duration::from_secs(1).max(Duration::from_secs_f64(1.0 / args.rate.max(1e-3)));
    let held = args.rate <= 0.0 || (loss == 0 && lag <= allowed);
    let mut t = Table::new(
        format!(
            "fan-out: {} subscribers, {} publications at {}/s",
            subscribed, args.publications, args.rate
        ),
        &[
            "transport",
            "subscribers",
            "publications",
            "payload B",
            "deliveries",
            "loss",
            "duplicates",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "last subscriber ms",
            "CPU ms / 1000 deliveries",
            "deliveries/s",
            "server RSS MB",
            "publish p50 ms",
            "publish p99 ms",
            "publications/s",
            "wire B / delivery",
            "load",
            "lag ms",
            "publishers max",
            "clients busy %",
            "first ms",
            "spread ms",
        ],
    );
    t.push(vec![
        json!(args.transport.label()),
        json!(subscribed),
        json!(args.publications),
        json!(args.payload),
        json!(deliveries),
        json!(expected.saturating_sub(deliveries)),
        json!(totals.duplicates),
        p50,
        p90,
        p99,
        max,
        super::ms(last_subscriber_max),
        cpu_ms_per_1000.map_or(serde_json::Value::Null, |v| round(v, 2)),
        round(deliveries as f64 / delivered_in.as_secs_f64().max(1e-3), 0),
        cpu1.map_or(serde_json::Value::Null, |s| {
            round(s.rss_bytes as f64 / 1e6, 1)
        }),
        publish_ms(0.5),
        publish_ms(0.99),
        round(
            args.publications as f64 / published_in.as_secs_f64().max(1e-3),
            0,
        ),
        // What the subscribers read off their sockets while the publications came, per
        // delivery: frames, compressed or not, and their TCP framing's share of nothing.
        if deliveries > 0 {
            round(
                drained.bytes_in.saturating_sub(joined.bytes_in) as f64 / deliveries as f64,
                1,
            )
        } else {
            serde_json::Value::Null
        },
        json!(if held { "held" } else { "behind" }),
        round(lag.as_secs_f64() * 1000.0, 1),
        json!(publishers_max),
        clients_busy.map_or(serde_json::Value::Null, |v| round(v, 1)),
        median_ms(firsts),
        median_ms(spreads),
    ]);
    let mut notes = vec![format!(
        "publishing took {:.2} s; deliveries counted until every expected one arrived (or 30 s); CPU is the server's user+system time over that window (/proc/PID/stat)",
        published_in.as_secs_f64()
    )];
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let total = b.cpu_seconds - a.cpu_seconds;
        let system = b.system_seconds - a.system_seconds;
        if total > 0.0 {
            notes.push(format!(
                "server CPU {:.2} s, {:.0} % of it in the kernel (system time)",
                total,
                system / total * 100.0
            ));
        }
    }
    if !held {
        notes.push(format!(
            "BEHIND: the server did not hold {}/s (lost {loss}, the last publication arrived {:.0} ms after it was sent): compare its latency with no other's",
            args.rate,
            lag.as_secs_f64() * 1000.0
        ));
    }
    if let Some(busy) = clients_busy.filter(|b| *b >= CLIENT_BOUND_PERCENT) {
        notes.push(format!(
            "CLIENT-BOUND: the clients kept their cores {busy:.0} % busy: the rate and the latency measure the clients too; compare the server's CPU per delivery instead"
        ));
    }
    if common.server_cores.is_some()
        || common.server_cgroup.is_some()
        || common.client_cores.is_some()
    {
        let cores = |pid: u32| crate::cores::of(pid).unwrap_or_else(|| "?".into());
        notes.push(format!(
            "server on cores {}, clients on cores {}",
            target.server.pids.first().map_or("?".into(), |p| cores(*p)),
            cores(std::process::id())
        ));
    }
    if target.generic_client {
        notes.push(if generic_clients {
            "Herald read by the generic client: each push searched for its stamp, offsets not checked".to_string()
        } else {
            "Herald read by its own client: --generic-client reads WebSocket and SSE only".to_string()
        });
    }
    if let Some(dir) = &common.server_cgroup {
        let quota = crate::cores::quota(dir)
            .map_or("no CPU quota".into(), |q| format!("a quota of {q:.2} CPUs"));
        notes.push(format!("server in cgroup {} ({quota})", dir.display()));
    }
    if subscribed < args.subscribers {
        notes.push(format!(
            "only {subscribed} of {} subscribers connected; errors: {:?}",
            args.subscribers, joined.errors
        ));
    }
    if let Some(info) = info {
        // With several nodes on one address, the request reaches one of them.
        let whose = if common.nodes > 1 {
            format!("one node's (of {})", common.nodes)
        } else {
            "server".to_string()
        };
        notes.push(format!(
            "{whose} counters: {} publications fanned out, {} deliveries",
            info["publications_fanned_out"], info["deliveries"]
        ));
    }
    if common.nodes > 1 {
        let engine = if common.nats_url.is_some() {
            "NATS JetStream"
        } else {
            "Redis"
        };
        notes.push(format!(
            "{} Herald nodes on one address (SO_REUSEPORT) sharing the channel through {engine}; CPU and RSS are the sum of the nodes and the processes given with --pid (or the Redis started here)",
            common.nodes
        ));
    }
    Ok(Outcome {
        scenario: "fanout".into(),
        tables: vec![t],
        notes,
        series: vec![(args.transport.label(), monitor.points)],
        bars: Vec::new(),
    })
}
