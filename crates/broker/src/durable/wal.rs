//! The write-ahead log: what makes a publication durable before it is acknowledged.
//!
//! A commit of the database file rewrites B-tree pages and the allocator's state, which
//! costs far more CPU than the bytes it stores; an append of the same records and one
//! `fdatasync` costs little more than the bytes. So the writer appends each batch here,
//! syncs, and acknowledges; the applier writes batches of many commits into the database
//! later, and segments whose entries all reached the database (durably) are deleted.
//!
//! A segment file is a header (magic, the store's run mark, the first entry's number) and
//! then batches. A batch is `[body length u32][entry count u32][first entry's number u64]
//! [CRC-32 u32][body]`, the CRC covering count, number and body. Entries are numbered
//! consecutively across batches and segments (their log sequence number, LSN); the
//! database records the last one it applied, so replay applies each entry exactly once.
//!
//! Reading back ([`scan`]) tells a torn tail from damage: a crash mid-append leaves the last
//! batch short or failing its CRC with nothing valid after it, and that batch was never
//! acknowledged (it is acknowledged only after the sync), so it is dropped. A batch that
//! fails while a valid one follows it means bytes were damaged inside the log: the entries
//! in it cannot be known, so the caller gives every stream a new epoch.

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
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
const BATCH_HEADER_LEN: usize = 20;
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
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(lsn) = name
            .to_str()
            .and_then(|n| n.strip_prefix("herald.wal."))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((lsn, entry.path()));
    }
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
    /// Where the valid batches end: appends continue here.
    pub end: usize,
    /// A batch failed while a later one is valid, or the header is bad: entries were lost
    /// inside the log, not at a torn tail.
    pub damaged: bool,
}

/// Reads a segment's bytes. Never panics, whatever they are.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut scan = Scan::default();
    let Some(h) = bytes.get(..HEADER_LEN) else {
        // A segment is created with its header synced before anything is appended: a
        // shorter one was never used.
        scan.damaged = !bytes.is_empty();
        return scan;
    };
    let crc = u32::from_le_bytes(h[24..28].try_into().unwrap_or_default());
    if &h[..8] != MAGIC || crc != crc32fast::hash(&h[..24]) {
        scan.damaged = true;
        return scan;
    }
    scan.run = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
    scan.first_lsn = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
    let mut pos = HEADER_LEN;
    let mut next_lsn = scan.first_lsn;
    while pos < bytes.len() {
        match read_batch(&bytes[pos..], next_lsn) {
            Ok((len, entries)) => {
                next_lsn += entries.len() as u64;
                scan.entries.extend(entries);
                pos += len;
            }
            Err(skip) => {
                // Valid bytes after a bad batch: damage inside the log, not a torn tail.
                scan.damaged = skip.is_some_and(|len| {
                    let rest = bytes.get(pos + len..).unwrap_or_default();
                    !rest.is_empty() && read_batch(rest, next_lsn).is_ok()
                        || rest.len() >= BATCH_HEADER_LEN && rest.iter().any(|b| *b != 0)
                });
                break;
            }
        }
    }
    scan.end = pos;
    scan
}

/// One batch at the start of `bytes`, numbered from `lsn`: its length and entries, or, if
/// it is not valid, its declared length when that is plausible (to look past it).
#[allow(clippy::type_complexity)]
fn read_batch(bytes: &[u8], lsn: u64) -> Result<(usize, Vec<(u64, Entry)>), Option<usize>> {
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
        let entry = r.entry().ok_or(Some(len))?;
        entries.push((lsn + i, entry));
    }
    if !r.0.is_empty() {
        return Err(Some(len));
    }
    Ok((len, entries))
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn text(&mut self, wide: bool) -> Option<String> {
        let len = if wide {
            u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize
        } else {
            self.u8()? as usize
        };
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
    fn entry(&mut self) -> Option<Entry> {
        Some(match self.u8()? {
            PUBLISH => {
                let channel = self.text(true)?;
                let epoch = self.text(false)?;
                let offset = self.u64()?;
                let at_ms = self.u64()?;
                let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
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

/// The segment being appended to. Its file is grown in chunks of zeros ahead of the
/// appends: a sync of bytes written into blocks the file already has flushes only them,
/// while one that also grows the file commits the file system's journal too (on this
/// machine 45 against 55 us of CPU per sync).
pub struct Segment {
    /// Shared with whoever syncs it without holding the log (see [`Segment::file`]).
    file: Arc<File>,
    pub first_lsn: u64,
    /// Bytes of valid batches: the next one goes here.
    pub len: u64,
    /// The file's size: zeros from `len` on.
    capacity: u64,
    /// The end of the last write tried, which may have left bytes after `len`.
    dirty_to: u64,
    /// Tests: the next sync fails, as a disk's error would make it.
    #[cfg(test)]
    pub fail_next_sync: bool,
}

/// How much a segment's file grows at a time.
const CHUNK: u64 = 1 << 20;

impl Segment {
    /// Creates the segment for entries from `first_lsn`, its header synced, and the
    /// directory synced so the file's name survives a crash.
    pub fn create(dir: &Path, run: u64, first_lsn: u64) -> io::Result<Self> {
        let path = segment_path(dir, first_lsn);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let mut segment = Self {
            file: Arc::new(file),
            first_lsn,
            len: HEADER_LEN as u64,
            capacity: 0,
            dirty_to: 0,
            #[cfg(test)]
            fail_next_sync: false,
        };
        segment.grow(CHUNK)?;
        segment.file.write_all_at(&header(run, first_lsn), 0)?;
        segment.file.sync_all()?;
        File::open(dir)?.sync_all()?;
        Ok(segment)
    }

    /// Grows the file with zeros to at least `size`, a page per write.
    ///
    /// Page by page because the kernel (Linux 6.18, ext4) caches a file written in 1 MiB
    /// writes in folios as large, and every later small write into such a folio costs
    /// 3-6x more (it walks the folio's blocks): 1.5-3.1 against 0.4-0.5 us per 300-byte
    /// append here. Zeros rather than `fallocate`, so a sync does not also commit the
    /// blocks' allocation.
    fn grow(&mut self, size: u64) -> io::Result<()> {
        const PAGE: usize = 4096;
        static ZEROS: [u8; PAGE] = [0; PAGE];
        // Every append calls this; it returns at once unless the file must grow.
        while self.capacity < size {
            self.dirty_to = self.dirty_to.max(self.capacity + CHUNK);
            for page in (0..CHUNK).step_by(PAGE) {
                self.file.write_all_at(&ZEROS, self.capacity + page)?;
            }
            self.capacity += CHUNK;
        }
        Ok(())
    }

    /// Writes a batch after the last good one; synced when `sync`.
    pub fn append(&mut self, bytes: &[u8], sync: bool) -> io::Result<()> {
        let end = self.len + bytes.len() as u64;
        self.grow(end)?;
        self.dirty_to = self.dirty_to.max(end);
        self.file.write_all_at(bytes, self.len)?;
        if sync {
            self.sync()?;
        }
        self.len = end;
        Ok(())
    }

    /// Makes every append so far durable.
    pub fn sync(&mut self) -> io::Result<()> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_sync) {
            return Err(io::Error::other("a sync failed on purpose"));
        }
        self.file.sync_data()
    }

    /// The file, to sync without holding the segment: a sync makes every append made
    /// before it durable, whoever made it.
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// After a failed append: zeros what it left after the last valid batch, and checks
    /// that the file can grow by 64 KiB again (a full disk has room again).
    pub fn recover(&mut self) -> io::Result<()> {
        if self.dirty_to > self.len {
            let left = (self.dirty_to - self.len) as usize;
            self.file.write_all_at(&vec![0u8; left], self.len)?;
        }
        self.file.set_len(self.capacity)?;
        self.file
            .write_all_at(&vec![0u8; 64 * 1024], self.capacity)?;
        self.file.sync_data()?;
        self.file.set_len(self.capacity)?;
        self.file.sync_all()?;
        self.dirty_to = self.capacity;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(channel: &str, offset: u64, data: &[u8]) -> Entry {
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
        assert_eq!((scan.run, scan.first_lsn, scan.damaged), (7, 40, false));
        assert_eq!(scan.end, bytes.len());
        let lsns: Vec<u64> = scan.entries.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, [40, 41, 42, 43]);
        assert_eq!(scan.entries[0].1, a[0]);
        assert_eq!(scan.entries[3].1, b[1]);
    }

    #[test]
    fn a_torn_last_batch_is_dropped_without_calling_it_damage() {
        let first = [publish("c", 1, b"one")];
        let second = [publish("c", 2, &[7u8; 300])];
        let whole = segment(1, 1, &[&first, &second]);
        let good = segment(1, 1, &[&first]).len();
        for cut in good..whole.len() {
            let scan = scan(&whole[..cut]);
            assert!(!scan.damaged, "cut at {cut}");
            assert_eq!(scan.end, good);
            assert_eq!(scan.entries.len(), 1);
        }
        // A torn write can also leave the right length with wrong bytes at the end.
        let mut torn = whole.clone();
        *torn.last_mut().unwrap() ^= 1;
        let scan = scan(&torn);
        assert!(!scan.damaged);
        assert_eq!((scan.entries.len(), scan.end), (1, good));
    }

    #[test]
    fn a_bad_batch_followed_by_a_good_one_is_damage() {
        let batches: [&[Entry]; 3] = [
            &[publish("c", 1, b"one")],
            &[publish("c", 2, b"two")],
            &[publish("c", 3, b"three")],
        ];
        let mut bytes = segment(1, 1, &batches);
        let second = segment(1, 1, &batches[..1]).len();
        bytes[second + BATCH_HEADER_LEN + 4] ^= 0x10; // inside the second batch's body
        let scan = scan(&bytes);
        assert!(scan.damaged);
        assert_eq!(scan.entries.len(), 1);
    }

    #[test]
    fn a_bad_header_is_damage_and_an_empty_file_is_not() {
        let mut bytes = segment(1, 1, &[&[publish("c", 1, b"x")]]);
        assert!(!scan(&[]).damaged);
        bytes[3] ^= 1;
        assert!(scan(&bytes).damaged);
        assert!(scan(&bytes[..10]).damaged);
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

    #[test]
    fn appends_survive_reopening_and_a_failed_append_is_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 3, 1).unwrap();
        let mut body = Vec::new();
        encode(&mut body, &publish("c", 1, b"x"));
        seg.append(&batch(1, 1, &body), true).unwrap();
        let good = seg.len;
        // What a failed append leaves behind, then the recovery.
        seg.file.write_all_at(b"partial garbage", good).unwrap();
        seg.dirty_to = good + 15;
        seg.recover().unwrap();
        let listed = segments(dir.path()).unwrap();
        assert_eq!(listed.len(), 1);
        let bytes = std::fs::read(&listed[0].1).unwrap();
        assert_eq!(bytes.len() as u64, CHUNK, "grown ahead, in zeros");
        assert!(bytes[good as usize..].iter().all(|b| *b == 0));
        let read = scan(&bytes);
        assert_eq!(
            (read.entries.len(), read.end as u64, read.damaged),
            (1, good, false)
        );
        // Appends go on after the valid batch, past a chunk's end too.
        let mut body = Vec::new();
        encode(&mut body, &publish("c", 2, &vec![1u8; CHUNK as usize]));
        seg.append(&batch(2, 1, &body), true).unwrap();
        let read = scan(&std::fs::read(&listed[0].1).unwrap());
        assert_eq!((read.entries.len(), read.damaged), (2, false));
    }
}
