//! What the applier does with the log's entries (and trims): it tells the index where each
//! publication lies, in order. Replay at open does the same with what it reads back.

use std::io;

use super::applier::Op;
use super::disk::Dir;
use super::index::{Index, Kind, Loc};
use super::wal;

/// Applies `ops` to `index`; returns, for every trim, when the oldest publication left was
/// published (`None`: none left). A log segment the index has not seen yet is opened for
/// reading: that is the only thing that can fail, before anything is applied.
pub(super) fn apply(index: &mut Index, dir: &Dir, ops: &[Op]) -> io::Result<Vec<Option<u64>>> {
    for op in ops {
        if let Op::Publish {
            written: Some((first_lsn, _)),
            ..
        } = op
        {
            open_segment(index, dir, *first_lsn)?;
        }
    }
    let mut oldest_left = Vec::new();
    for op in ops {
        match op {
            Op::Publish {
                channel,
                epoch,
                offset,
                at_ms,
                history_size,
                written,
                ..
            } => {
                let Some((first_lsn, span)) = written else {
                    continue;
                };
                let Some(file) = index.log_file(*first_lsn) else {
                    continue;
                };
                let loc = Loc {
                    file,
                    span: *span,
                    at_ms: *at_ms,
                };
                index.publish(channel.as_str(), epoch, *offset, loc, *history_size);
            }
            Op::Reset {
                channel,
                epoch,
                at_ms,
                ..
            } => index.reset(channel.as_str(), epoch, *at_ms),
            Op::Forget { channel, .. } => index.forget(channel.as_str()),
            Op::Trim {
                channel,
                older_than_ms,
                ..
            } => oldest_left.push(index.trim(channel.as_str(), *older_than_ms)),
        }
    }
    if let Some(last) = ops.iter().filter_map(Op::lsn).max() {
        index.applied = index.applied.max(last);
    }
    Ok(oldest_left)
}

/// Makes the log segment starting at `first_lsn` one of the index's files, if it is not.
pub(super) fn open_segment(index: &mut Index, dir: &Dir, first_lsn: u64) -> io::Result<()> {
    if index.log_file(first_lsn).is_none() {
        let path = wal::segment_path(dir, first_lsn);
        let file = dir.disk().open(&path)?;
        let id = index.new_file_id();
        index.add_file(id, Kind::Log { first_lsn }, file, wal::HEADER_LEN as u64);
    }
    Ok(())
}
