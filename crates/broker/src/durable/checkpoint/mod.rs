//! The index on disk, so that an open reads it and only the log entries after it instead
//! of every file. A **base**, `herald.index`, holds the whole index as of a number `seq`;
//! **deltas**, `herald.index.N` for N = seq + 1, seq + 2, ..., each hold what changed
//! since the one before: the index's changes in order, as it noted them (`index::Change`:
//! a publication appended, a stream trimmed, reset, forgotten, moved, given a new
//! epoch). A checkpoint is a delta, so writing one costs what changed, not what is kept
//! (at 10 million kept publications the whole index was 240 MB, rewritten while the
//! applier waited, issue #57). When the deltas grow past a quarter of the base (or are
//! many), a thread of its own merges them into a new base, reading and writing a record
//! at a time (`merge`); the applier goes on meanwhile.
//!
//! Every file carries what the store must know about the run that wrote it: its mark (a
//! restore puts back an older checkpoint, whose mark no longer matches the one beside it),
//! and whether that run delivered publications before syncing them, on which boot of the
//! machine (see `recovery`). Each is written to a temporary file, synced, and renamed, so
//! an open finds it whole or not at all; a delta missing from the run of numbers, or one
//! that cannot be read, makes the whole checkpoint unreadable (then the index is rebuilt
//! from the data files).

mod fold;
mod format;
mod merge;

use std::{collections::HashMap, io};

use fold::Fold;
use format::{Part, Sink};
pub(crate) use merge::merge;
#[cfg(test)]
pub(crate) use merge::MERGED;

use super::disk::Dir;
use super::index::{Change, FileId, Index, Kind, Stream};

/// The base's file name inside the data directory; deltas add `.N`.
pub const FILE_NAME: &str = "herald.index";

/// What a checkpoint holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) head: Head,
    pub(crate) streams: Vec<(String, Stream)>,
    pub(crate) chain: Chain,
}

/// A checkpoint but its streams: what the store knows of the run that wrote it, and its
/// files.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) run: u64,
    pub(crate) boot: Option<u64>,
    /// The run delivered publications before syncing them and had not stopped cleanly.
    pub(crate) unflushed: bool,
    /// The last log entry the streams hold.
    pub(crate) applied: u64,
    pub(crate) next_file: FileId,
    /// Every file the streams point into: id, kind, size.
    pub(crate) files: Vec<(FileId, Kind, u64)>,
}

/// The files a checkpoint is read from: the base's number and size, and the deltas after
/// it (the newest's number, and their bytes).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) base_seq: u64,
    pub(crate) base_bytes: u64,
    pub(crate) seq: u64,
    pub(crate) delta_bytes: u64,
}

/// Bytes of deltas below which they are never merged, and how many there are at most.
#[cfg(not(test))]
const MERGE_LIMITS: (u64, u64) = (1 << 20, 64);
/// Small in tests, so that the crash tests merge often.
#[cfg(test)]
const MERGE_LIMITS: (u64, u64) = (2 << 10, 4);

impl Chain {
    /// Whether the deltas are worth merging into a new base: past a quarter of it (an open
    /// reads them all), or many.
    pub(crate) fn wants_merge(&self) -> bool {
        let (bytes, count) = MERGE_LIMITS;
        self.delta_bytes > (self.base_bytes / 4).max(bytes) || self.seq - self.base_seq >= count
    }
}

/// The delta numbered `seq`.
pub(crate) fn delta_name(seq: u64) -> String {
    format!("{FILE_NAME}.{seq:010}")
}

/// The deltas in the directory, by number.
pub(crate) fn deltas(dir: &Dir) -> io::Result<Vec<(u64, std::path::PathBuf)>> {
    let mut found: Vec<_> = dir
        .list()?
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let n = name.strip_prefix(FILE_NAME)?.strip_prefix('.')?;
            let seq = n
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| n.parse().ok())??;
            Some((seq, path))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The head of `index` as a checkpoint says it.
pub(crate) fn head_of(index: &Index, run: u64, boot: Option<u64>, unflushed: bool) -> Head {
    Head {
        run,
        boot,
        unflushed,
        applied: index.applied,
        next_file: index.next_file,
        files: (index.files.iter())
            .map(|(id, f)| (*id, f.kind, f.size))
            .collect(),
    }
}

/// The bytes of a delta numbered `seq`: the index's changes since the last checkpoint, in
/// order. Written into `out` (emptied first), which the checkpoint thread keeps from one
/// checkpoint to the next.
pub(crate) fn delta(
    mut out: Vec<u8>,
    seq: u64,
    head: &Head,
    journal: &[(String, Change)],
) -> Vec<u8> {
    out.clear();
    let mut sink = Sink::start(out, Part::Delta, seq, head).expect("writes to memory");
    for (channel, change) in journal {
        sink.change(channel, change).expect("writes to memory");
    }
    sink.finish().expect("writes to memory").0
}

/// The bytes of a base numbered `seq`: every stream, whole.
pub(crate) fn base<'s>(
    seq: u64,
    head: &Head,
    streams: impl IntoIterator<Item = (&'s String, &'s Stream)>,
) -> Vec<u8> {
    let mut sink = Sink::start(Vec::new(), Part::Base, seq, head).expect("writes to memory");
    for (channel, s) in streams {
        sink.stream(channel, s).expect("writes to memory");
    }
    sink.finish().expect("writes to memory").0
}

/// Writes a base numbered `seq`, then deletes the deltas it makes old.
pub(crate) fn write_base(dir: &Dir, seq: u64, bytes: &[u8]) -> io::Result<()> {
    dir.replace(FILE_NAME, bytes)?;
    remove_deltas(dir, seq)
}

/// Writes the delta numbered `seq`.
pub(crate) fn write_delta(dir: &Dir, seq: u64, bytes: &[u8]) -> io::Result<()> {
    dir.replace(&delta_name(seq), bytes)
}

/// Deletes the deltas numbered up to `seq` (a base holds them).
pub(crate) fn remove_deltas(dir: &Dir, seq: u64) -> io::Result<()> {
    let mut removed = false;
    for (n, path) in deltas(dir)? {
        if n <= seq {
            dir.disk().remove(&path)?;
            removed = true;
        }
    }
    if removed {
        dir.sync()?;
    }
    Ok(())
}

/// The directory's checkpoint, its base and deltas applied: `Ok(None)` if it has no base,
/// `Err` with why if what it has cannot be read.
pub(crate) fn read(dir: &Dir) -> Result<Option<Checkpoint>, String> {
    let why = |e: io::Error| format!("the checkpoint cannot be read: {e}");
    let Some(fold) = Fold::open(dir, None).map_err(why)? else {
        return Ok(None);
    };
    let (head, chain) = (fold.head.clone(), fold.chain);
    let mut streams = Vec::new();
    fold.streams(|channel, stream| {
        streams.push((channel, stream));
        Ok(())
    })
    .map_err(why)?;
    check_files(&head, &streams)?;
    Ok(Some(Checkpoint {
        head,
        streams,
        chain,
    }))
}

/// Every kept publication lies in a file the head lists, within it.
fn check_files(head: &Head, streams: &[(String, Stream)]) -> Result<(), String> {
    let sizes: HashMap<u32, u64> = head
        .files
        .iter()
        .map(|(id, _, size)| (*id, *size))
        .collect();
    for (channel, s) in streams {
        for l in &s.locs {
            let end = u64::from(l.span.pos) + u64::from(l.span.len);
            if sizes.get(&l.file).is_none_or(|size| end > *size) {
                return Err(format!(
                    "the checkpoint places a publication of {channel} outside its files"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
