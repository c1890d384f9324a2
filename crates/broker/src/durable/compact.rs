//! Giving disk space back. A file of the store holds publications of many channels; as
//! they are trimmed, reset or forgotten its bytes die. Files with nothing live are taken
//! out of the index at each checkpoint and deleted once it is written ([`take_dead`]). When more
//! than a quarter of all bytes are dead, the files with the least live in them have their
//! live publications copied into a new packed file ([`pack`]); the next checkpoint points
//! there, and the files they came from are collected after it. So the store stays within
//! 4/3 of what it keeps, plus the segment being written.

use std::{io, path::PathBuf};

use herald_protocol::Epoch;
use parking_lot::RwLock;

use super::disk::{Appender, Dir, Handle};
use super::index::{packed_path, FileId, Index, Kind, Loc};
use super::pack;

/// Most live bytes one round of packing copies: the applier does nothing else meanwhile.
pub(super) const PACK_BUDGET: u64 = 32 << 20;

/// Takes the files nothing in the index points into out of it, except the newest log
/// segment (the writer may still append to it); their paths, to delete once a checkpoint
/// that no longer names them is written (the one before may point into them, and a
/// replay after it needs only newer segments).
pub(super) fn take_dead(index: &mut Index, dir: &Dir) -> Vec<PathBuf> {
    let newest_log = newest_log(index);
    let ids: Vec<_> = (index.files.iter())
        .filter(|(id, f)| f.live == 0 && Some(**id) != newest_log)
        .map(|(id, _)| *id)
        .collect();
    ids.into_iter()
        .filter_map(|id| index.remove_file(id).map(|f| f.kind.path(dir, id)))
        .collect()
}

/// The newest log segment, which the writer may still append to: never packed nor
/// collected.
fn newest_log(index: &Index) -> Option<FileId> {
    index
        .files
        .iter()
        .filter_map(|(id, f)| match f.kind {
            Kind::Log { first_lsn } => Some((first_lsn, *id)),
            Kind::Packed => None,
        })
        .max()
        .map(|(_, id)| id)
}

/// When more than a quarter of the store's bytes are dead, copies the live publications of
/// the files with the least live in them (below three quarters) into a new packed file and
/// points the index there; whether it did (the caller then checkpoints and collects).
pub(super) fn pack(index: &RwLock<Index>, dir: &Dir) -> io::Result<bool> {
    // What to copy, chosen under the read lock: the applier, the only writer, is here.
    let (id, moves) = {
        let index = index.read();
        let (size, live) = index.footprint();
        if size * 3 <= live * 4 {
            return Ok(false);
        }
        let newest = newest_log(&index);
        let mut victims: Vec<(FileId, u64, u64)> = index
            .files
            .iter()
            .filter(|(id, f)| Some(**id) != newest && f.live > 0 && f.live * 4 < f.size * 3)
            .map(|(id, f)| (*id, f.live, f.size))
            .collect();
        // The least live share first.
        victims.sort_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)));
        let mut budget = 0;
        victims.retain(|(_, live, _)| {
            budget += live;
            budget - live < PACK_BUDGET
        });
        if victims.is_empty() {
            return Ok(false);
        }
        let mut moves: Vec<Move> = Vec::new();
        for (channel, stream) in &index.streams {
            for (i, loc) in stream.locs.iter().enumerate() {
                if let Some(f) = victims.iter().find(|v| v.0 == loc.file) {
                    moves.push(Move {
                        channel: channel.clone(),
                        epoch: stream.epoch.clone(),
                        offset: stream.first + i as u64,
                        from: *loc,
                        file: index.files[&f.0].file.clone(),
                    });
                }
            }
        }
        (index.next_file, moves)
    };
    // Copied without a lock, in file order (reads in sequence).
    let mut moves = moves;
    moves.sort_by_key(|m| (m.from.file, m.from.span.pos));
    let path = packed_path(dir, id);
    let mut out = Appender::new(dir.disk().create(&path)?);
    out.write_all(pack::MAGIC)?;
    let mut pos = pack::MAGIC.len() as u64;
    let mut moved = Vec::with_capacity(moves.len());
    let mut buf = Vec::new();
    for m in moves {
        buf.resize(m.from.span.len as usize, 0);
        m.file.read_exact_at(&mut buf, u64::from(m.from.span.pos))?;
        // A damaged one stays where it is, for the read that finds it to reset its channel.
        if crc32fast::hash(&buf) != m.from.span.crc {
            continue;
        }
        // A pack holds at most PACK_BUDGET and one file's live bytes, far below what a
        // position can say; past it the rest stays where it is, for the next round.
        let Some(span) = pack::put(&mut out, pos, &buf)? else {
            break;
        };
        let to = Loc {
            file: id,
            span,
            at_ms: m.from.at_ms,
        };
        pos = u64::from(span.pos) + u64::from(span.len);
        moved.push((m.channel, m.epoch, m.offset, to));
    }
    if moved.is_empty() {
        // Only damaged ones were left: nothing to point elsewhere.
        drop(out);
        dir.disk().remove(&path)?;
        return Ok(false);
    }
    let file = out.finish()?;
    dir.sync()?;
    let mut index = index.write();
    index.add_file(id, Kind::Packed, file, pos);
    let count = moved.len();
    for (channel, epoch, offset, to) in moved {
        index.moved(&channel, &epoch, offset, to);
    }
    let (size, live) = index.footprint();
    tracing::info!(file = %path.display(), publications = count, bytes = pos, store_bytes = size, live_bytes = live, "packed history");
    Ok(true)
}

/// A kept publication to copy.
struct Move {
    channel: String,
    epoch: Epoch,
    offset: u64,
    from: Loc,
    file: Handle,
}
