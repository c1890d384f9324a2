//! The durable store at scale (issue #57 item 5): a store of N kept publications in C
//! channels, then what an open costs after a `kill -9` and after `herald.index` is
//! deleted, the idle memory per kept publication, and a lone publisher's latency at
//! 100,000 and at N kept. Figures in docs/benchmarks.md, "The store at scale".
//!
//! ```text
//! cargo run --release -p herald-broker --example store_scale -- DIR [N] [C]
//! ```
//!
//! Run as: `fill` (publishes, then aborts without closing, as `kill -9` leaves it),
//! `open` (opens once; prints the time and the memory), driven by the default command,
//! which runs them as child processes of itself. The fill logs each checkpoint the store
//! writes and each merge of its deltas (debug lines), which the driver sums up: how long
//! each held the thread that applies publications to the index, and took on its own.

use std::{
    io::BufRead,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use herald_broker::{Broker, DurableBroker, PublicationSink, StreamPolicy, SyncPolicy};
use herald_protocol::{ChannelName, Epoch, Publication};

struct Discard;

impl PublicationSink for Discard {
    fn on_publication(&self, _: &ChannelName, _: &Epoch, _: &Publication) {}
}

fn policy(per_channel: usize) -> StreamPolicy {
    StreamPolicy {
        history_size: per_channel,
        history_ttl: Duration::from_secs(365 * 24 * 3600),
        meta_ttl: Duration::from_secs(365 * 24 * 3600),
    }
}

fn open(dir: &Path, per_channel: usize) -> Arc<DurableBroker> {
    let policy = policy(per_channel);
    DurableBroker::open_with(
        dir,
        SyncPolicy::Interval,
        Arc::new(Discard),
        Arc::new(move |_| policy),
    )
    .unwrap()
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// A lone publisher's latency, p50 and p99 in µs, over `n` publications.
async fn latency(
    broker: &DurableBroker,
    channels: usize,
    n: usize,
    per_channel: usize,
) -> (f64, f64) {
    let data = Bytes::from(format!("\"{}\"", "y".repeat(98)));
    let mut took: Vec<f64> = Vec::with_capacity(n);
    for i in 0..n {
        let channel = ChannelName::new(&format!("room:{}", i % channels)).unwrap();
        let started = Instant::now();
        broker
            .publish(&channel, data.clone(), policy(per_channel))
            .await
            .unwrap();
        took.push(started.elapsed().as_secs_f64() * 1e6);
    }
    took.sort_by(|a, b| a.total_cmp(b));
    (took[n / 2], took[n * 99 / 100])
}

async fn fill(dir: &Path, total: usize, channels: usize) {
    let per_channel = total / channels;
    let broker = open(dir, per_channel);
    let data = Bytes::from(format!("\"{}\"", "x".repeat(98)));
    let started = Instant::now();
    let mut at_100k = None;
    let mut done = 0;
    while done < total {
        if done >= 100_000 && at_100k.is_none() {
            at_100k = Some(latency(&broker, channels, 2_000, per_channel).await);
            done += 2_000;
        }
        let wave = 64.min(total - done);
        let tasks: Vec<_> = (0..wave)
            .map(|k| {
                let broker = broker.clone();
                let data = data.clone();
                let channel = ChannelName::new(&format!("room:{}", (done + k) % channels)).unwrap();
                tokio::spawn(async move {
                    broker
                        .publish(&channel, data, policy(per_channel))
                        .await
                        .unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        done += wave;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let at_full = latency(&broker, channels, 2_000, per_channel).await;
    let (p50_100k, p99_100k) = at_100k.unwrap_or_default();
    println!(
        "fill: {total} publications in {channels} channels in {elapsed:.1} s ({:.0}/s)",
        total as f64 / elapsed
    );
    println!("lone publisher at 100,000 kept: p50 {p50_100k:.1} us, p99 {p99_100k:.1} us");
    println!(
        "lone publisher at {total} kept: p50 {:.1} us, p99 {:.1} us",
        at_full.0, at_full.1
    );
    // As `kill -9` leaves it: no last checkpoint, the log since the last one replayed at
    // the next open.
    std::process::abort();
}

async fn open_once(dir: &Path, per_channel: usize, what: &str) {
    let before = rss();
    let started = Instant::now();
    let broker = open(dir, per_channel);
    let took = started.elapsed();
    let after = rss();
    println!(
        "open {what}: {:.2} s; resident {:.0} MB ({:.0} MB before the open)",
        took.as_secs_f64(),
        after as f64 / 1e6,
        before as f64 / 1e6
    );
    drop(broker);
}

/// Runs the fill and sums up the store's debug lines: how long each checkpoint held the
/// applier, how long each delta took to write and each merge to run on their threads.
fn fill_and_sum_up(me: &Path, dir: &str, total: usize, channels: usize) {
    let mut child = Command::new(me)
        .args(["fill", dir, &total.to_string(), &channels.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let field = |line: &str, name: &str| -> Option<f64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split(' ').next()?.parse().ok()
    };
    let (mut held, mut deltas, mut bytes, mut merges) = (vec![], vec![], vec![], vec![]);
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("handed a checkpoint over") {
            held.extend(field(&line, "us").map(|us| us / 1e3));
        } else if line.contains("wrote a delta of the index") {
            deltas.extend(field(&line, "us").map(|us| us / 1e3));
            bytes.extend(field(&line, "bytes").map(|b| b / 1e6));
        } else if line.contains("merged the index's deltas") {
            merges.extend(field(&line, "us").map(|us| us / 1e3));
        } else if !line.contains("DEBUG") {
            eprintln!("{line}");
        }
    }
    child.wait().unwrap();
    let sum_up = |what: &str, unit: &str, mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        if let (Some(max), false) = (v.last(), v.is_empty()) {
            println!(
                "{what}: {} times, p50 {:.1} {unit}, max {max:.1} {unit}",
                v.len(),
                v[v.len() / 2]
            );
        }
    };
    sum_up("checkpoint handed over (applier held)", "ms", held);
    sum_up("delta written (own thread)", "ms", deltas);
    sum_up("delta size", "MB", bytes);
    sum_up("merge (own thread)", "ms", merges);
}

fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let me = std::env::current_exe().unwrap();
    match args.get(1).map(String::as_str) {
        Some("fill") => {
            tracing_subscriber::fmt()
                .with_env_filter("herald_broker=debug")
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .init();
            let (total, channels) = (args[3].parse().unwrap(), args[4].parse().unwrap());
            fill(Path::new(&args[2]), total, channels).await
        }
        Some("open") => {
            let per_channel: usize = args[3].parse().unwrap();
            open_once(Path::new(&args[2]), per_channel, &args[4]).await
        }
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let total: usize = args.get(2).map_or(10_000_000, |n| n.parse().unwrap());
            let channels: usize = args.get(3).map_or(20_000, |n| n.parse().unwrap());
            let per_channel = (total / channels).to_string();
            let run = |args: &[&str]| {
                let status = Command::new(&me).args(args).status().unwrap();
                status
            };
            let d = dir.to_str().unwrap();
            fill_and_sum_up(&me, d, total, channels);
            println!("files: {:.0} MB", du(&dir) as f64 / 1e6);
            run(&["open", d, &per_channel, "after kill -9"]);
            run(&["open", d, &per_channel, "after a clean stop"]);
            std::fs::remove_file(dir.join("herald.index")).unwrap();
            run(&[
                "open",
                d,
                &per_channel,
                "with herald.index deleted (rebuilt)",
            ]);
        }
        None => eprintln!("usage: store_scale DIR [N] [CHANNELS]"),
    }
}
