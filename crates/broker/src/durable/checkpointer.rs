//! The thread that writes checkpoints, so that the applier never waits for one. At a
//! checkpoint the applier hands over a [`Job`]: the index's journal of changes since the
//! last one (taken in a swap), its head, the log segments those changes point into, and
//! the files nothing points into any more. This thread syncs the segments, writes the
//! journal as the next delta (`checkpoint`), and only then deletes the dead files, which
//! the durable checkpoint no longer names. It also starts the merges of the deltas into a
//! new base, each on a thread of its own.
//!
//! A delta that cannot be written is kept and said again with the next job's changes
//! after it, so the chain of deltas never skips a change; meanwhile the log is the truth
//! (an open replays it from the last delta written), and no file is deleted.

use std::{path::PathBuf, sync::mpsc, time::Instant};

use super::checkpoint::{self, Chain, Head};
use super::disk::{Dir, Handle};
use super::index::Change;
use super::store::Failing;

/// A checkpoint to write.
pub(super) struct Job {
    pub(super) head: Head,
    /// The index's changes since the last job, in order.
    pub(super) journal: Vec<(String, Change)>,
    /// Log segments appended to since the last job: synced before the delta that points
    /// into them.
    pub(super) segments: Vec<Handle>,
    /// Files nothing points into as of this job: deleted once its delta is written.
    pub(super) dead: Vec<PathBuf>,
}

impl Job {
    /// This job and a newer one, as one.
    fn then(mut self, newer: Job) -> Job {
        self.head = newer.head;
        self.journal.extend(newer.journal);
        self.segments.extend(newer.segments);
        self.dead.extend(newer.dead);
        self
    }
}

pub(super) struct Checkpointer {
    dir: Dir,
    /// The checkpoint's files: a base and the deltas after it.
    chain: Chain,
    /// Why checkpoints fail, while they do (the applier packs nothing meanwhile).
    failing: Failing,
    merging: Option<Merging>,
    /// The last delta's bytes, its buffer kept for the next.
    buffer: Vec<u8>,
}

struct Merging {
    /// The newest delta merged.
    upto: u64,
    /// Their bytes.
    delta_bytes: u64,
    thread: std::thread::JoinHandle<std::io::Result<Option<u64>>>,
}

impl Checkpointer {
    pub(super) fn new(dir: Dir, chain: Chain, failing: Failing) -> Self {
        Self {
            dir,
            chain,
            failing,
            merging: None,
            buffer: Vec::new(),
        }
    }

    /// Writes the jobs as they come, until the applier hangs up; then waits for a merge.
    pub(super) fn run(mut self, jobs: mpsc::Receiver<Job>) {
        let mut unwritten: Option<Job> = None;
        while let Ok(job) = jobs.recv() {
            let mut job = match unwritten.take() {
                Some(old) => old.then(job),
                None => job,
            };
            // Jobs that queued meanwhile are written as one.
            while let Ok(newer) = jobs.try_recv() {
                job = job.then(newer);
            }
            unwritten = self.write(job);
        }
        if unwritten.is_some() {
            tracing::warn!(dir = %self.dir.display(), "the last checkpoint could not be written; the next start replays the log since the one before");
        }
        self.reap_merge(true);
    }

    /// Writes the job's delta, then deletes its dead files; the job back if it failed.
    fn write(&mut self, job: Job) -> Option<Job> {
        let started = Instant::now();
        self.reap_merge(false);
        let seq = self.chain.seq + 1;
        let bytes = checkpoint::delta(
            std::mem::take(&mut self.buffer),
            seq,
            &job.head,
            &job.journal,
        );
        let written = (job.segments.iter())
            .try_for_each(|f| f.sync_data())
            .and_then(|()| checkpoint::write_delta(&self.dir, seq, &bytes));
        if let Err(e) = written {
            tracing::error!(error = %e, dir = %self.dir.display(), "the index checkpoint could not be written; the next start reads more of the log");
            *self.failing.lock() = Some(format!("checkpoint: {e}"));
            self.buffer = bytes;
            return Some(job);
        }
        if self.failing.lock().take().is_some() {
            tracing::info!(dir = %self.dir.display(), "storage works again");
        }
        self.chain.seq = seq;
        self.chain.delta_bytes += bytes.len() as u64;
        for path in &job.dead {
            if let Err(e) = self.dir.disk().remove(path) {
                tracing::warn!(error = %e, file = %path.display(), "a file of history nothing is kept in could not be deleted");
            }
        }
        tracing::debug!(
            seq,
            bytes = bytes.len(),
            changes = job.journal.len(),
            us = started.elapsed().as_micros() as u64,
            "wrote a delta of the index"
        );
        self.buffer = bytes;
        if self.merging.is_none() && self.chain.wants_merge() {
            self.start_merge();
        }
        None
    }

    fn start_merge(&mut self) {
        let (dir, upto) = (self.dir.clone(), self.chain.seq);
        let thread = std::thread::Builder::new()
            .name("herald-store-merge".into())
            .spawn(move || {
                let started = Instant::now();
                let merged = checkpoint::merge(&dir, upto);
                if let Ok(Some(bytes)) = merged {
                    let us = started.elapsed().as_micros() as u64;
                    tracing::debug!(bytes, seq = upto, us, dir = %dir.display(), "merged the index's deltas into a new base");
                }
                merged
            });
        match thread {
            Ok(thread) => {
                self.merging = Some(Merging {
                    upto,
                    delta_bytes: self.chain.delta_bytes,
                    thread,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "no thread to merge the index's deltas; tried again at the next checkpoint");
            }
        }
    }

    /// Takes in a merge that has ended (waiting for it when `wait`).
    fn reap_merge(&mut self, wait: bool) {
        let Some(m) = self.merging.take_if(|m| wait || m.thread.is_finished()) else {
            return;
        };
        match m.thread.join() {
            Ok(Ok(Some(bytes))) => {
                self.chain.base_seq = m.upto;
                self.chain.base_bytes = bytes;
                self.chain.delta_bytes -= m.delta_bytes;
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "the index's deltas could not be merged into a new base; tried again at the next checkpoint (an open reads them meanwhile)");
            }
            Err(_) => tracing::error!("the merge of the index's deltas panicked"),
        }
    }
}
