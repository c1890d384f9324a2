//! What opening the file checks before anything is served from it: damaged records, a
//! file put back from a copy (a restore), and a `sync = "none"` run that stopped uncleanly.
//! Each one that history may have gone back for gives streams a new epoch, so that no
//! offset is handed out twice within an epoch.

use std::{collections::HashMap, path::Path};

use herald_protocol::{ChannelName, Epoch};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::applier::Op;
use super::apply::apply;
use super::store::{
    record_crc, stream_crc, OpenError, Streams, APPLIED, BOOT, PUBLICATIONS, RUN, RUN_FILE_NAME,
    STATE, STREAMS, UNFLUSHED,
};
use super::{wal, Meta};
use crate::StreamPolicy;

/// Runs `open` with its panics turned into [`OpenError::Damaged`]: redb decodes keys and
/// values with `unwrap` (a string that is not UTF-8, a value of the wrong length), so a
/// damaged file could otherwise panic at start instead of naming the file.
pub(super) fn contained<T>(
    path: &Path,
    open: impl FnOnce() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open))
        .unwrap_or_else(|_| Err(damaged(path, "a record cannot be decoded")))
}

pub(super) fn damaged(path: &Path, e: impl std::fmt::Display) -> OpenError {
    OpenError::Damaged {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Reads every stream and (with `records`) every publication, and checks it. A channel with
/// any record that fails its checksum (or lies outside its stream) is reset: its history is
/// deleted and it gets a new epoch, so clients resuming in it are told `recovered: false`
/// instead of being served damaged data. A file that cannot be read at all is refused.
pub(super) fn verify(db: &Database, path: &Path, records: bool) -> Result<Streams, OpenError> {
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
                    let valid =
                        ChannelName::stored(&channel).is_ok() && Epoch::checked(epoch).is_some();
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
            Ok(table) if records => {
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
            Ok(_) | Err(TableError::TableDoesNotExist(_)) => {}
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
        .filter_map(|(c, m)| Some((ChannelName::stored(&c).ok()?, m)))
        .collect())
}

/// Writes into the file (durably) the log entries it does not hold yet, from the segments
/// this file's run wrote; whether entries were lost inside the log (damaged bytes, a
/// missing segment), which the caller answers with new epochs. Segments of another run
/// belong to another copy of the file (this one was restored from a backup) and are
/// ignored: the restore check gives every stream a new epoch then.
pub(super) fn replay(db: &Database, dir: &Path, path: &Path) -> Result<bool, OpenError> {
    let directory = |source| OpenError::Directory {
        path: dir.to_owned(),
        source,
    };
    let run = file_run(db).map_err(|e| damaged(path, e))?;
    let mut expected = applied(db).map_err(|e| damaged(path, e))? + 1;
    let mut lost = false;
    let mut ops = Vec::new();
    'segments: for (_, segment) in wal::segments(dir).map_err(directory)? {
        let bytes = std::fs::read(&segment).map_err(directory)?;
        let scan = wal::scan(&bytes);
        lost |= scan.damaged;
        if Some(scan.run) != run {
            if !scan.damaged {
                tracing::warn!(file = %segment.display(), "a log segment of another copy of the data file is ignored");
            }
            continue;
        }
        for (lsn, entry) in scan.entries {
            if lsn < expected {
                continue;
            }
            let op = (lsn == expected)
                .then(|| Op::replayed(lsn, entry))
                .flatten();
            let Some(op) = op else {
                // A gap, or an entry naming no valid stream: what follows cannot be trusted
                // to continue what the file holds.
                lost = true;
                break 'segments;
            };
            ops.push(op);
            expected += 1;
        }
    }
    for chunk in ops.chunks(50_000) {
        apply(db, chunk).map_err(|e| damaged(path, e))?;
    }
    if !ops.is_empty() {
        tracing::info!(entries = ops.len(), dir = %dir.display(), "replayed the write-ahead log into the data file");
    }
    Ok(lost)
}

/// The last log entry the file holds ([`APPLIED`]; 0 for none).
pub(super) fn applied(db: &Database) -> Result<u64, redb::Error> {
    let read = db.begin_read()?;
    match read.open_table(STATE) {
        Ok(table) => Ok(table.get(APPLIED)?.map_or(0, |v| v.value())),
        Err(TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The [`RUN`] mark the file carries, if any (files written before marks carry none).
pub(super) fn file_run(db: &Database) -> Result<Option<u64>, redb::Error> {
    let read = db.begin_read()?;
    match read.open_table(STATE) {
        Ok(table) => Ok(table.get(RUN)?.map(|v| v.value())),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the file was put back from a copy: it carries a mark, and the directory's is
/// another one or none (a whole directory restored from a snapshot, its mark removed as
/// the deployment guide says).
pub(super) fn restored(db: &Database, dir: &Path) -> Result<bool, redb::Error> {
    let Some(in_file) = file_run(db)? else {
        return Ok(false);
    };
    let beside = std::fs::read_to_string(dir.join(RUN_FILE_NAME))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    Ok(beside != Some(in_file))
}

/// Writes `run` beside the file, replacing the old mark in one step.
pub(super) fn write_run_file(dir: &Path, run: u64) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{RUN_FILE_NAME}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{run}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(RUN_FILE_NAME))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Gives every stream whose record checks a new epoch, keeping its offsets and history: a
/// client that resumes with a position of the old epoch is told `recovered: false`. Records
/// that fail their checksum are left for [`verify`] to drop.
pub(super) fn renew_epochs(db: &Database, path: &Path) -> Result<usize, OpenError> {
    let write = db.begin_write().map_err(|e| damaged(path, e))?;
    let mut renewed = 0;
    {
        let mut streams = write.open_table(STREAMS).map_err(|e| damaged(path, e))?;
        let mut rows = Vec::new();
        for entry in streams.iter().map_err(|e| damaged(path, e))? {
            let (k, v) = entry.map_err(|e| damaged(path, e))?;
            let (epoch, top, last, crc) = v.value();
            let channel = k.value().to_string();
            if crc == stream_crc(&channel, epoch, top, last) {
                rows.push((channel, top, last));
            }
        }
        for (channel, top, last) in rows {
            let epoch = Epoch::random(|| fastrand::u64(..));
            let crc = stream_crc(&channel, epoch.as_str(), top, last);
            streams
                .insert(channel.as_str(), (epoch.as_str(), top, last, crc))
                .map_err(|e| damaged(path, e))?;
            renewed += 1;
        }
    }
    write.commit().map_err(|e| damaged(path, e))?;
    Ok(renewed)
}

/// Whether the last run delivered publications before syncing them ([`UNFLUSHED`]) and
/// did not stop cleanly, on a machine that has restarted since (or whose restarts cannot be
/// told): then what it delivered last may be lost. A process that was killed on a
/// machine still running lost nothing it wrote: the operating system keeps it.
pub(super) fn unflushed(db: &Database) -> Result<bool, redb::Error> {
    let read = db.begin_read()?;
    let table = match read.open_table(STATE) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if table.get(UNFLUSHED)?.is_none_or(|v| v.value() != 1) {
        return Ok(false);
    }
    let boot = table.get(BOOT)?.map(|v| v.value());
    Ok(boot.is_none() || boot != boot_id())
}

/// This boot of the machine, as a number (Linux's `boot_id`); `None` where it is unknown.
pub(super) fn boot_id() -> Option<u64> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| {
        // FNV-1a: a stable hash (std's is seeded per process).
        id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}

/// Sets or clears [`UNFLUSHED`] in a durable commit (which also makes every earlier
/// commit durable), with this open's [`RUN`] mark when given, and this boot's id.
pub(super) fn set_unflushed(db: &Database, on: bool, run: Option<u64>) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut state = txn.open_table(STATE)?;
        state.insert(UNFLUSHED, u64::from(on))?;
        if let Some(run) = run {
            state.insert(RUN, run)?;
        }
        match boot_id() {
            Some(boot) => drop(state.insert(BOOT, boot)?),
            None => drop(state.remove(BOOT)?),
        }
    }
    txn.commit()?;
    Ok(())
}

/// Writes and deletes a record of 64 KiB: a file that takes it can take publications again.
pub(super) fn probe(db: &Database) -> Result<(), redb::Error> {
    const PROBE: TableDefinition<&str, &[u8]> = TableDefinition::new("probe");
    for value in [Some(vec![0u8; 64 * 1024]), None] {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(PROBE)?;
            match &value {
                Some(v) => drop(table.insert("probe", &v[..])?),
                None => drop(table.remove("probe")?),
            }
        }
        txn.commit()?;
    }
    Ok(())
}
