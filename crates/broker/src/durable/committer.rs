//! Making publications durable (a write group): a publisher queues its record under its
//! channel's lock, then has the queue written. The leader, whoever holds the log, takes
//! everything queued and appends it to the write-ahead log as one batch, then makes it
//! readable and fans it out in order, syncs it (once per batch, as `sync` says: `always`
//! syncs before the fan-out instead), acknowledges it, and hands it to the applier, which
//! records in the index where it lies. With a sync
//! before each acknowledgement (`group`, `always`) the store thread leads, so that a sync
//! never blocks a runtime worker. Otherwise (`interval`, `none`) the publisher leads on its
//! own thread, unless another leader holds the log: a lone publisher writes its own record
//! with no thread handing it over and back (two thread switches per publication, which
//! cost more CPU than the write). The store thread also syncs the log on time with
//! `interval`, and retries it while writes fail.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use herald_protocol::{Publication, StreamPosition};
use parking_lot::Mutex;

use super::applier::Op;
use super::disk::Dir;
use super::store::{unavailable, Failing, Job, Unapplied};
use super::{now_ms, segment, wal, Deadlines, StoreOptions, SyncPolicy};
use crate::{BrokerError, PublicationSink};

/// How often the log is tried again while appends fail.
const RETRY: Duration = Duration::from_secs(1);

/// Most bytes of publications kept in memory for the applier (see [`Unapplied`]); past it,
/// publications wait for the index to catch up.
const MAX_UNAPPLIED_BYTES: usize = 256 << 20;

/// How long publications wait for the index to catch up before they are refused.
const BEHIND_PATIENCE: Duration = Duration::from_secs(5);

/// Batches one leader writes before it hands the rest to a task of its own, so that a
/// publisher is not kept writing others' publications for long.
const MAX_ROUNDS: usize = 8;

/// The log being appended to; whoever holds it is the leader.
pub(super) struct Log {
    pub(super) dir: Dir,
    pub(super) segment: segment::Segment,
    /// The store's run mark, written in every segment's header.
    pub(super) run: u64,
    /// The LSN the next logged entry gets.
    pub(super) next_lsn: u64,
    /// The batch being encoded (kept to reuse its allocation).
    pub(super) body: Vec<u8>,
    /// With [`SyncPolicy::Interval`]: since when appends wait for a sync.
    pub(super) unsynced: Option<Instant>,
    /// A segment past this size is closed and a new one started.
    pub(super) segment_bytes: u64,
    /// Whether a sync of the log failed in this run, and whether that is marked on disk
    /// yet (see [`recovery::mark_sync_failed`]): until it is, publications are refused.
    /// Sticky: after a failed fsync the kernel may have dropped the pages it was to
    /// write, and a later sync that succeeds says nothing of them.
    pub(super) sync_failed: SyncFailed,
}

/// Whether a sync of the log failed in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyncFailed {
    No,
    /// And the next open is not told yet.
    Unmarked,
    /// And `herald.sync-failed` says so beside the log.
    Marked,
}

impl SyncFailed {
    /// A sync failed (again).
    fn failed(&mut self) {
        if *self == SyncFailed::No {
            *self = SyncFailed::Unmarked;
        }
    }
}

pub(crate) struct Writer {
    queue: Mutex<Vec<Job>>,
    log: Mutex<Log>,
    options: StoreOptions,
    sink: Arc<dyn PublicationSink>,
    /// Why appends to the log fail, while they do.
    failing: Failing,
    deadlines: Arc<Deadlines>,
    unapplied: Arc<Unapplied>,
    applier: Mutex<Option<mpsc::Sender<Op>>>,
    /// The store thread (see [`store_thread`]), to wake and to join.
    thread: std::sync::OnceLock<std::thread::Thread>,
    joined: Mutex<Option<std::thread::JoinHandle<()>>>,
    stopping: AtomicBool,
    /// Times a publisher found the log held and left its job to the holder.
    contended: AtomicU64,
}

impl Writer {
    pub(super) fn start(
        log: Log,
        options: StoreOptions,
        sink: Arc<dyn PublicationSink>,
        failing: Failing,
        deadlines: Arc<Deadlines>,
        unapplied: Arc<Unapplied>,
        applier: mpsc::Sender<Op>,
    ) -> std::io::Result<Arc<Self>> {
        let writer = Arc::new(Self {
            queue: Mutex::default(),
            log: Mutex::new(log),
            options,
            sink,
            failing,
            deadlines,
            unapplied,
            applier: Mutex::new(Some(applier)),
            thread: std::sync::OnceLock::new(),
            joined: Mutex::default(),
            stopping: AtomicBool::new(false),
            contended: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&writer);
        let thread = std::thread::Builder::new()
            .name("herald-store".into())
            .spawn(move || store_thread(weak))?;
        let _ = writer.thread.set(thread.thread().clone());
        *writer.joined.lock() = Some(thread);
        Ok(writer)
    }

    /// Queues a job. The caller holds what orders it (the channel's lock); it must call
    /// [`Writer::drive`] once it no longer does.
    pub(super) fn submit(&self, job: Job) {
        self.queue.lock().push(job);
    }

    /// Has what is queued written: with a sync before each acknowledgement (`group`,
    /// `always`), by the store thread, because a sync blocks for a tenth of a millisecond
    /// or more and must not hold a runtime worker (measured: publish p50 0.51 ms on the
    /// publisher's thread against 0.41 on the store thread); otherwise here, unless another
    /// leader holds the log.
    pub(super) fn drive(self: &Arc<Self>) {
        if self.options.sync.syncs_before_ack() {
            self.wake_store_thread();
        } else {
            self.lead(MAX_ROUNDS);
        }
    }

    /// Writes what is queued as leader, at most `rounds` batches, unless another leader
    /// holds the log (it looks at the queue again after letting the log go, so nothing
    /// queued is left behind).
    fn lead(self: &Arc<Self>, rounds: usize) {
        for _ in 0..rounds {
            let Some(mut log) = self.log.try_lock() else {
                self.contended.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let batch = {
                let mut queue = self.queue.lock();
                if self.options.sync == SyncPolicy::Always && queue.len() > 1 {
                    vec![queue.remove(0)]
                } else {
                    std::mem::take(&mut *queue)
                }
            };
            let unsynced = !batch.is_empty() && self.process(&mut log, batch);
            drop(log);
            if unsynced {
                self.wake_store_thread();
            }
            if self.queue.lock().is_empty() {
                return;
            }
        }
        // Still more: a task of its own goes on, and this publisher gets its answer.
        let writer = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(async move { writer.lead(MAX_ROUNDS) })),
            Err(_) => writer.lead(usize::MAX),
        }
    }

    /// Writes a batch as leader and answers it; whether the log now waits for a sync the
    /// store thread is to time (`interval`). The caller wakes that thread once it has let
    /// the log go: woken here, on a core of its own it would only wait for the log, and
    /// on the leader's core it would take the core from the fan-out to do so (an `strace`
    /// of a channel fanned out inline showed it yield six times a publication).
    fn process(&self, log: &mut Log, batch: Vec<Job>) -> bool {
        let batch = self.without_stale(batch);
        if log.sync_failed == SyncFailed::Unmarked && self.failing.lock().is_none() {
            // A sync failed (at a rotation, say) and is not marked on disk yet.
            *self.failing.lock() = Some("a sync of the log failed".into());
            self.wake_store_thread();
        }
        let why = self.failing.lock().clone();
        if let Some(why) = why {
            self.fail(batch, &why);
            return false;
        }
        // The index cannot keep up (a flood): what waits for it is held in memory, so it
        // must not grow without bound. Publishers wait for the applier, and past
        // `BEHIND_PATIENCE` are refused (nothing is lost).
        if self.unapplied.bytes() > MAX_UNAPPLIED_BYTES
            && !self
                .unapplied
                .wait_below(MAX_UNAPPLIED_BYTES, BEHIND_PATIENCE)
        {
            self.fail(
                batch,
                "the store's index is behind the log; publish again shortly",
            );
            return false;
        }
        let mut lsn = log.next_lsn;
        let mut ops: Vec<Op> = batch.iter().map(|job| op(job, &mut lsn)).collect();
        let sync = self.options.sync;
        match log.write(&mut ops, sync.syncs_before_delivery()) {
            Ok(()) => {
                // The sync falls due `sync_interval` after this write, whenever the store
                // thread learns of it.
                let unsynced = sync == SyncPolicy::Interval && log.unsynced.is_none();
                if unsynced {
                    log.unsynced = Some(Instant::now());
                }
                // Written: a killed process loses none of it, so subscribers may have it
                // now; with `group` the sync runs after, and only the answers wait for it.
                self.deliver(&batch, &ops);
                let synced = if sync.syncs_before_ack() && !sync.syncs_before_delivery() {
                    log.segment.sync()
                } else {
                    Ok(())
                };
                // Only now: the sync above is of the segment that holds this batch.
                if synced.is_ok() {
                    log.rotate_if_full();
                }
                if let Err(e) = &synced {
                    log.sync_failed.failed();
                    // Delivered, so kept: its offset is not handed out again. The applier
                    // still indexes it; meanwhile publications are refused until a sync
                    // works again and the failure is marked for the next open.
                    tracing::error!(error = %e, dir = %log.dir.display(), "storage sync failed; publications are refused until a write works again (retried every second)");
                    *self.failing.lock() = Some(e.to_string());
                    self.wake_store_thread();
                }
                self.acknowledge(batch, ops, synced.err());
                unsynced
            }
            Err(e) => {
                tracing::error!(error = %e, dir = %log.dir.display(), "storage write failed; publications are refused until a write works again (retried every second)");
                let why = e.to_string();
                *self.failing.lock() = Some(why.clone());
                self.wake_store_thread();
                self.fail(batch, &why);
                false
            }
        }
    }

    /// Runs `f` with the log held by a thread that is not a leader (the store thread), then
    /// writes what publishers queued meanwhile: they found the log held and left their
    /// jobs for whoever held it.
    pub(super) fn with_log<R>(self: &Arc<Self>, f: impl FnOnce(&mut Log) -> R) -> R {
        let result = f(&mut self.log.lock());
        if !self.queue.lock().is_empty() {
            self.lead(usize::MAX);
        }
        result
    }

    /// Times a publisher found the log held and left its job to the holder.
    #[cfg(test)]
    pub(super) fn contended(&self) -> u64 {
        self.contended.load(Ordering::Relaxed)
    }

    fn wake_store_thread(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    /// Stops the store thread, syncs, and lets the applier index everything it was given and
    /// write its last checkpoint. The broker is gone: nothing is queued any more.
    pub(super) fn close(&self, applier: Option<std::thread::JoinHandle<()>>) {
        self.stopping.store(true, Ordering::Release);
        let thread = self.joined.lock().take();
        if let Some(thread) = thread {
            thread.thread().unpark();
            let _ = thread.join();
        }
        {
            let mut log = self.log.lock();
            if self.options.sync == SyncPolicy::Interval {
                log.unsynced = None;
                if let Err(e) = log.segment.sync() {
                    tracing::error!(error = %e, "storage: the last sync of the log failed");
                    log.sync_failed.failed();
                }
            }
            if log.sync_failed == SyncFailed::Unmarked {
                if let Err(e) = super::recovery::mark_sync_failed(&log.dir) {
                    tracing::error!(error = %e, dir = %log.dir.display(), "storage: a failed sync could not be marked for the next start");
                }
            }
            log.segment.seal();
        }
        self.applier.lock().take();
        if let Some(thread) = applier {
            // Its channel is closed now; wake it from its linger.
            thread.thread().unpark();
            let _ = thread.join();
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

    /// After the append: the batch's publications become readable and are fanned out, in
    /// order.
    fn deliver(&self, batch: &[Job], ops: &[Op]) {
        // Readable before anyone is told it is committed.
        self.unapplied.add(ops);
        for job in batch {
            let Job::Publish(r) = job else {
                continue;
            };
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
                    record: r.data.clone(),
                };
                self.sink.on_publication(&r.channel, &r.epoch, &publication);
            }
        }
    }

    /// After [`Writer::deliver`] (and the sync, where acknowledgements wait for it): the
    /// batch is answered, `unsynced` saying why it may not be on disk; then its `ops` go to
    /// the applier in the same order.
    fn acknowledge(&self, batch: Vec<Job>, ops: Vec<Op>, unsynced: Option<std::io::Error>) {
        let unconfirmed = |e: &std::io::Error| {
            BrokerError::Unconfirmed(format!(
                "storage: written and delivered, but the sync to disk failed ({e}); it is kept unless the machine stops first"
            ))
        };
        for job in batch {
            match job {
                Job::Publish(r) => {
                    let position = StreamPosition {
                        offset: r.offset,
                        epoch: r.epoch,
                    };
                    let _ = r.done.send(
                        unsynced
                            .as_ref()
                            .map_or(Ok(position), |e| Err(unconfirmed(e))),
                    );
                }
                Job::Reset { done, .. } => {
                    let _ = done.send(unsynced.as_ref().map_or(Ok(()), |e| Err(unconfirmed(e))));
                }
                Job::Trim { .. } | Job::Forget { .. } => {}
            }
        }
        if let Some(applier) = &*self.applier.lock() {
            for op in ops {
                let _ = applier.send(op);
            }
        }
    }
}

impl Log {
    /// Appends the logged ones of `ops` (numbered from [`Log::next_lsn`]) to the log as one
    /// batch, synced if `sync`; each publication learns where its entry lies.
    fn write(&mut self, ops: &mut [Op], sync: bool) -> std::io::Result<()> {
        // A segment left full by a failed rotation is rotated before it takes more.
        self.rotate_if_full();
        self.body.clear();
        let at = self.segment.len + wal::BATCH_HEADER_LEN as u64;
        let first_lsn = self.segment.first_lsn;
        let mut count = 0u32;
        for op in ops.iter_mut() {
            let start = self.body.len();
            if !op.log(&mut self.body) {
                continue;
            }
            count += 1;
            if let Op::Publish { written, .. } = op {
                // A segment that grew to what a position can say (its rotation failing
                // all along) takes no more: the write fails, and is tried again.
                let span = wal::Span::of(at + start as u64, &self.body[start..])
                    .ok_or_else(|| std::io::Error::other("the log segment is full"))?;
                *written = Some((first_lsn, span));
            }
        }
        if count > 0 {
            let bytes = wal::batch(self.next_lsn, count, &self.body);
            self.segment.append(&bytes, sync)?;
            self.next_lsn += u64::from(count);
        }
        Ok(())
    }

    /// Starts a new segment once the current one is full; called after a batch's sync, so
    /// that the sync is of the segment that holds it.
    fn rotate_if_full(&mut self) {
        if self.segment.len >= self.segment_bytes {
            self.rotate();
        }
    }

    /// Starts a new segment; the old one keeps its publications until compaction. A
    /// failure keeps appending to the current one.
    fn rotate(&mut self) {
        match segment::Segment::create(&self.dir, self.run, self.next_lsn) {
            Ok(segment) => {
                // Whatever waits for a sync in the old one gets it now.
                if self.unsynced.take().is_some() {
                    if let Err(e) = self.segment.sync() {
                        tracing::error!(error = %e, dir = %self.dir.display(), "storage sync failed");
                        self.sync_failed.failed();
                    }
                }
                let old = std::mem::replace(&mut self.segment, segment);
                old.seal();
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "a new log segment could not be created; the current one grows");
            }
        }
    }
}

/// The store thread: with `group` and `always`, writes what publishers queue (they wake it);
/// with `interval`, syncs the log once its oldest unsynced append has waited the interval
/// (without holding the log, so publishers go on appending); while appends fail, tries
/// the log again every second. Parked otherwise.
fn store_thread(writer: std::sync::Weak<Writer>) {
    loop {
        let wait = {
            let Some(writer) = writer.upgrade() else {
                return;
            };
            if writer.stopping.load(Ordering::Acquire) {
                return;
            }
            // What publishers queued for this thread (`group`, `always`).
            if !writer.queue.lock().is_empty() {
                writer.lead(usize::MAX);
            }
            let interval = writer.options.sync_interval;
            let due = writer.with_log(|log| {
                if writer.failing.lock().is_some() {
                    let marked = match log.sync_failed {
                        SyncFailed::Unmarked => super::recovery::mark_sync_failed(&log.dir),
                        _ => Ok(()),
                    };
                    match marked.and_then(|()| log.segment.recover()) {
                        Ok(()) => {
                            if log.sync_failed == SyncFailed::Unmarked {
                                log.sync_failed = SyncFailed::Marked;
                            }
                            *writer.failing.lock() = None;
                            tracing::info!(dir = %log.dir.display(), "storage writes work again");
                        }
                        Err(e) => *writer.failing.lock() = Some(e.to_string()),
                    }
                }
                let due = log
                    .unsynced
                    .is_some_and(|since| since.elapsed() >= interval);
                due.then(|| {
                    log.unsynced = None;
                    (log.segment.file(), log.dir.clone())
                })
            });
            if let Some((file, dir)) = due {
                if let Err(e) = file.sync_data() {
                    // What was acknowledged may not be on disk: only a machine crash loses
                    // it, and the next start answers that with new epochs. New
                    // publications wait until the log works again.
                    tracing::error!(error = %e, dir = %dir.display(), "storage sync failed; publications are refused until a write works again (retried every second)");
                    writer.log.lock().sync_failed.failed();
                    *writer.failing.lock() = Some(e.to_string());
                }
            }
            if writer.failing.lock().is_some() {
                Some(RETRY)
            } else {
                let log = writer.log.lock();
                log.unsynced
                    .map(|since| (since + interval).saturating_duration_since(Instant::now()))
            }
        };
        match wait {
            Some(wait) => std::thread::park_timeout(wait),
            None => std::thread::park(),
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
            history_size: r.history_size,
            written: None,
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
