//! The write-ahead log's format: what makes a publication durable before it is
//! acknowledged, and where it is kept. The log is the store: each publication is appended
//! once, and read back from where it lies (see `index`).
//!
//! A segment file is a header (magic, the store's run mark, the first entry's number) and
//! then batches. A batch is `[body length u32][entry count u32][first entry's number u64]
//! [CRC-32 u32][body]`, the CRC covering count, number and body. Entries are numbered
//! consecutively across batches and segments (their log sequence number, LSN); the index's
//! checkpoint records the last one it holds, so replay applies each entry exactly once.
//!
//! Reading back ([`scan`]) tells a torn tail from damage: a crash mid-append leaves the last
//! batch short or failing its CRC with nothing valid after it, and that batch was never
//! acknowledged (it is acknowledged only after it is written), so it is dropped. A batch
//! that fails while a valid one follows it means bytes were damaged inside the log: the
//! entries in it cannot be known; reading goes on after it, and the caller gives every
//! stream a new epoch if they were not in the index already.

use std::{
    io,
    path::{Path, PathBuf},
};

/// What the log records. Trims are not logged: one lost in a crash is done again by the
/// sweeper, which looks at every stream after a start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A publication, at its offset in its stream's epoch.
    Publish {
        /// The channel.
        channel: String,
        /// The stream's epoch.
        epoch: String,
        /// The publication's offset.
        offset: u64,
        /// When it was published, in ms since the Unix epoch.
        at_ms: u64,
        /// Its record.
        data: Vec<u8>,
    },
    /// The channel's history deleted; the stream starts again in `epoch`.
    Reset {
        /// The channel.
        channel: String,
        /// The new epoch.
        epoch: String,
        /// When, in ms since the Unix epoch.
        at_ms: u64,
    },
    /// The channel removed entirely (idle past its retention).
    Forget {
        /// The channel.
        channel: String,
    },
}

const MAGIC: &[u8; 8] = b"HRLDWAL1";
/// Magic, run mark, first LSN, CRC of those, padding.
pub const HEADER_LEN: usize = 32;
pub const BATCH_HEADER_LEN: usize = 20;
/// Larger batches are not written; a length beyond it is damage, not a batch.
const MAX_BODY: usize = 1 << 30;

const PUBLISH: u8 = 1;
const RESET: u8 = 2;
const FORGET: u8 = 3;

/// The segment file holding entries from `first_lsn` on.
pub fn segment_path(dir: &Path, first_lsn: u64) -> PathBuf {
    dir.join(format!("herald.wal.{first_lsn:020}"))
}

/// The segments in `dir`, by first LSN (from their names).
pub(crate) fn segments(dir: &super::disk::Dir) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<_> = (dir.list()?.into_iter())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let lsn = name.strip_prefix("herald.wal.")?.parse::<u64>().ok()?;
            Some((lsn, path))
        })
        .collect();
    found.sort();
    Ok(found)
}

pub fn header(run: u64, first_lsn: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&run.to_le_bytes());
    h[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    let crc = crc32fast::hash(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Appends `entry` to a batch body being built.
pub fn encode(body: &mut Vec<u8>, entry: &Entry) {
    match entry {
        Entry::Publish {
            channel,
            epoch,
            offset,
            at_ms,
            data,
        } => encode_publish(body, channel, epoch, *offset, *at_ms, data),
        Entry::Reset {
            channel,
            epoch,
            at_ms,
        } => encode_reset(body, channel, epoch, *at_ms),
        Entry::Forget { channel } => encode_forget(body, channel),
    }
}

/// Channel names take a 16-bit length, epochs an 8-bit one.
fn text(body: &mut Vec<u8>, s: &str, wide: bool) {
    if wide {
        body.extend_from_slice(&(s.len() as u16).to_le_bytes());
    } else {
        body.push(s.len() as u8);
    }
    body.extend_from_slice(s.as_bytes());
}

/// [`encode`] of a publication from borrowed parts (the writer's hot path builds no
/// [`Entry`]).
pub fn encode_publish(
    body: &mut Vec<u8>,
    channel: &str,
    epoch: &str,
    offset: u64,
    at_ms: u64,
    data: &[u8],
) {
    body.push(PUBLISH);
    text(body, channel, true);
    text(body, epoch, false);
    body.extend_from_slice(&offset.to_le_bytes());
    body.extend_from_slice(&at_ms.to_le_bytes());
    body.extend_from_slice(&(data.len() as u32).to_le_bytes());
    body.extend_from_slice(data);
}

/// [`encode`] of a reset from borrowed parts.
pub fn encode_reset(body: &mut Vec<u8>, channel: &str, epoch: &str, at_ms: u64) {
    body.push(RESET);
    text(body, channel, true);
    text(body, epoch, false);
    body.extend_from_slice(&at_ms.to_le_bytes());
}

/// [`encode`] of a forget from borrowed parts.
pub fn encode_forget(body: &mut Vec<u8>, channel: &str) {
    body.push(FORGET);
    text(body, channel, true);
}

/// A batch's bytes as written: header and `body` of `count` entries from `first_lsn`.
pub fn batch(first_lsn: u64, count: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&first_lsn.to_le_bytes());
    out.extend_from_slice(&batch_crc(count, first_lsn, body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn batch_crc(count: u32, first_lsn: u64, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&count.to_le_bytes());
    h.update(&first_lsn.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// What a segment holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The run mark in its header.
    pub run: u64,
    /// The LSN its first entry has.
    pub first_lsn: u64,
    /// Every entry of its valid batches, with its LSN, in order.
    pub entries: Vec<(u64, Entry)>,
    /// Where each of `entries` lies in the segment, in the same order.
    pub spans: Vec<Span>,
    /// Where the valid batches end: appends continue here.
    pub end: usize,
    /// The entry numbers lost to damage inside the log (not at a torn tail), as half-open
    /// ranges (`u64::MAX`: up to wherever the segment would have ended). Reading goes on
    /// after a damaged batch whose length is intact and that a valid batch follows.
    pub lost: Vec<(u64, u64)>,
}

impl Scan {
    /// A batch failed while a later one is valid, or the header is bad: entries were lost
    /// inside the log, not at a torn tail.
    pub fn damaged(&self) -> bool {
        !self.lost.is_empty()
    }
}

/// Where an entry's bytes lie in a file, and their CRC-32: what reads it back later checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// Where the entry starts.
    pub pos: u32,
    /// Its length.
    pub len: u32,
    /// CRC-32 of those bytes.
    pub crc: u32,
}

/// The furthest a span may end in a file: positions are kept in 32 bits.
pub const MAX_FILE_BYTES: u64 = u32::MAX as u64;

impl Span {
    /// The span of `bytes`, found at `pos`; `None` when it would end past
    /// [`MAX_FILE_BYTES`], which its 32-bit position cannot say (it wrapped, and every
    /// later read failed its check).
    pub fn of(pos: u64, bytes: &[u8]) -> Option<Self> {
        let end = pos.checked_add(bytes.len() as u64)?;
        (end <= MAX_FILE_BYTES).then(|| Self {
            pos: pos as u32,
            len: bytes.len() as u32,
            crc: crc32fast::hash(bytes),
        })
    }
}

/// A publication entry's parts, borrowed from its bytes (exactly one entry): channel,
/// epoch, offset, time and data. `None` for anything else.
pub fn publication(bytes: &[u8]) -> Option<(&str, &str, u64, u64, &[u8])> {
    let mut r = Reader(bytes);
    if r.u8()? != PUBLISH {
        return None;
    }
    let channel = r.str(true)?;
    let epoch = r.str(false)?;
    let offset = r.u64()?;
    let at_ms = r.u64()?;
    let len = u32::from_le_bytes(r.take(4)?.try_into().ok()?) as usize;
    let data = r.take(len)?;
    r.0.is_empty()
        .then_some((channel, epoch, offset, at_ms, data))
}

/// How many bytes a publication's entry takes beyond its data.
pub fn publication_overhead(channel: &str, epoch: &str) -> usize {
    1 + 2 + channel.len() + 1 + epoch.len() + 8 + 8 + 4
}

/// Reads a segment's bytes. Never panics, whatever they are.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut scan = Scan::default();
    let Some(h) = bytes.get(..HEADER_LEN) else {
        // A segment is created with its header synced before anything is appended: a
        // shorter one was never used.
        if !bytes.is_empty() {
            scan.lost.push((0, u64::MAX));
        }
        return scan;
    };
    let crc = u32::from_le_bytes(h[24..28].try_into().unwrap_or_default());
    if &h[..8] != MAGIC || crc != crc32fast::hash(&h[..24]) {
        scan.lost.push((0, u64::MAX));
        return scan;
    }
    scan.run = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
    scan.first_lsn = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
    let mut pos = HEADER_LEN;
    let mut next_lsn = scan.first_lsn;
    while pos < bytes.len() {
        match read_batch(&bytes[pos..], next_lsn) {
            Ok((len, entries)) => {
                let at = pos + BATCH_HEADER_LEN;
                let spans: Option<Vec<Span>> = entries
                    .iter()
                    .map(|(_, _, start, end)| {
                        Span::of((at + start) as u64, &bytes[at + start..at + end])
                    })
                    .collect();
                let Some(spans) = spans else {
                    // Past what a position can say: no writer goes there.
                    scan.lost.push((next_lsn, u64::MAX));
                    break;
                };
                next_lsn += entries.len() as u64;
                scan.spans.extend(spans);
                scan.entries
                    .extend(entries.into_iter().map(|(lsn, entry, _, _)| (lsn, entry)));
                pos += len;
            }
            Err(skip) => {
                // A valid batch right after a bad one: what the bad one held is lost, and
                // reading goes on.
                let rest = skip
                    .and_then(|len| bytes.get(pos + len..))
                    .unwrap_or_default();
                let resumed = rest
                    .get(8..16)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .filter(|first| *first > next_lsn && read_batch(rest, *first).is_ok());
                if let (Some(len), Some(first)) = (skip, resumed) {
                    scan.lost.push((next_lsn, first));
                    next_lsn = first;
                    pos += len;
                    continue;
                }
                // Damage, or a torn tail (see `torn`): what follows is not read, only
                // counted lost when it is damage.
                if super::torn::damaged(bytes, pos, skip, next_lsn) {
                    scan.lost.push((next_lsn, u64::MAX));
                }
                break;
            }
        }
    }
    scan.end = pos;
    scan
}

/// An entry of a batch, with its LSN and where it starts and ends in the batch's body.
pub(super) type Read = (u64, Entry, usize, usize);

/// One batch at the start of `bytes`, numbered from `lsn`: its length and entries, or, if
/// it is not valid, its declared length when that is plausible (to look past it).
pub(super) fn read_batch(bytes: &[u8], lsn: u64) -> Result<(usize, Vec<Read>), Option<usize>> {
    let head = bytes.get(..BATCH_HEADER_LEN).ok_or(None)?;
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let body_len = word(0) as usize;
    let count = word(4);
    let first = u64::from_le_bytes(head[8..16].try_into().map_err(|_| None)?);
    let crc = word(16);
    if body_len == 0 || body_len > MAX_BODY || count == 0 {
        return Err(None);
    }
    let len = BATCH_HEADER_LEN + body_len;
    let Some(body) = bytes.get(BATCH_HEADER_LEN..len) else {
        return Err(None);
    };
    if first != lsn || crc != batch_crc(count, first, body) {
        return Err(Some(len));
    }
    let mut entries = Vec::with_capacity((count as usize).min(body_len));
    let mut r = Reader(body);
    for i in 0..u64::from(count) {
        let start = body_len - r.0.len();
        let entry = r.entry().ok_or(Some(len))?;
        entries.push((lsn + i, entry, start, body_len - r.0.len()));
    }
    if !r.0.is_empty() {
        return Err(Some(len));
    }
    Ok((len, entries))
}

/// Little-endian fields read off the front of a slice; `None` once it runs short. The log's
/// entries and the checkpoint (`checkpoint.rs`) are both read with it.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn text(&mut self, wide: bool) -> Option<String> {
        self.str(wide).map(str::to_owned)
    }
    fn str(&mut self, wide: bool) -> Option<&'a str> {
        let len = if wide {
            self.u16()? as usize
        } else {
            self.u8()? as usize
        };
        std::str::from_utf8(self.take(len)?).ok()
    }
    fn entry(&mut self) -> Option<Entry> {
        Some(match self.u8()? {
            PUBLISH => {
                let channel = self.text(true)?;
                let epoch = self.text(false)?;
                let offset = self.u64()?;
                let at_ms = self.u64()?;
                let len = self.u32()? as usize;
                Entry::Publish {
                    channel,
                    epoch,
                    offset,
                    at_ms,
                    data: self.take(len)?.to_vec(),
                }
            }
            RESET => Entry::Reset {
                channel: self.text(true)?,
                epoch: self.text(false)?,
                at_ms: self.u64()?,
            },
            FORGET => Entry::Forget {
                channel: self.text(true)?,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A publication entry of epoch `e1` in `channel`.
    pub(in crate::durable) fn publish(channel: &str, offset: u64, data: &[u8]) -> Entry {
        Entry::Publish {
            channel: channel.into(),
            epoch: "e1".into(),
            offset,
            at_ms: 1_700_000_000_000 + offset,
            data: data.to_vec(),
        }
    }

    fn segment(run: u64, first: u64, batches: &[&[Entry]]) -> Vec<u8> {
        let mut out = header(run, first).to_vec();
        let mut lsn = first;
        for entries in batches {
            let mut body = Vec::new();
            for e in *entries {
                encode(&mut body, e);
            }
            out.extend(batch(lsn, entries.len() as u32, &body));
            lsn += entries.len() as u64;
        }
        out
    }

    #[test]
    fn entries_read_back_numbered_in_order() {
        let a = [
            publish("chat:a", 1, b"{\"x\":1}"),
            publish("chat:b", 1, b""),
        ];
        let b = [
            Entry::Reset {
                channel: "chat:a".into(),
                epoch: "e2".into(),
                at_ms: 5,
            },
            Entry::Forget {
                channel: "chat:b".into(),
            },
        ];
        let bytes = segment(7, 40, &[&a, &b]);
        let scan = scan(&bytes);
        assert_eq!((scan.run, scan.first_lsn, scan.damaged()), (7, 40, false));
        assert_eq!(scan.end, bytes.len());
        let lsns: Vec<u64> = scan.entries.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, [40, 41, 42, 43]);
        assert_eq!(scan.entries[0].1, a[0]);
        assert_eq!(scan.entries[3].1, b[1]);
    }

    #[test]
    fn a_torn_last_batch_is_dropped_without_calling_it_damage() {
        let first = [publish("c", 1, b"one")];
        let second = [publish("c", 2, &[7u8; 1500])];
        let whole = segment(1, 1, &[&first, &second]);
        let good = segment(1, 1, &[&first]).len();
        for cut in good..whole.len() {
            let scan = scan(&whole[..cut]);
            assert!(!scan.damaged(), "cut at {cut}");
            assert_eq!(scan.end, good);
            assert_eq!(scan.entries.len(), 1);
        }
        // A torn write can also leave the right length, with the sectors it did not reach
        // still zeros, as the segment was grown.
        let mut torn = whole.clone();
        torn[1024..].fill(0);
        let scan = scan(&torn);
        assert!(!scan.damaged());
        assert_eq!((scan.entries.len(), scan.end), (1, good));
    }

    /// Issue #57, found by the crash harness (seed 9): a bit flipped in the last batch of
    /// a segment, every sector of which was written, read as a torn tail, so acknowledged
    /// publications were lost and their offsets handed out again.
    #[test]
    fn a_damaged_last_batch_written_whole_is_damage() {
        let first = [publish("c", 1, b"one")];
        let second = [publish("c", 2, &[7u8; 1500])];
        let whole = segment(1, 1, &[&first, &second]);
        let good = segment(1, 1, &[&first]).len();
        let mut padded = whole.clone();
        padded.resize(8192, 0);
        for at in [whole.len() - 1, good + 30, good + 2] {
            let mut flipped = padded.clone();
            flipped[at] ^= 0x10;
            let scan = scan(&flipped);
            assert!(scan.damaged(), "a bit flipped at {at}");
            assert_eq!(scan.entries.len(), 1);
        }
        // The length made longer: the batch still passes its CRC at its real length.
        let mut longer = padded.clone();
        longer[good + 1] ^= 0x01;
        assert!(scan(&longer).damaged());
    }

    #[test]
    fn a_bad_batch_followed_by_a_good_one_is_damage_read_past() {
        let batches: [&[Entry]; 3] = [
            &[publish("c", 1, b"one")],
            &[publish("c", 2, b"two")],
            &[publish("c", 3, b"three")],
        ];
        let mut bytes = segment(1, 1, &batches);
        let second = segment(1, 1, &batches[..1]).len();
        bytes[second + BATCH_HEADER_LEN + 4] ^= 0x10; // inside the second batch's body
        let scan = scan(&bytes);
        assert!(scan.damaged());
        // Read on past it: only the damaged batch's entry is lost.
        let lsns: Vec<u64> = scan.entries.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, [1, 3]);
        assert_eq!(scan.lost, [(2, 3)]);
        assert_eq!(scan.end, bytes.len());
    }

    /// Issue #57 defect 4: positions are 32 bits; a span past them wrapped (a migrated
    /// store over 4 GiB, or a segment whose rotation kept failing), and every read of it
    /// failed its check. Now no span is made there: writers start a new file first.
    #[test]
    fn no_span_ends_past_what_a_position_can_say() {
        let last = MAX_FILE_BYTES - 2;
        assert_eq!(
            Span::of(last, b"xy").map(|s| (s.pos, s.len)),
            Some((u32::MAX - 2, 2))
        );
        assert_eq!(Span::of(last, b"xyz"), None);
        assert_eq!(Span::of(u64::MAX, b"x"), None);
    }

    /// Issue #57 defect 2: a flipped bit in the length of a batch with valid batches after
    /// it was read as a torn tail whenever the length it made pointed past the file's end
    /// (or past the largest batch): everything after it was dropped without a word, and
    /// offsets were handed out again. Now every flip of every bit of the length is damage.
    #[test]
    fn a_flipped_bit_in_a_batch_length_mid_segment_is_damage() {
        let batches: [&[Entry]; 3] = [
            &[publish("c", 1, b"one")],
            &[publish("c", 2, b"two")],
            &[publish("c", 3, b"three")],
        ];
        let bytes = segment(1, 1, &batches);
        let second = segment(1, 1, &batches[..1]).len();
        for bit in 0..32 {
            let mut flipped = bytes.clone();
            flipped[second + bit / 8] ^= 1 << (bit % 8);
            let scan = scan(&flipped);
            assert!(
                scan.damaged(),
                "bit {bit} of the length read as a torn tail"
            );
            let lsns: Vec<u64> = scan.entries.iter().map(|(l, _)| *l).collect();
            assert_eq!(lsns, [1], "bit {bit}");
        }
    }

    #[test]
    fn a_bad_header_is_damage_and_an_empty_file_is_not() {
        let mut bytes = segment(1, 1, &[&[publish("c", 1, b"x")]]);
        assert!(!scan(&[]).damaged());
        bytes[3] ^= 1;
        assert!(scan(&bytes).damaged());
        assert!(scan(&bytes[..10]).damaged());
    }

    #[test]
    fn batches_numbered_out_of_sequence_are_not_read() {
        let mut bytes = header(1, 10).to_vec();
        let mut body = Vec::new();
        encode(&mut body, &publish("c", 1, b"x"));
        bytes.extend(batch(11, 1, &body));
        let scan = scan(&bytes);
        assert!(scan.entries.is_empty());
        assert_eq!(scan.end, HEADER_LEN);
    }
}
