//! Where history lies: for every stream, its epoch and top, and for each publication it
//! keeps, the file and span of its log entry (with the entry's CRC) and when it was
//! published. The log's segments are the store: a publication is written once, to the
//! log, and read back from there; this index, in memory, says where. It costs 24 bytes a
//! kept publication. It is written whole to a checkpoint now and then (see `checkpoint`),
//! and rebuilt at open from the last checkpoint and the log entries after it.
//!
//! Files hold dead bytes once what they hold is trimmed, reset or forgotten: each file's
//! live bytes are counted here, so compaction knows which files are worth rewriting.
//!
//! Every change to a stream is also noted, as a [`Change`], in a journal the next
//! checkpoint writes as a delta: a checkpoint then costs what changed, written in order,
//! not a visit to every stream touched (20,000 of them took 9 ms of cache misses).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
};

use herald_protocol::Epoch;

use super::disk::Handle;
use super::wal::{self, Span};

/// A file of the store, numbered in the index.
pub(crate) type FileId = u32;

/// Where a kept publication's entry lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) file: FileId,
    pub(crate) span: Span,
    /// When it was published, in ms since the Unix epoch (for trims by age).
    pub(crate) at_ms: u64,
}

/// A stream as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stream {
    pub(crate) epoch: Epoch,
    /// The newest offset written.
    pub(crate) top: u64,
    /// When it was last published to (or reset).
    pub(crate) last_ms: u64,
    /// The offset of `locs[0]`.
    pub(crate) first: u64,
    /// The kept publications, oldest first, at consecutive offsets.
    pub(crate) locs: VecDeque<Loc>,
}

impl Stream {
    pub(crate) fn new(epoch: Epoch, top: u64, last_ms: u64) -> Self {
        Self {
            epoch,
            top,
            last_ms,
            first: top + 1,
            locs: VecDeque::new(),
        }
    }

    /// The kept publication at `offset`.
    pub(crate) fn at(&self, offset: u64) -> Option<&Loc> {
        self.locs
            .get(usize::try_from(offset.checked_sub(self.first)?).ok()?)
    }

    /// Takes its oldest kept publications off while `gone(kept, oldest)` says so (`kept`:
    /// how many it keeps at that point); what it took off.
    fn drop_oldest(&mut self, gone: impl Fn(usize, &Loc) -> bool) -> Vec<Loc> {
        let mut dropped = Vec::new();
        while self.locs.front().is_some_and(|l| gone(self.locs.len(), l)) {
            dropped.extend(self.locs.pop_front());
            self.first += 1;
        }
        dropped
    }
}

/// A change to a stream, as a checkpoint's delta records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The stream as it is now (begun again, reset or dropped as damaged). Boxed: the
    /// other changes are a third of its size, and an open holds a million of them.
    Whole(Box<Stream>),
    Forget,
    /// A publication at the offset after its newest.
    Append(u64, Loc),
    /// Its oldest kept publication is now the one at this offset (trimmed to it).
    First(u64),
    /// The kept publication at an offset was copied to a new place.
    Move(u64, Loc),
    /// A new epoch, history and offsets kept.
    Epoch(Epoch),
}

impl Change {
    /// Applies the change to what the stream was (`None`: unknown or forgotten); `Err` if
    /// it does not follow from that state (then the checkpoint's files disagree: damage).
    pub(crate) fn apply(self, slot: &mut Option<Stream>) -> Result<(), &'static str> {
        let stream = match self {
            Change::Whole(stream) => {
                *slot = Some(*stream);
                return Ok(());
            }
            Change::Forget => {
                *slot = None;
                return Ok(());
            }
            _ => slot.as_mut().ok_or("a change to an unknown stream")?,
        };
        let end = stream.first + stream.locs.len() as u64;
        match self {
            Change::Append(offset, loc) if offset == end => {
                stream.locs.push_back(loc);
                stream.top = offset;
                stream.last_ms = loc.at_ms;
            }
            Change::First(first) if (stream.first..=end).contains(&first) => {
                stream.locs.drain(..(first - stream.first) as usize);
                stream.first = first;
            }
            Change::Move(offset, loc) if (stream.first..end).contains(&offset) => {
                stream.locs[(offset - stream.first) as usize] = loc;
            }
            Change::Epoch(epoch) => stream.epoch = epoch,
            _ => return Err("a change to publications the stream does not keep"),
        }
        Ok(())
    }
}

/// What a file of the store is, which names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A segment of the write-ahead log, named by its first entry's number.
    Log { first_lsn: u64 },
    /// Publications rewritten by compaction (or a migration), named by its id.
    Packed,
}

impl Kind {
    pub(crate) fn path(self, dir: &Path, id: FileId) -> PathBuf {
        match self {
            Kind::Log { first_lsn } => wal::segment_path(dir, first_lsn),
            Kind::Packed => packed_path(dir, id),
        }
    }
}

/// The file of packed publications numbered `id`.
pub(crate) fn packed_path(dir: &Path, id: FileId) -> PathBuf {
    dir.join(format!("herald.pack.{id:010}"))
}

/// A file of the store.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) kind: Kind,
    pub(crate) file: Handle,
    /// Bytes it holds (for the file being appended to: as far as the index has seen).
    pub(crate) size: u64,
    /// Bytes of entries it holds that the index still points to.
    pub(crate) live: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) streams: HashMap<String, Stream>,
    pub(crate) files: BTreeMap<FileId, Stored>,
    /// The log's segments among `files`, by first entry's number.
    logs: BTreeMap<u64, FileId>,
    pub(crate) next_file: FileId,
    /// The last log entry the index holds.
    pub(crate) applied: u64,
    /// The changes since the last checkpoint, in order, while they are noted (`None`: not
    /// noted, as while the index is rebuilt or loaded from its checkpoint).
    pub(crate) journal: Option<Vec<(String, Change)>>,
}

impl Index {
    fn note(&mut self, channel: &str, change: impl FnOnce() -> Change) {
        if let Some(journal) = &mut self.journal {
            journal.push((channel.to_owned(), change()));
        }
    }

    /// Adds a file; its live bytes are counted as entries point to it.
    pub(crate) fn add_file(&mut self, id: FileId, kind: Kind, file: Handle, size: u64) {
        if let Kind::Log { first_lsn } = kind {
            self.logs.insert(first_lsn, id);
        }
        self.next_file = self.next_file.max(id + 1);
        self.files.insert(
            id,
            Stored {
                kind,
                file,
                size,
                live: 0,
            },
        );
    }

    /// A new file's number.
    pub(crate) fn new_file_id(&mut self) -> FileId {
        let id = self.next_file;
        self.next_file += 1;
        id
    }

    /// The log segment starting at `first_lsn`, if the index has it.
    pub(crate) fn log_file(&self, first_lsn: u64) -> Option<FileId> {
        self.logs.get(&first_lsn).copied()
    }

    pub(crate) fn remove_file(&mut self, id: FileId) -> Option<Stored> {
        let stored = self.files.remove(&id)?;
        if let Kind::Log { first_lsn } = stored.kind {
            self.logs.remove(&first_lsn);
        }
        Some(stored)
    }

    fn live(&mut self, loc: &Loc, by: i64) {
        if let Some(f) = self.files.get_mut(&loc.file) {
            f.live = f.live.saturating_add_signed(by * i64::from(loc.span.len));
            if by > 0 {
                f.size = f
                    .size
                    .max(u64::from(loc.span.pos) + u64::from(loc.span.len));
            }
        }
    }

    fn drop_locs(&mut self, locs: impl IntoIterator<Item = Loc>) {
        for loc in locs {
            self.live(&loc, -1);
        }
    }

    /// A publication written at `loc`; the stream keeps at most `history_size`.
    pub(crate) fn publish(
        &mut self,
        channel: &str,
        epoch: &Epoch,
        offset: u64,
        loc: Loc,
        history_size: usize,
    ) {
        let mut new = false;
        let stream = self.streams.entry(channel.to_owned()).or_insert_with(|| {
            new = true;
            Stream::new(epoch.clone(), offset - 1, loc.at_ms)
        });
        let mut gone = Vec::new();
        // A stream begun again (a reset or a forget not logged before it, as after damage)
        // or a hole: what it held is not this run of offsets.
        let begun = stream.epoch != *epoch || stream.first + stream.locs.len() as u64 != offset;
        if begun {
            gone.extend(stream.locs.drain(..));
            stream.epoch = epoch.clone();
            stream.first = offset;
        }
        // Room first, then the push: pushed first, a full stream's buffer doubled and stayed
        // so (49 bytes a kept publication at 10 million, not 24).
        let trimmed = stream.drop_oldest(|kept, _| kept >= history_size.max(1));
        let trimmed_to = (!trimmed.is_empty()).then_some(stream.first);
        gone.extend(trimmed);
        stream.locs.push_back(loc);
        stream.top = offset;
        stream.last_ms = loc.at_ms;
        // A stream that keeps none.
        let emptied_to = (history_size == 0).then(|| {
            gone.extend(stream.drop_oldest(|_, _| true));
            stream.first
        });
        // Begun streams are noted whole (what they held before is not their history).
        let whole = (new || begun).then(|| Box::new(stream.clone()));
        self.live(&loc, 1);
        self.drop_locs(gone);
        if let Some(stream) = whole {
            return self.note(channel, || Change::Whole(stream));
        }
        if let Some(first) = trimmed_to {
            self.note(channel, || Change::First(first));
        }
        self.note(channel, || Change::Append(offset, loc));
        if let Some(first) = emptied_to {
            self.note(channel, || Change::First(first));
        }
    }

    /// The channel's history deleted; its stream starts again in `epoch`.
    pub(crate) fn reset(&mut self, channel: &str, epoch: &Epoch, at_ms: u64) {
        let stream = Stream::new(epoch.clone(), 0, at_ms);
        self.note(channel, || Change::Whole(Box::new(stream.clone())));
        let old = self.streams.insert(channel.to_owned(), stream);
        if let Some(old) = old {
            self.drop_locs(old.locs);
        }
    }

    /// The channel removed entirely.
    pub(crate) fn forget(&mut self, channel: &str) {
        if let Some(old) = self.streams.remove(channel) {
            self.note(channel, || Change::Forget);
            self.drop_locs(old.locs);
        }
    }

    /// Drops the channel's oldest publications beyond the newest `n`.
    pub(crate) fn keep_newest(&mut self, channel: &str, n: usize) {
        let Some(stream) = self.streams.get_mut(channel) else {
            return;
        };
        let gone = stream.drop_oldest(|kept, _| kept > n);
        let first = stream.first;
        // Replay grows streams without their retention; what they keep is known now.
        if stream.locs.capacity() > 2 * stream.locs.len() + 16 {
            stream.locs.shrink_to_fit();
        }
        if !gone.is_empty() {
            self.note(channel, || Change::First(first));
        }
        self.drop_locs(gone);
    }

    /// Drops the channel's publications older than `older_than_ms`; when the oldest one
    /// left was published (`None`: none left).
    pub(crate) fn trim(&mut self, channel: &str, older_than_ms: u64) -> Option<u64> {
        let stream = self.streams.get_mut(channel)?;
        let gone = stream.drop_oldest(|_, oldest| oldest.at_ms < older_than_ms);
        let (oldest, first) = (stream.locs.front().map(|l| l.at_ms), stream.first);
        if !gone.is_empty() {
            self.note(channel, || Change::First(first));
        }
        self.drop_locs(gone);
        oldest
    }

    /// Drops what the channel keeps, as damaged: it starts again in a new epoch after its
    /// top, so no offset is handed out twice and resuming clients are told.
    pub(crate) fn drop_damaged(&mut self, channel: &str) {
        if let Some(stream) = self.streams.get_mut(channel) {
            let locs = std::mem::take(&mut stream.locs);
            stream.epoch = Epoch::random(|| fastrand::u64(..));
            stream.first = stream.top + 1;
            let whole = stream.clone();
            self.note(channel, || Change::Whole(Box::new(whole)));
            self.drop_locs(locs);
        }
    }

    /// Gives every stream a new epoch, keeping its history and offsets.
    pub(crate) fn renew_epochs(&mut self) -> usize {
        for (channel, stream) in &mut self.streams {
            stream.epoch = Epoch::random(|| fastrand::u64(..));
            if let Some(journal) = &mut self.journal {
                journal.push((channel.clone(), Change::Epoch(stream.epoch.clone())));
            }
        }
        self.streams.len()
    }

    /// Points the kept publication `offset` of `channel` in `epoch` to `loc` instead (it was
    /// copied there); whether it was still kept.
    pub(crate) fn moved(&mut self, channel: &str, epoch: &Epoch, offset: u64, loc: Loc) -> bool {
        let Some(stream) = self.streams.get_mut(channel).filter(|s| s.epoch == *epoch) else {
            return false;
        };
        let Some(i) = offset
            .checked_sub(stream.first)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < stream.locs.len())
        else {
            return false;
        };
        let old = std::mem::replace(&mut stream.locs[i], loc);
        self.live(&old, -1);
        self.live(&loc, 1);
        self.note(channel, || Change::Move(offset, loc));
        true
    }

    /// Counts every file's live bytes from the streams (after a checkpoint is read).
    pub(crate) fn count_live(&mut self) {
        let Self { streams, files, .. } = self;
        for f in files.values_mut() {
            f.live = 0;
        }
        for loc in streams.values().flat_map(|s| &s.locs) {
            if let Some(f) = files.get_mut(&loc.file) {
                let end = u64::from(loc.span.pos) + u64::from(loc.span.len);
                f.live += u64::from(loc.span.len);
                f.size = f.size.max(end);
            }
        }
    }

    /// Bytes of all files, and of their live entries.
    pub(crate) fn footprint(&self) -> (u64, u64) {
        self.files
            .values()
            .fold((0, 0), |(size, live), f| (size + f.size, live + f.live))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn loc(file: FileId, pos: u32, at_ms: u64) -> Loc {
        Loc {
            file,
            span: Span {
                pos,
                len: 100,
                crc: 7,
            },
            at_ms,
        }
    }

    fn index() -> Index {
        let mut index = Index::default();
        let file = Arc::new(tempfile::tempfile().unwrap());
        index.add_file(0, Kind::Log { first_lsn: 1 }, file, 32);
        index
    }

    #[test]
    fn a_stream_keeps_its_newest_within_its_size_and_counts_live_bytes() {
        let mut index = index();
        let e = Epoch::new("e1");
        for offset in 1..=5 {
            index.publish("a", &e, offset, loc(0, offset as u32 * 100, offset), 3);
        }
        let s = &index.streams["a"];
        assert_eq!((s.first, s.top, s.locs.len()), (3, 5, 3));
        assert_eq!(s.at(3).unwrap().span.pos, 300);
        assert!(s.at(2).is_none() && s.at(6).is_none());
        assert_eq!(index.files[&0].live, 300);
        assert_eq!(index.files[&0].size, 600);
    }

    #[test]
    fn trims_resets_and_forgets_free_their_bytes() {
        let mut index = index();
        let e = Epoch::new("e1");
        for offset in 1..=4 {
            index.publish(
                "a",
                &e,
                offset,
                loc(0, offset as u32 * 100, offset * 10),
                100,
            );
            index.publish("b", &e, offset, loc(0, offset as u32 * 1000, offset), 100);
        }
        assert_eq!(index.trim("a", 25), Some(30));
        assert_eq!(index.streams["a"].first, 3);
        assert_eq!(index.files[&0].live, 600);
        index.reset("a", &Epoch::new("e2"), 99);
        assert_eq!(index.streams["a"].first, 1);
        assert_eq!(index.files[&0].live, 400);
        index.forget("b");
        assert_eq!(index.files[&0].live, 0);
        assert_eq!(index.trim("b", 1), None);
    }

    #[test]
    fn a_publication_of_another_epoch_or_after_a_hole_starts_the_run_again() {
        let mut index = index();
        index.publish("a", &Epoch::new("e1"), 1, loc(0, 100, 1), 100);
        index.publish("a", &Epoch::new("e1"), 2, loc(0, 200, 1), 100);
        index.publish("a", &Epoch::new("e2"), 1, loc(0, 300, 1), 100);
        assert_eq!(index.streams["a"].locs.len(), 1);
        index.publish("a", &Epoch::new("e2"), 5, loc(0, 400, 1), 100);
        let s = &index.streams["a"];
        assert_eq!((s.first, s.locs.len()), (5, 1));
        assert_eq!(index.files[&0].live, 100);
    }

    #[test]
    fn a_move_repoints_a_kept_publication_only() {
        let mut index = index();
        index.add_file(1, Kind::Packed, Arc::new(tempfile::tempfile().unwrap()), 0);
        let e = Epoch::new("e1");
        for offset in 1..=3 {
            index.publish("a", &e, offset, loc(0, offset as u32 * 100, 1), 2);
        }
        assert!(index.moved("a", &e, 3, loc(1, 8, 1)));
        assert!(!index.moved("a", &e, 1, loc(1, 108, 1)));
        assert!(!index.moved("a", &Epoch::new("e9"), 2, loc(1, 108, 1)));
        assert_eq!((index.files[&0].live, index.files[&1].live), (100, 100));
        assert_eq!(index.streams["a"].at(3).unwrap().file, 1);
    }
}
