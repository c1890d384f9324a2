//! `herald top`: a live terminal view of a running Herald, every node of it (like `nats
//! top`): what `/api/nodes` says of each node, rates between two looks, and from the node
//! that answers, its connections by transport and how connections ended.

use std::{collections::BTreeMap, fmt::Write as _, process::ExitCode, time::Duration};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::cli::TopArgs;

/// One look at the cluster: each node's figures by id, and the answering node's metrics.
struct Look {
    nodes: BTreeMap<String, Value>,
    metrics: String,
}

pub async fn run(a: TopArgs) -> anyhow::Result<ExitCode> {
    let Some(key) = a.api_key.clone() else {
        bail!("an API key is needed: pass --api-key or set HERALD_API_KEY");
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let base = a.server.url.trim_end_matches('/').to_string();
    let look = || async {
        let get = |path: &str| {
            http.get(format!("{base}{path}"))
                .header("Authorization", format!("apikey {key}"))
                .send()
        };
        let answer = get("/api/nodes")
            .await
            .with_context(|| format!("cannot reach {base}"))?;
        let status = answer.status();
        let listed: Value = answer.json().await.unwrap_or_default();
        if !status.is_success() {
            bail!(
                "{base}/api/nodes answered {status}: {}",
                listed["error"]["message"]
                    .as_str()
                    .unwrap_or("no reason given")
            );
        }
        let nodes = listed["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| Some((n["node"].as_str()?.to_string(), n.clone())))
            .collect();
        let metrics = get("/metrics").await?.text().await?;
        anyhow::Ok(Look { nodes, metrics })
    };
    let mut before = look().await?;
    loop {
        tokio::time::sleep(a.interval).await;
        let now = look().await?;
        let view = render(&before, &now, a.interval, &base);
        if a.once {
            print!("{view}");
            return Ok(ExitCode::SUCCESS);
        }
        // Clear the screen and draw from the top left.
        print!("\x1b[2J\x1b[H{view}");
        use std::io::Write as _;
        std::io::stdout().flush()?;
        before = now;
    }
}

/// The view: a line for the cluster, a row per node, then the answering node's detail.
fn render(before: &Look, now: &Look, over: Duration, base: &str) -> String {
    let seconds = over.as_secs_f64().max(1e-3);
    let rate = |id: &str, key: &str| -> f64 {
        let of = |l: &Look| l.nodes.get(id).and_then(|n| n[key].as_u64()).unwrap_or(0);
        of(now).saturating_sub(of(before)) as f64 / seconds
    };
    let count = |n: &Value, key: &str| n[key].as_u64().unwrap_or(0);
    let mut out = String::new();
    let total = |key: &str| now.nodes.values().map(|n| count(n, key)).sum::<u64>();
    let _ = writeln!(
        out,
        "herald top: {base}, {} node{}, {} connections, {:.0} deliveries/s",
        now.nodes.len(),
        if now.nodes.len() == 1 { "" } else { "s" },
        total("connections"),
        now.nodes
            .keys()
            .map(|id| rate(id, "deliveries"))
            .sum::<f64>()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>12} {:>10} {:>14} {:>16}",
        "NODE", "UPTIME", "CONNECTIONS", "CHANNELS", "DELIVERIES/S", "PUBLICATIONS/S"
    );
    for (id, n) in &now.nodes {
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>12} {:>10} {:>14.0} {:>16.1}",
            id,
            humantime::format_duration(Duration::from_secs(count(n, "uptime_seconds"))).to_string(),
            count(n, "connections"),
            count(n, "channels"),
            rate(id, "deliveries"),
            rate(id, "publications_fanned_out"),
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "this node's connections by transport, CPU per thread (% of a core), and how connections ended:"
    );
    let mut open = samples(&now.metrics, "herald_connections{transport=\"");
    // Best transport first, as clients try them.
    const ORDER: [&str; 6] = ["websocket", "sse", "stream", "iframe", "longpoll", "poll"];
    open.sort_by_key(|(t, _)| ORDER.iter().position(|o| o == t).unwrap_or(ORDER.len()));
    let line: Vec<String> = open.iter().map(|(t, v)| format!("{t} {v:.0}")).collect();
    let _ = writeln!(out, "  open:  {}", line.join("  "));
    let mut ends = samples(&now.metrics, "herald_disconnects_total{code=\"");
    ends.sort_by(|a, b| a.0.cmp(&b.0));
    let line: Vec<String> = ends.iter().map(|(c, v)| format!("{c}: {v:.0}")).collect();
    // Per-thread CPU between the two looks: the load on each worker and fan-out thread.
    let cpu = |l: &Look| samples(&l.metrics, "herald_thread_cpu_seconds_total{thread=\"");
    let earlier: BTreeMap<String, f64> = cpu(before).into_iter().collect();
    let load: Vec<String> = cpu(now)
        .into_iter()
        .map(|(t, v)| {
            let was = earlier.get(&t).copied().unwrap_or(v);
            format!("{t} {:.0}%", (v - was).max(0.0) / seconds * 100.0)
        })
        .collect();
    if !load.is_empty() {
        let _ = writeln!(out, "  CPU:   {}", load.join("  "));
    }
    let _ = writeln!(
        out,
        "  ended: {}",
        if line.is_empty() {
            "none yet".to_string()
        } else {
            line.join("  ")
        }
    );
    out
}

/// The samples of one labelled metric in a scrape: `prefix` is the name and the label up to
/// its value, e.g. `herald_connections{transport="`.
fn samples(metrics: &str, prefix: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (label, value) = rest.split_once("\"} ")?;
            Some((label.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_over_the_interval_and_samples_read_by_label() {
        let look = |deliveries: u64, metrics: &str| Look {
            nodes: BTreeMap::from([(
                "n1".to_string(),
                serde_json::json!({"node": "n1", "connections": 3, "deliveries": deliveries, "uptime_seconds": 61}),
            )]),
            metrics: metrics.to_string(),
        };
        let metrics = "herald_connections{transport=\"websocket\"} 2\nherald_connections{transport=\"sse\"} 1\nherald_disconnects_total{code=\"3003\"} 4\nherald_thread_cpu_seconds_total{thread=\"herald-f-0\"} 10.25\n";
        let view = render(
            &look(
                100,
                "herald_thread_cpu_seconds_total{thread=\"herald-f-0\"} 10.0\n",
            ),
            &look(600, metrics),
            Duration::from_millis(500),
            "http://h",
        );
        assert!(
            view.contains("1 node, 3 connections, 1000 deliveries/s"),
            "{view}"
        );
        assert!(view.contains("websocket 2  sse 1"), "{view}");
        assert!(view.contains("3003: 4"), "{view}");
        assert!(
            view.contains("herald-f-0 50%"),
            "a quarter second in half a second: {view}"
        );
        assert!(view.contains("1m 1s"), "{view}");
    }
}
