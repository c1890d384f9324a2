//! The parent's side of load generation: starts worker processes, spreads clients and source
//! addresses over them, and adds up what they report.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context};
use hdrhistogram::{serialization::Deserializer, Histogram};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin},
};

use crate::worker::{Report, WorkerSpec};

/// Clients per worker process at most: under the ~20,000 open files one process may hold.
pub const CLIENTS_PER_WORKER: usize = 15_000;
/// Clients per source address at most: well under the ~28,000 ephemeral ports one address
/// has towards one server port.
pub const CLIENTS_PER_SOURCE: usize = 5_000;

/// Per publication `seq`: (first, last) delivery latency over every client, µs.
type SeqSpread = HashMap<u64, (u64, u64)>;

pub struct Fleet {
    workers: Vec<(Child, ChildStdin, tempfile::TempPath)>,
    latest: Arc<Mutex<Vec<Report>>>,
    seqs: Arc<Mutex<SeqSpread>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

/// The sum over workers.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Totals {
    pub started: u64,
    pub connected: u64,
    pub accepted: u64,
    pub dropped: u64,
    pub received: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub errors: BTreeMap<String, u64>,
    pub error_count: u64,
    pub first_error_s: Option<f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub packets_in: u64,
    pub packets_out: u64,
    /// Worst worker's p99 over the last interval, µs.
    pub interval_p99_us: u64,
    pub interval_max_us: u64,
    pub presence_pushes: u64,
    pub presence_changes: u64,
    pub presence_bytes: u64,
}

/// Source addresses 127.0.0.2 ... so that `clients` never need more than
/// [`CLIENTS_PER_SOURCE`] ports from one of them, and each of `workers` has its own.
/// 127.0.0.1 is left to the publisher and everything else on the machine.
pub fn loopback_sources(clients: usize, workers: usize) -> Vec<IpAddr> {
    let n = clients
        .div_ceil(CLIENTS_PER_SOURCE)
        .max(workers)
        .clamp(1, 250);
    (2..n as u8 + 2)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)))
        .collect()
}

impl Fleet {
    /// Splits `template.clients` over enough workers (at least `min_workers`) and starts them.
    pub async fn launch(template: WorkerSpec, min_workers: usize) -> anyhow::Result<Self> {
        let total = template.clients;
        let count = total.div_ceil(CLIENTS_PER_WORKER).max(min_workers).max(1);
        let exe = std::env::current_exe()?;
        let sources = if template.sources.is_empty() {
            loopback_sources(total, count)
        } else {
            template.sources.clone()
        };
        let mut fleet = Fleet {
            workers: Vec::new(),
            latest: Arc::new(Mutex::new(vec![Report::default(); count])),
            seqs: Arc::default(),
            readers: Vec::new(),
        };
        for w in 0..count {
            let mut spec = template.clone();
            spec.clients = total / count + usize::from(w < total % count);
            spec.rate = template.rate / count as f64;
            spec.speakers = template.speakers / count + usize::from(w < template.speakers % count);
            // Each worker takes its own share of the source addresses when there are enough.
            spec.sources = if sources.len() >= count {
                sources.iter().skip(w).step_by(count).copied().collect()
            } else {
                sources.clone()
            };
            // Rotate channels so that every worker's first client does not share one.
            spec.channels
                .rotate_left(w % template.channels.len().max(1));
            let hist = tempfile::NamedTempFile::new()?.into_temp_path();
            spec.histogram = hist.to_path_buf();
            let mut child = tokio::process::Command::new(&exe)
                .arg("bench-worker")
                .arg(serde_json::to_string(&spec)?)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("starting a load worker")?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = child.stdout.take().expect("piped");
            let (latest, seqs) = (fleet.latest.clone(), fleet.seqs.clone());
            fleet.readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(report) = serde_json::from_str::<Report>(&line) else {
                        continue;
                    };
                    {
                        let mut s = seqs.lock().unwrap();
                        for (seq, _, min, max) in &report.seqs {
                            let e = s.entry(*seq).or_insert((u64::MAX, 0));
                            e.0 = e.0.min(*min);
                            e.1 = e.1.max(*max);
                        }
                    }
                    latest.lock().unwrap()[w] = report;
                }
            }));
            fleet.workers.push((child, stdin, hist));
        }
        Ok(fleet)
    }

    /// The load's processes: this one (the publisher) and its workers (the subscribers).
    pub fn client_pids(&self) -> Vec<u32> {
        std::iter::once(std::process::id())
            .chain(self.workers.iter().filter_map(|(child, _, _)| child.id()))
            .collect()
    }

    pub fn totals(&self) -> Totals {
        let latest = self.latest.lock().unwrap();
        let mut t = Totals::default();
        for r in latest.iter() {
            t.started += r.started;
            t.connected += r.connected;
            t.accepted += r.accepted;
            t.dropped += r.dropped;
            t.received += r.received;
            t.duplicates += r.duplicates;
            t.gaps += r.gaps;
            for (k, v) in &r.errors {
                *t.errors.entry(k.clone()).or_default() += v;
                t.error_count += v;
            }
            t.first_error_s = match (t.first_error_s, r.first_error_s) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            t.bytes_in += r.bytes_in;
            t.bytes_out += r.bytes_out;
            t.packets_in += r.packets_in;
            t.packets_out += r.packets_out;
            t.interval_p99_us = t.interval_p99_us.max(r.interval_p99_us);
            t.interval_max_us = t.interval_max_us.max(r.interval_max_us);
            t.presence_pushes += r.presence_pushes;
            t.presence_changes += r.presence_changes;
            t.presence_bytes += r.presence_bytes;
        }
        t
    }

    /// (first delivery, last delivery) latency of publication `seq`, µs, over every client.
    pub fn seq_latency(&self, seq: u64) -> Option<(u64, u64)> {
        self.seqs.lock().unwrap().get(&seq).copied()
    }

    /// Waits until `ready(totals)` holds, or fails after `limit`.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut(&Totals) -> bool,
        mut progress: impl FnMut(&Totals),
    ) -> anyhow::Result<Totals> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let t = self.totals();
            progress(&t);
            if ready(&t) {
                return Ok(t);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("gave up waiting for {what} after {limit:?}: {t:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every client drops its connection at once and connects again: with the first
    /// connection's client id (`resume`), or as a new client.
    pub async fn reconnect(&mut self, resume: bool) -> anyhow::Result<()> {
        let line: &[u8] = if resume {
            b"reconnect resume\n"
        } else {
            b"reconnect\n"
        };
        for (_, stdin, _) in &mut self.workers {
            stdin.write_all(line).await?;
            stdin.flush().await?;
        }
        Ok(())
    }

    /// Stops every worker; returns the final totals and the merged latency histogram (µs).
    pub async fn stop(mut self) -> anyhow::Result<(Totals, Histogram<u64>)> {
        for (_, stdin, _) in &mut self.workers {
            let _ = stdin.write_all(b"stop\n").await;
            let _ = stdin.flush().await;
        }
        for (child, _, _) in &mut self.workers {
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        }
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
        let mut merged = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
        for (_, _, path) in &self.workers {
            let bytes = std::fs::read(path).unwrap_or_default();
            if bytes.is_empty() {
                continue;
            }
            let h: Histogram<u64> = Deserializer::new().deserialize(&mut bytes.as_slice())?;
            merged.add(&h)?;
        }
        Ok((self.totals(), merged))
    }
}
