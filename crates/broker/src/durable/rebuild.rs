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

use std::collections::{BTreeMap, HashMap};

use herald_protocol::Epoch;

use super::disk::Dir;
use super::index::{FileId, Index, Kind, Loc, Stream};
use super::{pack, wal};

/// A publication (or, without `loc`, a reset) found for a channel.
struct Found {
    epoch: Epoch,
    offset: u64,
    at_ms: u64,
    /// Its log entry's number (0 in a packed file): after time, what orders epochs.
    lsn: u64,
    loc: Option<Loc>,
}

/// The index of what the files in `dir` hold, its files opened; every entry of the newest
/// log segment counted as applied.
pub(super) fn rebuild(dir: &Dir) -> std::io::Result<Index> {
    let mut index = Index::default();
    let mut found: HashMap<String, Vec<Found>> = HashMap::new();
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
                let loc = Loc {
                    file: id,
                    span,
                    at_ms,
                };
                let Some(epoch) = Epoch::checked(epoch) else {
                    continue;
                };
                found.entry(channel.to_owned()).or_default().push(Found {
                    epoch,
                    offset,
                    at_ms,
                    lsn: 0,
                    loc: Some(loc),
                });
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
            found.entry(channel).or_default().push(Found {
                epoch,
                offset,
                at_ms,
                lsn,
                loc: published.then_some(Loc {
                    file: id,
                    span,
                    at_ms,
                }),
            });
        }
    }
    for (channel, all) in found {
        if let Some(stream) = newest_run(all) {
            index.streams.insert(channel, stream);
        }
    }
    index.count_live();
    Ok(index)
}

/// A channel's stream from what was found for it: its newest epoch's run of consecutive
/// offsets up to the newest one.
fn newest_run(all: Vec<Found>) -> Option<Stream> {
    let newest = all.iter().max_by_key(|f| (f.at_ms, f.lsn, f.offset))?;
    let (epoch, reset_ms) = (newest.epoch.clone(), newest.at_ms);
    let mut by_offset: BTreeMap<u64, Loc> = BTreeMap::new();
    let mut last_ms = reset_ms;
    for f in all.into_iter().filter(|f| f.epoch == epoch) {
        if let Some(loc) = f.loc {
            by_offset.insert(f.offset, loc);
            last_ms = last_ms.max(f.at_ms);
        }
    }
    let Some((&top, _)) = by_offset.last_key_value() else {
        // Reset, nothing published since.
        return Some(Stream::new(epoch, 0, last_ms));
    };
    let mut stream = Stream::new(epoch, top, last_ms);
    for (offset, loc) in by_offset.into_iter().rev() {
        if offset + 1 != stream.first {
            break;
        }
        stream.locs.push_front(loc);
        stream.first = offset;
    }
    Some(stream)
}
