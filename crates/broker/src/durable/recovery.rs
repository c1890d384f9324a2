//! Opening the store: the last checkpoint (or, the first time, the old database file, see
//! `migrate`), then the log entries after it, then what the store must answer with new
//! epochs: damage inside the log, a directory put back from a copy (a restore), and a run
//! that delivered publications before syncing them and stopped with the machine. Each means
//! history may have gone back while clients saw later offsets, so every stream starts a new
//! epoch rather than hand an offset out twice.

use std::{
    collections::HashSet,
    io,
    path::{Path, PathBuf},
};

use super::applier::Op;
use super::apply::apply;
use super::checkpoint::{self, Chain, Head};
use super::disk::Dir;
use super::index::{Index, Stream};
use super::store::{OpenError, RUN_FILE_NAME};
use super::{migrate, rebuild, wal};

/// What an open found: the index, the mark of this run, the next log entry's number, and
/// whether it moved an old database file over (so the caller can say so once the
/// checkpoint is written).
pub(super) struct Opened {
    pub(super) index: Index,
    pub(super) run: u64,
    pub(super) next_lsn: u64,
    pub(super) migrated: Option<PathBuf>,
    /// The checkpoint's files as this open left them.
    pub(super) chain: Chain,
}

pub(super) fn damaged(path: &Path, e: impl std::fmt::Display) -> OpenError {
    OpenError::Damaged {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// Opens the store in `dir` and writes its first checkpoint for this run (`unflushed`: the
/// run delivers publications before syncing them).
pub(super) fn open(dir: &Dir, unflushed: bool) -> Result<Opened, OpenError> {
    let directory = |source| OpenError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let (found, migrated, lost_index) = match checkpoint::read(dir) {
        Ok(Some(found)) => (Some(found), None, None),
        Ok(None) => match migrate::from_redb(dir)? {
            Some((found, old)) => (Some(found), Some(old), None),
            None if holds_data(dir).map_err(directory)? => {
                (None, None, Some("herald.index was missing and was rebuilt from the data files, which cannot say whether anything is lost"))
            }
            None => (None, None, None),
        },
        Err(why) => {
            // Kept for a look; the data files say what it said.
            let deltas = checkpoint::deltas(dir).map_err(directory)?;
            let files = deltas.into_iter().map(|(_, path)| path);
            for path in std::iter::once(dir.join(checkpoint::FILE_NAME)).chain(files) {
                let aside = PathBuf::from(format!("{}.damaged", path.display()));
                dir.disk().rename(&path, &aside).map_err(directory)?;
            }
            tracing::warn!(dir = %dir.display(), "{why}: the damaged index is set aside (its files renamed *.damaged)");
            (None, None, Some("herald.index was damaged and was rebuilt from the data files, which cannot say whether anything is lost"))
        }
    };
    let had_checkpoint = found.is_some();
    // A base on disk to write deltas after (a migration's checkpoint is in memory only).
    let chain = found
        .as_ref()
        .filter(|_| migrated.is_none())
        .map(|found| found.chain);
    let mut found = found.unwrap_or_default();
    let streams = std::mem::take(&mut found.streams);
    let head = &found.head;
    let (mut index, log_damaged) = match lost_index {
        Some(_) => {
            let started = std::time::Instant::now();
            let index = rebuild::rebuild(dir).map_err(directory)?;
            let (bytes, live) = index.footprint();
            tracing::warn!(
                channels = index.streams.len(),
                files = index.files.len(),
                bytes,
                live,
                ms = started.elapsed().as_millis() as u64,
                dir = %dir.display(),
                "the index was rebuilt from the data files"
            );
            (index, false)
        }
        None => {
            let mut index = load(dir, head, streams).map_err(directory)?;
            let lost = replay(&mut index, dir, had_checkpoint.then_some(head.run))?;
            (index, lost)
        }
    };
    if !had_checkpoint {
        set_aside_unindexed_packs(dir, &mut index).map_err(directory)?;
    }
    let renew = if lost_index.is_some() {
        lost_index
    } else if head.unflushed && (head.boot.is_none() || head.boot != boot_id(dir)) {
        Some("the last run delivered publications before syncing them (sync = \"group\", \"interval\" or \"none\") and stopped with the machine, so its latest ones may be lost")
    } else if sync_failed(dir) {
        Some("a sync of the log failed in an earlier run: the disk may have dropped what it was to write, though later syncs worked")
    } else if log_damaged {
        Some("the write-ahead log is damaged: entries in it may be lost")
    } else if had_checkpoint && restored(dir, head.run) {
        Some("the data directory is older than the one this server last used (restored from a backup or a snapshot)")
    } else {
        None
    };
    if let Some(why) = renew {
        let renewed = index.renew_epochs();
        tracing::warn!(
            channels = renewed,
            dir = %dir.display(),
            "{why}: every channel starts a new epoch, keeping its history (resuming clients get recovered: false)"
        );
    }
    // The mark goes into the checkpoint first: a crash before the copy beside it is written
    // looks like a restore next time, which costs a new epoch, never a reused offset.
    let run = fastrand::u64(..);
    let head = checkpoint::head_of(&index, run, boot_id(dir), unflushed);
    let chain = match chain {
        // What the replay (and any answer to damage) changed.
        Some(chain) => {
            let seq = chain.seq + 1;
            let journal = index.journal.take().unwrap_or_default();
            let bytes = checkpoint::delta(Vec::new(), seq, &head, &journal);
            checkpoint::write_delta(dir, seq, &bytes).map_err(directory)?;
            Chain {
                seq,
                delta_bytes: chain.delta_bytes + bytes.len() as u64,
                ..chain
            }
        }
        // Numbered past any delta left of another base (one set aside as damaged).
        None => {
            let deltas = checkpoint::deltas(dir).map_err(directory)?;
            let seq = deltas.last().map_or(0, |(n, _)| *n) + 1;
            let bytes = checkpoint::base(seq, &head, &index.streams);
            checkpoint::write_base(dir, seq, &bytes).map_err(directory)?;
            Chain {
                base_seq: seq,
                base_bytes: bytes.len() as u64,
                seq,
                delta_bytes: 0,
            }
        }
    };
    // Noted from now on, for the applier's checkpoints.
    index.journal = Some(Vec::new());
    write_run_file(dir, run).map_err(directory)?;
    // Answered by the checkpoint just written (every epoch renewed in it).
    clear_sync_failed(dir).map_err(directory)?;
    // Only now that the checkpoint holds the new epochs: set aside first, a crash (or a
    // full disk) before the checkpoint left no damage for the next open to see, and the
    // lost offsets were handed out again in their epochs.
    set_aside_unreplayed(dir, index.applied).map_err(directory)?;
    remove_unused(dir, &index).map_err(directory)?;
    checkpoint::remove_deltas(dir, chain.base_seq).map_err(directory)?;
    let next_lsn = index.applied + 1;
    Ok(Opened {
        index,
        run,
        next_lsn,
        migrated,
        chain,
    })
}

/// The index a checkpoint describes, its files opened. Streams that point into a file
/// that is gone lose what they kept, as damaged.
fn load(dir: &Dir, head: &Head, streams: Vec<(String, Stream)>) -> io::Result<Index> {
    let mut index = Index::default();
    index.next_file = head.next_file;
    index.applied = head.applied;
    let mut missing = HashSet::new();
    for &(id, kind, size) in &head.files {
        match dir.disk().open(&kind.path(dir, id)) {
            Ok(file) => index.add_file(id, kind, file, size),
            Err(e) if e.kind() == io::ErrorKind::NotFound => drop(missing.insert(id)),
            Err(e) => return Err(e),
        }
    }
    // Moved, not copied: at 10 million kept publications a copy held 240 MB more, which
    // the allocator kept after the checkpoint was dropped.
    index.streams.reserve(streams.len());
    let mut hit: Vec<String> = Vec::new();
    for (channel, stream) in streams {
        if stream.locs.iter().any(|l| missing.contains(&l.file)) {
            hit.push(channel.clone());
        }
        index.streams.insert(channel, stream);
    }
    index.count_live();
    // What the open changes from here on (damage dropped, the log replayed, new epochs)
    // goes into its checkpoint, a delta.
    index.journal = Some(Vec::new());
    for channel in hit {
        tracing::warn!(channel, dir = %dir.display(), "a file of this channel's history is missing; its history is dropped and it starts a new epoch (resuming clients get recovered: false)");
        index.drop_damaged(&channel);
    }
    Ok(index)
}

/// Applies the log entries after the index's, from the segments `run` wrote; whether
/// entries were lost inside the log (damaged bytes, a missing segment), which the caller
/// answers with new epochs. Segments of another run belong to another copy of the store
/// (this one was restored from a backup) and are ignored: the restore check gives every
/// stream a new epoch then.
fn replay(index: &mut Index, dir: &Dir, run: Option<u64>) -> Result<bool, OpenError> {
    let directory = |source| OpenError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let mut expected = index.applied + 1;
    let segments = wal::segments(dir).map_err(directory)?;
    // Segments wholly before the index's last entry hold nothing to replay.
    let start = segments
        .iter()
        .rposition(|(first, _)| *first <= expected)
        .unwrap_or(0);
    let mut lost = false;
    let mut replayed = 0usize;
    'segments: for (_, segment) in segments.get(start..).unwrap_or_default() {
        let bytes = dir.disk().read(segment).map_err(directory)?;
        let scan = wal::scan(&bytes);
        // Damage among entries the index holds already costs nothing here: a read that
        // reaches a damaged publication resets its channel.
        lost |= scan.lost.iter().any(|(_, to)| *to > expected);
        if run.is_some_and(|r| r != scan.run) {
            if !scan.damaged() {
                tracing::warn!(file = %segment.display(), "a log segment of another copy of the store is ignored");
            }
            continue;
        }
        let mut ops = Vec::new();
        for ((lsn, entry), span) in scan.entries.into_iter().zip(scan.spans) {
            if lsn < expected {
                continue;
            }
            let op = (lsn == expected)
                .then(|| Op::replayed(lsn, entry, (scan.first_lsn, span)))
                .flatten();
            let Some(op) = op else {
                // A gap, or an entry naming no valid stream: what follows cannot be trusted
                // to continue what the index holds.
                lost = true;
                apply_replayed(index, dir, &ops)?;
                break 'segments;
            };
            ops.push(op);
            expected += 1;
        }
        replayed += ops.len();
        apply_replayed(index, dir, &ops)?;
        // The checkpoint this open writes will point into it: what the last run wrote may
        // be in the page cache only (it was killed, not the machine), and a power cut
        // after that checkpoint would take it back (issue #57 defect 5).
        let file = (index.log_file(scan.first_lsn)).and_then(|id| index.files.get(&id));
        if let Some(f) = file.filter(|_| !ops.is_empty()) {
            f.file.sync_data().map_err(directory)?;
        }
    }
    if replayed > 0 {
        tracing::info!(entries = replayed, dir = %dir.display(), "replayed the write-ahead log after the last checkpoint");
    }
    Ok(lost)
}

/// Without a checkpoint the index is rebuilt from the log alone, and a packed file cannot
/// be read back without one (its entries have no framing of their own): such files are
/// renamed `herald.pack.N.unindexed`, never deleted (putting the checkpoint back, with
/// them, brings their history back), and new files never take their numbers.
fn set_aside_unindexed_packs(dir: &Dir, index: &mut Index) -> io::Result<()> {
    let mut moved = Vec::new();
    for path in dir.list()? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(rest) = name.strip_prefix("herald.pack.") else {
            continue;
        };
        let (number, aside) = match rest.strip_suffix(".unindexed") {
            Some(number) => (number, true),
            None => (rest, false),
        };
        let Ok(id) = number.parse::<u32>() else {
            continue;
        };
        index.next_file = index.next_file.max(id + 1);
        if !aside && !index.files.contains_key(&id) {
            let to = dir.join(format!("{name}.unindexed"));
            dir.disk().rename(&path, &to)?;
            moved.push(to.display().to_string());
        }
    }
    if !moved.is_empty() {
        dir.sync()?;
        tracing::warn!(files = ?moved, dir = %dir.display(), "without herald.index, packed history cannot be read: its files are set aside, not deleted (stop Herald and put the index back, with them renamed back, to read it again)");
    }
    Ok(())
}

/// Whether the directory holds a log segment with entries, or a packed file: without an
/// index, its history must be rebuilt.
fn holds_data(dir: &Dir) -> io::Result<bool> {
    for (_, path) in wal::segments(dir)? {
        if !wal::scan(&dir.disk().read(&path)?).entries.is_empty() {
            return Ok(true);
        }
    }
    Ok(dir.list()?.iter().any(|p| {
        (p.file_name().and_then(|n| n.to_str())).is_some_and(|n| n.starts_with("herald.pack."))
    }))
}

/// The file whose presence says a sync of the log failed since the last open.
const SYNC_FAILED_FILE: &str = "herald.sync-failed";

/// Marks, durably, that a sync of the log failed in this run: the next open gives every
/// channel a new epoch (see `Log::sync_failed` for why a later sync is no proof).
pub(super) fn mark_sync_failed(dir: &Dir) -> io::Result<()> {
    let path = dir.join(SYNC_FAILED_FILE);
    dir.write_synced(&path, b"a sync of the log failed in this run\n")?;
    dir.sync()
}

fn sync_failed(dir: &Dir) -> bool {
    dir.disk().exists(&dir.join(SYNC_FAILED_FILE))
}

fn clear_sync_failed(dir: &Dir) -> io::Result<()> {
    match dir.disk().remove(&dir.join(SYNC_FAILED_FILE)) {
        Ok(()) => dir.sync(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes away the log segments wholly after what the index holds once replayed. A replay
/// that stopped early (damage, a gap) could not apply them, and what they held is answered
/// with new epochs; left in place, they would sit in the range this run numbers its entries
/// in, where a later replay could start at one, skip it as another run's, and never read
/// this run's. Segments with entries are renamed `herald.stale.N` (nothing reads them
/// again; kept for a look), empty ones (a rotation just before a stop) deleted.
fn set_aside_unreplayed(dir: &Dir, applied: u64) -> io::Result<()> {
    let mut moved = Vec::new();
    for (first_lsn, path) in wal::segments(dir)? {
        if first_lsn <= applied {
            continue;
        }
        let scan = wal::scan(&dir.disk().read(&path)?);
        if scan.entries.is_empty() && !scan.damaged() {
            dir.disk().remove(&path)?;
            continue;
        }
        let aside = dir.join(format!("herald.stale.{first_lsn}"));
        dir.disk().rename(&path, &aside)?;
        moved.push(aside.display().to_string());
    }
    dir.sync()?;
    if !moved.is_empty() {
        tracing::warn!(files = ?moved, dir = %dir.display(), "log segments the replay could not reach (after damage or a gap) are set aside; what they hold is lost, and their channels start new epochs");
    }
    Ok(())
}

fn apply_replayed(index: &mut Index, dir: &Dir, ops: &[Op]) -> Result<(), OpenError> {
    apply(index, dir, ops).map_err(|source| OpenError::Directory {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// Deletes what the index does not need, once its checkpoint is written: log segments
/// whose entries it holds and points nowhere into, files of packed publications it does
/// not know (a compaction cut short), a segment or a checkpoint's unfinished copy.
fn remove_unused(dir: &Dir, index: &Index) -> io::Result<()> {
    for (first_lsn, path) in wal::segments(dir)? {
        if index.log_file(first_lsn).is_none() && first_lsn <= index.applied {
            dir.disk().remove(&path)?;
        }
    }
    for path in dir.list()? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let unknown_pack = name
            .strip_prefix("herald.pack.")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|id| !index.files.contains_key(&id));
        let unfinished_segment =
            name.starts_with("herald.wal.") && name.ends_with(super::segment::UNFINISHED);
        let unfinished_checkpoint =
            name.starts_with(checkpoint::FILE_NAME) && name.ends_with(".tmp");
        if unknown_pack || unfinished_segment || unfinished_checkpoint {
            dir.disk().remove(&path)?;
        }
    }
    Ok(())
}

/// Whether the directory was put back from a copy: the checkpoint's mark is not the one
/// beside it (a whole directory restored from a snapshot, its mark removed as the
/// deployment guide says).
fn restored(dir: &Dir, run: u64) -> bool {
    let beside = dir
        .disk()
        .read(&dir.join(RUN_FILE_NAME))
        .ok()
        .and_then(|t| String::from_utf8(t).ok()?.trim().parse::<u64>().ok());
    beside != Some(run)
}

/// Writes `run` beside the store, replacing the old mark in one step.
pub(super) fn write_run_file(dir: &Dir, run: u64) -> io::Result<()> {
    dir.replace(RUN_FILE_NAME, format!("{run}\n").as_bytes())
}

/// This boot of the machine, as a number (Linux's `boot_id`); `None` where it is unknown.
pub(super) fn boot_id(dir: &Dir) -> Option<u64> {
    let id = dir.disk().boot_id()?;
    let id = id.trim();
    (!id.is_empty()).then(|| {
        // FNV-1a: a stable hash (std's is seeded per process).
        id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}
