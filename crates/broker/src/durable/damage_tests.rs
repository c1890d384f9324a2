//! The durable store against damage: a checkpoint or a record that fails its check, files
//! cut short or missing, a compaction or checkpoint cut short.

use super::disk::Dir;
use super::tests::{ch, offsets, open, publish_long_runs, read_all, since};
use super::*;
use crate::conformance::Recorder;

/// Issue #57 item 4: a damaged `herald.index` stopped the store from starting (its remedy,
/// moving it away, lost packed history). Now it is set aside and the index is rebuilt from
/// the data files: every publication kept, each channel in a new epoch.
#[tokio::test]
async fn a_damaged_checkpoint_is_set_aside_and_the_index_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, records) = {
        let (broker, _) = open(dir.path());
        let mut records = Vec::new();
        for i in 0..200 {
            let record = Bytes::from(format!("\"{}\"", "x".repeat(i)));
            broker
                .publish(&ch("a"), record.clone(), StreamPolicy::default())
                .await
                .unwrap();
            records.push(record);
        }
        (
            read_all(&broker, "a", &Epoch::new("x"))
                .await
                .position
                .epoch,
            records,
        )
    };
    // The base and the newest delta, each cut short and scribbled over.
    let newest_delta = || {
        let deltas = checkpoint::deltas(&Dir::os(dir.path())).unwrap();
        deltas.last().expect("a delta").1.clone()
    };
    let base = dir.path().join(checkpoint::FILE_NAME);
    let mut epochs = vec![epoch];
    for (which, cut) in [(0, true), (0, false), (1, true), (1, false)] {
        let file = if which == 0 {
            base.clone()
        } else {
            newest_delta()
        };
        let bytes = std::fs::read(&file).unwrap();
        let bad = if cut {
            bytes[..bytes.len() / 3].to_vec()
        } else {
            let mut scribbled = bytes.clone();
            scribbled[9..bytes.len().min(64)].fill(0x5a);
            scribbled
        };
        std::fs::write(&file, &bad).unwrap();
        let (broker, _) = open(dir.path());
        let h = broker.history(&ch("a"), everything()).await.unwrap();
        assert!(!epochs.contains(&h.position.epoch), "a new epoch");
        epochs.push(h.position.epoch.clone());
        let read: Vec<&Bytes> = h.publications.iter().map(|p| &p.record).collect();
        assert_eq!(read, records.iter().collect::<Vec<_>>());
        assert_eq!(offsets(&h), (1..=200).collect::<Vec<_>>());
        let aside = std::path::PathBuf::from(format!("{}.damaged", file.display()));
        assert!(std::fs::read(aside).unwrap() == bad, "kept for a look");
        drop(broker);
        // Opened and closed once more: deltas after the rebuilt base, for the next round.
        let (broker, _) = open(dir.path());
        drop(broker);
    }
}

/// Moving a damaged checkpoint away, as its error says, rebuilds the index from the log
/// while the log still holds everything from its first entry.
#[tokio::test]
async fn without_its_checkpoint_the_index_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "a", 30).await
    };
    std::fs::remove_file(dir.path().join(checkpoint::FILE_NAME)).unwrap();
    let (broker, _) = open(dir.path());
    let h = read_all(&broker, "a", &epoch).await;
    assert_eq!(offsets(&h), (1..=30).collect::<Vec<_>>());
}

/// A read of a channel's newest 1,000 publications.
fn everything() -> HistoryQuery {
    HistoryQuery {
        since: None,
        limit: 1000,
        max_bytes: None,
    }
}

/// Changes a byte of every stored publication whose run of `Q` holds `marker` (its number),
/// in whichever file holds it.
fn damage_records(dir: &Path, markers: &[usize]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.starts_with("herald.wal.") && !name.starts_with("herald.pack.") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        for marker in markers {
            let needle = format!("QQQQ{marker}\"");
            let found = bytes
                .windows(needle.len())
                .position(|w| w == needle.as_bytes());
            if let Some(at) = found {
                bytes[at] = b'R';
            }
        }
        std::fs::write(&path, &bytes).unwrap();
    }
}

/// Records that fail their checksums are never served: their channel's history is
/// dropped and it starts a new epoch when a read finds them; an intact one keeps
/// everything.
#[tokio::test]
async fn damaged_records_reset_their_channel_instead_of_being_served() {
    let dir = tempfile::tempdir().unwrap();
    let (damaged_epoch, intact_epoch) = {
        let (broker, _) = open(dir.path());
        let damaged = publish_long_runs(&broker, "hit", 300).await;
        let intact = broker
            .publish(&ch("intact"), Bytes::from("1"), StreamPolicy::default())
            .await
            .unwrap()
            .epoch;
        (damaged, intact)
    };
    damage_records(dir.path(), &[10, 150, 290]);

    let (broker, _) = open(dir.path());
    let hit = broker.history(&ch("hit"), everything()).await.unwrap();
    assert_ne!(
        hit.position.epoch, damaged_epoch,
        "a damaged channel gets a new epoch"
    );
    assert!(hit.publications.is_empty());
    let resume = broker
        .history(
            &ch("hit"),
            HistoryQuery {
                since: since(10, &damaged_epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(
        matches!(resume, Err(BrokerError::Unrecoverable { .. })),
        "resuming clients are told"
    );
    let intact = broker.history(&ch("intact"), everything()).await.unwrap();
    assert_eq!(intact.position.epoch, intact_epoch);
    assert_eq!(offsets(&intact), [1]);
}

/// What a crash in the middle of compaction or of a checkpoint leaves: a packed file the
/// checkpoint does not know yet, and a checkpoint's unfinished copy. Both are ignored and
/// deleted at the next open, and history reads back from where the checkpoint says.
#[tokio::test]
async fn a_compaction_or_checkpoint_cut_short_is_cleared_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "a", 10).await
    };
    let orphan = index::packed_path(dir.path(), 999);
    std::fs::write(&orphan, b"HRLDPCK1 half-written").unwrap();
    let tmp = dir.path().join(format!("{}.tmp", checkpoint::FILE_NAME));
    std::fs::write(&tmp, b"half a checkpoint").unwrap();
    let (broker, _) = open(dir.path());
    assert!(!orphan.exists() && !tmp.exists());
    let h = read_all(&broker, "a", &epoch).await;
    assert_eq!(offsets(&h), (1..=10).collect::<Vec<_>>());
}

/// A file cut short under its channel (a disk or an operator truncated it): the read that
/// reaches past its end serves nothing of it, and the channel starts a new epoch.
#[tokio::test]
async fn a_file_cut_short_resets_the_channel_that_reads_past_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "a", 20).await
    };
    let (_, segment) = wal::segments(&Dir::os(dir.path())).unwrap().remove(0);
    let len = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (broker, _) = open(dir.path());
    let h = broker.history(&ch("a"), everything()).await.unwrap();
    assert_ne!(h.position.epoch, epoch);
    assert!(h.publications.is_empty());
    let resume = broker
        .history(
            &ch("a"),
            HistoryQuery {
                since: since(3, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await;
    assert!(matches!(resume, Err(BrokerError::Unrecoverable { .. })));
}

/// A file the checkpoint points into that is gone: the channels kept there lose their
/// history and start a new epoch at the next open; the others keep everything.
#[tokio::test]
async fn a_missing_file_drops_the_history_kept_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let gone_epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "gone", 5).await
    };
    let first = wal::segments(&Dir::os(dir.path())).unwrap().remove(0).1;
    let kept_epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "kept", 5).await
    };
    std::fs::remove_file(first).unwrap();
    let (broker, _) = open(dir.path());
    let gone = broker.history(&ch("gone"), everything()).await.unwrap();
    assert_ne!(gone.position.epoch, gone_epoch);
    assert!(gone.publications.is_empty());
    let kept = read_all(&broker, "kept", &kept_epoch).await;
    assert_eq!(offsets(&kept), [1, 2, 3, 4, 5]);
}

/// Issue #57 defect 3: readers that reached one damaged publication at once each reset the
/// channel (3 to 16 times with 16 readers), and a later reset dropped what was published
/// and acknowledged after an earlier one. Now a reader resets the channel only in the
/// epoch it read: one new epoch, and every publication acknowledged in it kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_of_one_damaged_record_reset_its_channel_once() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let damaged = {
            let (broker, _) = open(dir.path());
            publish_long_runs(&broker, "hit", 50).await
        };
        damage_records(dir.path(), &[25]);
        let (broker, _) = open(dir.path());
        let readers: Vec<_> = (0..16)
            .map(|_| {
                let broker = broker.clone();
                tokio::spawn(async move {
                    broker
                        .history(&ch("hit"), everything())
                        .await
                        .unwrap()
                        .position
                        .epoch
                })
            })
            .collect();
        let mut acknowledged = Vec::new();
        for i in 0..24 {
            let p = broker
                .publish(
                    &ch("hit"),
                    Bytes::from(i.to_string()),
                    StreamPolicy::default(),
                )
                .await
                .unwrap();
            acknowledged.push(p);
        }
        for reader in readers {
            reader.await.unwrap();
        }
        let now = broker.history(&ch("hit"), everything()).await.unwrap();
        let epoch = &now.position.epoch;
        assert_ne!(epoch, &damaged, "round {round}");
        // Published in the new epoch: every one still there; in the old (before any reader
        // reset it): gone with the damaged history, as a reset does.
        let kept: Vec<u64> = acknowledged
            .iter()
            .filter(|p| &p.epoch == epoch)
            .map(|p| p.offset)
            .collect();
        let epochs: std::collections::BTreeSet<&str> =
            acknowledged.iter().map(|p| p.epoch.as_str()).collect();
        assert!(
            epochs
                .iter()
                .all(|e| *e == epoch.as_str() || *e == damaged.as_str()),
            "round {round}: the channel was reset more than once ({epochs:?})"
        );
        assert_eq!(offsets(&now), kept, "round {round}");
    }
}

/// Issue #57 defect 8: an open without `herald.index` (the remedy its error named) kept 0
/// of the publications compaction had packed: packed files had no framing, so nothing
/// could read them without the index. Their entries are framed now, and the index is
/// rebuilt from them and the log: every kept publication comes back, in a new epoch.
#[tokio::test]
async fn without_its_checkpoint_packed_history_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (options, policies, ..) = super::tests::packed_store(dir.path()).await;
    let (_, packed) = super::tests::store_bytes(dir.path());
    assert!(packed, "nothing was packed");
    let read = |broker: Arc<DurableBroker>| async move {
        let mut found = Vec::new();
        for channel in ["quiet", "churn"] {
            let h = broker.history(&ch(channel), everything()).await.unwrap();
            found.push((h.position, h.publications));
        }
        found
    };
    let open_it = || {
        DurableBroker::open_with(
            dir.path(),
            options,
            Arc::new(Recorder::default()),
            policies.clone(),
        )
        .unwrap()
    };
    let before = read(open_it()).await;
    std::fs::remove_file(dir.path().join(checkpoint::FILE_NAME)).unwrap();
    let after = read(open_it()).await;
    assert_eq!(before[0].1.len(), 300, "the quiet channel keeps all it got");
    for ((was, kept), (now, rebuilt)) in before.iter().zip(&after) {
        assert_ne!(was.epoch, now.epoch, "a new epoch");
        assert_eq!(was.offset, now.offset);
        assert!(kept == rebuilt, "the same publications");
    }
}
