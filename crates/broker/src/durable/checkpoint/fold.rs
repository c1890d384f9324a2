//! Reading a checkpoint: its base a stream at a time, through a small buffer, each stream
//! with its changes from the deltas applied as it is read. The deltas are read first and
//! held (each is what changed between two checkpoints). One stream at a time, a stream
//! grown by the deltas is sized to what it keeps before the next is read: applied to a
//! whole index at once, the grown buffers doubled an open's memory at 10 million kept
//! publications.

use std::{
    collections::HashMap,
    io::{self, BufReader},
};

use super::format::{Part, Source};
use super::{delta_name, deltas, Chain, Head, FILE_NAME};
use crate::durable::disk::{Dir, ReadAt};
use crate::durable::index::{Change, Stream};

const BUFFER: usize = 1 << 20;

pub(super) fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// A checkpoint being read: the newest head and the chain of files, known once the deltas
/// are read; the streams follow, from [`Fold::streams`].
pub(crate) struct Fold {
    pub(crate) head: Head,
    pub(crate) chain: Chain,
    base: Source<BufReader<ReadAt>>,
    /// Each channel's changes, in order.
    changes: HashMap<String, Vec<Change>>,
}

impl Fold {
    /// Starts reading the directory's checkpoint, with its deltas up to `upto` (`None`:
    /// all of them); `Ok(None)` if it has no base.
    pub(crate) fn open(dir: &Dir, upto: Option<u64>) -> io::Result<Option<Fold>> {
        let file = match dir.disk().open(&dir.join(FILE_NAME)) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let base_bytes = file.len()?;
        let reader = BufReader::with_capacity(BUFFER, ReadAt::new(file)?);
        let (base, part, seq, head) = Source::start(reader)?;
        if part != Part::Base {
            return Err(bad(format!("{FILE_NAME} is not a base")));
        }
        let mut fold = Fold {
            head,
            chain: Chain {
                base_seq: seq,
                base_bytes,
                seq,
                delta_bytes: 0,
            },
            base,
            changes: HashMap::new(),
        };
        for (n, path) in deltas(dir)? {
            if n <= seq || upto.is_some_and(|upto| n > upto) {
                continue;
            }
            if n != fold.chain.seq + 1 {
                let after = delta_name(fold.chain.seq);
                return Err(bad(format!("the delta after {after} is missing")));
            }
            let bytes = dir.disk().read(&path)?;
            fold.add_delta(n, &bytes)
                .map_err(|e| bad(format!("{} cannot be read: {e}", delta_name(n))))?;
        }
        if upto.is_some_and(|upto| upto > fold.chain.seq) {
            let after = delta_name(fold.chain.seq);
            return Err(bad(format!("the delta after {after} is missing")));
        }
        Ok(Some(fold))
    }

    fn add_delta(&mut self, n: u64, bytes: &[u8]) -> io::Result<()> {
        let (mut source, part, number, head) = Source::start(bytes)?;
        if part != Part::Delta || number != n {
            return Err(bad("not the delta its name says".into()));
        }
        while let Some((channel, change)) = source.next()? {
            self.changes.entry(channel).or_default().push(change);
        }
        self.head = head;
        self.chain.seq = n;
        self.chain.delta_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Hands each stream, as of the newest delta, to `each`. An error (damage anywhere,
    /// the CRC at the base's end included) may come after streams were handed out: the
    /// caller drops them with the checkpoint.
    pub(crate) fn streams(
        mut self,
        mut each: impl FnMut(String, Stream) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut give = |channel: String, mut slot: Option<Stream>, changes: Option<Vec<Change>>| {
            let changed = changes.is_some();
            for change in changes.into_iter().flatten() {
                change
                    .apply(&mut slot)
                    .map_err(|why| bad(format!("{channel}: {why}")))?;
            }
            match slot {
                Some(mut s) => {
                    if changed && s.locs.capacity() > s.locs.len() + s.locs.len() / 8 + 16 {
                        s.locs.shrink_to_fit();
                    }
                    each(channel, s)
                }
                None => Ok(()),
            }
        };
        while let Some((channel, change)) = self.base.next()? {
            let Change::Whole(stream) = change else {
                return Err(bad(format!(
                    "{FILE_NAME} holds a change, not a whole stream"
                )));
            };
            let changes = self.changes.remove(&channel);
            give(channel, Some(*stream), changes)?;
        }
        for (channel, changes) in self.changes {
            give(channel, None, Some(changes))?;
        }
        Ok(())
    }
}
