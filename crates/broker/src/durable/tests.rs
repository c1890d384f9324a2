use std::sync::Arc;

use herald_protocol::Since;

use redb::ReadableTable;

use super::*;

use crate::conformance::Recorder;

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

fn open(dir: &Path) -> (Arc<DurableBroker>, Arc<Recorder>) {
    let sink = Arc::new(Recorder::default());
    (
        DurableBroker::open(dir, SyncPolicy::Group, sink.clone()).unwrap(),
        sink,
    )
}

fn offsets(h: &History) -> Vec<u64> {
    h.publications.iter().map(|p| p.offset).collect()
}

fn since(offset: u64, epoch: &Epoch) -> Option<Since> {
    Some(Since {
        offset,
        epoch: Some(epoch.clone()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fulfils_the_broker_contract() {
    let dir = tempfile::tempdir().unwrap();
    let next = std::sync::atomic::AtomicUsize::new(0);
    crate::conformance::run_all(|sink| {
        let sub = dir.path().join(
            next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .to_string(),
        );
        DurableBroker::open(&sub, SyncPolicy::Group, sink).unwrap()
    })
    .await;
}

#[tokio::test]
async fn offsets_epochs_and_history_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = ch("chat:a");
    let epoch = {
        let (broker, sink) = open(dir.path());
        let mut epoch = None;
        for i in 1..=5u64 {
            let p = broker
                .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
                .await
                .unwrap();
            assert_eq!(p.offset, i);
            epoch = Some(p.epoch);
        }
        assert_eq!(
            sink.offsets("chat:a"),
            [1, 2, 3, 4, 5],
            "fanned out in order, after commit"
        );
        epoch.unwrap()
    };
    let (broker, _) = open(dir.path());
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: since(2, &epoch),
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(offsets(&h), [3, 4, 5]);
    assert_eq!(h.publications[0].record, Bytes::from("3"));
    assert_eq!(
        h.position,
        StreamPosition {
            offset: 5,
            epoch: epoch.clone()
        }
    );
    let next = broker
        .publish(&c, Bytes::from("6"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(next, StreamPosition { offset: 6, epoch });
}

#[tokio::test]
async fn removed_history_gets_a_new_epoch_that_is_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let c = ch("a");
    let (broker, _) = open(dir.path());
    let before = broker
        .publish(&c, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    broker.remove_history(&c).await.unwrap();
    let after = broker
        .publish(&c, Bytes::from("2"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(after.offset, 1);
    assert_ne!(after.epoch, before.epoch);
    drop(broker);
    let (broker, _) = open(dir.path());
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: None,
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(h.position, after);
    assert_eq!(offsets(&h), [1]);
}

#[tokio::test]
async fn a_damaged_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (broker, _) = open(dir.path());
        for i in 0..200 {
            broker
                .publish(
                    &ch("a"),
                    Bytes::from(format!("\"{}\"", "x".repeat(i))),
                    StreamPolicy::default(),
                )
                .await
                .unwrap();
        }
    }
    let file = dir.path().join(store::FILE_NAME);
    let len = std::fs::metadata(&file).unwrap().len();
    // Truncated.
    let truncated = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(
        truncated.path().join(store::FILE_NAME),
        &bytes[..(len / 3) as usize],
    )
    .unwrap();
    // Overwritten header.
    let scribbled = tempfile::tempdir().unwrap();
    let mut bad = bytes.clone();
    bad[..512].fill(0x5a);
    std::fs::write(scribbled.path().join(store::FILE_NAME), &bad).unwrap();
    for dir in [truncated.path(), scribbled.path()] {
        let err =
            DurableBroker::open(dir, SyncPolicy::Group, Arc::new(Recorder::default())).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, OpenError::Damaged { .. }), "{message}");
        assert!(
            message.contains(store::FILE_NAME) && message.contains("new epoch"),
            "{message}"
        );
    }
}

/// Publishes `count` strings of 200 bytes, mostly a run of `Q` that only stored payloads
/// hold (so a test can find them in the file); returns the epoch.
async fn publish_long_runs(broker: &DurableBroker, channel: &str, count: usize) -> Epoch {
    let mut epoch = None;
    for i in 0..count {
        let p = broker
            .publish(
                &ch(channel),
                Bytes::from(format!("\"{:Q>200}\"", i)),
                StreamPolicy::default(),
            )
            .await
            .unwrap();
        epoch = Some(p.epoch);
    }
    epoch.expect("count > 0")
}

/// Records that fail Herald's own checksums (while redb's pages are intact) are never
/// served: their channel starts a new epoch, an intact one keeps everything.
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
    // Three records whose data no longer matches their checksum, written through redb so
    // its own page checksums still pass: what a bug or another program could leave.
    {
        let db = redb::Database::create(dir.path().join(store::FILE_NAME)).unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut table = write.open_table(store::PUBLICATIONS).unwrap();
            for offset in [10u64, 150, 290] {
                let (at, crc) = {
                    let old = table.get(("hit", offset)).unwrap().unwrap();
                    let (at, crc, _) = old.value();
                    (at, crc)
                };
                table
                    .insert(("hit", offset), (at, crc, &b"\"altered\""[..]))
                    .unwrap();
            }
        }
        write.commit().unwrap();
    }

    let (broker, _) = open(dir.path());
    let hit = broker
        .history(
            &ch("hit"),
            HistoryQuery {
                since: None,
                limit: 1000,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
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
    let intact = broker
        .history(
            &ch("intact"),
            HistoryQuery {
                since: None,
                limit: 10,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(intact.position.epoch, intact_epoch);
    assert_eq!(offsets(&intact), [1]);
}

/// Bytes damaged on disk fail redb's page checksums, which are checked at every open: the
/// file is refused with its name, before anything reads or writes it (a damaged page can
/// make redb panic inside a destructor, which would abort the process).
#[tokio::test]
async fn a_damaged_page_is_refused_before_anything_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "hit", 300).await;
    }
    let file = dir.path().join(store::FILE_NAME);
    let mut bytes = std::fs::read(&file).unwrap();
    // One byte in the middle of a long run of `Q`: only a stored payload holds those.
    let run = bytes
        .windows(150)
        .position(|w| w.iter().all(|b| *b == b'Q'))
        .unwrap();
    bytes[run + 75] = b'R';
    std::fs::write(&file, &bytes).unwrap();
    let err = DurableBroker::open(dir.path(), SyncPolicy::Group, Arc::new(Recorder::default()))
        .unwrap_err();
    assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );
}

/// A clean stop seals the file, and the next open trusts it instead of reading every page
/// (restart time stays flat as history grows), serving the same history. No seal exists
/// while a store is open, so a crash leaves none and the open after it checks everything;
/// so does an open after anything wrote to the file, even the same bytes.
#[tokio::test]
async fn a_cleanly_closed_file_is_opened_without_reading_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let seal = dir.path().join(seal::SEAL_FILE_NAME);
    let all = HistoryQuery {
        since: None,
        limit: 100,
        max_bytes: None,
    };
    let epoch = {
        let (broker, _) = open(dir.path());
        assert!(!broker.opened_sealed(), "a new file");
        publish_long_runs(&broker, "a", 20).await
    };
    assert!(seal.exists(), "a clean stop seals the file");
    {
        let (broker, _) = open(dir.path());
        assert!(broker.opened_sealed());
        assert!(
            !seal.exists(),
            "taken at open: a crash from here leaves none"
        );
        let h = broker.history(&ch("a"), all.clone()).await.unwrap();
        assert_eq!(h.position.epoch, epoch);
        assert_eq!(offsets(&h), (1..=20).collect::<Vec<_>>());
    }
    let file = dir.path().join(store::FILE_NAME);
    std::fs::write(&file, std::fs::read(&file).unwrap()).unwrap();
    let (broker, _) = open(dir.path());
    assert!(!broker.opened_sealed(), "written after its seal: checked");
    let h = broker.history(&ch("a"), all).await.unwrap();
    assert_eq!((h.position.epoch, h.publications.len()), (epoch, 20));
}

#[tokio::test]
async fn a_file_in_use_is_reported_as_such_not_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (_first, _) = open(dir.path());
    let err = DurableBroker::open(dir.path(), SyncPolicy::Group, Arc::new(Recorder::default()))
        .unwrap_err();
    assert!(matches!(err, OpenError::InUse { .. }), "{err}");
    assert!(err.to_string().contains("another herald"), "{err}");
}

/// The namespace rules a node gives its broker: `chat:` keeps 5,000 for a week and is
/// remembered for 30 days; everything else keeps the defaults.
fn chat_rules() -> crate::Policies {
    Arc::new(|c: &ChannelName| {
        if c.namespace() == "chat" {
            StreamPolicy {
                history_size: 5000,
                history_ttl: std::time::Duration::from_secs(7 * 24 * 3600),
                meta_ttl: std::time::Duration::from_secs(30 * 24 * 3600),
            }
        } else {
            StreamPolicy::default()
        }
    })
}

#[tokio::test]
async fn a_restart_keeps_each_namespace_retention() {
    let dir = tempfile::tempdir().unwrap();
    let c = ch("chat:big");
    let rules = chat_rules();
    {
        let sink = Arc::new(Recorder::default());
        let broker =
            DurableBroker::open_with(dir.path(), SyncPolicy::Group, sink, rules.clone()).unwrap();
        // Concurrent, so that group commit keeps this quick.
        let mut publishes = tokio::task::JoinSet::new();
        for i in 1..=2000u64 {
            let (broker, c, policy) = (broker.clone(), c.clone(), rules(&c));
            publishes
                .spawn(async move { broker.publish(&c, Bytes::from(i.to_string()), policy).await });
        }
        while let Some(done) = publishes.join_next().await {
            done.unwrap().unwrap();
        }
    }
    let sink = Arc::new(Recorder::default());
    let broker = DurableBroker::open_with(dir.path(), SyncPolicy::Group, sink, rules).unwrap();
    // The first sweep after a restart must judge by the namespace's rules, not defaults.
    broker.sweep();
    let h = broker
        .history(
            &c,
            HistoryQuery {
                since: Some(Since {
                    offset: 0,
                    epoch: None,
                }),
                limit: 5000,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        h.publications.len(),
        2000,
        "all 2,000 kept under the 5,000 rule"
    );
    assert_eq!(h.position.offset, 2000);
}

#[tokio::test]
async fn reading_unknown_channels_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (broker, _) = open(dir.path());
        for i in 0..100 {
            let c = ch(&format!("nobody:{i}"));
            let h = broker.history(&c, HistoryQuery::default()).await.unwrap();
            assert_eq!(h.position.offset, 0);
            broker.subscribe(&c).await.unwrap();
            broker.unsubscribe(&c).await.unwrap();
        }
    }
    let (broker, _) = open(dir.path());
    assert_eq!(broker.channel_count(), 0, "nothing read was written");
}

/// Issue #38, item 3: streams made by reads are bounded, and forgetting them writes nothing.
#[tokio::test]
async fn streams_made_by_reads_are_bounded_by_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _) = open(dir.path());
    let shared: crate::SharedBroker = broker.clone();
    crate::conformance::reads_are_bounded_by_the_sweep(&shared, || broker.sweep()).await;
}

/// Issue #35: the store keeps at most `cache_bytes` of its pages in memory; a history
/// larger than the cache is still read back whole, after a restart, by a store whose cache
/// holds a small part of it.
#[tokio::test]
async fn a_history_larger_than_the_cache_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = StoreOptions {
        sync_interval: DEFAULT_SYNC_INTERVAL,
        sync: SyncPolicy::Group,
        cache_bytes: 64 << 10,
    };
    let policy = StreamPolicy {
        history_size: 2000,
        ..StreamPolicy::default()
    };
    let record = |i: usize| Bytes::from(format!("{i:0>2000}"));
    {
        let sink = Arc::new(Recorder::default());
        let broker = DurableBroker::open(dir.path(), tiny, sink).unwrap();
        for i in 0..900 {
            broker
                .publish(&ch("chat:big"), record(i), policy)
                .await
                .unwrap();
        }
    }
    let size = std::fs::metadata(dir.path().join(store::FILE_NAME))
        .unwrap()
        .len();
    assert!(
        size > 20 * (64 << 10),
        "the file ({size} B) is many caches large"
    );
    let broker = DurableBroker::open(dir.path(), tiny, Arc::new(Recorder::default())).unwrap();
    let h = broker
        .history(
            &ch("chat:big"),
            HistoryQuery {
                since: Some(Since {
                    offset: 0,
                    epoch: None,
                }),
                limit: 2000,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(h.publications.len(), 900);
    assert!(h
        .publications
        .iter()
        .enumerate()
        .all(|(i, p)| p.record == record(i)));
}
