//! The one thread that keeps the index: it tells it where each publication the writer
//! appended to the log lies (and applies trims), many at a time, then writes a checkpoint
//! of it once enough of the log has gone by since the last one, so that an open reads
//! little of the log. After a checkpoint, files nothing points into any more are deleted,
//! and files mostly dead are compacted (see `compact`).

use std::{
    collections::BTreeSet,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use super::apply::apply;
use super::checkpoint;
use super::checkpointer::Job;
use super::disk::Dir;
use super::index::Index;
use super::store::{Failing, Unapplied};
use super::{compact, now_ms, recovery, wal, Deadlines, Meta, StoreOptions};
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::{Mutex, RwLock};

/// How long the applier gathers work before it applies it: one wake-up of its thread per
/// many publications. What waits is durable in the log and readable from memory.
#[cfg(not(test))]
const LINGER: Duration = Duration::from_millis(250);
/// Short in tests, so that a crash test's few publications reach checkpoints and packing.
#[cfg(test)]
const LINGER: Duration = Duration::from_millis(5);
/// Most operations applied at once.
const MAX_OPS: usize = 50_000;
/// How often the applier tries again when a segment cannot be opened.
const RETRY: Duration = Duration::from_secs(1);

/// What the applier writes, in the writer's order.
pub(crate) enum Op {
    Publish {
        lsn: u64,
        channel: ChannelName,
        epoch: Epoch,
        offset: u64,
        at_ms: u64,
        data: Bytes,
        /// Most publications the stream keeps (`usize::MAX` when replayed: the retention
        /// is known again at the stream's next publication).
        history_size: usize,
        /// Where its entry was written: the segment's first entry number, and the span.
        written: Option<(u64, wal::Span)>,
    },
    Reset {
        lsn: u64,
        channel: ChannelName,
        epoch: Epoch,
        at_ms: u64,
    },
    Forget {
        lsn: u64,
        channel: ChannelName,
    },
    /// Delete publications older than a time, then note the oldest one left.
    Trim {
        channel: ChannelName,
        meta: Arc<Mutex<Meta>>,
        older_than_ms: u64,
    },
}

impl Op {
    pub(super) fn lsn(&self) -> Option<u64> {
        match self {
            Op::Publish { lsn, .. } | Op::Reset { lsn, .. } | Op::Forget { lsn, .. } => Some(*lsn),
            Op::Trim { .. } => None,
        }
    }

    /// Appends this operation's log entry to a batch body; whether it has one (trims are
    /// not logged). The inverse of [`Op::replayed`].
    pub(super) fn log(&self, body: &mut Vec<u8>) -> bool {
        match self {
            Op::Publish {
                channel,
                epoch,
                offset,
                at_ms,
                data,
                ..
            } => wal::encode_publish(
                body,
                channel.as_str(),
                epoch.as_str(),
                *offset,
                *at_ms,
                data,
            ),
            Op::Reset {
                channel,
                epoch,
                at_ms,
                ..
            } => wal::encode_reset(body, channel.as_str(), epoch.as_str(), *at_ms),
            Op::Forget { channel, .. } => wal::encode_forget(body, channel.as_str()),
            Op::Trim { .. } => return false,
        }
        true
    }

    /// The operation a replayed log entry asks for, or `None` if the entry names no valid
    /// channel or epoch (then the log is damaged). `written`: where the entry lies.
    pub(super) fn replayed(lsn: u64, entry: wal::Entry, written: (u64, wal::Span)) -> Option<Op> {
        let channel = |c: &str| ChannelName::stored(c).ok();
        Some(match entry {
            wal::Entry::Publish {
                channel: c,
                epoch,
                offset,
                at_ms,
                data,
            } => Op::Publish {
                lsn,
                channel: channel(&c)?,
                epoch: Epoch::checked(&epoch)?,
                offset,
                at_ms,
                data: Bytes::from(data),
                history_size: usize::MAX,
                written: Some(written),
            },
            wal::Entry::Reset {
                channel: c,
                epoch,
                at_ms,
            } => Op::Reset {
                lsn,
                channel: channel(&c)?,
                epoch: Epoch::checked(&epoch)?,
                at_ms,
            },
            wal::Entry::Forget { channel: c } => Op::Forget {
                lsn,
                channel: channel(&c)?,
            },
        })
    }
}

pub(super) struct Applier {
    pub(super) dir: Dir,
    pub(super) index: Arc<RwLock<Index>>,
    pub(super) options: StoreOptions,
    /// Why the applier fails, while it does (a segment it cannot open).
    pub(super) failing: Failing,
    /// Why checkpoints fail, while they do (the checkpoint thread says).
    pub(super) checkpoint_failing: Failing,
    pub(super) deadlines: Arc<Deadlines>,
    pub(super) unapplied: Arc<Unapplied>,
    /// This open's mark, written in every checkpoint.
    pub(super) run: u64,
    /// Bytes of log applied since the last checkpoint.
    pub(super) since_checkpoint: u64,
    /// The log segments appended to since the last checkpoint: synced before the next one,
    /// so a checkpoint never points to bytes a machine crash could take back.
    pub(super) touched: BTreeSet<u64>,
    /// Where checkpoints go to be written, and the thread that writes them.
    pub(super) checkpoints: Option<(mpsc::Sender<Job>, std::thread::JoinHandle<()>)>,
}

impl Applier {
    pub(super) fn run(mut self, ops: mpsc::Receiver<Op>) {
        let mut pending: Vec<Op> = Vec::new();
        let mut open = true;
        while open {
            let Ok(first) = ops.recv() else {
                break;
            };
            pending.push(first);
            open = self.linger(&ops, &mut pending);
            self.flush(&mut pending);
            if !pending.is_empty() {
                // A segment could not be opened: try again in a while (once more at once
                // when the store closes).
                if open {
                    std::thread::park_timeout(RETRY);
                }
            } else if self.since_checkpoint >= self.options.checkpoint_bytes {
                self.checkpoint(!self.options.sync.syncs_before_delivery());
            }
        }
        self.flush(&mut pending);
        if pending.is_empty() {
            self.checkpoint(false);
        }
        // The last checkpoint written before the store is closed.
        if let Some((jobs, thread)) = self.checkpoints.take() {
            drop(jobs);
            if thread.join().is_err() {
                tracing::error!(dir = %self.dir.display(), "the thread that writes checkpoints panicked");
            }
        }
    }

    /// Gathers operations for [`LINGER`] (or until [`MAX_OPS`]); whether the channel is
    /// still open. Parked rather than waiting on the channel: a receiver that waits is woken
    /// by every send, which costs both threads a switch per publication. Closing unparks it,
    /// so a stop does not wait out the linger.
    fn linger(&self, ops: &mpsc::Receiver<Op>, pending: &mut Vec<Op>) -> bool {
        let until = Instant::now() + LINGER;
        loop {
            while pending.len() < MAX_OPS {
                match ops.try_recv() {
                    Ok(op) => pending.push(op),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return false,
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if pending.len() >= MAX_OPS || left.is_zero() {
                return true;
            }
            std::thread::park_timeout(left);
        }
    }

    /// Applies `pending` to the index; on success empties it, otherwise keeps it for the
    /// retry and says why.
    fn flush(&mut self, pending: &mut Vec<Op>) {
        if pending.is_empty() {
            return;
        }
        let applied = apply(&mut self.index.write(), &self.dir, pending);
        match applied {
            Ok(oldest_left) => {
                if self.failing.lock().take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "storage works again");
                }
                self.complete(std::mem::take(pending), oldest_left);
            }
            Err(e) => {
                tracing::error!(error = %e, dir = %self.dir.display(), "a log segment cannot be opened for reading; retried every second");
                *self.failing.lock() = Some(e.to_string());
            }
        }
    }

    /// After the index has them: the log entries are read through it from now on, and trims
    /// tell their streams what is left.
    fn complete(&mut self, done: Vec<Op>, oldest_left: Vec<Option<u64>>) {
        let last = done.iter().filter_map(Op::lsn).max();
        let mut oldest_left = oldest_left.into_iter();
        let mut touched: Vec<&ChannelName> = Vec::new();
        for op in &done {
            match op {
                Op::Publish {
                    channel, written, ..
                } => {
                    touched.push(channel);
                    if let Some((segment, span)) = written {
                        self.since_checkpoint += u64::from(span.len);
                        self.touched.insert(*segment);
                    }
                }
                Op::Trim { channel, meta, .. } => {
                    let mut m = meta.lock();
                    m.oldest_ms = oldest_left.next().flatten();
                    self.deadlines.refile(&mut m, channel, now_ms());
                }
                Op::Reset { .. } | Op::Forget { .. } => {}
            }
        }
        if let Some(last) = last {
            touched.sort_unstable();
            touched.dedup();
            self.unapplied.applied(touched, last);
        }
    }

    /// Hands what changed since the last checkpoint to the thread that writes it (see
    /// `checkpointer`), with the log segments appended to since and the files nothing
    /// points into any more, taken out of the index now and deleted once it is written.
    /// Then packs files mostly dead: one round (at most `compact::PACK_BUDGET` copied),
    /// and a checkpoint of the copies, so the files they came from die too. `unflushed`:
    /// this run still delivers publications before syncing them (false at a clean close).
    fn checkpoint(&mut self, unflushed: bool) {
        self.hand_over(unflushed);
        // Not while checkpoints fail: the copies would only add to the disk.
        if self.checkpoint_failing.lock().is_some() {
            return;
        }
        match compact::pack(&self.index, &self.dir) {
            Ok(true) => self.hand_over(unflushed),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "history could not be packed; its files keep their dead bytes for now");
            }
        }
    }

    /// The applier's whole part in a checkpoint: a swap of the journal, a look at the
    /// files. No encoding and no I/O (they held it for 10-30 ms at 10 million kept).
    fn hand_over(&mut self, unflushed: bool) {
        let started = Instant::now();
        let job = {
            let index = &mut *self.index.write();
            let journal = std::mem::take(index.journal.get_or_insert_with(Vec::new));
            let segments = (self.touched.iter())
                .filter_map(|first_lsn| index.files.get(&index.log_file(*first_lsn)?))
                .map(|f| f.file.clone())
                .collect();
            let dead = compact::take_dead(index, &self.dir);
            let head =
                checkpoint::head_of(index, self.run, recovery::boot_id(&self.dir), unflushed);
            Job {
                head,
                journal,
                segments,
                dead,
            }
        };
        self.touched.clear();
        self.since_checkpoint = 0;
        tracing::debug!(
            us = started.elapsed().as_micros() as u64,
            changes = job.journal.len(),
            "handed a checkpoint over"
        );
        if let Some((jobs, _)) = &self.checkpoints {
            // Its receiver ends only after this thread hangs up.
            let _ = jobs.send(job);
        }
    }
}
