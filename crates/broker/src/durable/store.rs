//! The database file: opening it (checked by `recovery`, the log replayed), reading it
//! (joined with what waits for it, `unapplied`), and handing writes to the writer
//! (`committer`: the log) and the applier (the file).

use std::{
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, TableDefinition, TableError};
use tokio::sync::oneshot;

use super::applier::Applier;
use super::committer::{Log, Writer};
use super::recovery::{
    applied, contained, damaged, file_run, renew_epochs, replay, restored, set_unflushed,
    unflushed, verify, write_run_file,
};
use super::seal;
pub(crate) use super::unapplied::Unapplied;
use super::{wal, Deadlines, Meta, StoreOptions};
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
/// 1 while a process delivers publications before syncing them (`sync = "group"`,
/// `"interval"` or `"none"`), set durably at open and cleared durably at a clean close. Found set at open
/// on a machine that restarted since ([`BOOT`]), the last such process stopped with the
/// machine: its latest publications may be gone, but subscribers saw their offsets, so
/// every stream must start a new epoch rather than hand those offsets out again.
pub(super) const UNFLUSHED: &str = "unflushed";
/// The machine's boot the mark above was set in.
pub(super) const BOOT: &str = "boot";
/// The last write-ahead log entry the file holds: replay at open starts after it.
pub(super) const APPLIED: &str = "applied";

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

/// Reads the file once, in order, so that the integrity check that follows finds its pages
/// in the kernel's cache: the check walks the B-tree, whose pages lie scattered in the file
/// (the more so after commits of many channels and compaction), and on a cold cache that
/// random reading, not the check, was the restart's time. 274 MB: 0.15-0.25 s read in order
/// against 2.2 s of checking from a cold cache. Best effort: a read that fails leaves the
/// check to read the file itself.
fn prefetch(path: &Path) {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return;
    };
    let mut chunk = vec![0u8; 4 << 20];
    while matches!(file.read(&mut chunk), Ok(n) if n > 0) {}
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
    /// Most publications the stream keeps (its policy when published).
    pub(crate) history_size: usize,
    pub(crate) done: oneshot::Sender<Result<StreamPosition, BrokerError>>,
}

pub(crate) enum Job {
    Publish(Record),
    /// Delete a channel's history and start a new epoch.
    Reset {
        channel: ChannelName,
        epoch: Epoch,
        at_ms: u64,
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

/// The open database. Empty while the applier reopens it after a write failure: redb
/// refuses every operation after an I/O error until the file is opened anew.
pub(super) type Slot = Arc<RwLock<Option<Arc<Database>>>>;

/// Why writes fail, while they do.
pub(super) type Failing = Arc<Mutex<Option<String>>>;

pub(crate) struct Store {
    pub(crate) path: PathBuf,
    db: Slot,
    pub(crate) writer: Arc<Writer>,
    applier: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Why appends to the log fail, while they do.
    failing: Failing,
    /// Why writes of the database file fail, while they do.
    applier_failing: Failing,
    pub(crate) unapplied: Arc<Unapplied>,
    /// Whether the open trusted the file as its last clean stop sealed it, instead of
    /// reading every page (see `seal`). The open's log line says so too.
    #[cfg(test)]
    pub(crate) opened_sealed: bool,
}

impl Drop for Store {
    fn drop(&mut self) {
        // Let the applier write everything, so the file is closed cleanly and the log is
        // no longer needed.
        self.writer.close(self.applier.lock().take());
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
        let (db, streams, run, next_lsn, _sealed) = contained(&path, || {
            // Before the file is opened: opening it for writing changes it.
            let sealed = seal::take(dir, &path);
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
            // inside a destructor, which aborts the process instead of unwinding. Unless
            // the file is as this directory's last clean stop left it (see `seal`).
            let started = std::time::Instant::now();
            let sealed =
                sealed.is_some() && file_run(&db).map_err(|e| damaged(&path, e))? == sealed;
            if !sealed {
                prefetch(&path);
                db.check_integrity().map_err(|e| damaged(&path, e))?;
            }
            let checked = started.elapsed();
            let log_damaged = replay(&db, dir, &path)?;
            // Each of these means history may have gone back, or has holes, while clients
            // saw later offsets: every stream starts a new epoch, keeping its history, so
            // that resuming clients get recovered: false instead of reused offsets.
            let renew = if unflushed(&db).map_err(|e| damaged(&path, e))? {
                Some("the last run delivered publications before syncing them (sync = \"group\", \"interval\" or \"none\") and stopped with the machine, so its latest ones may be lost")
            } else if log_damaged {
                Some("the write-ahead log is damaged: entries in it may be lost")
            } else if restored(&db, dir).map_err(|e| damaged(&path, e))? {
                Some("the data file is older than the one this directory last used (restored from a backup or a snapshot)")
            } else {
                None
            };
            if let Some(why) = renew {
                let renewed = renew_epochs(&db, &path)?;
                tracing::warn!(
                    channels = renewed,
                    file = %path.display(),
                    "{why}: every channel starts a new epoch, keeping its history (resuming clients get recovered: false)"
                );
            }
            let verifying = std::time::Instant::now();
            let streams = verify(&db, &path, !sealed)?;
            tracing::info!(
                file = %path.display(),
                channels = streams.len(),
                sealed,
                page_check_ms = checked.as_millis() as u64,
                record_check_ms = verifying.elapsed().as_millis() as u64,
                "opened the data file"
            );
            // The mark goes into the file first: a crash before the copy beside it is
            // written looks like a restore next time, which costs a new epoch, never a
            // reused offset.
            let run = fastrand::u64(..);
            set_unflushed(&db, !sync.syncs_before_delivery(), Some(run))
                .map_err(|e| damaged(&path, e))?;
            write_run_file(dir, run).map_err(|source| OpenError::Directory {
                path: dir.to_owned(),
                source,
            })?;
            let next_lsn = applied(&db).map_err(|e| damaged(&path, e))? + 1;
            Ok((db, streams, run, next_lsn, sealed))
        })?;
        let directory = |source| OpenError::Directory {
            path: dir.to_owned(),
            source,
        };
        // Every entry of the old log is in the file now (or was another file's, or lost
        // and answered with new epochs): a new log starts.
        for (_, old) in wal::segments(dir).map_err(directory)? {
            std::fs::remove_file(old).map_err(directory)?;
        }
        let segment = wal::Segment::create(dir, run, next_lsn).map_err(directory)?;
        let segments = Arc::new(Mutex::new(vec![next_lsn]));
        let db: Slot = Arc::new(RwLock::new(Some(Arc::new(db))));
        let unapplied = Arc::new(Unapplied::default());
        let (failing, applier_failing) = (Failing::default(), Failing::default());
        let (ops, rx) = mpsc::channel();
        let applier = Applier {
            path: path.clone(),
            dir: dir.to_owned(),
            db: db.clone(),
            options,
            failing: applier_failing.clone(),
            deadlines: deadlines.clone(),
            unapplied: unapplied.clone(),
            segments: segments.clone(),
            run,
        };
        let applier_thread = std::thread::Builder::new()
            .name("herald-store-apply".into())
            .spawn(move || applier.run(rx))
            .map_err(directory)?;
        let log = Log {
            dir: dir.to_owned(),
            segment,
            segments,
            run,
            next_lsn,
            body: Vec::new(),
            unsynced: None,
        };
        let writer = Writer::start(
            log,
            options,
            sink,
            failing.clone(),
            applier_failing.clone(),
            deadlines,
            unapplied.clone(),
            ops,
        )
        .map_err(directory)?;
        let store = Self {
            path,
            db,
            writer,
            applier: Mutex::new(Some(applier_thread)),
            failing,
            applier_failing,
            unapplied,
            #[cfg(test)]
            opened_sealed: _sealed,
        };
        Ok((Arc::new(store), streams))
    }

    /// Queues a job, which is answered (also while writes fail) once [`Store::drive`] runs:
    /// call it when no channel lock is held any more.
    pub(crate) fn submit(&self, job: Job) {
        self.writer.submit(job);
    }

    /// Writes what is queued, here or by the writer already doing so.
    pub(crate) fn drive(&self) {
        self.writer.drive();
    }

    /// Why writes fail, while they do; `Ok` once the writes that failed (or a retry) work.
    pub(crate) fn health(&self) -> Result<(), String> {
        let log = self.failing.lock().clone();
        match log.or_else(|| self.applier_failing.lock().clone()) {
            None => Ok(()),
            Some(why) => Err(format!("storage writes fail: {why}")),
        }
    }

    /// Reads committed history. `position` is the committed top, read under the channel's
    /// lock, so publications past it (committed but not yet fanned out) stay invisible.
    /// The newest publications may not be in the file yet: those come from [`Unapplied`],
    /// read first, so that one the applier moves meanwhile is found in the file.
    pub(crate) fn read(
        &self,
        channel: &ChannelName,
        position: &StreamPosition,
        expired_before_ms: u64,
        history_size: usize,
        query: &HistoryQuery,
    ) -> Result<History, BrokerError> {
        let top = position.offset;
        let recent = self.unapplied.read(channel, &position.epoch, top);
        // The file serves the offsets before the first one still waiting for it.
        let split = recent.first().map_or(top + 1, |r| r.0);
        let db = self
            .db
            .read()
            .clone()
            .ok_or_else(|| unavailable("the file is being reopened after a write failure"))?;
        let txn = db.begin_read().map_err(unavailable)?;
        let ch = channel.as_str();
        fn open<T>(found: Result<T, TableError>) -> Result<Option<T>, BrokerError> {
            match found {
                Ok(t) => Ok(Some(t)),
                Err(TableError::TableDoesNotExist(_)) => Ok(None),
                Err(e) => Err(unavailable(e)),
            }
        }
        // Rows of another epoch (a reset or a new stream the file has not seen yet) are not
        // this stream's.
        let same_epoch = match open(txn.open_table(STREAMS))? {
            Some(streams) => streams
                .get(ch)
                .map_err(unavailable)?
                .is_some_and(|row| row.value().0 == position.epoch.as_str()),
            None => false,
        };
        let table = if same_epoch && split > 1 {
            open(txn.open_table(PUBLICATIONS))?
        } else {
            None
        };
        // The oldest publication still readable: within the size bound and not expired.
        let lowest = top.saturating_sub(history_size as u64) + 1;
        let mut first = None;
        if let (Some(table), true) = (&table, lowest < split) {
            for entry in table
                .range((ch, lowest)..(ch, split))
                .map_err(unavailable)?
            {
                let (k, v) = entry.map_err(unavailable)?;
                if v.value().0 >= expired_before_ms {
                    first = Some(k.value().1);
                    break;
                }
            }
        }
        let first = first
            .or_else(|| {
                recent
                    .iter()
                    .find(|r| r.0 >= lowest && r.1 >= expired_before_ms)
                    .map(|r| r.0)
            })
            .unwrap_or(top + 1);
        let from = match &query.since {
            None => first.max((top + 1).saturating_sub(query.limit as u64)),
            Some(since) => {
                crate::check_since(since, position, first)?;
                (since.offset + 1).max(first)
            }
        };
        let mut page = Page {
            query,
            publications: Vec::new(),
            bytes: 0,
        };
        if query.limit > 0 && from <= top {
            // After a `since` the page is the oldest that fit; without one, the newest.
            let newest_first = query.since.is_none();
            let recent = recent.iter().filter(|r| r.0 >= from);
            let mut more = true;
            if newest_first {
                for r in recent.clone().rev() {
                    if !page.take(r.0, r.2.len(), || r.2.clone()) {
                        more = false;
                        break;
                    }
                }
            }
            if let (Some(table), true) = (&table, more && from < split) {
                let range = table.range((ch, from)..(ch, split)).map_err(unavailable)?;
                let entries: Box<dyn Iterator<Item = _>> = match newest_first {
                    false => Box::new(range),
                    true => Box::new(range.rev()),
                };
                for entry in entries {
                    let (k, v) = entry.map_err(unavailable)?;
                    let offset = k.value().1;
                    let (at, crc, data) = v.value();
                    if !page.fits(data.len()) {
                        more = false;
                        break;
                    }
                    if crc != record_crc(ch, offset, at, data) {
                        tracing::error!(channel = ch, offset, file = %self.path.display(), "damaged record; restart to drop it");
                        return Err(unavailable(format!("record {offset} of {ch} is damaged")));
                    }
                    page.take(offset, data.len(), || Bytes::copy_from_slice(data));
                }
            }
            if !newest_first && more {
                for r in recent {
                    if !page.take(r.0, r.2.len(), || r.2.clone()) {
                        break;
                    }
                }
            }
            if newest_first {
                page.publications.reverse();
            }
        }
        Ok(History {
            position: position.clone(),
            publications: page.publications,
        })
    }
}

/// A history page being filled, within the query's bounds.
struct Page<'q> {
    query: &'q HistoryQuery,
    publications: Vec<Publication>,
    bytes: usize,
}

impl Page<'_> {
    fn fits(&self, len: usize) -> bool {
        self.query.fits(self.publications.len(), self.bytes, len)
    }

    /// Adds a publication if it fits; whether it did.
    fn take(&mut self, offset: u64, len: usize, record: impl FnOnce() -> Bytes) -> bool {
        if !self.fits(len) {
            return false;
        }
        self.bytes += len;
        self.publications.push(Publication {
            offset,
            record: record(),
        });
        true
    }
}
