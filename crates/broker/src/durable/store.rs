//! The store: opening it (`recovery`: the last checkpoint and the log after it), reading
//! history (through the index, joined with what the applier has not indexed yet,
//! `unapplied`), and handing writes to the writer (`committer`: the log) and the applier
//! (the index).

use std::{
    path::PathBuf,
    sync::{mpsc, Arc},
};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::{Mutex, RwLock};
use tokio::sync::oneshot;

use super::applier::Applier;
use super::checkpointer::Checkpointer;
use super::committer::{Log, Writer};
use super::disk::{Dir, FileIo, Handle, Held};
use super::index::{Index, Loc};
use super::recovery::Opened;
pub(crate) use super::unapplied::Unapplied;
use super::{migrate, recovery, segment, wal, Deadlines, Meta, StoreOptions};
use crate::{BrokerError, History, HistoryQuery, PublicationSink};

/// Beside the store: the run mark of the last open, as decimal text (see `recovery`).
pub const RUN_FILE_NAME: &str = "herald.run";

/// Beside the store: locked by the process that has it open.
pub const LOCK_FILE_NAME: &str = "herald.lock";

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
    /// Another process (or another broker in this one) has the store open.
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

/// The streams found when the store was opened.
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

/// Why a history read failed.
pub(crate) enum ReadError {
    Broker(BrokerError),
    /// A publication it reached is damaged (its bytes fail their CRC, or are not it): the
    /// channel's history cannot be trusted.
    Damaged(String),
}

impl From<BrokerError> for ReadError {
    fn from(e: BrokerError) -> Self {
        Self::Broker(e)
    }
}

/// Why writes fail, while they do.
pub(super) type Failing = Arc<Mutex<Option<String>>>;

pub(crate) struct Store {
    pub(crate) dir: PathBuf,
    index: Arc<RwLock<Index>>,
    pub(crate) writer: Arc<Writer>,
    applier: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Why appends to the log fail, while they do.
    failing: Failing,
    /// Why the applier fails (a segment it cannot open).
    applier_failing: Failing,
    /// Why checkpoints fail (see `checkpointer`).
    checkpoint_failing: Failing,
    pub(crate) unapplied: Arc<Unapplied>,
    /// Locked while the store is open (see [`LOCK_FILE_NAME`]); dropped after everything
    /// else is written.
    _lock: Held,
}

impl Drop for Store {
    fn drop(&mut self) {
        // Let the applier index everything and write its last checkpoint, so the next
        // start reads no log.
        self.writer.close(self.applier.lock().take());
    }
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("storage: {e}"))
}

impl Store {
    pub(crate) fn open(
        dir: Dir,
        options: StoreOptions,
        sink: Arc<dyn PublicationSink>,
        deadlines: Arc<Deadlines>,
    ) -> Result<(Arc<Self>, Streams), OpenError> {
        let sync = options.sync;
        let directory = |source| OpenError::Directory {
            path: dir.to_path_buf(),
            source,
        };
        dir.disk().create_dir_all(&dir).map_err(directory)?;
        // One process at a time: held until the store is dropped.
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock = (dir.disk().lock(&lock_path).map_err(directory)?)
            .ok_or(OpenError::InUse { path: lock_path })?;
        let started = std::time::Instant::now();
        let Opened {
            index,
            run,
            next_lsn,
            migrated,
            chain,
        } = recovery::open(&dir, !sync.syncs_before_delivery())?;
        if let Some(old) = migrated {
            migrate::retire(&dir, &old);
        }
        let streams: Streams = index
            .streams
            .iter()
            .filter_map(|(c, s)| {
                let meta = Meta::new(s.epoch.clone(), s.top, Default::default(), s.last_ms);
                Some((ChannelName::stored(c).ok()?, meta))
            })
            .collect();
        let (size, live) = index.footprint();
        tracing::info!(
            dir = %dir.display(),
            channels = streams.len(),
            bytes = size,
            live,
            ms = started.elapsed().as_millis() as u64,
            "opened the store"
        );
        let segment = segment::Segment::create(&dir, run, next_lsn).map_err(directory)?;
        let index = Arc::new(RwLock::new(index));
        let unapplied = Arc::new(Unapplied::default());
        let (failing, applier_failing) = (Failing::default(), Failing::default());
        let checkpoint_failing = Failing::default();
        let (ops, rx) = mpsc::channel();
        let checkpointer = Checkpointer::new(dir.clone(), chain, checkpoint_failing.clone());
        let (jobs, jobs_rx) = mpsc::channel();
        let checkpointer_thread = std::thread::Builder::new()
            .name("herald-store-checkpoint".into())
            .spawn(move || checkpointer.run(jobs_rx))
            .map_err(directory)?;
        let applier = Applier {
            dir: dir.clone(),
            index: index.clone(),
            options,
            failing: applier_failing.clone(),
            checkpoint_failing: checkpoint_failing.clone(),
            deadlines: deadlines.clone(),
            unapplied: unapplied.clone(),
            run,
            since_checkpoint: 0,
            touched: Default::default(),
            checkpoints: Some((jobs, checkpointer_thread)),
        };
        let applier_thread = std::thread::Builder::new()
            .name("herald-store-apply".into())
            .spawn(move || applier.run(rx))
            .map_err(directory)?;
        let log = Log {
            dir: dir.clone(),
            segment,
            run,
            next_lsn,
            body: Vec::new(),
            unsynced: None,
            sync_failed: super::committer::SyncFailed::No,
            segment_bytes: options
                .segment_bytes
                .clamp(super::MIN_SEGMENT_BYTES, super::MAX_SEGMENT_BYTES),
        };
        let writer = Writer::start(
            log,
            options,
            sink,
            failing.clone(),
            deadlines,
            unapplied.clone(),
            ops,
        )
        .map_err(directory)?;
        let store = Self {
            dir: dir.to_path_buf(),
            index,
            writer,
            applier: Mutex::new(Some(applier_thread)),
            failing,
            applier_failing,
            checkpoint_failing,
            unapplied,
            _lock: lock,
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
        let applier = || self.applier_failing.lock().clone();
        match log
            .or_else(applier)
            .or_else(|| self.checkpoint_failing.lock().clone())
        {
            None => Ok(()),
            Some(why) => Err(format!("storage writes fail: {why}")),
        }
    }

    /// Trims every stream to the newest publications its retention keeps (`keep`, by
    /// channel), as publishing would.
    pub(crate) fn keep_newest(&self, keep: impl Fn(&ChannelName) -> usize) {
        let mut index = self.index.write();
        let limits: Vec<(String, usize)> = index
            .streams
            .keys()
            .filter_map(|c| Some((c.clone(), keep(&ChannelName::stored(c).ok()?))))
            .collect();
        for (channel, n) in limits {
            index.keep_newest(&channel, n);
        }
    }

    /// Bytes of the store's files, and of the entries in them still kept.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (u64, u64) {
        self.index.read().footprint()
    }

    /// Reads committed history. `position` is the committed top, read under the channel's
    /// lock, so publications past it (committed but not yet fanned out) stay invisible.
    /// The newest publications may not be indexed yet: those come from [`Unapplied`], read
    /// first, so that one the applier indexes meanwhile is found in the index.
    pub(crate) fn read(
        &self,
        channel: &ChannelName,
        position: &StreamPosition,
        expired_before_ms: u64,
        history_size: usize,
        query: &HistoryQuery,
    ) -> Result<History, ReadError> {
        let top = position.offset;
        let recent = self.unapplied.read(channel, &position.epoch, top);
        // The index serves the offsets before the first one still waiting for it.
        let split = recent.first().map_or(top + 1, |r| r.0);
        let ch = channel.as_str();
        // The oldest publication still readable: within the size bound and not expired.
        let lowest = top.saturating_sub(history_size as u64) + 1;
        // What the index points to for this page, taken under its lock and read after.
        let mut located: Vec<(u64, Loc, Handle)> = Vec::new();
        let mut page = Page {
            query,
            publications: Vec::new(),
            bytes: 0,
        };
        let newest_first = query.since.is_none();
        let mut more = true;
        let from;
        {
            let index = self.index.read();
            // Another epoch's publications (a reset the index has not seen yet) are not
            // this stream's.
            let stream = index
                .streams
                .get(ch)
                .filter(|s| s.epoch == position.epoch && split > 1);
            let overhead = wal::publication_overhead(ch, position.epoch.as_str()) as u32;
            let kept = |offset: u64| stream.and_then(|s| s.at(offset));
            let first = stream
                .and_then(|s| {
                    (lowest.max(s.first)..split)
                        .find(|o| kept(*o).is_some_and(|l| l.at_ms >= expired_before_ms))
                })
                .or_else(|| {
                    recent
                        .iter()
                        .find(|r| r.0 >= lowest && r.1 >= expired_before_ms)
                        .map(|r| r.0)
                })
                .unwrap_or(top + 1);
            from = match &query.since {
                None => first.max((top + 1).saturating_sub(query.limit as u64)),
                Some(since) => {
                    crate::check_since(since, position, first)?;
                    (since.offset + 1).max(first)
                }
            };
            if query.limit > 0 && from <= top {
                // After a `since` the page is the oldest that fit; without one, the newest.
                if newest_first {
                    for r in recent.iter().filter(|r| r.0 >= from).rev() {
                        if !page.take(r.0, r.2.len(), || r.2.clone()) {
                            more = false;
                            break;
                        }
                    }
                }
                if more && from < split {
                    let offsets: Box<dyn Iterator<Item = u64>> = match newest_first {
                        false => Box::new(from..split),
                        true => Box::new((from..split).rev()),
                    };
                    let mut bytes = page.bytes;
                    for offset in offsets {
                        let Some(loc) = kept(offset) else {
                            continue;
                        };
                        let len = loc.span.len.saturating_sub(overhead) as usize;
                        if !query.fits(page.publications.len() + located.len(), bytes, len) {
                            more = false;
                            break;
                        }
                        bytes += len;
                        let Some(file) = index.files.get(&loc.file) else {
                            continue;
                        };
                        located.push((offset, *loc, file.file.clone()));
                    }
                }
            }
        }
        for (offset, loc, file) in located {
            let data = match read_entry(&*file, &loc, ch, offset) {
                Ok(data) => data,
                Err(Unreadable::Io(e)) => {
                    return Err(
                        unavailable(format!("reading publication {offset} of {ch}: {e}")).into(),
                    )
                }
                Err(Unreadable::Damaged(why)) => {
                    return Err(ReadError::Damaged(format!(
                        "publication {offset} of {ch} {why}"
                    )))
                }
            };
            page.take(offset, data.len(), || data);
        }
        if query.limit > 0 && from <= top && !newest_first && more {
            for r in recent.iter().filter(|r| r.0 >= from) {
                if !page.take(r.0, r.2.len(), || r.2.clone()) {
                    break;
                }
            }
        }
        if newest_first {
            page.publications.reverse();
        }
        Ok(History {
            position: position.clone(),
            publications: page.publications,
        })
    }
}

enum Unreadable {
    Io(std::io::Error),
    Damaged(&'static str),
}

/// Reads the publication `offset` of `channel` where `loc` says, checking its CRC and that
/// it is that publication.
fn read_entry(
    file: &dyn FileIo,
    loc: &Loc,
    channel: &str,
    offset: u64,
) -> Result<Bytes, Unreadable> {
    let mut buf = vec![0u8; loc.span.len as usize];
    file.read_exact_at(&mut buf, u64::from(loc.span.pos))
        .map_err(|e| match e.kind() {
            // The file is shorter than the index says.
            std::io::ErrorKind::UnexpectedEof => Unreadable::Damaged("is cut off"),
            _ => Unreadable::Io(e),
        })?;
    if crc32fast::hash(&buf) != loc.span.crc {
        return Err(Unreadable::Damaged("fails its checksum"));
    }
    let (ch, _, off, _, data) =
        wal::publication(&buf).ok_or(Unreadable::Damaged("cannot be decoded"))?;
    if ch != channel || off != offset {
        return Err(Unreadable::Damaged("is another publication"));
    }
    let start = buf.len() - data.len();
    Ok(Bytes::from(buf).slice(start..))
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
