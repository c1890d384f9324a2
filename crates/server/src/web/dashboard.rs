//! The live dashboard at `/dashboard`: a page (built from `sdk/demo/dashboard.ts`, charts by
//! uPlot) that signs in with an API key, takes a ticket (`/api/dashboard/ticket`), and
//! subscribes over Herald's own transports to [`STATS_CHANNEL`], where the nodes publish
//! their figures every second while someone watches.
//!
//! The figures are a digest of each node's `/metrics` ([`digest`]): what the dashboard shows
//! is what Prometheus would scrape, with latency percentiles worked out between two looks.
//! With several nodes, each one's digest also travels in its node report (every 2 s), and
//! the watched node publishes every node's latest.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde_json::{json, Map, Value};

use crate::node::Node;

/// Where the nodes' figures are published (the `herald` namespace: read by tickets only).
pub const STATS_CHANNEL: &str = "herald:stats";

/// How often a watched node publishes its figures.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Latency histograms whose percentiles (p50, p99, in ms) the digest carries, between this
/// look and the previous one, over every label value.
const LATENCIES: [(&str, &str); 3] = [
    ("publish", "herald_publish_duration_seconds"),
    ("delivery", "herald_delivery_latency_seconds"),
    ("command", "herald_command_duration_seconds"),
];

/// One sample line of the Prometheus text: `name{label="value",…} number`.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

/// The samples of a Prometheus text (comments skipped; lines it cannot read too).
fn samples(text: &str) -> Vec<Sample<'_>> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(sample)
        .collect()
}

fn sample(line: &str) -> Option<Sample<'_>> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Some(Sample {
            name: series,
            labels: Vec::new(),
            value,
        });
    };
    let mut labels = Vec::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut text = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => text.push('\n'),
                    c => text.push(c),
                },
                (_, c) => text.push(c),
            }
        };
        labels.push((key.trim_start_matches(','), text));
        rest = &after[end + 1..];
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Cumulative bucket counts by upper bound, summed over a histogram's label sets.
type Buckets = Vec<(f64, f64)>;

/// What the digest remembers between two looks: each latency histogram's buckets.
#[derive(Debug, Default)]
pub struct Previous {
    buckets: BTreeMap<&'static str, Buckets>,
}

/// The `q` quantile (ms) of what was observed between `before` and `now`, interpolated
/// inside its bucket as Prometheus's `histogram_quantile` does; `None` if nothing was.
fn quantile_ms(now: &Buckets, before: Option<&Buckets>, q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = now
        .iter()
        .map(|&(le, n)| {
            let was = before
                .and_then(|b| b.iter().find(|(l, _)| *l == le))
                .map_or(0.0, |(_, n)| *n);
            (le, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &delta {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0 * 1e3);
            }
            let within = if count > lower.1 {
                (rank - lower.1) / (count - lower.1)
            } else {
                1.0
            };
            return Some((lower.0 + (le - lower.0) * within) * 1e3);
        }
        lower = (le, count);
    }
    None
}

/// A node's figures for the dashboard, from its Prometheus text: each metric without its
/// `herald_` prefix, a number, or an object by its one label's values; latency
/// histograms as p50/p99 (ms) since the previous look.
pub fn digest(text: &str, previous: &mut Previous) -> Map<String, Value> {
    let mut out = Map::new();
    let mut buckets: BTreeMap<&'static str, Buckets> = BTreeMap::new();
    for s in samples(text) {
        if let Some((key, _)) = LATENCIES
            .iter()
            .find(|(_, name)| s.name.strip_suffix("_bucket") == Some(*name))
        {
            let le = s
                .labels
                .iter()
                .find(|(k, _)| *k == "le")
                .and_then(|(_, v)| {
                    v.parse::<f64>()
                        .ok()
                        .or((v == "+Inf").then_some(f64::INFINITY))
                });
            if let Some(le) = le {
                let b = buckets.entry(key).or_default();
                match b.iter_mut().find(|(l, _)| *l == le) {
                    Some(entry) => entry.1 += s.value,
                    None => b.push((le, s.value)),
                }
            }
            continue;
        }
        let histogram_part = ["_bucket", "_sum", "_count", "_created"]
            .iter()
            .any(|suffix| s.name.ends_with(suffix));
        if histogram_part && !s.name.ends_with("_total") {
            continue;
        }
        let name = s.name.strip_prefix("herald_").unwrap_or(s.name).to_string();
        match s.labels.as_slice() {
            [] => {
                out.insert(name, json!(s.value));
            }
            [(_, value)] => {
                let by = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(by) = by {
                    by.insert(value.clone(), json!(s.value));
                }
            }
            _ => {}
        }
    }
    let mut latency = Map::new();
    for (key, now) in &mut buckets {
        now.sort_by(|a, b| a.0.total_cmp(&b.0));
        // The first look has nothing to compare with: its counts cover everything since
        // the node started, which is not "now".
        let Some(before) = previous.buckets.get(key) else {
            latency.insert(key.to_string(), json!({ "p50": null, "p99": null }));
            continue;
        };
        let before = Some(before);
        latency.insert(
            key.to_string(),
            json!({
                "p50": quantile_ms(now, before, 0.5),
                "p99": quantile_ms(now, before, 0.99),
            }),
        );
    }
    out.insert("latency_ms".into(), Value::Object(latency));
    previous.buckets = buckets;
    out
}

/// Samples the node every [`SAMPLE_EVERY`] while someone watches (and every
/// [`crate::node::REPORT_EVERY`] for its node report, when the broker links several
/// nodes), until the node is dropped.
pub fn spawn_sampler(node: &Arc<Node>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak = Arc::downgrade(node);
    let channel = herald_protocol::ChannelName::new(STATS_CHANNEL).expect("a valid name");
    let report_every =
        (crate::node::REPORT_EVERY.as_millis() / SAMPLE_EVERY.as_millis()).max(1) as u64;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut previous = Previous::default();
        let mut others: Vec<Value> = Vec::new();
        for n in 0u64.. {
            tick.tick().await;
            let Some(node) = weak.upgrade() else { return };
            // A node of several tells the others its figures every `REPORT_EVERY`.
            let report = node.link.as_ref().filter(|_| n % report_every == 0);
            let watched = node.hub.subscriber_count(&channel) > 0;
            if report.is_none() && !watched {
                continue;
            }
            let mut own = digest(&node.metrics_text(), &mut previous);
            own.insert("node".into(), json!(&*node.id));
            own.insert("t".into(), json!(crate::hooks::events::now_ms()));
            own.insert("uptime_seconds".into(), json!(node.uptime().as_secs()));
            let own = Value::Object(own);
            if let Some(link) = report {
                let mut figures = node.figures();
                figures["digest"] = own.clone();
                if let Err(e) = link.report_node(figures.to_string().into()).await {
                    tracing::warn!(error = %e, "could not report this node's figures to the others");
                }
                if watched {
                    others = other_digests(&node).await;
                }
            }
            if watched {
                let mut nodes = vec![own];
                nodes.extend(others.iter().cloned());
                let data = json!({ "nodes": nodes }).to_string().into();
                if let Err(f) = crate::publish::publish(&node, &channel, data, None).await {
                    tracing::debug!(error = %f.message, "could not publish the dashboard's figures");
                }
            }
        }
    });
}

/// The digests other nodes reported last.
async fn other_digests(node: &Node) -> Vec<Value> {
    let Some(link) = &node.link else {
        return Vec::new();
    };
    let Ok(reported) = link.nodes().await else {
        return Vec::new();
    };
    reported
        .iter()
        .filter_map(|f| serde_json::from_slice::<Value>(f).ok())
        .filter(|f| f["node"].as_str() != Some(&*node.id))
        .map(|mut f| f["digest"].take())
        .filter(Value::is_object)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_with_labels_and_escapes() {
        let s = sample(r#"herald_x_total{code="3003",note="a\"b,c"} 4"#).unwrap();
        assert_eq!(s.name, "herald_x_total");
        assert_eq!(
            s.labels,
            vec![("code", "3003".to_string()), ("note", "a\"b,c".to_string())]
        );
        assert_eq!(s.value, 4.0);
        assert_eq!(sample("herald_up 1").unwrap().labels, vec![]);
        assert!(sample("garbage").is_none());
    }

    #[test]
    fn digests_metrics_and_latency_percentiles_between_looks() {
        let m = crate::metrics::Metrics::default();
        m.opened(crate::hooks::Transport::Websocket);
        m.disconnected(1000);
        for _ in 0..10 {
            m.published("chat", "memory", Duration::from_micros(30));
        }
        let mut previous = Previous::default();
        let first = digest(&m.encode(Default::default()), &mut previous);
        assert_eq!(first["connections"]["websocket"], 1.0);
        assert_eq!(first["disconnects_total"]["1000"], 1.0);
        assert_eq!(first["publications_total"]["chat"], 10.0);
        // The first look has no interval to speak of.
        assert!(first["latency_ms"]["publish"]["p50"].is_null());
        for _ in 0..10 {
            m.published("chat", "memory", Duration::from_micros(30));
        }
        let between = digest(&m.encode(Default::default()), &mut previous);
        // All ten at or under 50 µs: p50 inside the first bucket.
        let p50 = between["latency_ms"]["publish"]["p50"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= 0.05, "{p50}");
        // Between two looks: only what happened in between.
        m.published("chat", "memory", Duration::from_millis(3));
        let second = digest(&m.encode(Default::default()), &mut previous);
        let p50 = second["latency_ms"]["publish"]["p50"].as_f64().unwrap();
        assert!((1.6..=3.2).contains(&p50), "{p50}");
        let third = digest(&m.encode(Default::default()), &mut previous);
        assert!(third["latency_ms"]["publish"]["p50"].is_null());
    }
}
