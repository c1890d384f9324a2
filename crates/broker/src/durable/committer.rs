//! The one thread that makes publications durable: it takes jobs in batches, appends each
//! batch to the write-ahead log with one sync (as `sync` says), then makes what it wrote
//! readable, fans it out and acknowledges it in order, and hands it to the applier, which
//! writes it into the database file later. While appends fail, it refuses publications,
//! cuts what a failed append left and tries again.

use std::{
    path::PathBuf,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use herald_protocol::{Publication, StreamPosition};
use parking_lot::Mutex;

use super::applier::Op;
use super::store::{unavailable, Failing, Job, Unapplied};
use super::{now_ms, wal, Deadlines, StoreOptions, SyncPolicy};
use crate::PublicationSink;

pub(super) struct Committer {
    pub(super) dir: PathBuf,
    pub(super) options: StoreOptions,
    pub(super) sink: Arc<dyn PublicationSink>,
    /// Why appends to the log fail, while they do.
    pub(super) failing: Failing,
    /// Why the applier's writes fail, while they do: publications are refused then too,
    /// so that the log and what waits for the file do not grow without bound.
    pub(super) applier_failing: Failing,
    pub(super) deadlines: Arc<Deadlines>,
    pub(super) unapplied: Arc<Unapplied>,
    pub(super) segment: wal::Segment,
    pub(super) segments: Arc<Mutex<Vec<u64>>>,
    /// The store's run mark, written in every segment's header.
    pub(super) run: u64,
    /// The LSN the next logged entry gets.
    pub(super) next_lsn: u64,
    /// The batch being encoded (kept to reuse its allocation).
    pub(super) body: Vec<u8>,
    /// With [`SyncPolicy::Interval`]: since when appends wait for a sync.
    pub(super) unsynced: Option<Instant>,
    pub(super) applier: Option<mpsc::Sender<Op>>,
    pub(super) applier_thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the committer tries the log again while appends fail.
const RETRY: Duration = Duration::from_secs(1);

/// A segment past this size is closed and a new one started, so that applied entries can
/// be deleted.
const SEGMENT_BYTES: u64 = 16 << 20;

impl Committer {
    pub(super) fn run(mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            let failing = self.failing.lock().is_some();
            let wait = match (failing, self.unsynced) {
                (true, _) => Some(RETRY),
                (false, Some(since)) => Some(
                    (since + self.options.sync_interval).saturating_duration_since(Instant::now()),
                ),
                (false, None) => None,
            };
            let first = if let Some(wait) = wait {
                match jobs.recv_timeout(wait) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return self.close(),
                }
            } else {
                match jobs.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return self.close(),
                }
            };
            if failing {
                self.recover();
            }
            self.sync_if_due();
            let Some(first) = first else { continue };
            let mut batch = vec![first];
            if self.options.sync != SyncPolicy::Always {
                // Whatever queued up during the last append shares this one.
                while batch.len() < 8192 {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
            }
            let batch = self.without_stale(batch);
            let why = self.failing.lock().clone();
            if let Some(why) = why.or_else(|| self.applier_failing.lock().clone()) {
                self.fail(batch, &why);
                continue;
            }
            match self.write(&batch) {
                Ok(first_lsn) => self.complete(batch, first_lsn),
                Err(e) => {
                    tracing::error!(error = %e, dir = %self.dir.display(), "storage write failed; publications are refused until a write works again (retried every second)");
                    let why = e.to_string();
                    *self.failing.lock() = Some(why.clone());
                    self.fail(batch, &why);
                }
            }
        }
    }

    /// With [`SyncPolicy::Interval`]: syncs the log once its oldest unsynced append has
    /// waited the interval.
    fn sync_if_due(&mut self) {
        let Some(since) = self.unsynced else { return };
        if since.elapsed() < self.options.sync_interval {
            return;
        }
        self.unsynced = None;
        if let Err(e) = self.segment.sync() {
            // What was acknowledged may not be on disk: only a machine crash loses it, and
            // the next start answers that with new epochs. New publications wait until
            // the log works again.
            tracing::error!(error = %e, dir = %self.dir.display(), "storage sync failed; publications are refused until a write works again (retried every second)");
            *self.failing.lock() = Some(e.to_string());
        }
    }

    /// Lets the applier write everything it was given and close the file.
    fn close(&mut self) {
        self.applier.take();
        if let Some(thread) = self.applier_thread.take() {
            let _ = thread.join();
        }
    }

    /// After a failed append: cuts what it left and checks that writes work again.
    fn recover(&mut self) {
        match self.segment.recover() {
            Ok(()) => {
                *self.failing.lock() = None;
                tracing::info!(dir = %self.dir.display(), "storage writes work again");
            }
            Err(e) => *self.failing.lock() = Some(e.to_string()),
        }
    }

    /// Refuses publications whose offsets were taken back by an earlier failure: the same
    /// offsets are handed out again, so these must never be written.
    fn without_stale(&self, batch: Vec<Job>) -> Vec<Job> {
        batch
            .into_iter()
            .filter_map(|job| match job {
                Job::Publish(r) if r.meta.lock().generation != r.generation => {
                    let why = "an earlier write of this channel failed; publish again";
                    let _ = r.done.send(Err(unavailable(why)));
                    None
                }
                job => Some(job),
            })
            .collect()
    }

    /// Answers a batch that was not written. Each channel's unwritten offsets are taken back
    /// (the next publication gets the offset after the last committed one), so a failure
    /// leaves no hole for subscribers to see as a gap.
    fn fail(&self, batch: Vec<Job>, why: &str) {
        for job in batch {
            match job {
                Job::Publish(r) => {
                    {
                        let mut m = r.meta.lock();
                        if m.generation == r.generation {
                            m.assigned = m.committed;
                            m.generation += 1;
                        }
                    }
                    let _ = r.done.send(Err(unavailable(why)));
                }
                Job::Reset { done, .. } => drop(done.send(Err(unavailable(why)))),
                Job::Trim { channel, meta, .. } => {
                    // Due again: the sweeper retries it.
                    self.deadlines.refile(&mut meta.lock(), &channel, now_ms());
                }
                Job::Forget { channel } => {
                    tracing::warn!(channel = %channel, "an idle channel could not be deleted from storage; it returns at the next start");
                }
            }
        }
    }

    /// Appends a batch's logged jobs to the log as one batch, synced unless `sync` is
    /// none; returns the LSN of its first entry.
    fn write(&mut self, batch: &[Job]) -> std::io::Result<u64> {
        let first = self.next_lsn;
        self.body.clear();
        let mut count = 0u32;
        for job in batch {
            match job {
                Job::Publish(r) => wal::encode_publish(
                    &mut self.body,
                    r.channel.as_str(),
                    r.epoch.as_str(),
                    r.offset,
                    r.at_ms,
                    &r.data,
                ),
                Job::Reset {
                    channel,
                    epoch,
                    at_ms,
                    ..
                } => wal::encode(
                    &mut self.body,
                    &wal::Entry::Reset {
                        channel: channel.as_str().into(),
                        epoch: epoch.as_str().into(),
                        at_ms: *at_ms,
                    },
                ),
                Job::Forget { channel } => wal::encode(
                    &mut self.body,
                    &wal::Entry::Forget {
                        channel: channel.as_str().into(),
                    },
                ),
                Job::Trim { .. } => continue,
            }
            count += 1;
        }
        if count > 0 {
            let bytes = wal::batch(first, count, &self.body);
            let sync = self.options.sync.syncs_before_ack();
            self.segment.append(&bytes, sync)?;
            if self.options.sync == SyncPolicy::Interval && self.unsynced.is_none() {
                self.unsynced = Some(Instant::now());
            }
            self.next_lsn += u64::from(count);
            if self.segment.len >= SEGMENT_BYTES {
                self.rotate();
            }
        }
        Ok(first)
    }

    /// Starts a new segment; the applier deletes the old one once it is applied. A failure
    /// keeps appending to the current one.
    fn rotate(&mut self) {
        match wal::Segment::create(&self.dir, self.run, self.next_lsn) {
            Ok(segment) => {
                // Whatever waits for a sync in the old one gets it now.
                if self.unsynced.take().is_some() {
                    if let Err(e) = self.segment.sync() {
                        tracing::error!(error = %e, dir = %self.dir.display(), "storage sync failed");
                        *self.failing.lock() = Some(e.to_string());
                    }
                }
                self.segments.lock().push(segment.first_lsn);
                self.segment = segment;
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "a new log segment could not be created; the current one grows");
            }
        }
    }

    /// After the append: publications become readable, are fanned out in order, and are
    /// acknowledged; then everything goes to the applier in the same order.
    fn complete(&mut self, batch: Vec<Job>, first_lsn: u64) {
        let mut lsn = first_lsn;
        let ops: Vec<Op> = batch.iter().map(|job| op(job, &mut lsn)).collect();
        // Readable before anyone is told it is committed.
        self.unapplied.add(&ops);
        for job in batch {
            match job {
                Job::Publish(r) => {
                    let position = StreamPosition {
                        offset: r.offset,
                        epoch: r.epoch.clone(),
                    };
                    {
                        let mut m = r.meta.lock();
                        // A record of an epoch removed meanwhile is acknowledged, not shown.
                        if m.epoch == r.epoch {
                            m.committed = r.offset;
                            if m.oldest_ms.is_none() && m.policy.history_size > 0 {
                                // History was empty: this one falls due first.
                                m.oldest_ms = Some(r.at_ms);
                                self.deadlines.refile(&mut m, &r.channel, r.at_ms);
                            }
                            let publication = Publication {
                                offset: r.offset,
                                record: r.data,
                            };
                            self.sink.on_publication(&r.channel, &r.epoch, &publication);
                        }
                    }
                    let _ = r.done.send(Ok(position));
                }
                Job::Reset { done, .. } => drop(done.send(Ok(()))),
                Job::Trim { .. } | Job::Forget { .. } => {}
            }
        }
        if let Some(applier) = &self.applier {
            for op in ops {
                let _ = applier.send(op);
            }
        }
    }
}

/// What the applier is to write for `job`; logged jobs take the next LSN.
fn op(job: &Job, lsn: &mut u64) -> Op {
    let mut next = || {
        *lsn += 1;
        *lsn - 1
    };
    match job {
        Job::Publish(r) => Op::Publish {
            lsn: next(),
            channel: r.channel.clone(),
            epoch: r.epoch.clone(),
            offset: r.offset,
            at_ms: r.at_ms,
            data: r.data.clone(),
            history_size: r.meta.lock().policy.history_size,
        },
        Job::Reset {
            channel,
            epoch,
            at_ms,
            ..
        } => Op::Reset {
            lsn: next(),
            channel: channel.clone(),
            epoch: epoch.clone(),
            at_ms: *at_ms,
        },
        Job::Forget { channel } => Op::Forget {
            lsn: next(),
            channel: channel.clone(),
        },
        Job::Trim {
            channel,
            meta,
            older_than_ms,
        } => Op::Trim {
            channel: channel.clone(),
            meta: meta.clone(),
            older_than_ms: *older_than_ms,
        },
    }
}
