//! The crash harness (issue #57): the store on a simulated disk (`sim_disk`), publishers
//! writing to it, and at a step chosen by a seed a power cut, a kill, a failed sync or a
//! full disk; then the store opened again, sometimes after a bit flipped at rest, a few
//! times over. Every acknowledgement goes into a model, and after every open the invariant
//! is checked against it: **every acknowledged publication is readable with its data in
//! its epoch, or its channel's epoch changed; no offset is handed out twice in one epoch.**
//!
//! `cargo test -p herald-broker --lib crash_harness` runs `HERALD_CRASH_SEEDS` seeds (2,000
//! unless told) from `HERALD_CRASH_SEED_FROM` (0); `HERALD_CRASH_SEED=n` runs seed n
//! alone and prints what happened. `docs/architecture.md` records the long runs.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Since, StreamPosition};

use super::disk::Dir;
use super::sim_disk::{Fault, SimDisk};
use super::{DurableBroker, OpenError, StoreOptions, SyncPolicy, MIN_SEGMENT_BYTES};
use crate::conformance::Recorder;
use crate::{Broker, HistoryQuery, StreamPolicy};

/// Publications each channel keeps: small, so that trims and compaction run.
const KEEP: usize = 40;
const CHANNELS: usize = 4;
const ROUNDS: usize = 3;

/// What was acknowledged: channel → epoch → offset → data.
#[derive(Default)]
struct Model {
    acked: BTreeMap<String, HashMap<String, BTreeMap<u64, Bytes>>>,
    violations: Vec<String>,
}

impl Model {
    fn ack(&mut self, channel: &str, at: &StreamPosition, data: Bytes) {
        let epoch = self.acked.entry(channel.to_owned()).or_default();
        let offsets = epoch.entry(at.epoch.as_str().to_owned()).or_default();
        if offsets.insert(at.offset, data).is_some() {
            self.violations.push(format!(
                "offset {} of {channel} handed out twice in epoch {}",
                at.offset,
                at.epoch.as_str()
            ));
        }
    }

    /// After an open: every acknowledged publication still kept by the retention is
    /// readable with its data, unless its channel's epoch changed.
    async fn check(&mut self, broker: &DurableBroker, disk: &SimDisk) {
        let all = HistoryQuery {
            since: Some(Since {
                offset: 0,
                epoch: None,
            }),
            limit: 10_000,
            max_bytes: None,
        };
        for (channel, epochs) in &self.acked {
            let history = match broker.history(&ch(channel), all.clone()).await {
                Ok(h) => h,
                // A read that finds damage resets the channel, which writes: the round's
                // fault may land there.
                Err(_) if disk.fired().is_some() => continue,
                Err(e) => {
                    self.violations
                        .push(format!("{channel}: history unreadable after an open: {e}"));
                    continue;
                }
            };
            let top = &history.position;
            let Some(acked) = epochs.get(top.epoch.as_str()) else {
                continue;
            };
            let newest = *acked.keys().last().unwrap();
            if top.offset < newest {
                self.violations.push(format!(
                    "{channel}: top {} below the acknowledged {newest} in epoch {}",
                    top.offset,
                    top.epoch.as_str()
                ));
            }
            let lowest = (top.offset + 1).saturating_sub(KEEP as u64);
            let read: HashMap<u64, &Bytes> = (history.publications.iter())
                .map(|p| (p.offset, &p.record))
                .collect();
            for (offset, data) in acked.range(lowest..) {
                match read.get(offset) {
                    Some(got) if *got == data => {}
                    Some(_) => self.violations.push(format!(
                        "{channel}: offset {offset} of epoch {} reads other data",
                        top.epoch.as_str()
                    )),
                    None => self.violations.push(format!(
                        "{channel}: acknowledged offset {offset} lost in epoch {} (top {})",
                        top.epoch.as_str(),
                        top.offset
                    )),
                }
            }
        }
    }
}

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

/// What one seed did, for the summary.
#[derive(Default)]
struct Run {
    faults: Vec<(u64, Fault, &'static str)>,
    flips: usize,
    acked: usize,
    violations: Vec<String>,
    log: Vec<String>,
}

fn open(disk: &Arc<SimDisk>, options: StoreOptions) -> Result<Arc<DurableBroker>, OpenError> {
    let policy = StreamPolicy {
        history_size: KEEP,
        ..StreamPolicy::default()
    };
    DurableBroker::open_on(
        Dir::on(disk.clone(), Path::new("/sim/data")),
        options,
        Arc::new(Recorder::default()),
        Arc::new(move |_| policy),
    )
}

async fn run_seed(seed: u64) -> Run {
    let mut rng = fastrand::Rng::with_seed(seed);
    let checkpoint_bytes = rng.u64(8 << 10..=48 << 10);
    let mut run = Run::default();
    let mut model = Model::default();
    let mut disk = SimDisk::new(seed);
    let mut budget = 2_500;
    for round in 0..=ROUNDS {
        let last = round == ROUNDS;
        let fault = [
            Fault::PowerCut,
            Fault::Kill,
            Fault::SyncFails,
            Fault::DiskFull,
        ][rng.usize(..4)];
        // Mostly one mode a seed; now and then an operator changes it between starts.
        let sync = [
            SyncPolicy::Always,
            SyncPolicy::Always,
            SyncPolicy::Group,
            SyncPolicy::Group,
            SyncPolicy::Interval,
            SyncPolicy::None,
        ][(seed as usize + usize::from(rng.usize(..4) == 0) * round) % 6];
        let options = StoreOptions {
            sync,
            sync_interval: std::time::Duration::from_millis(2),
            segment_bytes: MIN_SEGMENT_BYTES,
            checkpoint_bytes,
        };
        run.log.push(format!("round {round}: {options:?}"));
        let start = disk.steps();
        if !last {
            disk.arm(rng.u64(1..=budget), fault);
        }
        let broker = match open(&disk, options) {
            Ok(b) => Some(b),
            // A damaged index is rebuilt: nothing refuses to open.
            Err(OpenError::Damaged { path, reason }) => {
                run.violations
                    .push(format!("open refused: {path:?}: {reason}"));
                break;
            }
            Err(e) if !disk.is_stopped() && disk.fired().is_none() => {
                run.violations.push(format!("open failed, no fault: {e}"));
                break;
            }
            Err(e) => {
                run.log.push(format!("open failed: {e}"));
                None
            }
        };
        if let Some(broker) = &broker {
            model.check(broker, &disk).await;
            if !disk.is_stopped() {
                let n = if last { CHANNELS } else { rng.usize(40..240) };
                publish(broker, &mut model, &mut rng, seed, round, n, &mut run).await;
            }
        }
        if !last && disk.fired().is_none() {
            budget = (disk.steps() - start).max(100);
        }
        if let Some(f) = disk.fired() {
            run.faults.push(f);
        }
        let how = if rng.bool() {
            Fault::PowerCut
        } else {
            Fault::Kill
        };
        disk.stop(how);
        drop(broker);
        disk = disk.restarted(seed ^ (round as u64 + 1));
        if !last && rng.usize(..6) == 0 {
            if let Some((file, byte)) = disk.flip_bit() {
                run.log.push(format!("bit flipped in {file:?} at {byte}"));
                run.flips += 1;
            }
        }
    }
    run.acked = model
        .acked
        .values()
        .flat_map(|e| e.values())
        .map(|o| o.len())
        .sum();
    run.violations.append(&mut model.violations);
    run
}

/// Publishes `n` publications to the channels, eight at a time, into the model.
async fn publish(
    broker: &Arc<DurableBroker>,
    model: &mut Model,
    rng: &mut fastrand::Rng,
    seed: u64,
    round: usize,
    n: usize,
    run: &mut Run,
) {
    let mut failed = 0;
    for wave in (0..n).collect::<Vec<_>>().chunks(8) {
        let mut tasks = tokio::task::JoinSet::new();
        for &i in wave {
            let channel = format!("c{}", rng.usize(..CHANNELS));
            let pad = "x".repeat(rng.usize(..2_000));
            let data = Bytes::from(format!("\"{seed}/{round}/{i}/{pad}\""));
            let broker = broker.clone();
            tasks.spawn(async move {
                let at = broker
                    .publish(&ch(&channel), data.clone(), StreamPolicy::default())
                    .await;
                (channel, data, at)
            });
        }
        while let Some(done) = tasks.join_next().await {
            match done.unwrap() {
                (channel, data, Ok(at)) => model.ack(&channel, &at, data),
                (_, _, Err(_)) => failed += 1,
            }
        }
    }
    run.log
        .push(format!("round {round}: {n} published, {failed} refused"));
}

fn seeds() -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("HERALD_CRASH_SEED") {
        return vec![seed];
    }
    let from = var("HERALD_CRASH_SEED_FROM").unwrap_or(0);
    (from..from + var("HERALD_CRASH_SEEDS").unwrap_or(2_000)).collect()
}

#[test]
fn every_acknowledged_publication_survives_every_fault() {
    let seeds = seeds();
    let verbose = seeds.len() == 1;
    let started = std::time::Instant::now();
    let runs: Vec<(u64, Run)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let mine: Vec<u64> = seeds.iter().copied().skip(w).step_by(4).collect();
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .unwrap();
                    mine.into_iter()
                        .map(|seed| (seed, rt.block_on(run_seed(seed))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let (mut acked, mut flips) = (0, 0);
    let mut failures = Vec::new();
    for (seed, run) in &runs {
        for (_, fault, op) in &run.faults {
            *by_kind.entry(format!("{fault:?} at {op}")).or_default() += 1;
        }
        acked += run.acked;
        flips += run.flips;
        if verbose || (!run.violations.is_empty() && failures.len() < 40) {
            eprintln!("seed {seed}: faults {:?}", run.faults);
            run.log.iter().for_each(|l| eprintln!("  {l}"));
        }
        for v in &run.violations {
            failures.push(format!("seed {seed}: {v}"));
        }
    }
    let merges = super::checkpoint::MERGED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "crash harness: {} seeds in {:.1}s, {acked} acknowledged, faults {by_kind:?}, {flips} bits flipped at rest, {merges} merges of the index's deltas",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} violations (replay one with HERALD_CRASH_SEED=n):\n{}",
        failures.len(),
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
