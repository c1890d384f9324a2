//! Telling a torn tail from damage, where a segment's batches stop being valid.
//!
//! An append cut short by a crash is the last thing written to its segment. Of the 512-byte
//! sectors its write covered, some reached the disk and some did not, and those that did
//! not still hold what the segment held there before: zeros (a segment is grown with zeros
//! ahead of its appends, and bytes a failed append left are zeroed before the next). So an
//! invalid batch is damage, never a torn tail, when:
//!
//! - a valid batch follows it anywhere in the segment, or non-zero bytes follow its end;
//! - every sector it covers holds some of its bytes non-zero: every sector was written, so
//!   the append was whole, and its bytes changed after (a flipped bit, say);
//! - its bytes up to some other length pass its CRC: it was written whole, and its length
//!   changed after.
//!
//! What this cannot see: a bit flipped in a batch that also holds 512 zero bytes aligned on
//! a sector (a payload of zeros), which reads as a torn tail.

use super::wal::{read_batch, BATCH_HEADER_LEN};

const SECTOR: usize = 512;

/// Whether the invalid batch at `pos` of the segment `bytes` (its declared length `skip`
/// when plausible; its first entry should be `lsn`) is damage rather than a torn tail.
pub(super) fn damaged(bytes: &[u8], pos: usize, skip: Option<usize>, lsn: u64) -> bool {
    let followed = skip.is_some_and(|len| {
        let rest = bytes.get(pos + len..).unwrap_or_default();
        !rest.is_empty() && read_batch(rest, lsn).is_ok()
            || rest.len() >= BATCH_HEADER_LEN && rest.iter().any(|b| *b != 0)
    });
    // The length its header declares, though a count of 0 or a wrong number made it
    // invalid before its length was looked at.
    let declared = (bytes.get(pos..pos + 4))
        .map(|b| BATCH_HEADER_LEN + u32::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
        .filter(|len| *len > BATCH_HEADER_LEN);
    followed
        || declared.is_some_and(|len| every_sector_written(bytes, pos, len))
        || passes_at_another_length(bytes, pos)
        || valid_batch_after(bytes, pos, lsn)
}

/// Whether each sector that `pos..pos + len` covers holds a non-zero byte of it.
fn every_sector_written(bytes: &[u8], pos: usize, len: usize) -> bool {
    let end = pos + len;
    if end > bytes.len() {
        return false;
    }
    let mut at = pos;
    while at < end {
        let sector_end = ((at / SECTOR) + 1) * SECTOR;
        let part = &bytes[at..end.min(sector_end)];
        if part.iter().all(|b| *b == 0) {
            return false;
        }
        at = sector_end;
    }
    true
}

/// Whether the batch at `pos`, its declared length aside, passes its CRC at some length
/// within the segment's written bytes.
fn passes_at_another_length(bytes: &[u8], pos: usize) -> bool {
    let Some(head) = bytes.get(pos..pos + BATCH_HEADER_LEN) else {
        return false;
    };
    let count = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    let first = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(head[16..20].try_into().unwrap_or_default());
    if count == 0 {
        return false;
    }
    let body = &bytes[pos + BATCH_HEADER_LEN..];
    // A batch written whole ends at or before the segment's last non-zero byte.
    let written = body.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let mut h = crc32fast::Hasher::new();
    h.update(&count.to_le_bytes());
    h.update(&first.to_le_bytes());
    (0..written).any(|i| {
        h.update(&body[i..=i]);
        h.clone().finalize() == crc
    })
}

/// Whether a valid batch starts anywhere in `bytes` after `bad` (where the batch of entry
/// `lsn` failed), numbered past `lsn` by no more entries than the bytes between could hold:
/// so random bytes are turned down by their header, nearly always before a CRC is computed.
fn valid_batch_after(bytes: &[u8], bad: usize, lsn: u64) -> bool {
    let end = bytes.len().saturating_sub(BATCH_HEADER_LEN);
    (bad + 1..end).any(|at| {
        let rest = &bytes[at..];
        let first = rest
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        first > lsn && first - lsn <= (at - bad) as u64 && read_batch(rest, first).is_ok()
    })
}
