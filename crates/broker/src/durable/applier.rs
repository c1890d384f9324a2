//! The one thread that writes the database file. What it writes is already durable in the
//! write-ahead log (or is a trim, which the sweeper repeats if it is lost), so it takes
//! what arrives over [`LINGER`] and commits it in one transaction: one B-tree update and
//! one sync per many publications instead of one per commit of the log. Each commit
//! records the last log entry it holds, so replay at the next open applies each entry
//! once; after a durable commit, log segments wholly applied are deleted. While writes fail
//! it keeps what it could not write, retries every second, and the writer refuses new
//! publications meanwhile (what is kept is acknowledged: it is in the log).

use std::{
    path::PathBuf,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use super::apply::apply;
use super::recovery::{probe, set_unflushed};
use super::store::{Failing, Slot, Unapplied};
use super::{now_ms, seal, wal, Deadlines, Meta, StoreOptions};
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch};
use parking_lot::Mutex;

/// How long the applier gathers work before a commit of the database. Each commit rewrites
/// the B-tree path of every channel it touches and syncs the file, so with many channels the
/// cost is per commit more than per publication: at 1,000 channels and 2,000 publications/s
/// the applier took 13.5 us of CPU a publication at 100 ms and 7.5 at 1 s. What waits is
/// already durable in the log and readable from memory; a restart replays at most this much.
const LINGER: Duration = Duration::from_millis(1000);
/// Most operations in one commit.
const MAX_OPS: usize = 50_000;
/// How often the applier tries the file again while writes fail.
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
    /// The channel of an operation other than a publication.
    pub(super) fn other_than_publish(&self) -> Option<&str> {
        match self {
            Op::Publish { .. } => None,
            Op::Reset { channel, .. } | Op::Forget { channel, .. } | Op::Trim { channel, .. } => {
                Some(channel.as_str())
            }
        }
    }

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
    /// channel or epoch (then the log is damaged).
    pub(super) fn replayed(lsn: u64, entry: wal::Entry) -> Option<Op> {
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
    pub(super) path: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) db: Slot,
    pub(super) options: StoreOptions,
    pub(super) failing: Failing,
    pub(super) deadlines: Arc<Deadlines>,
    pub(super) unapplied: Arc<Unapplied>,
    /// First LSNs of the log's segments, oldest first; the last is being appended to.
    pub(super) segments: Arc<Mutex<Vec<u64>>>,
    /// This open's mark, in the file: a clean close seals the file with it.
    pub(super) run: u64,
}

impl Applier {
    pub(super) fn run(self, ops: mpsc::Receiver<Op>) {
        let mut pending: Vec<Op> = Vec::new();
        let mut open = true;
        while open {
            let failing = self.failing.lock().is_some();
            let first = if failing {
                match ops.recv_timeout(RETRY) {
                    Ok(op) => Some(op),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match ops.recv() {
                    Ok(op) => Some(op),
                    Err(_) => break,
                }
            };
            // After a failure the file is reopened, and health turns green only once the
            // writes that failed (or, with none kept, a probe) work: a probe that fits in
            // the file's free pages says nothing about a write that must grow it.
            let reopened = failing && self.reopen();
            if let Some(first) = first {
                pending.push(first);
                open = self.linger(&ops, &mut pending);
            }
            if !pending.is_empty() && (!failing || reopened) {
                self.flush(&mut pending);
            } else if reopened {
                self.probe();
            }
        }
        if !pending.is_empty() && self.failing.lock().is_none() {
            self.flush(&mut pending);
        }
        self.close(pending.is_empty());
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

    /// Writes `pending` in one commit; on success empties it, otherwise keeps it for the
    /// retry and says why writes fail.
    fn flush(&self, pending: &mut Vec<Op>) {
        // redb decodes what trims read with `unwrap`: a damaged record must fail this
        // commit (health says so), not end the only thread that writes.
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let db = self
                .db
                .read()
                .clone()
                .ok_or_else(|| redb::Error::Corrupted("the file is being reopened".into()))?;
            apply(&db, pending)
        }))
        .unwrap_or_else(|_| {
            Err(redb::Error::Corrupted(
                "a stored record cannot be decoded; restart to drop the damaged channel".into(),
            ))
        });
        match written {
            Ok(oldest_left) => {
                if self.failing.lock().take().is_some() {
                    tracing::info!(file = %self.path.display(), "storage writes work again");
                }
                self.complete(std::mem::take(pending), oldest_left)
            }
            Err(e) => {
                tracing::error!(error = %e, file = %self.path.display(), "storage write failed; publications are refused until a write works again (retried every second)");
                *self.failing.lock() = Some(e.to_string());
            }
        }
    }

    /// After a commit: the log entries it holds are read from the file from now on, trims
    /// tell their streams what is left, and segments wholly applied go.
    fn complete(&self, done: Vec<Op>, oldest_left: Vec<Option<u64>>) {
        let last = done.iter().filter_map(Op::lsn).max();
        let mut oldest_left = oldest_left.into_iter();
        let mut touched: Vec<&ChannelName> = Vec::new();
        for op in &done {
            match op {
                Op::Publish { channel, .. } => touched.push(channel),
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
            self.drop_segments(last);
        }
    }

    /// Deletes the segments, except the one being appended to, whose entries are all at or
    /// before `applied`.
    fn drop_segments(&self, applied: u64) {
        let mut segments = self.segments.lock();
        while segments.len() > 1 && segments[1] <= applied + 1 {
            let first = segments.remove(0);
            let path = wal::segment_path(&self.dir, first);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(error = %e, file = %path.display(), "an applied log segment could not be deleted");
            }
        }
    }

    /// A clean close: everything is applied, so the log goes; with a mode that delivers
    /// before syncing (`group`, `interval`, `none`), one durable commit clears the unflushed
    /// mark, so the next start trusts the file.
    fn close(&self, all_applied: bool) {
        if self.failing.lock().is_some() || !all_applied {
            return; // the log keeps what is not applied; the next open replays it
        }
        let Some(db) = self.db.read().clone() else {
            return;
        };
        if !self.options.sync.syncs_before_delivery() {
            if let Err(e) = set_unflushed(&db, false, None) {
                tracing::error!(error = %e, "storage: the final durable commit failed; the next start gives every channel a new epoch");
                return;
            }
        }
        // The writer has stopped appending: every segment is applied.
        for first in std::mem::take(&mut *self.segments.lock()) {
            let _ = std::fs::remove_file(wal::segment_path(&self.dir, first));
        }
        drop(db);
        if self.compact() {
            if let Err(e) = seal::write(&self.dir, &self.path, self.run) {
                tracing::warn!(error = %e, file = %self.path.display(), "the data file was closed cleanly but could not be sealed; the next start checks every page");
            }
        }
    }

    /// Gives the file's free pages back (redb keeps them; commits of many channels at once
    /// leave many): 400,000 publications of 300 B in 2,000 channels made a 539 MB file,
    /// 274 MB compacted, in 1.1 s. Done at a clean stop, when nothing reads the file.
    /// Whether the file was compacted and closed, so nothing changes it any more.
    fn compact(&self) -> bool {
        let Some(db) = self.db.write().take() else {
            return false;
        };
        let Ok(mut db) = Arc::try_unwrap(db) else {
            return false; // a reader still holds it: the broker is being dropped while in use
        };
        let before = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let started = std::time::Instant::now();
        match db.compact() {
            Ok(_) => {
                let after = std::fs::metadata(&self.path).map_or(0, |m| m.len());
                tracing::info!(file = %self.path.display(), before, after, ms = started.elapsed().as_millis() as u64, "compacted the data file");
                drop(db);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, file = %self.path.display(), "the data file could not be compacted; it keeps its free pages");
                false
            }
        }
    }

    /// Reopens the file (redb refuses everything after an I/O error until then); whether
    /// it opened.
    fn reopen(&self) -> bool {
        let old = self.db.write().take();
        if let Some(mut old) = old {
            // Readers hold it only for one read.
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => break drop(db),
                    Err(still) => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
        match self.options.database(&self.path) {
            Ok(db) => {
                *self.db.write() = Some(Arc::new(db));
                true
            }
            Err(e) => {
                *self.failing.lock() = Some(format!("reopening: {e}"));
                false
            }
        }
    }

    /// With nothing kept to write again: clears the failure if a write of some size works.
    fn probe(&self) {
        let Some(db) = self.db.read().clone() else {
            return;
        };
        match probe(&db) {
            Ok(()) => {
                *self.failing.lock() = None;
                tracing::info!(file = %self.path.display(), "storage writes work again");
            }
            Err(e) => *self.failing.lock() = Some(e.to_string()),
        }
    }
}
