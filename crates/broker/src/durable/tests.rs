use std::sync::Arc;

use herald_protocol::Since;

use super::disk::Dir;
use super::*;

use crate::conformance::Recorder;

pub(super) fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

pub(super) fn open(dir: &Path) -> (Arc<DurableBroker>, Arc<Recorder>) {
    let sink = Arc::new(Recorder::default());
    (
        DurableBroker::open(dir, SyncPolicy::Group, sink.clone()).unwrap(),
        sink,
    )
}

pub(super) fn offsets(h: &History) -> Vec<u64> {
    h.publications.iter().map(|p| p.offset).collect()
}

pub(super) fn since(offset: u64, epoch: &Epoch) -> Option<Since> {
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

/// Everything `channel` keeps, from its start in `epoch`.
pub(super) async fn read_all(broker: &DurableBroker, channel: &str, epoch: &Epoch) -> History {
    let all = HistoryQuery {
        since: since(0, epoch),
        limit: 1000,
        max_bytes: None,
    };
    broker.history(&ch(channel), all).await.unwrap()
}

/// Publishes `count` strings of 200 bytes, mostly a run of `Q` that only stored payloads
/// hold (so a test can find them in the files); returns the epoch.
pub(super) async fn publish_long_runs(
    broker: &DurableBroker,
    channel: &str,
    count: usize,
) -> Epoch {
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

/// A clean stop checkpoints everything, so the next open replays no log; the history and
/// epochs read back the same.
#[tokio::test]
async fn a_clean_stop_leaves_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let all = HistoryQuery {
        since: None,
        limit: 100,
        max_bytes: None,
    };
    let epoch = {
        let (broker, _) = open(dir.path());
        publish_long_runs(&broker, "a", 20).await
    };
    let found = checkpoint::read(&Dir::os(dir.path())).unwrap().unwrap();
    assert_eq!((found.head.applied, found.head.unflushed), (20, false));
    let (broker, _) = open(dir.path());
    let h = broker.history(&ch("a"), all).await.unwrap();
    assert_eq!(h.position.epoch, epoch);
    assert_eq!(offsets(&h), (1..=20).collect::<Vec<_>>());
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

/// A history of many megabytes, across several segments of the log, reads back whole
/// after a restart.
#[tokio::test]
async fn a_large_history_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::from(SyncPolicy::Interval);
    let policy = StreamPolicy {
        history_size: 10_000,
        ..StreamPolicy::default()
    };
    let record = |i: usize| Bytes::from(format!("{i:0>2000}"));
    {
        let sink = Arc::new(Recorder::default());
        let broker = DurableBroker::open(dir.path(), options, sink).unwrap();
        for i in 0..9000 {
            broker
                .publish(&ch("chat:big"), record(i), policy)
                .await
                .unwrap();
        }
    }
    let segments = wal::segments(&Dir::os(dir.path())).unwrap().len();
    assert!(segments > 1, "{segments} segment");
    let broker = DurableBroker::open_with(
        dir.path(),
        options,
        Arc::new(Recorder::default()),
        Arc::new(move |_| policy),
    )
    .unwrap();
    let mut read = Vec::new();
    while read.len() < 9000 {
        let h = broker
            .history(
                &ch("chat:big"),
                HistoryQuery {
                    since: Some(Since {
                        offset: read.len() as u64,
                        epoch: None,
                    }),
                    limit: 1000,
                    max_bytes: None,
                },
            )
            .await
            .unwrap();
        assert!(!h.publications.is_empty(), "after {}", read.len());
        read.extend(h.publications);
    }
    assert!(read.iter().enumerate().all(|(i, p)| p.record == record(i)));
}

/// Bytes of the store's files in `dir`, and whether any is packed history.
pub(super) fn store_bytes(dir: &Path) -> (u64, bool) {
    let mut total = 0;
    let mut packed = false;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        packed |= name.starts_with("herald.pack.");
        if name.starts_with("herald.wal.") || name.starts_with("herald.pack.") {
            total += entry.metadata().unwrap().len();
        }
    }
    (total, packed)
}

/// Issue #35: the files give back what is no longer kept. A channel that keeps 10
/// publications churns through many segments while a quiet one keeps a few in each: the
/// quiet one's are packed elsewhere and the segments deleted, so the store stays within
/// 4/3 of what it keeps (plus the segment being written), and both read back whole after
/// a restart.
/// A store in `dir` where a churning channel (10 kept) and a quiet one (all kept) took
/// 6,000 publications of 300 bytes, so that the quiet one's were packed: its options, its
/// rules, the record of publication `i`, and the index's size and live bytes.
pub(super) async fn packed_store(
    dir: &Path,
) -> (StoreOptions, Policies, fn(usize) -> Bytes, (u64, u64)) {
    let options = StoreOptions::from(SyncPolicy::Interval);
    let churn = StreamPolicy {
        history_size: 10,
        ..StreamPolicy::default()
    };
    let quiet = StreamPolicy::default();
    let policies: Policies = Arc::new(move |c: &ChannelName| match c.as_str() {
        "quiet" => quiet,
        _ => churn,
    });
    fn record(i: usize) -> Bytes {
        Bytes::from(format!("\"{i:0>300}\""))
    }
    let broker = DurableBroker::open_with(
        dir,
        options,
        Arc::new(Recorder::default()),
        policies.clone(),
    )
    .unwrap();
    for i in 0..6000 {
        let (channel, policy) = if i % 20 == 0 {
            ("quiet", quiet)
        } else {
            ("churn", churn)
        };
        broker
            .publish(&ch(channel), record(i), policy)
            .await
            .unwrap();
    }
    let footprint = broker.footprint();
    (options, policies, record, footprint)
}

#[tokio::test]
async fn dead_history_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let (options, policies, record, (size, live)) = packed_store(dir.path()).await;
    let (on_disk, packed) = store_bytes(dir.path());
    assert!(packed, "nothing was packed");
    let segment = DEFAULT_SEGMENT_BYTES;
    assert!(
        on_disk <= live * 4 / 3 + 2 * segment,
        "{on_disk} B on disk for {live} B kept ({size} B by the index)"
    );
    let broker =
        DurableBroker::open_with(dir.path(), options, Arc::new(Recorder::default()), policies)
            .unwrap();
    let all = |offset| HistoryQuery {
        since: Some(Since {
            offset,
            epoch: None,
        }),
        limit: 1000,
        max_bytes: None,
    };
    let q = broker.history(&ch("quiet"), all(0)).await.unwrap();
    let want: Vec<Bytes> = (0..6000).step_by(20).map(record).collect();
    let got: Vec<Bytes> = q.publications.into_iter().map(|p| p.record).collect();
    assert_eq!(got, want);
    let c = broker.history(&ch("churn"), all(5700 - 10)).await.unwrap();
    assert_eq!(c.publications.len(), 10);
}
