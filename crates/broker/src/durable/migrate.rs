//! Moving a data directory of an earlier Herald over: it kept history in a redb database
//! file (`herald.redb`) fed by the same write-ahead log. At the first open without a
//! checkpoint, the file is checked as before (redb's page checksums, then every record's
//! own), its publications are written into a packed file, and the checkpoint made from
//! them takes over, with the file's last applied log entry, run mark and unflushed mark,
//! so that the log segments it had not applied yet are replayed as usual. The old file is
//! then renamed `herald.redb.migrated` (kept, so a rollback can rename it back; delete it
//! once satisfied).

use std::{
    collections::{BTreeMap, VecDeque},
    path::{Path, PathBuf},
};

use herald_protocol::{ChannelName, Epoch};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::checkpoint::{Checkpoint, Head};
use super::disk::{Appender, Dir};
use super::index::{packed_path, FileId, Kind, Loc, Stream};
use super::pack;
use super::recovery::{boot_id, damaged, write_run_file};
use super::store::{OpenError, RUN_FILE_NAME};
use super::wal::{self, Span};

/// The old database file inside the data directory.
pub const REDB_FILE_NAME: &str = "herald.redb";
/// Its run mark beside it.
const REDB_RUN_FILE_NAME: &str = "herald.redb.run";
/// The seal its clean stops left beside it.
const REDB_SEAL_FILE_NAME: &str = "herald.redb.closed";

/// (channel, offset) → (published at in ms since the Unix epoch, CRC-32, JSON payload).
const PUBLICATIONS: TableDefinition<(&str, u64), (u64, u32, &[u8])> =
    TableDefinition::new("publications");
/// channel → (epoch, newest offset, last publish in ms since the Unix epoch, CRC-32).
const STREAMS: TableDefinition<&str, (&str, u64, u64, u32)> = TableDefinition::new("streams");
const STATE: TableDefinition<&str, u64> = TableDefinition::new("state");

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

/// The checkpoint made from the old database file in `dir`, if there is one, and the
/// file's path (renamed by the caller once the checkpoint is written, see [`retire`]).
pub(super) fn from_redb(dir: &Dir) -> Result<Option<(Checkpoint, PathBuf)>, OpenError> {
    let path = dir.join(REDB_FILE_NAME);
    if !dir.disk().exists(&path) {
        return Ok(None);
    }
    // redb decodes keys and values with `unwrap`: a damaged file must name itself, not
    // panic.
    let export = || export(dir, &path, wal::MAX_FILE_BYTES);
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(export))
        .unwrap_or_else(|_| Err(damaged(&path, "a record cannot be decoded")))?;
    tracing::info!(file = %path.display(), channels = found.streams.len(), "moving history from the old database file");
    Ok(Some((found, path)))
}

/// After the checkpoint made from it is written: the old file is set aside.
pub(super) fn retire(dir: &Dir, old: &Path) {
    let aside = old.with_extension("redb.migrated");
    match dir.disk().rename(old, &aside) {
        Ok(()) => {
            tracing::info!(file = %aside.display(), "history moved to the log store; the old file is kept as this (delete it once satisfied)")
        }
        Err(e) => {
            tracing::warn!(error = %e, file = %old.display(), "the old database file could not be renamed; it is moved over again at the next start")
        }
    }
    let _ = dir.disk().remove(&dir.join(REDB_SEAL_FILE_NAME));
}

fn export(dir: &Dir, path: &Path, pack_limit: u64) -> Result<Checkpoint, OpenError> {
    let mut db = match redb::Database::create(path) {
        Ok(db) => db,
        Err(
            redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch,
        ) => {
            return Err(OpenError::InUse {
                path: path.to_owned(),
            })
        }
        Err(e) => return Err(damaged(path, e)),
    };
    db.check_integrity().map_err(|e| damaged(path, e))?;
    let read = db.begin_read().map_err(|e| damaged(path, e))?;
    let state = |key: &str| -> Result<Option<u64>, OpenError> {
        match read.open_table(STATE) {
            Ok(t) => Ok(t.get(key).map_err(|e| damaged(path, e))?.map(|v| v.value())),
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(damaged(path, e)),
        }
    };
    let run = state("run")?;
    let unflushed = state("unflushed")? == Some(1);
    let boot = state("boot")?;
    let applied = state("applied")?.unwrap_or(0);

    let mut streams: BTreeMap<String, Stream> = BTreeMap::new();
    match read.open_table(STREAMS) {
        Ok(table) => {
            for entry in table.iter().map_err(|e| damaged(path, e))? {
                let (k, v) = entry.map_err(|e| damaged(path, e))?;
                let channel = k.value().to_string();
                let (epoch, top, last, crc) = v.value();
                let valid =
                    ChannelName::stored(&channel).is_ok() && Epoch::checked(epoch).is_some();
                if valid && crc == stream_crc(&channel, epoch, top, last) {
                    streams.insert(channel, Stream::new(Epoch::new(epoch), top, last));
                } else {
                    tracing::warn!(channel, file = %path.display(), "damaged stream dropped; the channel starts again");
                }
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(damaged(path, e)),
    }

    let directory = |source| OpenError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let mut packs = Packs::start(dir, pack_limit).map_err(directory)?;
    let mut entry = Vec::new();
    let mut bad: Vec<String> = Vec::new();
    match read.open_table(PUBLICATIONS) {
        Ok(table) => {
            for row in table.iter().map_err(|e| damaged(path, e))? {
                let (k, v) = row.map_err(|e| damaged(path, e))?;
                let (channel, offset) = k.value();
                let (at_ms, crc, data) = v.value();
                let Some(stream) = streams.get_mut(channel) else {
                    continue;
                };
                let fits = offset <= stream.top
                    && (stream.locs.is_empty()
                        || stream.first + stream.locs.len() as u64 == offset);
                if !fits || crc != record_crc(channel, offset, at_ms, data) {
                    bad.push(channel.to_string());
                    continue;
                }
                if stream.locs.is_empty() {
                    stream.first = offset;
                }
                entry.clear();
                wal::encode_publish(
                    &mut entry,
                    channel,
                    stream.epoch.as_str(),
                    offset,
                    at_ms,
                    data,
                );
                let (file, span) = packs.put(&entry).map_err(directory)?;
                stream.locs.push_back(Loc { file, span, at_ms });
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(damaged(path, e)),
    }
    let files = packs.finish().map_err(directory)?;
    for channel in bad {
        if let Some(stream) = streams.get_mut(&channel) {
            tracing::warn!(channel, file = %path.display(), "damaged history dropped; the channel starts a new epoch (resuming clients get recovered: false)");
            stream.locs = VecDeque::new();
            stream.first = stream.top + 1;
            stream.epoch = Epoch::random(|| fastrand::u64(..));
        }
    }
    // A stream's kept publications end at its top. Ones that do not are dropped rather
    // than the top moved back, which would hand their offsets out again.
    for (channel, stream) in &mut streams {
        if !stream.locs.is_empty() && stream.first + stream.locs.len() as u64 != stream.top + 1 {
            tracing::warn!(channel, file = %path.display(), "history that does not end at its stream's newest offset is dropped");
            stream.locs.clear();
            stream.first = stream.top + 1;
        }
    }
    // The mark beside the old file is the one beside the store now; a file without a mark
    // (written before marks) is not taken for a restore, as before.
    let old_mark = dir.join(REDB_RUN_FILE_NAME);
    if dir.disk().exists(&old_mark) {
        (dir.disk().rename(&old_mark, &dir.join(RUN_FILE_NAME))).map_err(directory)?;
    } else if run.is_none() {
        write_run_file(dir, 0).map_err(directory)?;
    }
    Ok(Checkpoint {
        head: Head {
            run: run.unwrap_or(0),
            boot: if unflushed { boot } else { boot_id(dir) },
            unflushed,
            applied,
            next_file: files.len() as FileId,
            files,
        },
        streams: streams.into_iter().collect(),
        chain: Default::default(),
    })
}

/// The packed files a migration writes, numbered from 0: each ends before what a 32-bit
/// position can say (`limit`), a new one begun when the next entry would pass it (one file
/// held everything, and past 4 GiB every position wrapped).
struct Packs<'d> {
    dir: &'d Dir,
    limit: u64,
    out: Appender,
    id: FileId,
    pos: u64,
    done: Vec<(FileId, Kind, u64)>,
}

impl<'d> Packs<'d> {
    fn start(dir: &'d Dir, limit: u64) -> std::io::Result<Self> {
        Ok(Self {
            dir,
            limit,
            out: Self::create(dir, 0)?,
            id: 0,
            pos: pack::MAGIC.len() as u64,
            done: Vec::new(),
        })
    }

    fn create(dir: &Dir, id: FileId) -> std::io::Result<Appender> {
        let mut out = Appender::new(dir.disk().create(&packed_path(dir, id))?);
        out.write_all(pack::MAGIC)?;
        Ok(out)
    }

    /// Writes `entry`: the file it is in, and where.
    fn put(&mut self, entry: &[u8]) -> std::io::Result<(FileId, Span)> {
        let fits = |pos: u64| pos + pack::FRAME_LEN + entry.len() as u64 <= self.limit;
        if !fits(self.pos) && self.pos > pack::MAGIC.len() as u64 {
            let next = Self::create(self.dir, self.id + 1)?;
            let full = std::mem::replace(&mut self.out, next);
            Self::close(full)?;
            self.done.push((self.id, Kind::Packed, self.pos));
            self.id += 1;
            self.pos = pack::MAGIC.len() as u64;
        }
        let too_large = || std::io::Error::other("a publication larger than a packed file");
        if !fits(self.pos) {
            return Err(too_large());
        }
        let span = pack::put(&mut self.out, self.pos, entry)?.ok_or_else(too_large)?;
        self.pos = u64::from(span.pos) + u64::from(span.len);
        Ok((self.id, span))
    }

    fn close(out: Appender) -> std::io::Result<()> {
        out.finish().map(drop)
    }

    /// Syncs the last file; every file written, with its size.
    fn finish(mut self) -> std::io::Result<Vec<(FileId, Kind, u64)>> {
        Self::close(self.out)?;
        self.done.push((self.id, Kind::Packed, self.pos));
        Ok(self.done)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use herald_protocol::Since;

    use super::*;
    use crate::conformance::Recorder;
    use crate::durable::{DurableBroker, SyncPolicy};
    use crate::{Broker, HistoryQuery, StreamPolicy};

    /// Writes what an earlier version left after a `kill -9`: streams and publications in
    /// `herald.redb` up to entry 4 of its log, and its log with entries 5 and 6 besides.
    fn old_directory(dir: &Path, run: u64) {
        // Times of now: older ones would be past the history's time to live.
        let t = super::super::now_ms() - 100;
        let db = redb::Database::create(dir.join(REDB_FILE_NAME)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut pubs = txn.open_table(PUBLICATIONS).unwrap();
            let mut streams = txn.open_table(STREAMS).unwrap();
            let mut state = txn.open_table(STATE).unwrap();
            for (channel, epoch, n) in [("chat:a", "ea", 3u64), ("chat:b", "eb", 1)] {
                for offset in 1..=n {
                    let data = format!("\"{channel} {offset}\"");
                    let crc = record_crc(channel, offset, t + offset, data.as_bytes());
                    pubs.insert((channel, offset), (t + offset, crc, data.as_bytes()))
                        .unwrap();
                }
                let crc = stream_crc(channel, epoch, n, t + n);
                streams.insert(channel, (epoch, n, t + n, crc)).unwrap();
            }
            state.insert("run", run).unwrap();
            state.insert("applied", 4).unwrap();
            state.insert("unflushed", 0).unwrap();
        }
        txn.commit().unwrap();
        std::fs::write(dir.join(REDB_RUN_FILE_NAME), format!("{run}\n")).unwrap();
        let mut bytes = wal::header(run, 1).to_vec();
        for (lsn, offset) in [(5u64, 4u64), (6, 5)] {
            let mut body = Vec::new();
            let data = format!("\"chat:a {offset}\"");
            wal::encode_publish(
                &mut body,
                "chat:a",
                "ea",
                offset,
                super::super::now_ms(),
                data.as_bytes(),
            );
            bytes.extend(wal::batch(lsn, 1, &body));
        }
        // Entries 1-4 of that log were deleted once applied: this segment starts at 5.
        let mut segment = wal::header(run, 5).to_vec();
        segment.extend_from_slice(&bytes[wal::HEADER_LEN..]);
        std::fs::write(wal::segment_path(dir, 5), segment).unwrap();
    }

    async fn read_all(broker: &DurableBroker, channel: &str) -> (String, Vec<Bytes>) {
        let h = broker
            .history(
                &ChannelName::new(channel).unwrap(),
                HistoryQuery {
                    since: Some(Since {
                        offset: 0,
                        epoch: None,
                    }),
                    limit: 100,
                    max_bytes: None,
                },
            )
            .await
            .unwrap();
        let records = h.publications.into_iter().map(|p| p.record).collect();
        (h.position.epoch.as_str().to_owned(), records)
    }

    #[tokio::test]
    async fn an_old_data_directory_is_moved_over_with_its_epochs_offsets_and_log() {
        let dir = tempfile::tempdir().unwrap();
        old_directory(dir.path(), 77);
        let open = || {
            DurableBroker::open(dir.path(), SyncPolicy::Group, Arc::new(Recorder::default()))
                .unwrap()
        };
        let broker = open();
        let a: Vec<Bytes> = (1..=5)
            .map(|o| Bytes::from(format!("\"chat:a {o}\"")))
            .collect();
        assert_eq!(read_all(&broker, "chat:a").await, ("ea".into(), a.clone()));
        assert_eq!(
            read_all(&broker, "chat:b").await,
            ("eb".into(), vec![Bytes::from("\"chat:b 1\"")])
        );
        let next = broker
            .publish(
                &ChannelName::new("chat:a").unwrap(),
                Bytes::from("6"),
                StreamPolicy::default(),
            )
            .await
            .unwrap();
        assert_eq!((next.offset, next.epoch.as_str()), (6, "ea"));
        drop(broker);
        assert!(!dir.path().join(REDB_FILE_NAME).exists());
        assert!(dir.path().join("herald.redb.migrated").exists());
        // From its own checkpoint now.
        let broker = open();
        let (epoch, records) = read_all(&broker, "chat:a").await;
        assert_eq!((epoch.as_str(), records.len()), ("ea", 6));
    }

    /// Issue #57 defect 4: a migration wrote every publication to `herald.pack.0`, and a
    /// position past 4 GiB wrapped (every read after it failed its check). Packs now end
    /// before their limit (4 GiB; 100 bytes here): each publication where its span says.
    #[test]
    fn a_migration_splits_packs_before_positions_wrap() {
        let dir = tempfile::tempdir().unwrap();
        old_directory(dir.path(), 9);
        let found = export(&Dir::os(dir.path()), &dir.path().join(REDB_FILE_NAME), 100).unwrap();
        assert!(found.head.files.len() >= 2, "{:?}", found.head.files);
        assert_eq!(found.head.next_file as usize, found.head.files.len());
        let mut read = 0;
        for (channel, stream) in &found.streams {
            for (i, loc) in stream.locs.iter().enumerate() {
                let (_, _, size) = found.head.files.iter().find(|f| f.0 == loc.file).unwrap();
                let end = u64::from(loc.span.pos) + u64::from(loc.span.len);
                assert!(end <= (*size).min(100), "{loc:?} in a file of {size}");
                let bytes = std::fs::read(packed_path(dir.path(), loc.file)).unwrap();
                let entry = &bytes[loc.span.pos as usize..end as usize];
                assert_eq!(crc32fast::hash(entry), loc.span.crc);
                let (c, _, offset, _, _) = wal::publication(entry).unwrap();
                assert_eq!((c, offset), (channel.as_str(), stream.first + i as u64));
                read += 1;
            }
        }
        assert_eq!(read, 4);
    }

    #[tokio::test]
    async fn a_damaged_old_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REDB_FILE_NAME), vec![0x42; 8192]).unwrap();
        let err = DurableBroker::open(dir.path(), SyncPolicy::Group, Arc::new(Recorder::default()))
            .unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains(REDB_FILE_NAME), "{err}");
    }
}
