//! Folding the deltas into a new base, on a thread of its own while the store runs: the
//! base is read and the new one written a stream at a time through 1 MiB buffers (see
//! `fold`). The new base is written beside the old one and renamed over it, so a crash
//! leaves one or the other; the deltas it holds are deleted after, and an open skips any
//! left.

use std::io;

use super::fold::Fold;
use super::format::{Part, Sink};
use super::{remove_deltas, FILE_NAME};
use crate::durable::disk::{Appender, Dir};

/// Merges done, for the crash tests to show they ran.
#[cfg(test)]
pub(crate) static MERGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Merges the deltas up to `upto` into the base; the new base's bytes (`None` if it held
/// them already).
pub(crate) fn merge(dir: &Dir, upto: u64) -> io::Result<Option<u64>> {
    let Some(fold) = Fold::open(dir, Some(upto))? else {
        return Err(io::ErrorKind::NotFound.into());
    };
    if fold.chain.seq == fold.chain.base_seq {
        return Ok(None);
    }
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let out = Appender::new(dir.disk().create(&tmp)?);
    let mut sink = Sink::start(out, Part::Base, upto, &fold.head)?;
    fold.streams(|channel, stream| sink.stream(&channel, &stream))?;
    let (out, bytes) = sink.finish()?;
    out.finish()?;
    dir.disk().rename(&tmp, &dir.join(FILE_NAME))?;
    dir.sync()?;
    remove_deltas(dir, upto)?;
    #[cfg(test)]
    MERGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(bytes))
}
