//! The store's own steps at open cut short by a crash at each point: what a step that
//! renames or deletes files leaves after any number of its renames must open to a store
//! that keeps every acknowledged publication in its epoch, or gives the channel a new one.
//! (A crash is a copy of the live directory: what `kill -9` leaves. Power cuts, torn writes
//! and failed syncs at every write need the file layer of issue #57's harness.)

use std::{path::Path, sync::Arc};

use bytes::Bytes;

use super::checkpoint;
use super::disk::Dir;
use super::log_tests::{ch, file_state, open, publish, write_segment};
use super::sim_disk::{Fault, SimDisk};
use super::{wal, DurableBroker, StoreOptions, SyncPolicy};
use crate::conformance::Recorder;
use crate::{Broker, HistoryQuery, StreamPolicy};

/// What `kill -9` leaves of the store in `dir`: its files as they are now.
fn killed(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    copy
}

/// Opens the store kept at `/sim/data` on `disk`.
fn open_sim(
    disk: &Arc<SimDisk>,
    options: StoreOptions,
) -> Result<Arc<DurableBroker>, super::OpenError> {
    let dir = Dir::on(disk.clone(), Path::new("/sim/data"));
    DurableBroker::open_on(
        dir,
        options,
        Arc::new(Recorder::default()),
        crate::default_policies(),
    )
}

/// Issue #57 defect 1: a replay that stopped early (at damage, or a gap) left the old run's
/// later segments beside the new run's, numbered into the range the new run writes. Once
/// a checkpoint of the new run pointed past such a segment, the next open after a crash
/// started its replay there, skipped it as another run's, and never read the new run's
/// segment: acknowledged publications were lost and their offsets handed out again (offset
/// 155 of 170 here). Now what a replay could not apply is set aside, and an open that
/// crashed after setting aside some of them (each crash point: 0, 1 or 2 of 2) is
/// finished by the next.
#[tokio::test]
async fn segments_left_after_a_stopped_replay_never_hide_the_next_runs_log() {
    for set_aside_before_the_crash in 0..=2 {
        let dir = tempfile::tempdir().unwrap();
        let epoch = publish(&open(dir.path()), "news", 2).await;
        let (run, applied) = file_state(dir.path());
        write_segment(dir.path(), run, applied + 1, "news", &epoch, &[3, 4]);
        // Entries applied+3 and +4 are missing: the replay stops before these two.
        let stale = [applied + 5, applied + 7];
        write_segment(dir.path(), run, stale[0], "news", &epoch, &[7, 8]);
        write_segment(dir.path(), run, stale[1], "news", &epoch, &[9, 10]);
        for first_lsn in &stale[..set_aside_before_the_crash] {
            let aside = dir.path().join(format!("herald.stale.{first_lsn}"));
            std::fs::rename(wal::segment_path(dir.path(), *first_lsn), aside).unwrap();
        }
        let options = StoreOptions {
            segment_bytes: 1 << 20,
            checkpoint_bytes: 64 << 10,
            ..SyncPolicy::Group.into()
        };
        let broker =
            DurableBroker::open(dir.path(), options, Arc::new(Recorder::default())).unwrap();
        let mut acknowledged = Vec::new();
        let data = Bytes::from(format!("\"{}\"", "x".repeat(1000)));
        let mut publish_some = async |n| {
            for _ in 0..n {
                let p = broker
                    .publish(&ch("news"), data.clone(), StreamPolicy::default())
                    .await
                    .unwrap();
                acknowledged.push(p);
            }
        };
        // A checkpoint of this run past the old run's segments (published until one is
        // written: where the applier's batches end decides when), then more publications.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let checkpointed = || checkpoint::read(&Dir::os(dir.path())).unwrap().unwrap();
        while checkpointed().head.applied < applied + 100 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint was written"
            );
            publish_some(10).await;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        publish_some(20).await;
        let killed = killed(dir.path());
        drop(broker);
        let reopened = open(killed.path());
        let everything = HistoryQuery {
            since: None,
            limit: 1000,
            max_bytes: None,
        };
        let h = reopened.history(&ch("news"), everything).await.unwrap();
        let last = acknowledged.last().unwrap();
        let case = format!("{set_aside_before_the_crash} set aside before the crash");
        if h.position.epoch == last.epoch {
            let kept: Vec<u64> = h.publications.iter().map(|p| p.offset).collect();
            for p in &acknowledged {
                assert!(kept.contains(&p.offset), "{case}: offset {} lost", p.offset);
            }
        }
        assert!(
            h.position.epoch != last.epoch || h.position.offset >= last.offset,
            "{case}: the top went back from {} to {} in one epoch",
            last.offset,
            h.position.offset
        );
    }
}

/// A crash while a segment was being made (its 1 MiB of zeros written a page at a time,
/// then its header) left a file without a header under the segment's name: the next open
/// read it as damage and gave every channel a new epoch (the kill -9 test of `herald
/// serve` caught it about one run in ten). A segment is now made under `.tmp` and renamed
/// into place whole; what such a crash leaves costs nothing, and is deleted.
#[tokio::test]
async fn a_crash_while_a_segment_is_made_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = publish(&open(dir.path()), "news", 3).await;
    let (_, applied) = file_state(dir.path());
    // What the crash leaves: the new segment's zeros, no header yet.
    let mut unfinished = wal::segment_path(dir.path(), applied + 1).into_os_string();
    unfinished.push(super::segment::UNFINISHED);
    std::fs::write(&unfinished, vec![0u8; 950_272]).unwrap();
    let reopened = open(dir.path());
    let all = HistoryQuery {
        since: None,
        limit: 1000,
        max_bytes: None,
    };
    let h = reopened.history(&ch("news"), all).await.unwrap();
    assert_eq!(h.position.epoch, epoch, "nothing was lost");
    assert_eq!(h.publications.len(), 3);
    assert!(
        !Path::new(&unfinished).exists(),
        "the half-made file is deleted"
    );
}

/// With `interval`, what was acknowledged reaches the disk within the interval with no
/// later publication to prompt it, so a power cut after that loses none of it. The
/// publisher tells the store thread to time the sync, since 2026-12-01 after it has let
/// the log go rather than while holding it; a publisher that never told it would leave
/// the log unsynced until the next publication (this test then times out waiting).
#[tokio::test]
async fn an_interval_sync_comes_on_time_with_nothing_published_after() {
    use std::time::{Duration, Instant};
    let on = |disk: &Arc<SimDisk>| {
        let options = StoreOptions {
            sync_interval: Duration::from_millis(20),
            ..SyncPolicy::Interval.into()
        };
        open_sim(disk, options).unwrap()
    };
    // Polls what the disk holds; a sync is due 20 ms after the first write it covers.
    let synced = |disk: Arc<SimDisk>| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while disk.has_unsynced_writes() {
            assert!(
                Instant::now() < deadline,
                "acknowledged writes still unsynced 10 s after an interval of 20 ms"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let disk = SimDisk::new(11);
    let broker = on(&disk);
    // The first sync: after it the store thread waits to be told of the next write (before
    // it, a thread just started may find the write on its own).
    publish(&broker, "news", 1).await;
    synced(disk.clone()).await;
    let epoch = publish(&broker, "news", 19).await;
    synced(disk.clone()).await;
    disk.cut_power_losing_everything_unsynced();
    drop(broker);
    let disk = disk.restarted(12);
    let all = HistoryQuery {
        since: None,
        limit: 1000,
        max_bytes: None,
    };
    let h = on(&disk).history(&ch("news"), all).await.unwrap();
    // After a power cut with `interval` the channel starts a new epoch, by design (what
    // was acknowledged in the last interval might be gone); its history is kept.
    assert_ne!(h.position.epoch, epoch);
    let offsets: Vec<u64> = h.publications.iter().map(|p| p.offset).collect();
    assert_eq!(
        offsets,
        (1..=20).collect::<Vec<_>>(),
        "every acknowledged publication"
    );
}

/// Issue #57 defect 5: an open replays what the last run wrote after its last checkpoint,
/// then writes a checkpoint pointing there. When that run was killed with its appends in
/// the page cache only (`interval`, not synced yet), a power cut after the open took those
/// bytes back while the checkpoint, synced, still pointed at them: the channel's whole
/// history was dropped as damaged at its next read. The open now syncs what it replayed.
#[tokio::test]
async fn what_an_open_replays_is_synced_before_its_checkpoint_points_there() {
    let on = |disk: &Arc<SimDisk>, sync: SyncPolicy| {
        let options = StoreOptions {
            sync_interval: std::time::Duration::from_secs(3600),
            ..sync.into()
        };
        open_sim(disk, options).unwrap()
    };
    let disk = SimDisk::new(5);
    let broker = on(&disk, SyncPolicy::Interval);
    let epoch = publish(&broker, "news", 20).await;
    disk.stop(Fault::Kill);
    drop(broker);
    // Started again (with `always`, as an operator may): the replay's checkpoint written,
    // then the power goes.
    let disk = disk.restarted(6);
    drop(on(&disk, SyncPolicy::Always));
    disk.cut_power_losing_everything_unsynced();
    let disk = disk.restarted(7);
    let all = HistoryQuery {
        since: None,
        limit: 1000,
        max_bytes: None,
    };
    let h = on(&disk, SyncPolicy::Always)
        .history(&ch("news"), all)
        .await
        .unwrap();
    assert_eq!(h.position.epoch, epoch, "the history is kept in its epoch");
    assert_eq!(h.publications.len(), 20);
}

/// Found by the crash harness's long run (seed 1027508): an open that found damage in the
/// log set the unreplayable segments aside before its checkpoint (with every epoch
/// renewed) was written. When that write failed (a full disk here; a crash does the
/// same), the next open found no damage left to see, kept every epoch, and handed the
/// lost offsets out again. Now the checkpoint is written first.
#[tokio::test]
async fn damage_is_answered_even_when_the_open_that_found_it_fails() {
    let on = |disk: &Arc<SimDisk>| open_sim(disk, SyncPolicy::Group.into());
    let disk = SimDisk::new(11);
    // The channel in a checkpoint (a clean stop), then more of it in the log only.
    publish(&on(&disk).unwrap(), "news", 10).await;
    let broker = on(&disk).unwrap();
    let epoch = publish(&broker, "news", 20).await;
    disk.stop(Fault::Kill);
    drop(broker);
    let disk = disk.restarted(12);
    // A bit flipped in the first batch of the log after the checkpoint: damage.
    let dir = Dir::on(disk.clone(), Path::new("/sim/data"));
    let (_, segment) = wal::segments(&dir).unwrap().pop().unwrap();
    let file = dir.disk().open(&segment).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, wal::HEADER_LEN as u64 + 25)
        .unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], wal::HEADER_LEN as u64 + 25)
        .unwrap();
    // The open that finds it cannot write its checkpoint.
    disk.arm(1, Fault::DiskFull);
    assert!(on(&disk).is_err(), "the disk is full");
    disk.stop(Fault::Kill);
    let disk = disk.restarted(13);
    let h = on(&disk)
        .unwrap()
        .history(
            &ch("news"),
            HistoryQuery {
                since: None,
                limit: 1000,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert!(
        h.position.epoch != epoch || h.position.offset == 30,
        "acknowledged offsets lost in their epoch: top {}",
        h.position.offset
    );
}
