//! The database file: opening it (checked by `recovery`), reading it, and handing writes to
//! the one thread that makes them (`committer`).

use std::{
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, TableDefinition, TableError};
use tokio::sync::oneshot;

use super::committer::Committer;
use super::recovery::{
    contained, damaged, renew_epochs, restored, set_unflushed, unflushed, verify, write_run_file,
};
use super::{Deadlines, Meta, StoreOptions, SyncPolicy};
use crate::{BrokerError, History, HistoryQuery, PublicationSink};

/// (channel, offset) → (published at in ms since the Unix epoch, CRC-32, JSON payload).
pub(super) const PUBLICATIONS: TableDefinition<(&str, u64), (u64, u32, &[u8])> =
    TableDefinition::new("publications");
/// channel → (epoch, newest offset, last publish in ms since the Unix epoch, CRC-32).
pub(super) const STREAMS: TableDefinition<&str, (&str, u64, u64, u32)> =
    TableDefinition::new("streams");
/// The store's own state: [`UNFLUSHED`], [`RUN`].
pub(super) const STATE: TableDefinition<&str, u64> = TableDefinition::new("state");
/// A number drawn at every open and kept both in the file and beside it ([`RUN_FILE_NAME`]).
/// At the next open they match unless the file was put back from a copy (a backup, a
/// snapshot of the file): then history may have gone backwards while clients saw what came
/// later, so every stream starts a new epoch rather than hand their offsets out again.
pub(super) const RUN: &str = "run";
/// 1 while a process writes with `sync = "none"`, set durably at open and cleared durably at
/// a clean close. Found set at open, the last such process stopped uncleanly: its latest
/// commits were never made durable and are gone, but subscribers saw their offsets, so
/// every stream must start a new epoch rather than hand those offsets out again.
pub(super) const UNFLUSHED: &str = "unflushed";

/// Herald's own checksum of a record, key included, so a damaged page cannot pass for a
/// publication at another offset. (redb checks its pages only when it recovers from a
/// crash, not on every read.)
pub(super) fn record_crc(channel: &str, offset: u64, at_ms: u64, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(channel.as_bytes());
    h.update(&offset.to_le_bytes());
    h.update(&at_ms.to_le_bytes());
    h.update(data);
    h.finalize()
}

pub(super) fn stream_crc(channel: &str, epoch: &str, top: u64, last_ms: u64) -> u32 {
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

/// Beside it: the [`RUN`] mark of the last open, as decimal text.
pub const RUN_FILE_NAME: &str = "herald.redb.run";

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
    /// The stream's [`Meta::generation`] when the offset was handed out.
    pub(crate) generation: u64,
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

/// The open database. Empty while the committer reopens it after a write failure: redb
/// refuses every operation after an I/O error until the file is opened anew.
pub(super) type Slot = Arc<RwLock<Option<Arc<Database>>>>;

/// Why writes fail, while they do.
pub(super) type Failing = Arc<Mutex<Option<String>>>;

pub(crate) struct Store {
    pub(crate) path: PathBuf,
    db: Slot,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    failing: Failing,
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

pub(super) fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("storage: {e}"))
}

impl Store {
    pub(crate) fn open(
        dir: &Path,
        options: StoreOptions,
        sink: Arc<dyn PublicationSink>,
        deadlines: Arc<Deadlines>,
    ) -> Result<(Arc<Self>, Streams), OpenError> {
        let sync = options.sync;
        std::fs::create_dir_all(dir).map_err(|source| OpenError::Directory {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let (db, streams) = contained(&path, || {
            let mut db = match options.database(&path) {
                Ok(db) => db,
                Err(
                    redb::DatabaseError::DatabaseAlreadyOpen
                    | redb::DatabaseError::LockProtocolMismatch,
                ) => return Err(OpenError::InUse { path: path.clone() }),
                Err(e) => return Err(damaged(&path, e)),
            };
            // Checks every page's checksum before anything reads or writes the file: redb
            // trusts a cleanly closed file otherwise, and a damaged page can make it panic
            // inside a destructor, which aborts the process instead of unwinding.
            db.check_integrity().map_err(|e| damaged(&path, e))?;
            let lost_unflushed = unflushed(&db).map_err(|e| damaged(&path, e))?;
            if !lost_unflushed && restored(&db, dir).map_err(|e| damaged(&path, e))? {
                let renewed = renew_epochs(&db, &path)?;
                tracing::warn!(
                    channels = renewed,
                    file = %path.display(),
                    "the data file is older than the one this directory last used (restored from a backup or a snapshot): every channel starts a new epoch, keeping its history, so clients that saw later publications get recovered: false instead of reused offsets"
                );
            }
            let streams = verify(&db, &path, lost_unflushed)?;
            // The mark goes into the file first: a crash before the copy beside it is
            // written looks like a restore next time, which costs a new epoch, never a
            // reused offset.
            let run = fastrand::u64(..);
            set_unflushed(&db, sync == SyncPolicy::None, Some(run))
                .map_err(|e| damaged(&path, e))?;
            write_run_file(dir, run).map_err(|source| OpenError::Directory {
                path: dir.to_owned(),
                source,
            })?;
            Ok((db, streams))
        })?;
        let db: Slot = Arc::new(RwLock::new(Some(Arc::new(db))));
        let (jobs, rx) = mpsc::channel();
        let failing = Failing::default();
        let committer = Committer {
            path: path.clone(),
            db: db.clone(),
            options,
            sink,
            failing: failing.clone(),
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
            failing,
        };
        Ok((Arc::new(store), streams))
    }

    /// Queues a job for the committer, which answers it (also while writes fail).
    pub(crate) fn submit(&self, job: Job) {
        if let Some(jobs) = &*self.jobs.lock() {
            let _ = jobs.send(job);
        }
    }

    /// Why writes fail, while they do; `Ok` once a write (or the committer's retry) works.
    pub(crate) fn health(&self) -> Result<(), String> {
        match &*self.failing.lock() {
            None => Ok(()),
            Some(why) => Err(format!("storage writes fail: {why}")),
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
        let db = self
            .db
            .read()
            .clone()
            .ok_or_else(|| unavailable("the file is being reopened after a write failure"))?;
        let txn = db.begin_read().map_err(unavailable)?;
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
                    record: Bytes::copy_from_slice(data),
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
