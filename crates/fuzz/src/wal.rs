//! The durable store's write-ahead log segments, as replay at open reads them.

use herald_broker::wal::{self, Entry};

use crate::decoder::Decoder;

/// Valid segments: publications, a reset and a forget, in one batch and in several.
pub fn corpus() -> Vec<Vec<u8>> {
    let publish = |offset| Entry::Publish {
        channel: "chat:lobby".into(),
        epoch: "8f3a2c1d".into(),
        offset,
        at_ms: 1_790_000_000_000 + offset,
        data: br#"{"text":"hi"}"#.to_vec(),
    };
    let others = [
        Entry::Reset {
            channel: "chat:lobby".into(),
            epoch: "77aa01".into(),
            at_ms: 1_790_000_000_500,
        },
        Entry::Forget {
            channel: "room:1".into(),
        },
    ];
    let one = segment(9, 1, &[&[publish(1), publish(2)]]);
    let several = segment(9, 40, &[&[publish(3)], &others, &[publish(1)]]);
    // Bodies, for the decoder's second reading (a count byte, then entries).
    let mut body = vec![2u8];
    for e in [publish(7)].iter().chain(&others) {
        wal::encode(&mut body, e);
    }
    vec![one, several, body]
}

fn segment(run: u64, first_lsn: u64, batches: &[&[Entry]]) -> Vec<u8> {
    let mut out = wal::header(run, first_lsn).to_vec();
    let mut lsn = first_lsn;
    for entries in batches {
        let mut body = Vec::new();
        for e in *entries {
            wal::encode(&mut body, e);
        }
        out.extend(wal::batch(lsn, entries.len() as u32, &body));
        lsn += entries.len() as u64;
    }
    out
}

/// Reads the input as a segment; what it finds, written again, must read back the same;
/// every cut of that reads no entry it did not hold; and, written a batch per entry, a bit
/// flipped anywhere is never read as a torn tail (issue #57: a flipped length bit was, and
/// the entries after it were dropped without a word), except in a last batch with a sector
/// of zeros, which is what a torn append leaves.
pub fn decoder() -> Decoder {
    Box::new(|input| {
        // The input as a batch's body under a valid CRC too, so that the entry decoder
        // sees arbitrary bytes (a CRC stops nearly all of them otherwise).
        if let Some((&count, body)) = input.split_first() {
            if !body.is_empty() {
                let mut framed = wal::header(1, 1).to_vec();
                framed.extend(wal::batch(1, u32::from(count % 8) + 1, body));
                check(&framed);
            }
        }
        check(input);
    })
}

fn check(input: &[u8]) {
    {
        let found = wal::scan(input);
        assert!(found.end <= input.len().max(wal::HEADER_LEN));
        if found.entries.is_empty() {
            return;
        }
        let entries: Vec<Entry> = found.entries.iter().map(|(_, e)| e.clone()).collect();
        let again = segment(found.run, found.first_lsn, &[&entries]);
        let read = wal::scan(&again);
        assert!(!read.damaged());
        let numbered = |s: &wal::Scan| s.entries.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>();
        assert_eq!(numbered(&read), entries);
        if found.lost.is_empty() {
            assert_eq!(read.entries, found.entries);
        }
        let step = (again.len() / 7).max(1);
        for cut in (wal::HEADER_LEN..again.len()).step_by(step) {
            let torn = wal::scan(&again[..cut]);
            assert!(torn.entries.is_empty(), "a cut at {cut} read entries");
        }
        if entries.len() < 2 {
            return;
        }
        let apart: Vec<&[Entry]> = entries.chunks(1).collect();
        let apart = segment(found.run, found.first_lsn, &apart);
        let last = segment(found.run, found.first_lsn, &[&entries[..entries.len() - 1]]).len();
        let step = ((apart.len() - wal::HEADER_LEN) / 17).max(1);
        for at in (wal::HEADER_LEN..apart.len()).step_by(step) {
            for bit in [0, 3, 7] {
                let mut flipped = apart.clone();
                flipped[at] ^= 1 << bit;
                // In the last batch a flip is damage too, unless a sector of it holds only
                // zeros, as a torn append would leave it.
                if at >= last && zero_sector(&flipped[..], last) {
                    continue;
                }
                let read = wal::scan(&flipped);
                assert!(
                    read.damaged() || numbered(&read) == entries,
                    "a flip at {at} (bit {bit}) dropped entries as a torn tail"
                );
            }
        }
    }
}

/// Whether some 512-byte sector that the bytes from `from` on cover holds only zeros of
/// them.
fn zero_sector(bytes: &[u8], from: usize) -> bool {
    let mut at = from;
    while at < bytes.len() {
        let end = ((at / 512 + 1) * 512).min(bytes.len());
        if bytes[at..end].iter().all(|b| *b == 0) {
            return true;
        }
        at = end;
    }
    false
}
