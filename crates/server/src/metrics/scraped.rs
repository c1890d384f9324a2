//! The figures `/metrics` reads when scraped rather than counts as things happen: the
//! node's snapshot, the sums of the transports' sharded counts, and this process's CPU
//! (per thread too), memory and descriptors from /proc.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use super::{
    LimitLabel, Snapshot, ThreadLabel, TopologyLabel, TransportLabel, Wire, FANOUT_THREAD,
    WORKER_THREAD,
};

/// The figures read at scrape time: the node's snapshot, the sums of the transports'
/// sharded counts, and this process's CPU, memory and descriptors (from /proc; absent
/// elsewhere).
#[derive(Debug)]
pub(super) struct Scraped {
    pub(super) snapshot: Arc<Mutex<Snapshot>>,
    pub(super) wires: Arc<[Arc<Wire>]>,
}

impl Scraped {
    /// One family with a value per transport, read from its [`Wire`].
    fn by_transport(
        &self,
        encoder: &mut DescriptorEncoder,
        (name, help): (&str, &str),
        counter: bool,
        value: impl Fn(&Wire) -> i64,
    ) -> Result<(), std::fmt::Error> {
        let kind = if counter {
            prometheus_client::metrics::MetricType::Counter
        } else {
            prometheus_client::metrics::MetricType::Gauge
        };
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for wire in self.wires.iter() {
            let label = TransportLabel {
                transport: wire.transport,
            };
            let v = value(wire).max(0);
            if counter {
                ConstCounter::new(v as u64).encode(family.encode_family(&label)?)?;
            } else {
                ConstGauge::new(v).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.by_transport(
            &mut encoder,
            ("pushes", "Pushes (publications and presence changes) handed to clients' sockets, by transport"),
            true,
            |w| w.pushes.sum(),
        )?;
        self.by_transport(
            &mut encoder,
            (
                "pushed_bytes",
                "Bytes of those pushes as encoded, before the transport's framing, by transport",
            ),
            true,
            |w| w.bytes.sum(),
        )?;
        self.by_transport(
            &mut encoder,
            ("queued_bytes", "Bytes of pushes waiting in connections' queues (slow or busy clients), by transport"),
            false,
            |w| w.queued.sum(),
        )?;
        let s = self.snapshot.lock().clone();
        let counters = [
            (
                "publications_fanned_out",
                "Publications handed to this node's subscribers",
                s.publications_fanned_out,
            ),
            (
                "deliveries",
                "Publications queued for a subscriber (one per publication per subscriber)",
                s.deliveries,
            ),
            (
                "events_dropped",
                "Events for the backend's events hook dropped while hooks.events_max_pending were waiting",
                s.events_dropped,
            ),
        ];
        for (name, help, value) in counters {
            let metric = ConstCounter::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        let mut gauges = vec![
            ("channels", "Channels the broker holds", s.channels as i64),
            (
                "subscribed_channels",
                "Channels with subscribers on this node",
                s.subscribed_channels as i64,
            ),
            (
                "subscriptions",
                "Subscriptions of this node's connections, over every channel",
                s.subscriptions as i64,
            ),
            (
                "sockets",
                "Open TCP sockets, whatever they carry",
                s.sockets as i64,
            ),
        ];
        if let Some(p) = process() {
            gauges.push((
                "process_resident_memory_bytes",
                "Resident memory of this process",
                p.rss_bytes as i64,
            ));
            gauges.push((
                "process_open_fds",
                "Open file descriptors of this process",
                p.open_fds as i64,
            ));
            let cpu = ConstCounter::new(p.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time of this process",
                None,
                cpu.metric_type(),
            )?)?;
        }
        for (name, help, value) in gauges {
            let metric = ConstGauge::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        if let Some(reach) = &s.broker_reach {
            let up = ConstGauge::new(i64::from(reach.lost.is_none()));
            up.encode(encoder.encode_descriptor(
                "broker_up",
                "1 while this node reaches its remote broker (Redis: the command connection answers a PING and the pub/sub connection is subscribed), 0 while it does not (broker.unreachable_after; /readyz answers 503 then)",
                None,
                up.metric_type(),
            )?)?;
            let mut family = encoder.encode_descriptor(
                "broker_topology",
                "How the remote broker is laid out, as a label (Redis: single, sentinel, cluster)",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            let topology = TopologyLabel {
                topology: reach.topology,
            };
            ConstGauge::new(1i64).encode(family.encode_family(&topology)?)?;
            for (name, help, value) in [
                (
                    "broker_losses",
                    "Times this node lost its way to its remote broker",
                    reach.losses,
                ),
                (
                    "broker_recoveries",
                    "Times this node found its way to its remote broker again",
                    reach.recoveries,
                ),
                (
                    "broker_moves",
                    "Times this node followed a primary: Sentinel, connected to the one the Sentinels name after losing the one it had (a failover, or the same primary back); Cluster, lost a node's pub/sub connection or a shard channel to a moved slot (then subscribed again)",
                    reach.moves,
                ),
                (
                    "broker_resubscriptions",
                    "Times this node subscribed again on a new pub/sub connection, then caught up from history",
                    reach.resubscriptions,
                ),
            ] {
                let counter = prometheus_client::metrics::counter::ConstCounter::new(value);
                counter.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    counter.metric_type(),
                )?)?;
            }
        }
        if let Some(lag) = s.broker_lag {
            let metric = ConstGauge::new(lag.as_secs_f64());
            metric.encode(encoder.encode_descriptor(
                "broker_lag_seconds",
                "Redis: how long this node's own probe took from PUBLISH to its pub/sub listener at the last check (every 2 s; a probe still out counts as its age)",
                None,
                metric.metric_type(),
            )?)?;
        }
        let mut family = encoder.encode_descriptor(
            "refusals",
            "Clients refused by a limit, by its setting: max_connections (503, 106), and the per-address limits (106 or 111). Behind a proxy not in limits.trusted_proxies every client counts as the proxy's address",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (limit, count) in &s.refusals {
            ConstCounter::new(*count).encode(family.encode_family(&LimitLabel { limit })?)?;
        }
        let threads = threads();
        if !threads.is_empty() {
            let mut family = encoder.encode_descriptor(
                "thread_cpu_seconds",
                "CPU time of each runtime worker (herald-w-N) and fan-out thread (herald-f-N); every other thread summed as `other`. Uneven rates mean uneven load",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (thread, seconds) in threads {
                let metric = ConstCounter::new(seconds);
                metric.encode(family.encode_family(&ThreadLabel { thread })?)?;
            }
        }
        Ok(())
    }
}

/// CPU seconds per thread of this process (Linux: /proc/self/task), for the workers and
/// fan-out threads by name, the rest summed as `other`.
pub(super) fn threads() -> Vec<(String, f64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut by_name: std::collections::BTreeMap<String, f64> = Default::default();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((name, seconds)) = thread_cpu(&stat) else {
            continue;
        };
        let kept = name.starts_with(WORKER_THREAD) || name.starts_with(FANOUT_THREAD);
        let label = if kept { name } else { "other".to_string() };
        *by_name.entry(label).or_default() += seconds;
    }
    by_name.into_iter().collect()
}

/// A thread's name and CPU seconds from its `stat` line: `TID (NAME) STATE …`, user and
/// system time the 14th and 15th fields, in ticks of 1/100 s.
pub(super) fn thread_cpu(stat: &str) -> Option<(String, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((name, ticks as f64 / 100.0))
}

struct Process {
    cpu_seconds: f64,
    rss_bytes: u64,
    open_fds: u64,
}

/// This process's figures from /proc (Linux): CPU in clock ticks of 1/100 s (USER_HZ,
/// which /proc always uses), resident memory from `VmRSS`.
fn process() -> Option<Process> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(Process {
        cpu_seconds: ticks as f64 / 100.0,
        rss_bytes: rss_kb * 1024,
        open_fds,
    })
}
