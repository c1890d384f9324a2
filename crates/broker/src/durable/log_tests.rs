//! The write-ahead log seen through the broker: entries after the last checkpoint (as
//! after a `kill -9`) are replayed at open, damage inside the log costs epochs but never
//! offsets, and reads join what the index holds with what it does not yet.

use std::{path::Path, sync::Arc};

use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Since};

use super::checkpoint::{self, Checkpoint};
use super::disk::Dir;
use super::{recovery, wal, DurableBroker, SyncPolicy};
use crate::conformance::Recorder;
use crate::{Broker, HistoryQuery, StreamPolicy};

pub(super) fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

pub(super) fn open(dir: &Path) -> Arc<DurableBroker> {
    DurableBroker::open(dir, SyncPolicy::Group, Arc::new(Recorder::default())).unwrap()
}

pub(super) fn all() -> HistoryQuery {
    HistoryQuery {
        since: Some(Since {
            offset: 0,
            epoch: None,
        }),
        limit: 1000,
        max_bytes: None,
    }
}

pub(super) async fn publish(broker: &DurableBroker, channel: &str, n: u64) -> Epoch {
    let mut epoch = None;
    for i in 1..=n {
        let p = broker
            .publish(
                &ch(channel),
                Bytes::from(i.to_string()),
                StreamPolicy::default(),
            )
            .await
            .unwrap();
        epoch = Some(p.epoch);
    }
    epoch.unwrap()
}

/// The run mark and the last applied entry of the (closed) store in `dir`.
pub(super) fn file_state(dir: &Path) -> (u64, u64) {
    let found = checkpoint::read(&Dir::os(dir)).unwrap().unwrap();
    (found.head.run, found.head.applied)
}

/// Changes the checkpoint of the (closed) store in `dir`.
fn rewrite_checkpoint(dir: &Path, change: impl FnOnce(&mut Checkpoint)) {
    let mut found = checkpoint::read(&Dir::os(dir)).unwrap().unwrap();
    change(&mut found);
    let seq = found.chain.seq;
    let bytes = checkpoint::base(seq, &found.head, found.streams.iter().map(|(c, s)| (c, s)));
    checkpoint::write_base(&Dir::os(dir), seq, &bytes).unwrap();
}

/// Writes a log segment of `run` from `first_lsn` holding publications `offsets` of
/// `channel` in `epoch`, one batch each.
pub(super) fn write_segment(
    dir: &Path,
    run: u64,
    first_lsn: u64,
    channel: &str,
    epoch: &Epoch,
    offsets: &[u64],
) -> Vec<u8> {
    let mut bytes = wal::header(run, first_lsn).to_vec();
    for (i, offset) in offsets.iter().enumerate() {
        let mut body = Vec::new();
        let data = offset.to_string();
        wal::encode_publish(
            &mut body,
            channel,
            epoch.as_str(),
            *offset,
            // Now: a publication of 1970 would be expired, and its stream idle enough for
            // the sweeper to forget.
            super::now_ms(),
            data.as_bytes(),
        );
        bytes.extend(wal::batch(first_lsn + i as u64, 1, &body));
    }
    std::fs::write(wal::segment_path(dir, first_lsn), &bytes).unwrap();
    bytes
}

pub(super) fn offsets(h: &crate::History) -> Vec<u64> {
    h.publications.iter().map(|p| p.offset).collect()
}

#[tokio::test]
async fn publications_only_the_log_holds_are_replayed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 5).await;
    // What a `kill -9` leaves: acknowledged publications in the log after the checkpoint.
    let (run, applied) = file_state(dir.path());
    write_segment(dir.path(), run, applied + 1, "news", &epoch, &[6, 7, 8]);
    let broker = open(dir.path());
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_eq!(h.position.epoch, epoch, "a plain restart keeps the epoch");
    assert_eq!(offsets(&h), (1..=8).collect::<Vec<_>>());
    assert_eq!(h.publications[7].record, Bytes::from("8"));
    let next = broker
        .publish(&ch("news"), Bytes::from("9"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!((next.offset, next.epoch), (9, epoch));
    drop(broker);
    // Replayed once: the next open finds them in its checkpoint.
    let (_, applied_now) = file_state(dir.path());
    assert_eq!(applied_now, applied + 4);
    let h = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_eq!(offsets(&h), (1..=9).collect::<Vec<_>>());
}

#[tokio::test]
async fn damage_inside_the_log_gives_new_epochs_and_keeps_what_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 2).await;
    let (run, applied) = file_state(dir.path());
    let mut bytes = write_segment(dir.path(), run, applied + 1, "news", &epoch, &[3, 4, 5]);
    // A flipped byte in the middle batch's payload: its CRC fails and a valid batch follows.
    let middle = bytes.len() - (bytes.len() - wal::HEADER_LEN) / 3 - 2;
    bytes[middle] ^= 0x40;
    std::fs::write(wal::segment_path(dir.path(), applied + 1), &bytes).unwrap();
    let broker = open(dir.path());
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_ne!(
        h.position.epoch, epoch,
        "offsets after the damage could be reused otherwise"
    );
    assert_eq!(offsets(&h), [1, 2, 3], "what precedes the damage is kept");
}

/// Issue #57 defect 2, through the store: a bit flipped in the middle batch's length made
/// the rest of the segment read as a torn tail; 3 to 5 were dropped silently in their
/// epoch and offset 4 handed out again. Now the channel starts a new epoch.
#[tokio::test]
async fn a_flipped_length_bit_mid_segment_gives_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 2).await;
    let (run, applied) = file_state(dir.path());
    let mut bytes = write_segment(dir.path(), run, applied + 1, "news", &epoch, &[3, 4, 5]);
    let batch = (bytes.len() - wal::HEADER_LEN) / 3;
    // The top bit of the second batch's length: it now points far past the file's end.
    bytes[wal::HEADER_LEN + batch + 3] ^= 0x80;
    std::fs::write(wal::segment_path(dir.path(), applied + 1), &bytes).unwrap();
    let broker = open(dir.path());
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_ne!(h.position.epoch, epoch, "4 and 5 would be handed out again");
    assert_eq!(offsets(&h), [1, 2, 3], "what precedes the damage is kept");
}

#[tokio::test]
async fn a_torn_last_batch_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 2).await;
    let (run, applied) = file_state(dir.path());
    let bytes = write_segment(dir.path(), run, applied + 1, "news", &epoch, &[3, 4]);
    // The last append was cut short by the crash (so never acknowledged).
    std::fs::write(
        wal::segment_path(dir.path(), applied + 1),
        &bytes[..bytes.len() - 3],
    )
    .unwrap();
    let h = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_eq!(h.position.epoch, epoch);
    assert_eq!(offsets(&h), [1, 2, 3]);
}

#[tokio::test]
async fn a_log_of_another_run_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 2).await;
    let (run, applied) = file_state(dir.path());
    write_segment(dir.path(), run ^ 1, applied + 1, "news", &epoch, &[3]);
    let h = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_eq!(offsets(&h), [1, 2]);
}

#[tokio::test]
async fn a_missing_segment_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 2).await;
    let (run, applied) = file_state(dir.path());
    // Entries from applied + 1 should come first; this segment starts one later.
    write_segment(dir.path(), run, applied + 2, "news", &epoch, &[4]);
    let h = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_ne!(h.position.epoch, epoch);
    assert_eq!(offsets(&h), [1, 2]);
}

/// Reads join what the index holds with the publications it does not hold yet, at every page
/// boundary, oldest-first and newest-first.
#[tokio::test]
async fn reads_join_the_file_and_what_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path());
    let c = ch("news");
    let epoch = publish(&broker, "news", 50).await;
    // Until the applier has indexed them (it signals each time).
    assert!(
        broker
            .store
            .unapplied
            .wait_below(0, std::time::Duration::from_secs(10)),
        "never applied"
    );
    assert!(broker.store.unapplied.read(&c, &epoch, u64::MAX).is_empty());
    for i in 51..=80u64 {
        broker
            .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
            .await
            .unwrap();
    }
    for from in [0, 10, 49, 50, 51, 70, 80] {
        for limit in [1, 7, 30, 100] {
            let q = HistoryQuery {
                since: Some(Since {
                    offset: from,
                    epoch: Some(epoch.clone()),
                }),
                limit,
                max_bytes: None,
            };
            let h = broker.history(&c, q).await.unwrap();
            let want: Vec<u64> = (from + 1..=80).take(limit).collect();
            assert_eq!(offsets(&h), want, "since {from}, limit {limit}");
            for p in &h.publications {
                assert_eq!(p.record, Bytes::from(p.offset.to_string()));
            }
        }
    }
    for limit in [1, 20, 30, 31, 60, 100] {
        let q = HistoryQuery {
            since: None,
            limit,
            max_bytes: None,
        };
        let h = broker.history(&c, q).await.unwrap();
        let want: Vec<u64> = (81u64.saturating_sub(limit as u64).max(1)..=80).collect();
        assert_eq!(offsets(&h), want, "newest {limit}");
    }
}

/// `sync = "interval"` acknowledges before the sync, and `group` delivers before it. A
/// killed process loses nothing it wrote (the operating system keeps it), so the same boot
/// keeps every epoch; after the machine restarted, what was delivered last may be gone, so
/// every stream starts a new epoch (keeping its history) instead of handing offsets out
/// again. `always` syncs before delivering: its epochs survive a machine crash.
#[tokio::test]
async fn an_unsynced_run_that_stopped_with_the_machine_costs_epochs_not_offsets() {
    for sync in [SyncPolicy::Interval, SyncPolicy::Group] {
        unsynced_run_stopped_with_the_machine(sync).await;
    }
    always_keeps_epochs_after_a_machine_crash().await;
}

async fn always_keeps_epochs_after_a_machine_crash() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        DurableBroker::open(
            dir.path(),
            SyncPolicy::Always,
            Arc::new(Recorder::default()),
        )
        .unwrap()
    };
    let epoch = publish(&open(), "news", 2).await;
    // The checkpoint as `always` leaves it, now dated from another boot of the machine: a
    // crash of the machine looks so.
    rewrite_checkpoint(dir.path(), |c| {
        assert!(!c.head.unflushed);
        c.head.boot = Some(recovery::boot_id(&Dir::os(Path::new("/"))).unwrap_or(0) ^ 1);
    });
    let h = open().history(&ch("news"), all()).await.unwrap();
    assert_eq!((h.position.epoch.clone(), offsets(&h)), (epoch, vec![1, 2]));
}

async fn unsynced_run_stopped_with_the_machine(sync: SyncPolicy) {
    let dir = tempfile::tempdir().unwrap();
    let interval = || super::StoreOptions {
        sync,
        ..sync.into()
    };
    let broker =
        DurableBroker::open(dir.path(), interval(), Arc::new(Recorder::default())).unwrap();
    let epoch = publish(&broker, "news", 3).await;
    drop(broker);
    // What an unclean stop leaves: the mark that acknowledgements ran ahead of syncs.
    let mark = |boot: Option<u64>| {
        rewrite_checkpoint(dir.path(), |c| {
            c.head.unflushed = true;
            c.head.boot = boot.or_else(|| recovery::boot_id(&Dir::os(Path::new("/"))));
        })
    };
    if recovery::boot_id(&Dir::os(Path::new("/"))).is_some() {
        mark(None); // this boot
        let broker =
            DurableBroker::open(dir.path(), interval(), Arc::new(Recorder::default())).unwrap();
        let h = broker.history(&ch("news"), all()).await.unwrap();
        assert_eq!(
            (h.position.epoch.clone(), offsets(&h)),
            (epoch.clone(), vec![1, 2, 3])
        );
    }
    mark(Some(
        recovery::boot_id(&Dir::os(Path::new("/"))).unwrap_or(0) ^ 1,
    )); // another boot
    let broker =
        DurableBroker::open(dir.path(), interval(), Arc::new(Recorder::default())).unwrap();
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_ne!(
        h.position.epoch, epoch,
        "offsets 1-3 could be handed out again otherwise"
    );
    assert_eq!(offsets(&h), [1, 2, 3], "history is kept");
}

/// Publishes `data` to `channel` until the store takes publications again after a failed
/// write (its thread retries at once when told, then every second).
async fn publish_when_writable(broker: &DurableBroker, channel: &str, data: &str) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let published = broker
            .publish(
                &ch(channel),
                Bytes::from(data.to_string()),
                StreamPolicy::default(),
            )
            .await;
        match published {
            Ok(p) => return p.offset,
            Err(crate::BrokerError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("the store never took publications again: {e}"),
        }
    }
}

/// A store under `sync` whose channel `news` holds one publication, and the answer to a
/// publication of `data` whose sync fails.
async fn publish_through_a_failing_sync(
    sync: SyncPolicy,
    data: Bytes,
) -> (
    Arc<DurableBroker>,
    Arc<Recorder>,
    tempfile::TempDir,
    Result<crate::StreamPosition, crate::BrokerError>,
) {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Recorder::default());
    let broker = DurableBroker::open(dir.path(), sync, sink.clone()).unwrap();
    publish(&broker, "news", 1).await;
    broker
        .store
        .writer
        .with_log(|log| log.segment.fail_next_sync = true);
    let answer = broker
        .publish(&ch("news"), data, StreamPolicy::default())
        .await;
    (broker, sink, dir, answer)
}

/// `group` delivers a batch once it is written and answers once it is synced. A sync that
/// fails after the delivery cannot take the publication back (subscribers have it): it is
/// kept, its publisher hears "outcome unknown", and its offset is never handed out again.
#[tokio::test]
async fn a_group_sync_that_fails_after_delivery_keeps_the_publication() {
    let (broker, sink, _dir, failed) =
        publish_through_a_failing_sync(SyncPolicy::Group, Bytes::from("2")).await;
    assert!(
        matches!(failed, Err(crate::BrokerError::Unconfirmed(_))),
        "{failed:?}"
    );
    assert_eq!(sink.offsets("news"), [1, 2], "delivered before the sync");
    assert_eq!(publish_when_writable(&broker, "news", "3").await, 3);
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_eq!(offsets(&h), [1, 2, 3]);
    assert_eq!(sink.records("news").len(), 3);
}

/// Issue #57 defect 6: after a failed fsync the kernel may have dropped the pages it was
/// to write, and a later sync that succeeds says nothing of them (PostgreSQL's
/// "fsyncgate"): what was acknowledged around the failure may be gone after a power cut,
/// or read back as a torn tail once the pages are evicted. The store forgot the failure
/// once writes worked again; now it is marked on disk before publications are taken
/// again, and the next open gives every channel a new epoch (once: the one after keeps it).
#[tokio::test]
async fn a_failed_sync_costs_the_next_open_new_epochs() {
    let (broker, _sink, dir, _) =
        publish_through_a_failing_sync(SyncPolicy::Group, Bytes::from("2")).await;
    assert_eq!(publish_when_writable(&broker, "news", "3").await, 3);
    let epoch = broker
        .history(&ch("news"), all())
        .await
        .unwrap()
        .position
        .epoch;
    drop(broker);
    let h = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_ne!(
        h.position.epoch, epoch,
        "what the failed sync covered may be gone"
    );
    assert_eq!(offsets(&h), [1, 2, 3], "history is kept");
    let again = open(dir.path()).history(&ch("news"), all()).await.unwrap();
    assert_eq!(again.position.epoch, h.position.epoch);
}

/// A batch that fills its segment is synced in that segment before a new one starts: the
/// acknowledgement waits for the sync of the file that holds it, not of the next one.
#[tokio::test]
async fn a_batch_that_fills_its_segment_is_synced_there() {
    let big = Bytes::from(vec![b'x'; super::DEFAULT_SEGMENT_BYTES as usize]);
    let (_broker, _sink, _dir, answer) =
        publish_through_a_failing_sync(SyncPolicy::Group, big).await;
    assert!(
        matches!(answer, Err(crate::BrokerError::Unconfirmed(_))),
        "the failing sync was of the full segment: {answer:?}"
    );
}

/// `always` syncs before delivering: a failed sync is a failed write, so nothing was
/// delivered and the offset goes to the next publication.
#[tokio::test]
async fn an_always_sync_that_fails_delivers_nothing() {
    let (broker, sink, _dir, failed) =
        publish_through_a_failing_sync(SyncPolicy::Always, Bytes::from("lost")).await;
    assert!(
        matches!(failed, Err(crate::BrokerError::Unavailable(_))),
        "{failed:?}"
    );
    assert_eq!(sink.offsets("news"), [1], "nothing delivered");
    assert_eq!(publish_when_writable(&broker, "news", "2").await, 2);
    let h = broker.history(&ch("news"), all()).await.unwrap();
    assert_eq!(offsets(&h), [1, 2]);
    assert!(!sink.records("news").contains(&Bytes::from("lost")));
}

/// With `sync = "interval"` publishers write the log themselves. One that finds the log
/// held by the store thread (syncing it) leaves its record queued: that thread must write
/// it when it lets the log go, or a lone publisher waits for the next sweep (a second).
/// The broker is opened outside a runtime, so that no sweeper runs.
#[test]
fn a_publisher_is_not_left_waiting_behind_the_store_thread() {
    let dir = tempfile::tempdir().unwrap();
    let broker = DurableBroker::open(
        dir.path(),
        SyncPolicy::Interval,
        Arc::new(Recorder::default()),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let writer = broker.store.writer.clone();
    let publisher = broker.clone();
    let published = writer.with_log(|_| {
        let published = rt.spawn(async move {
            publisher
                .publish(&ch("news"), Bytes::from("1"), StreamPolicy::default())
                .await
        });
        // Until the publisher has queued its record and found the log held.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while writer.contended() == 0 {
            assert!(std::time::Instant::now() < deadline, "never tried the log");
            std::thread::yield_now();
        }
        published
    });
    let p = rt
        .block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), published).await
        })
        .expect("the queued publication was never written")
        .unwrap()
        .unwrap();
    assert_eq!(p.offset, 1);
}
