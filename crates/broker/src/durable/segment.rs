//! The log segment being appended to: its file, grown ahead of the appends, synced as the
//! writer asks, and cut to its size when no more goes into it. The format of what is
//! appended is [`super::wal`]'s.

use std::io;

use super::disk::{Dir, Handle};
use super::wal::{header, segment_path, HEADER_LEN};

/// The segment being appended to. Its file is grown in chunks of zeros ahead of the
/// appends: a sync of bytes written into blocks the file already has flushes only them,
/// while one that also grows the file commits the file system's journal too (on this
/// machine 45 against 55 us of CPU per sync).
pub struct Segment {
    /// Shared with whoever syncs it without holding the log (see [`Segment::file`]).
    file: Handle,
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

/// What the name of a segment being made ends with, until it is whole.
pub const UNFINISHED: &str = ".tmp";

/// How much a segment's file grows at a time.
const CHUNK: u64 = 1 << 20;

impl Segment {
    /// Creates the segment for entries from `first_lsn`, its header synced, and the
    /// directory synced so the file's name survives a crash. It is made under a name of
    /// its own and renamed into place once whole: a crash while its zeros were written
    /// left a file without a header under the segment's name, which the next open read as
    /// damage (every channel a new epoch). What such a crash leaves now is a `.tmp` file no
    /// reader looks at, which the next open deletes.
    pub fn create(dir: &Dir, run: u64, first_lsn: u64) -> io::Result<Self> {
        let path = segment_path(dir, first_lsn);
        let mut unfinished = path.clone().into_os_string();
        unfinished.push(UNFINISHED);
        let unfinished = std::path::PathBuf::from(unfinished);
        let mut segment = Self {
            file: dir.disk().create(&unfinished)?,
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
        dir.disk().rename(&unfinished, &path)?;
        dir.sync()?;
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

    /// Closes a segment no more is appended to: the zeros grown ahead of its appends are
    /// cut off (best effort: they are only space).
    pub fn seal(&self) {
        if let Err(e) = self.file.set_len(self.len) {
            tracing::warn!(error = %e, "a full log segment could not be cut to its size");
        }
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
    pub fn file(&self) -> Handle {
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
    use crate::durable::wal::{batch, encode, scan, segments, tests::publish};

    #[test]
    fn appends_survive_reopening_and_a_failed_append_is_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(&Dir::os(dir.path()), 3, 1).unwrap();
        let mut body = Vec::new();
        encode(&mut body, &publish("c", 1, b"x"));
        seg.append(&batch(1, 1, &body), true).unwrap();
        let good = seg.len;
        // What a failed append leaves behind, then the recovery.
        seg.file.write_all_at(b"partial garbage", good).unwrap();
        seg.dirty_to = good + 15;
        seg.recover().unwrap();
        let listed = segments(&Dir::os(dir.path())).unwrap();
        assert_eq!(listed.len(), 1);
        let bytes = std::fs::read(&listed[0].1).unwrap();
        assert_eq!(bytes.len() as u64, CHUNK, "grown ahead, in zeros");
        assert!(bytes[good as usize..].iter().all(|b| *b == 0));
        let read = scan(&bytes);
        assert_eq!(
            (read.entries.len(), read.end as u64, read.damaged()),
            (1, good, false)
        );
        // Appends go on after the valid batch, past a chunk's end too.
        let mut body = Vec::new();
        encode(&mut body, &publish("c", 2, &vec![1u8; CHUNK as usize]));
        seg.append(&batch(2, 1, &body), true).unwrap();
        let read = scan(&std::fs::read(&listed[0].1).unwrap());
        assert_eq!((read.entries.len(), read.damaged()), (2, false));
    }
}
