//! The one thread that writes the database file: it takes jobs in batches, commits each
//! batch in one transaction (synced as `sync` says), hands what it committed to the sink in
//! order, and while writes fail, keeps the file's damage out and tries again.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{mpsc, Arc},
    time::Duration,
};

use herald_protocol::{Publication, StreamPosition};
use redb::{Durability, ReadableTable};

use super::recovery::{probe, set_unflushed};
use super::store::{
    record_crc, stream_crc, unavailable, Failing, Job, Slot, PUBLICATIONS, STREAMS,
};
use super::{now_ms, Deadlines, StoreOptions, SyncPolicy};
use crate::PublicationSink;

pub(super) struct Committer {
    pub(super) path: PathBuf,
    pub(super) db: Slot,
    pub(super) options: StoreOptions,
    pub(super) sink: Arc<dyn PublicationSink>,
    pub(super) failing: Failing,
    pub(super) deadlines: Arc<Deadlines>,
}

/// How often the committer tries the file again while writes fail.
const RETRY: Duration = Duration::from_secs(1);

impl Committer {
    pub(super) fn run(self, jobs: mpsc::Receiver<Job>) {
        loop {
            let failing = self.failing.lock().is_some();
            let first = if failing {
                match jobs.recv_timeout(RETRY) {
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
                self.reopen();
            }
            let Some(first) = first else { continue };
            let mut batch = vec![first];
            if self.options.sync != SyncPolicy::Always {
                // Whatever queued up during the last commit shares this one.
                while batch.len() < 8192 {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
            }
            let batch = self.without_stale(batch);
            if let Some(why) = self.failing.lock().clone() {
                self.fail(batch, &why);
                continue;
            }
            // redb decodes what trims read with `unwrap`: a damaged record must fail this
            // batch (health says so), not end the only thread that writes.
            let written =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.write(&batch)))
                    .unwrap_or_else(|_| {
                        Err(redb::Error::Corrupted(
                    "a stored record cannot be decoded; restart to drop the damaged channel"
                        .into(),
                ))
                    });
            match written {
                Ok(oldest_left) => self.complete(batch, oldest_left),
                Err(e) => {
                    tracing::error!(error = %e, file = %self.path.display(), "storage write failed; publications are refused until a write works again (retried every second)");
                    let why = e.to_string();
                    *self.failing.lock() = Some(why.clone());
                    self.fail(batch, &why);
                }
            }
        }
    }

    /// A clean close: with `sync = "none"`, one durable commit makes everything written so
    /// far durable and clears [`UNFLUSHED`], so the next start trusts the file.
    fn close(&self) {
        if self.options.sync != SyncPolicy::None || self.failing.lock().is_some() {
            return;
        }
        if let Some(db) = self.db.read().clone() {
            if let Err(e) = set_unflushed(&db, false, None) {
                tracing::error!(error = %e, "storage: the final durable commit failed; the next start gives every channel a new epoch");
            }
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

    /// Reopens the file (redb refuses everything after an I/O error until then) and checks
    /// that a write of some size works; clears the failure if so.
    fn reopen(&self) {
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
        let db = match self.options.database(&self.path) {
            Ok(db) => db,
            Err(e) => {
                *self.failing.lock() = Some(format!("reopening: {e}"));
                return;
            }
        };
        let probe = probe(&db);
        *self.db.write() = Some(Arc::new(db));
        match probe {
            Ok(()) => {
                *self.failing.lock() = None;
                tracing::info!(file = %self.path.display(), "storage writes work again");
            }
            Err(e) => *self.failing.lock() = Some(e.to_string()),
        }
    }

    /// Writes a batch in one transaction; returns, for every trimmed channel, when its
    /// oldest publication left was published (`None`: none left).
    fn write(&self, batch: &[Job]) -> Result<Vec<Option<u64>>, redb::Error> {
        let mut oldest_left = Vec::new();
        let db = self
            .db
            .read()
            .clone()
            .ok_or_else(|| redb::Error::Corrupted("the file is being reopened".into()))?;
        let mut txn = db.begin_write()?;
        let durability = if self.options.sync == SyncPolicy::None {
            Durability::None
        } else {
            Durability::Immediate
        };
        txn.set_durability(durability)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        {
            let mut pubs = txn.open_table(PUBLICATIONS)?;
            let mut streams = txn.open_table(STREAMS)?;
            let mut tops: HashMap<&str, (u64, usize)> = HashMap::new();
            for job in batch {
                match job {
                    Job::Publish(r) => {
                        let ch = r.channel.as_str();
                        let crc = record_crc(ch, r.offset, r.at_ms, &r.data);
                        pubs.insert((ch, r.offset), (r.at_ms, crc, &r.data[..]))?;
                        let epoch = r.epoch.as_str();
                        streams.insert(
                            ch,
                            (
                                epoch,
                                r.offset,
                                r.at_ms,
                                stream_crc(ch, epoch, r.offset, r.at_ms),
                            ),
                        )?;
                        tops.insert(ch, (r.offset, r.meta.lock().policy.history_size));
                    }
                    Job::Reset { channel, epoch, .. } => {
                        let ch = channel.as_str();
                        pubs.retain_in((ch, 0)..=(ch, u64::MAX), |_, _| false)?;
                        let now = now_ms();
                        streams.insert(
                            ch,
                            (
                                epoch.as_str(),
                                0,
                                now,
                                stream_crc(ch, epoch.as_str(), 0, now),
                            ),
                        )?;
                        tops.remove(ch);
                    }
                    Job::Forget { channel } => {
                        let ch = channel.as_str();
                        pubs.retain_in((ch, 0)..=(ch, u64::MAX), |_, _| false)?;
                        streams.remove(ch)?;
                        tops.remove(ch);
                    }
                    Job::Trim {
                        channel,
                        older_than_ms,
                        ..
                    } => {
                        let ch = channel.as_str();
                        // Expired publications are the oldest ones: find where they end.
                        let mut end = None;
                        for entry in pubs.range((ch, 0)..=(ch, u64::MAX))? {
                            let (k, v) = entry?;
                            if v.value().0 >= *older_than_ms {
                                end = Some(k.value().1);
                                break;
                            }
                            end = Some(k.value().1 + 1);
                        }
                        if let Some(end) = end {
                            pubs.retain_in((ch, 0)..(ch, end), |_, (at, _, _)| {
                                at >= *older_than_ms
                            })?;
                        }
                        let first = pubs.range((ch, 0)..=(ch, u64::MAX))?.next();
                        oldest_left.push(match first {
                            Some(entry) => Some(entry?.1.value().0),
                            None => None,
                        });
                    }
                }
            }
            for (ch, (top, size)) in tops {
                let keep_from = top.saturating_sub(size as u64) + 1;
                pubs.retain_in((ch, 0)..(ch, keep_from), |_, _| false)?;
            }
        }
        txn.commit()?;
        Ok(oldest_left)
    }

    /// After the commit: publications become readable, are fanned out in order, and are
    /// acknowledged.
    fn complete(&self, batch: Vec<Job>, oldest_left: Vec<Option<u64>>) {
        let mut oldest_left = oldest_left.into_iter();
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
                Job::Reset { done, .. } => {
                    let _ = done.send(Ok(()));
                }
                Job::Trim { channel, meta, .. } => {
                    let oldest = oldest_left.next().flatten();
                    let mut m = meta.lock();
                    m.oldest_ms = oldest;
                    self.deadlines.refile(&mut m, &channel, now_ms());
                }
                Job::Forget { .. } => {}
            }
        }
    }
}
