//! What opening the file checks before anything is served from it: damaged records, a
//! file put back from a copy (a restore), and a `sync = "none"` run that stopped uncleanly.
//! Each one that history may have gone back for gives streams a new epoch, so that no
//! offset is handed out twice within an epoch.

use std::{collections::HashMap, path::Path};

use herald_protocol::{ChannelName, Epoch};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::store::{
    record_crc, stream_crc, OpenError, Streams, PUBLICATIONS, RUN, RUN_FILE_NAME, STATE, STREAMS,
    UNFLUSHED,
};
use super::Meta;
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

/// Reads every stream and publication and checks it. A channel with any record that fails
/// its checksum (or lies outside its stream) is reset: its history is deleted and it gets a
/// new epoch, so clients resuming in it are told `recovered: false` instead of being served
/// damaged data. A file that cannot be read at all is refused.
///
/// With `distrust_all` (a `sync = "none"` run stopped uncleanly), every channel is reset so.
pub(super) fn verify(db: &Database, path: &Path, distrust_all: bool) -> Result<Streams, OpenError> {
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
                    if distrust_all || !valid || crc != stream_crc(&channel, epoch, top, last) {
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
                if !distrust_all {
                    tracing::warn!(
                        channel = ch,
                        file = %path.display(),
                        "damaged history dropped; the channel starts a new epoch (resuming clients get recovered: false)"
                    );
                }
            }
        }
        write.commit().map_err(|e| damaged(path, e))?;
        if distrust_all {
            tracing::warn!(
                channels = bad.len(),
                file = %path.display(),
                "the last run used sync = \"none\" and did not stop cleanly, so its latest publications are lost: every channel starts a new epoch (resuming clients get recovered: false)"
            );
        }
    }
    Ok(metas
        .into_iter()
        .filter_map(|(c, m)| Some((ChannelName::stored(&c).ok()?, m)))
        .collect())
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

/// Whether [`UNFLUSHED`] is set.
pub(super) fn unflushed(db: &Database) -> Result<bool, redb::Error> {
    let read = db.begin_read()?;
    match read.open_table(STATE) {
        Ok(table) => Ok(table.get(UNFLUSHED)?.is_some_and(|v| v.value() == 1)),
        Err(TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sets or clears [`UNFLUSHED`] in a durable commit (which also makes every earlier
/// commit durable), with this open's [`RUN`] mark when given.
pub(super) fn set_unflushed(db: &Database, on: bool, run: Option<u64>) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut state = txn.open_table(STATE)?;
        state.insert(UNFLUSHED, u64::from(on))?;
        if let Some(run) = run {
            state.insert(RUN, run)?;
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
