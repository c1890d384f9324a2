//! The format of a packed file (what compaction and a migration write): a magic, then
//! publications encoded as in the log, each framed by its length and CRC-32, so that the
//! file can be read without the index (`rebuild`). The index points at an entry's own
//! bytes, after its frame, as it points into the log.
//!
//! Files of the first format (`HRLDPCK1`, entries without frames) are still read through
//! the index; without it they cannot be read, and are set aside.

use super::disk::Appender;
use super::wal::Span;

/// Magic at the start of a packed file of this format.
pub(crate) const MAGIC: &[u8; 8] = b"HRLDPCK2";
/// Magic of the first format, whose entries have no frames.
#[cfg(test)]
const MAGIC_UNFRAMED: &[u8; 8] = b"HRLDPCK1";
/// Bytes before each entry: its length and CRC-32.
pub(crate) const FRAME_LEN: u64 = 8;

/// Writes `entry` framed at `pos` (where the appender is); its span (the entry's own bytes),
/// or `None` when it would end past what a span can say.
pub(crate) fn put(out: &mut Appender, pos: u64, entry: &[u8]) -> std::io::Result<Option<Span>> {
    let Some(span) = Span::of(pos + FRAME_LEN, entry) else {
        return Ok(None);
    };
    out.write_all(&span.len.to_le_bytes())?;
    out.write_all(&span.crc.to_le_bytes())?;
    out.write_all(entry)?;
    Ok(Some(span))
}

/// The entries of a packed file of this format, in order, up to the first that is not
/// valid (a pack is written whole and synced before anything points into it: what follows
/// a bad frame belongs to a copy cut short, or is damage). `None` for another format.
pub(crate) fn entries(bytes: &[u8]) -> Option<Vec<Span>> {
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return None;
    }
    let mut found = Vec::new();
    let mut pos = MAGIC.len();
    while let Some(frame) = bytes.get(pos..pos + FRAME_LEN as usize) {
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().unwrap_or_default());
        let start = pos + FRAME_LEN as usize;
        let Some(entry) = bytes.get(start..start + len).filter(|_| len > 0) else {
            break;
        };
        match Span::of(start as u64, entry) {
            Some(span) if span.crc == crc => found.push(span),
            _ => break,
        }
        pos = start + len;
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::disk::Dir;

    #[test]
    fn framed_entries_read_back_without_the_index() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::os(tmp.path());
        let path = dir.join("p");
        let mut out = Appender::new(dir.disk().create(&path).unwrap());
        out.write_all(MAGIC).unwrap();
        let mut pos = MAGIC.len() as u64;
        let mut spans = Vec::new();
        for entry in [&b"first"[..], b"second entry", b"3"] {
            spans.push(put(&mut out, pos, entry).unwrap().unwrap());
            pos += FRAME_LEN + entry.len() as u64;
        }
        out.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(entries(&bytes), Some(spans.clone()));
        let s = spans[1];
        assert_eq!(
            &bytes[s.pos as usize..(s.pos + s.len) as usize],
            b"second entry"
        );
        // A damaged entry ends what is read; another format is not read at all.
        let mut damaged = bytes.clone();
        damaged[s.pos as usize] ^= 1;
        assert_eq!(entries(&damaged), Some(spans[..1].to_vec()));
        let mut old = bytes;
        old[..8].copy_from_slice(MAGIC_UNFRAMED);
        assert_eq!(entries(&old), None);
    }
}
