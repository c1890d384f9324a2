//! The index rebuilt from the data files, when `herald.index` is missing or damaged: every
//! packed file and log segment is read, every publication found is indexed where it lies,
//! and each channel keeps the publications of its newest epoch (the epoch of the newest
//! publication or reset found for it, by time, then by log order), the run of consecutive
//! offsets up to the newest. Nothing says which entries the lost index no longer kept, nor
//! whether every file is there, so the caller gives every channel a new epoch: history is
//! kept, resuming clients are told `recovered: false`, and no offset is handed out twice.
//!
//! What it cannot know: history deleted (a reset) whose log entry was compacted away since
//! comes back, in the new epoch; packed files of the first format (no frames) cannot be
//! read, and are set aside by the caller.

use std::collections::HashMap;

use herald_protocol::Epoch;

use super::disk::Dir;
use super::index::{FileId, Index, Kind, Loc, Stream};
use super::{pack, wal};

/// What was found of one epoch of a channel.
#[derive(Default)]
struct Found {
    /// The newest thing found in it, publication or reset, as (time, log entry number (0 in
    /// a packed file), offset): the epoch with the newest is the channel's.
    newest: (u64, u64, u64),
    /// Its publications, by offset and where they lie, in the order read (a later one of
    /// the same offset stands). 32 bytes each: a record per entry with its epoch's name
    /// took about 100, and the rebuild held 1.27 GB at 10 million publications.
    publications: Vec<(u64, Loc)>,
}

/// Everything found, by channel and epoch.
#[derive(Default)]
struct Finds(HashMap<String, HashMap<Epoch, Found>>);

impl Finds {
    /// A publication at `loc` (or, without, a reset) of `channel` in `epoch`.
    fn note(&mut self, channel: &str, epoch: Epoch, key: (u64, u64, u64), loc: Option<Loc>) {
        let epochs = match self.0.get_mut(channel) {
            Some(epochs) => epochs,
            None => self.0.entry(channel.to_owned()).or_default(),
        };
        let found = epochs.entry(epoch).or_default();
        found.newest = found.newest.max(key);
        if let Some(loc) = loc {
            found.publications.push((key.2, loc));
        }
    }
}

/// The index of what the files in `dir` hold, its files opened; every entry of the newest
/// log segment counted as applied.
pub(super) fn rebuild(dir: &Dir) -> std::io::Result<Index> {
    let mut index = Index::default();
    let mut found = Finds::default();
    for path in dir.list()? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(id) = (name.strip_prefix("herald.pack.")).and_then(|n| n.parse::<FileId>().ok())
        else {
            continue;
        };
        let bytes = dir.disk().read(&path)?;
        // The first format cannot be read without the index: set aside by the caller.
        let Some(spans) = pack::entries(&bytes) else {
            continue;
        };
        index.add_file(
            id,
            Kind::Packed,
            dir.disk().open(&path)?,
            bytes.len() as u64,
        );
        for span in spans {
            let entry = &bytes[span.pos as usize..(span.pos + span.len) as usize];
            if let Some((channel, epoch, offset, at_ms, _)) = wal::publication(entry) {
                let Some(epoch) = Epoch::checked(epoch) else {
                    continue;
                };
                let loc = Loc {
                    file: id,
                    span,
                    at_ms,
                };
                found.note(channel, epoch, (at_ms, 0, offset), Some(loc));
            }
        }
    }
    for (first_lsn, path) in wal::segments(dir)? {
        let scan = wal::scan(&dir.disk().read(&path)?);
        let id = index.new_file_id();
        let file = dir.disk().open(&path)?;
        index.add_file(id, Kind::Log { first_lsn }, file, wal::HEADER_LEN as u64);
        for ((lsn, entry), span) in scan.entries.into_iter().zip(scan.spans) {
            index.applied = index.applied.max(lsn);
            let (channel, epoch, offset, at_ms, published) = match entry {
                wal::Entry::Publish {
                    channel,
                    epoch,
                    offset,
                    at_ms,
                    ..
                } => (channel, epoch, offset, at_ms, true),
                wal::Entry::Reset {
                    channel,
                    epoch,
                    at_ms,
                } => (channel, epoch, 0, at_ms, false),
                wal::Entry::Forget { .. } => continue,
            };
            let Some(epoch) = Epoch::checked(&epoch) else {
                continue;
            };
            let loc = published.then_some(Loc {
                file: id,
                span,
                at_ms,
            });
            found.note(&channel, epoch, (at_ms, lsn, offset), loc);
        }
    }
    for (channel, epochs) in found.0 {
        if let Some(stream) = newest_run(epochs) {
            index.streams.insert(channel, stream);
        }
    }
    index.count_live();
    Ok(index)
}

/// A channel's stream from what was found for it: its newest epoch's run of consecutive
/// offsets up to the newest one.
fn newest_run(epochs: HashMap<Epoch, Found>) -> Option<Stream> {
    let (epoch, found) = epochs.into_iter().max_by_key(|(_, f)| f.newest)?;
    let last_ms = found.newest.0;
    let mut publications = found.publications;
    // Stable: of one offset, the one read last stands.
    publications.sort_by_key(|(offset, _)| *offset);
    let Some(&(top, _)) = publications.last() else {
        // Reset, nothing published since.
        return Some(Stream::new(epoch, 0, last_ms));
    };
    let mut stream = Stream::new(epoch, top, last_ms);
    for (offset, loc) in publications.into_iter().rev() {
        if offset + 1 == stream.first {
            stream.locs.push_front(loc);
            stream.first = offset;
        } else if offset != stream.first {
            break;
        }
    }
    stream.locs.shrink_to_fit();
    Some(stream)
}
