use std::sync::Arc;

use herald_protocol::Epoch;

use super::format::{Record, Source};
use super::*;
use crate::durable::index::Loc;
use crate::durable::wal::Span;

fn loc(file: FileId, pos: u32, at_ms: u64) -> Loc {
    Loc {
        file,
        span: Span {
            pos,
            len: 40,
            crc: 0xdead_beef,
        },
        at_ms,
    }
}

fn sample() -> Checkpoint {
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
                    locs: [loc(3, 32, 70), loc(3, 72, 77)].into(),
                },
            ),
            ("chat:b".into(), Stream::new(Epoch::new("xyz"), 3, 5)),
        ],
        chain: Chain::default(),
    }
}

fn sorted(mut c: Checkpoint) -> Checkpoint {
    c.streams.sort_by(|a, b| a.0.cmp(&b.0));
    c
}

/// Reads a whole file's bytes: its head and records, or the first error.
fn parse(bytes: &[u8]) -> io::Result<(Part, u64, Head, Vec<Record>)> {
    let (mut source, part, seq, head) = Source::start(bytes)?;
    let mut records = Vec::new();
    while let Some(r) = source.next()? {
        records.push(r);
    }
    Ok((part, seq, head, records))
}

fn tmp_dir() -> (tempfile::TempDir, Dir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = Dir::os(tmp.path());
    (tmp, dir)
}

#[test]
fn a_base_reads_back_as_written() {
    let (_tmp, dir) = tmp_dir();
    assert_eq!(read(&dir), Ok(None));
    let c = sample();
    let bytes = base(5, &c.head, c.streams.iter().map(|(n, s)| (n, s)));
    write_base(&dir, 5, &bytes).unwrap();
    let found = read(&dir).unwrap().unwrap();
    let chain = Chain {
        base_seq: 5,
        base_bytes: bytes.len() as u64,
        seq: 5,
        delta_bytes: 0,
    };
    assert_eq!(found.chain, chain);
    assert_eq!(sorted(found), Checkpoint { chain, ..sample() });
    std::fs::write(dir.join(FILE_NAME), b"nonsense").unwrap();
    assert!(read(&dir).is_err());
}

#[test]
fn any_damage_or_truncation_is_refused() {
    let c = sample();
    let good = base(1, &c.head, c.streams.iter().map(|(n, s)| (n, s)));
    assert!(parse(&good).is_ok());
    for cut in 0..good.len() {
        assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
    }
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        assert!(parse(&bad).is_err(), "byte {i} flipped");
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(parse(&longer).is_err());
}

/// A kept publication the checkpoint places past the end of its file (or in a file it
/// does not list) is refused with the checkpoint, as damage is.
#[test]
fn a_publication_past_its_file_is_refused() {
    for change in [
        |c: &mut Checkpoint| c.head.files[0].2 = 100, // chat:a's second ends at 112
        |c: &mut Checkpoint| {
            c.head.files.remove(0);
        },
    ] {
        let (_tmp, dir) = tmp_dir();
        let mut c = sample();
        change(&mut c);
        let bytes = base(1, &c.head, c.streams.iter().map(|(n, s)| (n, s)));
        write_base(&dir, 1, &bytes).unwrap();
        assert!(read(&dir).is_err());
    }
}

/// An index changed at random (publications, trims, resets, forgets, moves, new epochs),
/// with a delta written now and then and the deltas merged now and then: what is read
/// back is the index, every time.
#[test]
fn deltas_and_merges_read_back_as_the_index() {
    for seed in 0..40 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (_tmp, dir) = tmp_dir();
        let mut index = Index::default();
        index.journal = Some(Vec::new());
        for id in 0..3 {
            let file = Arc::new(tempfile::tempfile().unwrap());
            index.add_file(id, Kind::Log { first_lsn: 1 }, file, 1 << 30);
        }
        let head = |index: &Index| head_of(index, 9, None, false);
        let bytes = base(1, &head(&index), &index.streams);
        write_base(&dir, 1, &bytes).unwrap();
        let mut seq = 1;
        let channels = ["a", "b", "c", "d", "e"];
        let epochs = [Epoch::new("e1"), Epoch::new("e2")];
        let mut pos = 0u32;
        for step in 0..400u64 {
            let channel = channels[rng.usize(..channels.len())];
            match rng.u32(..100) {
                0..60 => {
                    let epoch = &epochs[rng.usize(..2)];
                    let next = (index.streams.get(channel))
                        .filter(|s| s.epoch == *epoch)
                        .map_or(1, |s| s.top + 1 + u64::from(rng.u32(..20) == 0));
                    pos += 40;
                    let at = loc(rng.u32(..3), pos, step);
                    index.publish(channel, epoch, next, at, rng.usize(..12));
                }
                60..70 => index.keep_newest(channel, rng.usize(..6)),
                70..75 => drop(index.trim(channel, step.saturating_sub(30))),
                75..78 => index.reset(channel, &epochs[rng.usize(..2)], step),
                78..81 => index.forget(channel),
                81..84 => index.drop_damaged(channel),
                84..85 => drop(index.renew_epochs()),
                _ => {
                    if let Some(s) = index.streams.get(channel).filter(|s| !s.locs.is_empty()) {
                        let (epoch, offset) =
                            (s.epoch.clone(), s.first + rng.u64(..s.locs.len() as u64));
                        pos += 40;
                        index.moved(channel, &epoch, offset, loc(rng.u32(..3), pos, step));
                    }
                }
            }
            if rng.u32(..10) == 0 {
                seq += 1;
                let journal = std::mem::take(index.journal.as_mut().unwrap());
                write_delta(&dir, seq, &delta(Vec::new(), seq, &head(&index), &journal)).unwrap();
                if rng.u32(..4) == 0 {
                    assert!(merge(&dir, seq).unwrap().is_some(), "seed {seed}");
                }
                let found = read(&dir).unwrap().unwrap();
                assert_eq!(found.chain.seq, seq);
                let streams: HashMap<_, _> = found.streams.into_iter().collect();
                assert_eq!(streams, index.streams, "seed {seed} step {step}");
            }
        }
    }
}

#[test]
fn a_missing_delta_is_refused_and_those_a_base_holds_are_skipped() {
    let (_tmp, dir) = tmp_dir();
    let c = sample();
    write_base(
        &dir,
        3,
        &base(3, &c.head, c.streams.iter().map(|(n, s)| (n, s))),
    )
    .unwrap();
    // Left by a merge cut short: older than the base, skipped.
    write_delta(&dir, 2, &delta(Vec::new(), 2, &c.head, &[])).unwrap();
    write_delta(&dir, 4, &delta(Vec::new(), 4, &c.head, &[])).unwrap();
    assert_eq!(read(&dir).unwrap().unwrap().chain.seq, 4);
    write_delta(&dir, 6, &delta(Vec::new(), 6, &c.head, &[])).unwrap();
    let why = read(&dir).unwrap_err();
    assert!(why.contains("missing"), "{why}");
    // A delta under another's name.
    std::fs::rename(dir.join(delta_name(6)), dir.join(delta_name(5))).unwrap();
    assert!(read(&dir).is_err());
}
