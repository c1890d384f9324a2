//! The index written whole, now and then, so that an open reads it and only the log
//! entries after it instead of every file: `herald.index` in the data directory.
//!
//! It also carries what the store must know about the run that wrote it: its mark (a
//! restore puts back an older checkpoint, whose mark no longer matches the one beside it),
//! and whether that run delivered publications before syncing them, on which boot of the
//! machine (see `recovery`).
//!
//! Layout, little-endian: magic `HRLDIDX1`; run u64; boot u64 (0: unknown); unflushed u8;
//! applied u64; next file u32; files (count u32, then id u32, kind u8, first LSN u64,
//! size u64 each); streams (count u32, then channel u16-length text, epoch u8-length text,
//! top u64, last u64, first u64, and a count u32 of kept publications, each file u32,
//! position u32, length u32, CRC u32, time u64); and a CRC-32 of all of it. It is written
//! to a temporary file, synced, and renamed over the last one, so an open finds either
//! the old checkpoint or the new one whole.

use std::{collections::VecDeque, io};

use herald_protocol::{ChannelName, Epoch};

use super::disk::Dir;
use super::index::{FileId, Kind, Loc, Stream};
use super::wal::{Reader, Span};

/// The file name inside the data directory.
pub const FILE_NAME: &str = "herald.index";

const MAGIC: &[u8; 8] = b"HRLDIDX1";
const LOG: u8 = 1;
const PACKED: u8 = 2;

/// What a checkpoint holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) head: Head,
    pub(crate) streams: Vec<(String, Stream)>,
}

/// A checkpoint but its streams: what the store knows of the run that wrote it, and its
/// files.
#[derive(Debug, Default, PartialEq, Eq)]
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

/// Encodes a checkpoint from its parts (the streams borrowed from the index).
pub(crate) fn encode<'s>(
    head: &Head,
    streams: impl ExactSizeIterator<Item = (&'s String, &'s Stream)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + streams.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&head.run.to_le_bytes());
    out.extend_from_slice(&head.boot.unwrap_or(0).to_le_bytes());
    out.push(u8::from(head.unflushed));
    out.extend_from_slice(&head.applied.to_le_bytes());
    out.extend_from_slice(&head.next_file.to_le_bytes());
    out.extend_from_slice(&(head.files.len() as u32).to_le_bytes());
    for (id, kind, size) in &head.files {
        out.extend_from_slice(&id.to_le_bytes());
        let (tag, lsn) = match kind {
            Kind::Log { first_lsn } => (LOG, *first_lsn),
            Kind::Packed => (PACKED, 0),
        };
        out.push(tag);
        out.extend_from_slice(&lsn.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
    }
    out.extend_from_slice(&(streams.len() as u32).to_le_bytes());
    for (channel, s) in streams {
        out.extend_from_slice(&(channel.len() as u16).to_le_bytes());
        out.extend_from_slice(channel.as_bytes());
        out.push(s.epoch.as_str().len() as u8);
        out.extend_from_slice(s.epoch.as_str().as_bytes());
        for n in [s.top, s.last_ms, s.first] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&(s.locs.len() as u32).to_le_bytes());
        for l in &s.locs {
            for n in [l.file, l.span.pos, l.span.len, l.span.crc] {
                out.extend_from_slice(&n.to_le_bytes());
            }
            out.extend_from_slice(&l.at_ms.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a checkpoint's bytes; `None` if they are not one, whole. Never panics.
pub(crate) fn decode(bytes: &[u8]) -> Option<Checkpoint> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let mut r = Reader(body);
    if r.take(8)? != MAGIC {
        return None;
    }
    let mut c = Checkpoint::default();
    c.head = Head {
        run: r.u64()?,
        boot: Some(r.u64()?).filter(|b| *b != 0),
        unflushed: match r.u8()? {
            0 => false,
            1 => true,
            _ => return None,
        },
        applied: r.u64()?,
        next_file: r.u32()?,
        files: Vec::new(),
    };
    for _ in 0..r.u32()? {
        let id = r.u32()?;
        let kind = match (r.u8()?, r.u64()?) {
            (LOG, first_lsn) => Kind::Log { first_lsn },
            (PACKED, _) => Kind::Packed,
            _ => return None,
        };
        let size = r.u64()?;
        if id >= c.head.next_file {
            return None;
        }
        c.head.files.push((id, kind, size));
    }
    // Each kept publication's file, looked up once per publication: a search of the list
    // made decoding O(publications x files).
    let sizes: std::collections::HashMap<u32, u64> = c
        .head
        .files
        .iter()
        .map(|(id, _, size)| (*id, *size))
        .collect();
    for _ in 0..r.u32()? {
        let len = r.u16()? as usize;
        let channel = std::str::from_utf8(r.take(len)?).ok()?;
        ChannelName::stored(channel).ok()?;
        let len = r.u8()? as usize;
        let epoch = Epoch::checked(std::str::from_utf8(r.take(len)?).ok()?)?;
        let (top, last_ms, first) = (r.u64()?, r.u64()?, r.u64()?);
        let count = r.u32()? as usize;
        // Each kept publication takes 24 bytes: a count the bytes cannot hold is damage.
        if count > r.0.len() / 24
            || count > 0 && first.checked_add(count as u64)? != top.checked_add(1)?
        {
            return None;
        }
        let mut locs = VecDeque::with_capacity(count);
        for _ in 0..count {
            let file = r.u32()?;
            let span = Span {
                pos: r.u32()?,
                len: r.u32()?,
                crc: r.u32()?,
            };
            let at_ms = r.u64()?;
            // In a file the checkpoint lists, and within it.
            let end = u64::from(span.pos) + u64::from(span.len);
            if sizes.get(&file).is_none_or(|size| end > *size) {
                return None;
            }
            locs.push_back(Loc { file, span, at_ms });
        }
        let stream = Stream {
            epoch,
            top,
            last_ms,
            first,
            locs,
        };
        c.streams.push((channel.to_owned(), stream));
    }
    r.0.is_empty().then_some(c)
}

/// Writes `bytes` as the directory's checkpoint: to a temporary file, synced, renamed over
/// the last one, and the directory synced.
pub(crate) fn write(dir: &Dir, bytes: &[u8]) -> io::Result<()> {
    dir.replace(FILE_NAME, bytes)
}

/// The directory's checkpoint: `Ok(None)` if it has none, `Err` with why if it has one
/// that cannot be read.
pub(crate) fn read(dir: &Dir) -> Result<Option<Checkpoint>, String> {
    match dir.disk().read(&dir.join(FILE_NAME)) {
        Ok(bytes) => decode(&bytes)
            .map(Some)
            .ok_or_else(|| "the checkpoint fails its checksum or cannot be decoded".into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let loc = |pos, at_ms| Loc {
            file: 3,
            span: Span {
                pos,
                len: 40,
                crc: 0xdead_beef,
            },
            at_ms,
        };
        Checkpoint {
            head: Head {
                run: 42,
                boot: Some(7),
                unflushed: true,
                applied: 1234,
                next_file: 5,
                files: vec![
                    (3, Kind::Log { first_lsn: 1000 }, 4096),
                    (4, Kind::Packed, 0),
                ],
            },
            streams: vec![
                (
                    "chat:a".into(),
                    Stream {
                        epoch: Epoch::new("abc"),
                        top: 9,
                        last_ms: 77,
                        first: 8,
                        locs: [loc(32, 70), loc(72, 77)].into(),
                    },
                ),
                ("chat:b".into(), Stream::new(Epoch::new("xyz"), 3, 5)),
            ],
        }
    }

    fn bytes(c: &Checkpoint) -> Vec<u8> {
        encode(
            &c.head,
            c.streams
                .iter()
                .map(|(n, s)| (n, s))
                .collect::<Vec<_>>()
                .into_iter(),
        )
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let c = sample();
        assert_eq!(decode(&bytes(&c)), Some(c));
    }

    #[test]
    fn any_damage_or_truncation_is_refused() {
        let good = bytes(&sample());
        for cut in 0..good.len() {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            assert_eq!(decode(&bad), None, "byte {i} flipped");
        }
    }

    /// A kept publication the checkpoint places past the end of its file (or in a file it
    /// does not list) is refused with the checkpoint, as damage is.
    #[test]
    fn a_publication_past_its_file_is_refused() {
        let mut c = sample();
        c.head.files[0].2 = 100; // chat:a's second publication ends at 112
        assert_eq!(decode(&bytes(&c)), None);
        let mut c = sample();
        c.head.files.remove(0);
        assert_eq!(decode(&bytes(&c)), None);
    }

    #[test]
    fn written_and_read_from_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::os(tmp.path());
        assert_eq!(read(&dir), Ok(None));
        write(&dir, &bytes(&sample())).unwrap();
        assert_eq!(read(&dir), Ok(Some(sample())));
        std::fs::write(dir.join(FILE_NAME), b"nonsense").unwrap();
        assert!(read(&dir).is_err());
    }
}
