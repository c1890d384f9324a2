//! The database file and the one thread that writes it.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableError};
use tokio::sync::oneshot;

use super::{now_ms, Deadlines, Meta, SyncPolicy};
use crate::{BrokerError, History, HistoryQuery, PublicationSink, StreamPolicy};

/// (channel, offset) → (published at in ms since the Unix epoch, CRC-32, JSON payload).
const PUBLICATIONS: TableDefinition<(&str, u64), (u64, u32, &[u8])> =
    TableDefinition::new("publications");
/// channel → (epoch, newest offset, last publish in ms since the Unix epoch, CRC-32).
const STREAMS: TableDefinition<&str, (&str, u64, u64, u32)> = TableDefinition::new("streams");

/// Herald's own checksum of a record, key included, so a damaged page cannot pass for a
/// publication at another offset. (redb checks its pages only when it recovers from a
/// crash, not on every read.)
fn record_crc(channel: &str, offset: u64, at_ms: u64, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(channel.as_bytes());
    h.update(&offset.to_le_bytes());
    h.update(&at_ms.to_le_bytes());
    h.update(data);
    h.finalize()
}

fn stream_crc(channel: &str, epoch: &str, top: u64, last_ms: u64) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(channel.as_bytes());
    h.update(&[0]);
    h.update(epoch.as_bytes());
    h.update(&top.to_le_bytes());
    h.update(&last_ms.to_le_bytes());
    h.finalize()
}

/// The file name inside the data directory.
pub const FILE_NAME: &str = "herald.redb";

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory cannot be created or written.
    #[error("cannot use data directory {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Another process (or another broker in this one) has the file open.
    #[error("data file {path} is in use by another process: is another herald running with the same data directory?")]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The file exists but is not a readable Herald database.
    #[error(
        "data file {path} is damaged or is not a Herald database ({reason}). Herald will not serve \
         offsets it cannot trust: restore a backup, or move the file away to start with empty history \
         (every channel then gets a new epoch and resuming clients are told recovered: false)"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What the storage engine said.
        reason: String,
    },
}

/// The streams found in the file when it was opened.
pub(crate) type Streams = Vec<(ChannelName, Meta)>;

pub(crate) struct Record {
    pub(crate) channel: ChannelName,
    pub(crate) meta: Arc<Mutex<Meta>>,
    pub(crate) epoch: Epoch,
    pub(crate) offset: u64,
    pub(crate) at_ms: u64,
    pub(crate) data: Bytes,
    pub(crate) done: oneshot::Sender<Result<StreamPosition, BrokerError>>,
}

pub(crate) enum Job {
    Publish(Record),
    /// Delete a channel's history and start a new epoch.
    Reset {
        channel: ChannelName,
        epoch: Epoch,
        done: oneshot::Sender<Result<(), BrokerError>>,
    },
    /// Delete publications older than a time, then note the oldest one left.
    Trim {
        channel: ChannelName,
        meta: Arc<Mutex<Meta>>,
        older_than_ms: u64,
    },
    /// Delete a channel entirely (idle past its meta TTL).
    Forget {
        channel: ChannelName,
    },
}

pub(crate) struct Store {
    pub(crate) path: PathBuf,
    db: Arc<Database>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    failed: Arc<AtomicBool>,
}

impl Drop for Store {
    fn drop(&mut self) {
        // Let the committer finish what it was given, so the file is closed cleanly.
        self.jobs.lock().take();
        if let Some(thread) = self.committer.lock().take() {
            let _ = thread.join();
        }
    }
}

fn damaged(path: &Path, e: impl std::fmt::Display) -> OpenError {
    OpenError::Damaged {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Reads every stream and publication and checks it. A channel with any record that fails
/// its checksum (or lies outside its stream) is reset: its history is deleted and it gets a
/// new epoch, so clients resuming in it are told `recovered: false` instead of being served
/// damaged data. A file that cannot be read at all is refused.
fn verify(db: &Database, path: &Path) -> Result<Streams, OpenError> {
    let mut metas: HashMap<String, Meta> = HashMap::new();
    let mut bad: std::collections::BTreeSet<String> = Default::default();
    {
        let read = db.begin_read().map_err(|e| damaged(path, e))?;
        match read.open_table(STREAMS) {
            Ok(table) => {
                for entry in table.iter().map_err(|e| damaged(path, e))? {
                    let (k, v) = entry.map_err(|e| damaged(path, e))?;
                    let channel = k.value().to_string();
                    let (epoch, top, last, crc) = v.value();
                    let valid = ChannelName::new(&channel).is_ok() && !epoch.is_empty();
                    if !valid || crc != stream_crc(&channel, epoch, top, last) {
                        bad.insert(channel);
                        continue;
                    }
                    metas.insert(
                        channel,
                        Meta::new(Epoch::new(epoch), top, StreamPolicy::default(), last),
                    );
                }
            }
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(damaged(path, e)),
        }
        match read.open_table(PUBLICATIONS) {
            Ok(table) => {
                for entry in table.iter().map_err(|e| damaged(path, e))? {
                    let (k, v) = entry.map_err(|e| damaged(path, e))?;
                    let (channel, offset) = k.value();
                    let (at, crc, data) = v.value();
                    let fits = metas.get(channel).is_some_and(|m| offset <= m.committed);
                    if !fits || crc != record_crc(channel, offset, at, data) {
                        bad.insert(channel.to_string());
                    }
                }
            }
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(damaged(path, e)),
        }
    }
    if !bad.is_empty() {
        let write = db.begin_write().map_err(|e| damaged(path, e))?;
        {
            let mut pubs = write
                .open_table(PUBLICATIONS)
                .map_err(|e| damaged(path, e))?;
            let mut streams = write.open_table(STREAMS).map_err(|e| damaged(path, e))?;
            for channel in &bad {
                let ch = channel.as_str();
                pubs.retain_in((ch, 0)..=(ch, u64::MAX), |_, _| false)
                    .map_err(|e| damaged(path, e))?;
                streams.remove(ch).map_err(|e| damaged(path, e))?;
                metas.remove(channel);
                tracing::warn!(
                    channel = ch,
                    file = %path.display(),
                    "damaged history dropped; the channel starts a new epoch (resuming clients get recovered: false)"
                );
            }
        }
        write.commit().map_err(|e| damaged(path, e))?;
    }
    Ok(metas
        .into_iter()
        .filter_map(|(c, m)| Some((ChannelName::new(&c).ok()?, m)))
        .collect())
}

fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("storage: {e}"))
}

impl Store {
    pub(crate) fn open(
        dir: &Path,
        sync: SyncPolicy,
        sink: Arc<dyn PublicationSink>,
        deadlines: Arc<Deadlines>,
    ) -> Result<(Arc<Self>, Streams), OpenError> {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::Directory {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let db = match Database::create(&path) {
            Ok(db) => db,
            Err(
                redb::DatabaseError::DatabaseAlreadyOpen
                | redb::DatabaseError::LockProtocolMismatch,
            ) => return Err(OpenError::InUse { path }),
            Err(e) => return Err(damaged(&path, e)),
        };
        let streams = verify(&db, &path)?;
        let db = Arc::new(db);
        let (jobs, rx) = mpsc::channel();
        let failed = Arc::new(AtomicBool::new(false));
        let committer = Committer {
            db: db.clone(),
            sync,
            sink,
            failed: failed.clone(),
            deadlines,
        };
        let thread = std::thread::Builder::new()
            .name("herald-store".into())
            .spawn(move || committer.run(rx))
            .map_err(|source| OpenError::Directory {
                path: dir.to_owned(),
                source,
            })?;
        let store = Self {
            path,
            db,
            jobs: Mutex::new(Some(jobs)),
            committer: Mutex::new(Some(thread)),
            failed,
        };
        Ok((Arc::new(store), streams))
    }

    /// Queues a job for the committer. Jobs dropped here (storage failed) answer their
    /// waiters with an error when their reply channel closes.
    pub(crate) fn submit(&self, job: Job) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Some(jobs) = &*self.jobs.lock() {
            let _ = jobs.send(job);
        }
    }

    /// Reads committed history. `position` is the committed top, read under the channel's
    /// lock, so publications past it (committed but not yet fanned out) stay invisible.
    pub(crate) fn read(
        &self,
        channel: &ChannelName,
        position: &StreamPosition,
        expired_before_ms: u64,
        history_size: usize,
        query: &HistoryQuery,
    ) -> Result<History, BrokerError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let top = position.offset;
        let ch = channel.as_str();
        let table = match txn.open_table(PUBLICATIONS) {
            Ok(t) => Some(t),
            Err(TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(unavailable(e)),
        };
        // The oldest publication still readable: within the size bound and not expired.
        let mut first = top + 1;
        let lowest = top.saturating_sub(history_size as u64) + 1;
        if let Some(table) = &table {
            for entry in table.range((ch, lowest)..=(ch, top)).map_err(unavailable)? {
                let (k, v) = entry.map_err(unavailable)?;
                if v.value().0 >= expired_before_ms {
                    first = k.value().1;
                    break;
                }
            }
        }
        let from = match &query.since {
            None => first.max((top + 1).saturating_sub(query.limit as u64)),
            Some(since) => {
                crate::check_since(since, position, first)?;
                (since.offset + 1).max(first)
            }
        };
        let mut publications = Vec::new();
        if let (Some(table), true) = (&table, query.limit > 0 && from <= top) {
            // After a `since` the page is the oldest that fit; without one, the newest.
            let range = table.range((ch, from)..=(ch, top)).map_err(unavailable)?;
            let entries: Box<dyn Iterator<Item = _>> = match query.since {
                Some(_) => Box::new(range),
                None => Box::new(range.rev()),
            };
            let mut bytes = 0;
            for entry in entries {
                let (k, v) = entry.map_err(unavailable)?;
                let offset = k.value().1;
                let (at, crc, data) = v.value();
                if !query.fits(publications.len(), bytes, data.len()) {
                    break;
                }
                if crc != record_crc(ch, offset, at, data) {
                    tracing::error!(channel = ch, offset, file = %self.path.display(), "damaged record; restart to drop it");
                    return Err(unavailable(format!("record {offset} of {ch} is damaged")));
                }
                bytes += data.len();
                publications.push(Publication {
                    offset,
                    data: Bytes::copy_from_slice(data),
                });
            }
            if query.since.is_none() {
                publications.reverse();
            }
        }
        Ok(History {
            position: position.clone(),
            publications,
        })
    }
}

struct Committer {
    db: Arc<Database>,
    sync: SyncPolicy,
    sink: Arc<dyn PublicationSink>,
    failed: Arc<AtomicBool>,
    deadlines: Arc<Deadlines>,
}

impl Committer {
    fn run(self, jobs: mpsc::Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            if self.sync != SyncPolicy::Always {
                // Whatever queued up during the last commit shares this one.
                while batch.len() < 8192 {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
            }
            match self.write(&batch) {
                Ok(oldest_left) => self.complete(batch, oldest_left),
                Err(e) => {
                    tracing::error!(error = %e, "storage write failed; refusing further writes");
                    self.failed.store(true, Ordering::Relaxed);
                    for job in batch {
                        match job {
                            Job::Publish(r) => drop(r.done.send(Err(unavailable(&e)))),
                            Job::Reset { done, .. } => drop(done.send(Err(unavailable(&e)))),
                            _ => {}
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Writes a batch in one transaction; returns, for every trimmed channel, when its
    /// oldest publication left was published (`None`: none left).
    fn write(&self, batch: &[Job]) -> Result<Vec<Option<u64>>, redb::Error> {
        let mut oldest_left = Vec::new();
        let mut txn = self.db.begin_write()?;
        let durability = if self.sync == SyncPolicy::None {
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
                                data: r.data,
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
