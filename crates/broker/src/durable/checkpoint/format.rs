//! The bytes of a checkpoint file, base or delta, little-endian:
//!
//! - magic `HRLDIDX2`; kind u8 (1: base, 2: delta); seq u64;
//! - the head: run u64; boot u64 (0: unknown); unflushed u8; applied u64; next file u32;
//!   files (count u32, then id u32, kind u8, first LSN u64, size u64 each);
//! - records, each a tag u8 and the channel (u16-length text), then by tag:
//!   1, the stream whole: epoch (u8-length text), top u64, last u64, first u64, and its
//!   kept publications from `first` to `top` (each file u32, position u32, length u32,
//!   CRC u32, time u64); 2, forgotten; 3, a publication appended: offset u64 and where it
//!   lies as above; 4, trimmed to a first offset u64; 5, a publication moved: offset u64
//!   and where it lies now; 6, a new epoch (u8-length text); 0 (no channel), the end;
//! - a CRC-32 of all of it.
//!
//! A base holds whole streams only; a delta, the index's changes in the order they were
//! made (see `index::Change`). Read and written a record at a time, so that a merge
//! streams a base of millions of publications through a small buffer.

use std::{
    collections::VecDeque,
    io::{self, Read, Write},
};

use herald_protocol::{ChannelName, Epoch};

use super::Head;
use crate::durable::index::{Change, Kind, Loc, Stream};
use crate::durable::wal::Span;

const MAGIC: &[u8; 8] = b"HRLDIDX2";
const LOG: u8 = 1;
const PACKED: u8 = 2;
const END: u8 = 0;
const WHOLE: u8 = 1;
const FORGET: u8 = 2;
const APPEND: u8 = 3;
const FIRST: u8 = 4;
const MOVE: u8 = 5;
const EPOCH: u8 = 6;
/// Bytes a kept publication takes.
const LOC_BYTES: usize = 24;
/// Kept publications read at once.
const RUN: usize = 2048;

/// Which of the two a checkpoint file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The whole index as of `seq`.
    Base = 1,
    /// What changed since the file `seq - 1`.
    Delta = 2,
}

/// One record of a checkpoint file: a channel and what it is, or what became of it.
pub(crate) type Record = (String, Change);

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

fn put_loc(b: &mut Vec<u8>, l: &Loc) {
    let mut e = [0u8; LOC_BYTES];
    e[0..4].copy_from_slice(&l.file.to_le_bytes());
    e[4..8].copy_from_slice(&l.span.pos.to_le_bytes());
    e[8..12].copy_from_slice(&l.span.len.to_le_bytes());
    e[12..16].copy_from_slice(&l.span.crc.to_le_bytes());
    e[16..24].copy_from_slice(&l.at_ms.to_le_bytes());
    b.extend_from_slice(&e);
}

fn loc(b: &[u8]) -> Loc {
    let n = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    Loc {
        file: n(0),
        span: Span {
            pos: n(4),
            len: n(8),
            crc: n(12),
        },
        at_ms: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
    }
}

/// Writes a checkpoint file, keeping its CRC.
pub(crate) struct Sink<W> {
    out: W,
    crc: crc32fast::Hasher,
    written: u64,
    /// Records are gathered here and written in pieces of up to 64 KiB: a write and a CRC
    /// update per field were most of the time.
    scratch: Vec<u8>,
}

impl<W: Write> Sink<W> {
    pub(crate) fn start(out: W, part: Part, seq: u64, head: &Head) -> io::Result<Self> {
        let mut b = Vec::with_capacity((64 << 10) + 512);
        b.extend_from_slice(MAGIC);
        b.push(part as u8);
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&head.run.to_le_bytes());
        b.extend_from_slice(&head.boot.unwrap_or(0).to_le_bytes());
        b.push(u8::from(head.unflushed));
        b.extend_from_slice(&head.applied.to_le_bytes());
        b.extend_from_slice(&head.next_file.to_le_bytes());
        b.extend_from_slice(&(head.files.len() as u32).to_le_bytes());
        for (id, kind, size) in &head.files {
            b.extend_from_slice(&id.to_le_bytes());
            let (tag, lsn) = match kind {
                Kind::Log { first_lsn } => (LOG, *first_lsn),
                Kind::Packed => (PACKED, 0),
            };
            b.push(tag);
            b.extend_from_slice(&lsn.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
        }
        Ok(Self {
            out,
            crc: crc32fast::Hasher::new(),
            written: 0,
            scratch: b,
        })
    }

    fn spill(&mut self) -> io::Result<()> {
        self.crc.update(&self.scratch);
        self.written += self.scratch.len() as u64;
        self.out.write_all(&self.scratch)?;
        self.scratch.clear();
        Ok(())
    }

    fn spill_if_full(&mut self) -> io::Result<()> {
        if self.scratch.len() >= 64 << 10 {
            self.spill()?;
        }
        Ok(())
    }

    fn tag(&mut self, tag: u8, channel: &str) {
        let b = &mut self.scratch;
        b.push(tag);
        b.extend_from_slice(&(channel.len() as u16).to_le_bytes());
        b.extend_from_slice(channel.as_bytes());
    }

    /// The stream, whole.
    pub(crate) fn stream(&mut self, channel: &str, s: &Stream) -> io::Result<()> {
        self.tag(WHOLE, channel);
        let b = &mut self.scratch;
        b.push(s.epoch.as_str().len() as u8);
        b.extend_from_slice(s.epoch.as_str().as_bytes());
        for n in [s.top, s.last_ms, s.first] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        for l in &s.locs {
            put_loc(&mut self.scratch, l);
            self.spill_if_full()?;
        }
        Ok(())
    }

    /// A change to the channel's stream.
    pub(crate) fn change(&mut self, channel: &str, change: &Change) -> io::Result<()> {
        let at = |tag, offset: u64, l: &Loc, sink: &mut Self| {
            sink.tag(tag, channel);
            sink.scratch.extend_from_slice(&offset.to_le_bytes());
            put_loc(&mut sink.scratch, l);
        };
        match change {
            Change::Whole(s) => return self.stream(channel, s),
            Change::Forget => self.tag(FORGET, channel),
            Change::Append(offset, l) => at(APPEND, *offset, l, self),
            Change::Move(offset, l) => at(MOVE, *offset, l, self),
            Change::First(first) => {
                self.tag(FIRST, channel);
                self.scratch.extend_from_slice(&first.to_le_bytes());
            }
            Change::Epoch(epoch) => {
                self.tag(EPOCH, channel);
                self.scratch.push(epoch.as_str().len() as u8);
                self.scratch.extend_from_slice(epoch.as_str().as_bytes());
            }
        }
        self.spill_if_full()
    }

    /// Ends the file; what it was written to, and how many bytes it took.
    pub(crate) fn finish(mut self) -> io::Result<(W, u64)> {
        self.scratch.push(END);
        self.spill()?;
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_le_bytes())?;
        Ok((self.out, self.written + 4))
    }
}

/// Reads a checkpoint file a record at a time. Any error means the file is damaged (or
/// could not be read): nothing it said can be trusted, though records already taken were
/// handed out (the caller drops them with the file).
pub(crate) struct Source<R> {
    input: R,
    crc: crc32fast::Hasher,
    done: bool,
    /// A run of kept publications' bytes, kept between streams.
    run: Vec<u8>,
}

impl<R: Read> Source<R> {
    /// Reads the file's start: which part it is, its number and its head.
    pub(crate) fn start(input: R) -> io::Result<(Self, Part, u64, Head)> {
        let mut s = Self {
            input,
            crc: crc32fast::Hasher::new(),
            done: false,
            run: Vec::new(),
        };
        if s.bytes::<8>()? != *MAGIC {
            return Err(bad("not a checkpoint of this version"));
        }
        let part = match s.u8()? {
            1 => Part::Base,
            2 => Part::Delta,
            _ => return Err(bad("unknown part")),
        };
        let seq = s.u64()?;
        let mut head = Head {
            run: s.u64()?,
            boot: Some(s.u64()?).filter(|b| *b != 0),
            unflushed: match s.u8()? {
                0 => false,
                1 => true,
                _ => return Err(bad("unflushed is not a boolean")),
            },
            applied: s.u64()?,
            next_file: s.u32()?,
            files: Vec::new(),
        };
        for _ in 0..s.u32()? {
            let id = s.u32()?;
            let kind = match (s.u8()?, s.u64()?) {
                (LOG, first_lsn) => Kind::Log { first_lsn },
                (PACKED, _) => Kind::Packed,
                _ => return Err(bad("unknown file kind")),
            };
            let size = s.u64()?;
            if id >= head.next_file {
                return Err(bad("a file numbered past the next"));
            }
            head.files.push((id, kind, size));
        }
        Ok((s, part, seq, head))
    }

    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0; N];
        self.input.read_exact(&mut b)?;
        self.crc.update(&b);
        Ok(b)
    }

    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.bytes::<1>()?[0])
    }

    fn u16(&mut self) -> io::Result<u16> {
        Ok(u16::from_le_bytes(self.bytes()?))
    }

    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn text(&mut self, len: usize) -> io::Result<String> {
        let mut b = vec![0; len];
        self.input.read_exact(&mut b)?;
        self.crc.update(&b);
        String::from_utf8(b).map_err(|_| bad("text is not UTF-8"))
    }

    fn epoch(&mut self) -> io::Result<Epoch> {
        let len = self.u8()? as usize;
        Epoch::checked(&self.text(len)?).ok_or_else(|| bad("not an epoch"))
    }

    fn loc(&mut self) -> io::Result<Loc> {
        Ok(loc(&self.bytes::<LOC_BYTES>()?))
    }

    /// The next record; `None` after the last, once the CRC and the end are checked.
    pub(crate) fn next(&mut self) -> io::Result<Option<Record>> {
        if self.done {
            return Ok(None);
        }
        let tag = self.u8()?;
        if tag == END {
            let crc = self.crc.clone().finalize();
            let mut stored = [0; 4];
            self.input.read_exact(&mut stored)?;
            if u32::from_le_bytes(stored) != crc {
                return Err(bad("the checkpoint fails its checksum"));
            }
            if self.input.read(&mut [0])? != 0 {
                return Err(bad("bytes after the end"));
            }
            self.done = true;
            return Ok(None);
        }
        let len = self.u16()? as usize;
        let channel = self.text(len)?;
        ChannelName::stored(&channel).map_err(|_| bad("not a channel name"))?;
        let change = match tag {
            WHOLE => Change::Whole(Box::new(self.whole()?)),
            FORGET => Change::Forget,
            APPEND => Change::Append(self.u64()?, self.loc()?),
            FIRST => Change::First(self.u64()?),
            MOVE => Change::Move(self.u64()?, self.loc()?),
            EPOCH => Change::Epoch(self.epoch()?),
            _ => return Err(bad("unknown record")),
        };
        Ok(Some((channel, change)))
    }

    fn whole(&mut self) -> io::Result<Stream> {
        let epoch = self.epoch()?;
        let (top, last_ms, first) = (self.u64()?, self.u64()?, self.u64()?);
        let end = top.checked_add(1).ok_or_else(|| bad("top overflows"))?;
        let mut left = end
            .checked_sub(first)
            .ok_or_else(|| bad("first past top"))?;
        // Grown as read: a count is not trusted before its bytes are there.
        let mut locs = VecDeque::with_capacity(left.min(4096) as usize);
        // Read and checked in runs: a CRC update per field was most of an open.
        let mut run = std::mem::take(&mut self.run);
        while left > 0 {
            let n = left.min(RUN as u64) as usize;
            run.resize(n * LOC_BYTES, 0);
            self.input.read_exact(&mut run)?;
            self.crc.update(&run);
            locs.extend(run.chunks_exact(LOC_BYTES).map(loc));
            left -= n as u64;
        }
        self.run = run;
        Ok(Stream {
            epoch,
            top,
            last_ms,
            first,
            locs,
        })
    }
}
