//! The store keeps every acknowledged publication through `kill -9`, whatever its sync mode.

mod support;

use std::{collections::BTreeMap, process::Command, sync::Arc};

use serde_json::{json, Value};
use support::{history, Server, KEY};

/// The default, `sync = "interval"`, acknowledges before the sync; a killed process still
/// loses nothing (the kernel holds what it wrote), and on the same boot the stream keeps
/// its epoch.
#[test]
fn kill_9_during_a_publish_burst_loses_no_acknowledged_publication() {
    kill_9_during_a_publish_burst(&[]);
}

/// `sync = "group"` acknowledges after the sync and delivers while it runs.
#[test]
fn with_sync_group_kill_9_loses_no_acknowledged_publication() {
    kill_9_during_a_publish_burst(&["--sync", "group"]);
}

fn kill_9_during_a_publish_burst(args: &[&str]) {
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(data.path(), args);
    let url = server.url.clone();
    let rt = runtime();
    let acked = Arc::new(acks::Acked::default());
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let data = move |i| json!({ "p": p, "i": i });
            rt.spawn(publish_until_refused(
                url.clone(),
                "chat:crash",
                200,
                data,
                acked.clone(),
            ))
        })
        .collect();
    // Kill in the middle of the burst, without warning.
    while acked.len() < 150 {
        std::thread::yield_now();
    }
    signal(&mut server, "-KILL");
    for p in publishers {
        rt.block_on(p).unwrap();
    }
    let acked = acked.take();
    assert!(acked.len() >= 150);

    let restarted = Server::start_in(data.path(), args);
    let h = history(&rt, &restarted.url, "chat:crash");
    assert_keeps_all(&h, &acked, "after kill -9");
    let top = h["offset"].as_u64().unwrap();
    let next = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/api/publish", restarted.url))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&json!({ "channel": "chat:crash", "data": "after" }))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    assert_eq!(next["offset"].as_u64(), Some(top + 1));
    assert_eq!(next["epoch"], h["epoch"], "same stream after the crash");
    println!(
        "{} acknowledged before kill -9; {top} stored after restart",
        acked.len()
    );
}

/// The store with segments of 64 KiB and a checkpoint every 64 KiB of log, so that a burst
/// rotates segments, writes checkpoints and packs history many times over; a channel that
/// keeps 20 publications makes the dead bytes that packing reclaims. Killed (`kill -9`)
/// mid-burst, four times over, and stopped cleanly after each check: every acknowledged
/// publication of the channel that keeps everything is there, with no holes, in the same
/// epoch, and the churning one keeps its newest 20.
#[test]
fn kill_9_while_the_store_rotates_checkpoints_and_packs_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let start = || small_files(data.path());
    let rt = runtime();
    let keep = Arc::new(acks::Acked::default());
    let churn = Arc::new(acks::Acked::default());
    let mut kept: BTreeMap<u64, Value> = BTreeMap::new();
    let mut epoch = Value::Null;
    for round in 0..4 {
        let mut server = start();
        let url = server.url.clone();
        let publishers: Vec<_> = (0..4)
            .map(|p| {
                let (channel, acked) = match p < 2 {
                    true => ("chat:keep", keep.clone()),
                    false => ("churn:x", churn.clone()),
                };
                let data = move |i| json!({ "r": round, "p": p, "i": i, "pad": "x".repeat(900) });
                rt.spawn(publish_until_refused(
                    url.clone(),
                    channel,
                    100,
                    data,
                    acked,
                ))
            })
            .collect();
        // Killed at a different point of each round.
        let target = 80 + 30 * round;
        while keep.len() < target {
            std::thread::yield_now();
        }
        signal(&mut server, "-KILL");
        for p in publishers {
            rt.block_on(p).unwrap();
        }
        kept.extend(keep.take());
        let restarted = start();
        let h = history(&rt, &restarted.url, "chat:keep");
        assert_keeps_all(&h, &kept, &format!("round {round}"));
        if round > 0 {
            assert_eq!(h["epoch"], epoch, "round {round}: the same stream");
        }
        epoch = h["epoch"].clone();
        let acked_churn = churn.take();
        let c = history(&rt, &restarted.url, "churn:x");
        let newest = stored_of(&c);
        let top = c["offset"].as_u64().unwrap();
        assert_eq!(
            newest.len(),
            20.min(top as usize),
            "round {round}: churn keeps 20"
        );
        for (offset, data) in acked_churn.range(top.saturating_sub(19)..) {
            assert_eq!(
                newest.get(offset),
                Some(data),
                "round {round}: churn offset {offset}"
            );
        }
        // A clean stop this time: its last checkpoint packs what the round left dead.
        let mut restarted = restarted;
        assert!(signal(&mut restarted, "-TERM").success());
    }
    let files: Vec<String> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.iter().any(|f| f.starts_with("herald.pack.")),
        "history was packed: {files:?}"
    );
}

/// `herald serve` on `data` with 64 KiB segments and checkpoints, and `churn:*` keeping 20:
/// so that a few hundred publications rotate, checkpoint and pack.
fn small_files(data: &std::path::Path) -> Server {
    let mut command = support::herald();
    command
        .env("HERALD_STORE_SEGMENT_BYTES", "65536")
        .env("HERALD_STORE_CHECKPOINT_BYTES", "65536")
        .env("HERALD_NAMESPACES__CHURN__HISTORY_SIZE", "20");
    Server::spawn_with(&mut command, data, &[])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Publishes `count` publications of `data(i)` to `channel` through the API, noting each
/// acknowledged one in `acked` as [epoch, data]; stops at the first that is not.
async fn publish_until_refused(
    url: String,
    channel: &'static str,
    count: usize,
    data: impl Fn(usize) -> Value,
    acked: Arc<acks::Acked>,
) {
    let http = reqwest::Client::new();
    for i in 0..count {
        let body = json!({ "channel": channel, "data": data(i) });
        let sent = http
            .post(format!("{url}/api/publish"))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&body)
            .send()
            .await;
        let Ok(r) = sent else { return };
        let Ok(v) = r.json::<Value>().await else {
            return;
        };
        let Some(offset) = v["offset"].as_u64() else {
            return;
        };
        acked.add(offset, json!([v["epoch"], body["data"]]));
    }
}

/// Sends `signal` (`-KILL`, `-TERM`) to the server and waits for it to end.
fn signal(server: &mut Server, signal: &str) -> std::process::ExitStatus {
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
    server.child.wait().unwrap()
}

/// That the history answer `h` holds every acknowledged publication of `acked` (offset →
/// [epoch, data]), in its epoch, and no hole from 1 to its top.
fn assert_keeps_all(h: &Value, acked: &BTreeMap<u64, Value>, when: &str) {
    let stored = stored_of(h);
    for (offset, data) in acked {
        assert_eq!(
            stored.get(offset),
            Some(data),
            "{when}: acknowledged offset {offset} lost, changed or of another epoch"
        );
    }
    let top = h["offset"].as_u64().unwrap();
    assert_eq!(
        stored.keys().copied().collect::<Vec<_>>(),
        (1..=top).collect::<Vec<_>>(),
        "{when}: no holes"
    );
}

/// A history answer's publications by offset, each as [epoch, data].
fn stored_of(h: &Value) -> BTreeMap<u64, Value> {
    h["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["offset"].as_u64().unwrap(),
                json!([h["epoch"], p["data"]]),
            )
        })
        .collect()
}

/// Issue #57 item 4, through `herald serve` and its files: with history packed, a damaged
/// `herald.index` used to stop the server, and moving it away (the remedy its message
/// named) kept none of the packed publications. Now each start rebuilds the index from the
/// data files: every acknowledged publication comes back, in a new epoch each time.
#[test]
fn a_damaged_or_missing_index_is_rebuilt_from_the_data_files() {
    let data = tempfile::tempdir().unwrap();
    let start = || small_files(data.path());
    let rt = runtime();
    let keep = Arc::new(acks::Acked::default());
    let mut server = start();
    let pad = |i| json!({ "i": i, "pad": "x".repeat(900) });
    rt.block_on(async {
        let url = server.url.clone();
        let churn = Arc::new(acks::Acked::default());
        for round in 0..3 {
            publish_until_refused(url.clone(), "chat:keep", 100, pad, keep.clone()).await;
            publish_until_refused(url.clone(), "churn:x", 200 + round, pad, churn.clone()).await;
        }
    });
    // A clean stop: its last checkpoint packs what the churn left dead.
    assert!(signal(&mut server, "-TERM").success());
    let kept = keep.take();
    assert_eq!(kept.len(), 300);
    let packed = std::fs::read_dir(data.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("herald.pack.")
    });
    assert!(packed, "history was packed");
    let index = data.path().join("herald.index");
    let mut epochs = vec![kept[&1][0].clone()];
    for damage in ["scribbled", "removed"] {
        match damage {
            "scribbled" => std::fs::write(&index, vec![0x42; 8192]).unwrap(),
            _ => std::fs::remove_file(&index).unwrap(),
        }
        let mut server = start();
        let h = history(&rt, &server.url, "chat:keep");
        assert!(!epochs.contains(&h["epoch"]), "{damage}: a new epoch");
        epochs.push(h["epoch"].clone());
        let read: BTreeMap<u64, Value> = (stored_of(&h).into_iter())
            .map(|(offset, v)| (offset, v[1].clone()))
            .collect();
        let acked: BTreeMap<u64, Value> = (kept.iter())
            .map(|(offset, v)| (*offset, v[1].clone()))
            .collect();
        assert!(
            read == acked,
            "{damage}: every acknowledged publication kept"
        );
        assert!(signal(&mut server, "-TERM").success());
    }
    assert!(data.path().join("herald.index.damaged").exists());
}

/// Issue #57 defect 2, through `herald serve` and its files: one bit flipped in a batch's
/// length in the middle of a segment was read as a torn tail, so everything after it was
/// dropped without a word and its offsets handed out again in the same epoch. Now it is
/// damage: the channel continues in a new epoch, and what is served is what was stored.
#[test]
fn a_flipped_length_bit_mid_log_gives_a_new_epoch() {
    use herald_broker::wal::{BATCH_HEADER_LEN, HEADER_LEN};
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let mut command = support::herald();
        command.env("HERALD_STORE_SEGMENT_BYTES", "65536");
        Server::spawn_with(&mut command, data.path(), &[])
    };
    let rt = runtime();
    let acked = Arc::new(acks::Acked::default());
    let mut server = start();
    let pad = |i| json!({ "i": i, "pad": "x".repeat(900) });
    rt.block_on(publish_until_refused(
        server.url.clone(),
        "chat:a",
        120,
        pad,
        acked.clone(),
    ));
    signal(&mut server, "-KILL");
    let acked = acked.take();
    // The third batch of the first segment: its length one bit off.
    let mut segments: Vec<_> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("herald.wal."))
        .collect();
    segments.sort();
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    let mut pos = HEADER_LEN;
    for _ in 0..2 {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += BATCH_HEADER_LEN + len;
    }
    bytes[pos + 1] ^= 0x02;
    std::fs::write(&segments[0], &bytes).unwrap();
    let server = start();
    let h = history(&rt, &server.url, "chat:a");
    assert_ne!(h["epoch"], acked[&1][0], "a new epoch");
    for (offset, v) in stored_of(&h) {
        assert_eq!(
            v[1], acked[&offset][1],
            "offset {offset} serves what was stored"
        );
    }
}

/// Issue #57 defect 3, through `herald serve`: a damaged publication read by 16 readers at
/// once reset its channel up to 16 times, and publications acknowledged after the first
/// reset were dropped by the later ones. Now the channel is reset once: every reader gets
/// the same new epoch, and everything acknowledged in it is kept.
#[test]
fn a_damaged_publication_read_by_16_readers_resets_its_channel_once() {
    let data = tempfile::tempdir().unwrap();
    let rt = runtime();
    let first = Arc::new(acks::Acked::default());
    let mut server = Server::start_in(data.path(), &[]);
    let marked = |i| json!({ "mark": format!("marker-{i:04}"), "pad": "y".repeat(300) });
    rt.block_on(publish_until_refused(
        server.url.clone(),
        "chat:b",
        50,
        marked,
        first.clone(),
    ));
    // A clean stop: every publication indexed, checked only when read.
    assert!(signal(&mut server, "-TERM").success());
    let old_epoch = first.take()[&1][0].clone();
    let segment = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.to_string_lossy().contains("herald.wal.")
                && std::fs::read(p)
                    .unwrap()
                    .windows(11)
                    .any(|w| w == b"marker-0020")
        })
        .expect("the segment holding publication 21");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes.windows(11).position(|w| w == b"marker-0020").unwrap();
    bytes[at + 3] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();
    let server = Server::start_in(data.path(), &[]);
    let later = Arc::new(acks::Acked::default());
    let (epochs, _) = rt.block_on(async {
        let readers: Vec<_> = (0..16)
            .map(|_| {
                let url = server.url.clone();
                tokio::spawn(async move {
                    support::api_get(&format!(
                        "{url}/api/history?channel=chat:b&since=0&limit=1000"
                    ))
                    .await["epoch"]
                        .clone()
                })
            })
            .collect();
        let publisher = tokio::spawn(publish_until_refused(
            server.url.clone(),
            "chat:b",
            20,
            move |i| json!({ "later": i }),
            later.clone(),
        ));
        let mut epochs = Vec::new();
        for r in readers {
            epochs.push(r.await.unwrap());
        }
        (epochs, publisher.await)
    });
    // A few more once every reader is done, so that some are surely acknowledged in the new
    // epoch: a reset after them (a reader late to the damage) would drop them.
    rt.block_on(publish_until_refused(
        server.url.clone(),
        "chat:b",
        3,
        |i| json!({ "after": i }),
        later.clone(),
    ));
    let h = history(&rt, &server.url, "chat:b");
    assert!(
        epochs.iter().all(|e| *e == h["epoch"]),
        "one reset: {epochs:?} then {}",
        h["epoch"]
    );
    assert_ne!(h["epoch"], old_epoch);
    let stored = stored_of(&h);
    let later = later.take();
    let in_new_epoch = later.values().filter(|v| v[0] == h["epoch"]).count();
    assert!(
        in_new_epoch >= 3,
        "acknowledged in the new epoch: {in_new_epoch}"
    );
    for (offset, v) in later {
        if v[0] == h["epoch"] {
            assert_eq!(
                stored.get(&offset),
                Some(&v),
                "acknowledged after the reset: {offset}"
            );
        }
    }
}

mod acks {
    use std::{collections::BTreeMap, sync::Mutex};

    use serde_json::Value;

    /// Acknowledged publications, by offset.
    #[derive(Default)]
    pub struct Acked(Mutex<BTreeMap<u64, Value>>);

    impl Acked {
        pub fn add(&self, offset: u64, data: Value) {
            let previous = self.0.lock().unwrap().insert(offset, data);
            assert!(previous.is_none(), "offset {offset} acknowledged twice");
        }
        pub fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub fn take(&self) -> BTreeMap<u64, Value> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }
}

/// Review item 8: a failed write (here the file-size limit, as a full disk) refuses
/// publications and turns health red, but does not disable the store: once writes work again
/// the store recovers by itself, health turns green, and offsets continue without a hole.
#[test]
fn a_failed_disk_write_is_recovered_when_space_returns() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with_file_size_limit(data.path(), 3 << 20);
    let url = server.url.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let publish = |i: u64| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body =
                json!({ "channel": "chat:full", "data": { "i": i, "pad": "x".repeat(60_000) } });
            let r = http
                .post(format!("{url}/api/publish"))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let health = || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            http.get(format!("{url}/healthz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    rt.block_on(async {
        assert_eq!(health().await, 200);
        let mut acked = 0;
        let refused = loop {
            let (status, body) = publish(acked + 1).await;
            if status != 200 {
                break body;
            }
            acked += 1;
            assert!(acked < 200, "the file-size limit never stopped a write");
        };
        assert!(acked > 0, "{refused}");
        assert_eq!(health().await, 503, "health says the node cannot store");
        let (status, _) = publish(0).await;
        assert_ne!(status, 200, "still refused while writes fail");

        server.lift_file_size_limit();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while health().await != 200 {
            assert!(std::time::Instant::now() < deadline, "never recovered");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let (status, body) = publish(acked + 1).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["offset"],
            acked + 1,
            "the next offset after the last acknowledged one"
        );
    });
    let offsets: Vec<u64> = history(&rt, &url, "chat:full")["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets.first(), Some(&1));
    assert!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "no hole in history: {offsets:?}"
    );
}

/// Review item 12: `sync = "none"` may lose the latest publications in a crash, but never
/// hands their offsets out again in the same epoch (subscribers saw them).
#[test]
fn with_sync_none_an_unclean_stop_never_reuses_an_offset() {
    let data = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let publish = |url: &str, i: u64| {
        rt.block_on(async {
            let v: Value = reqwest::Client::new()
                .post(format!("{url}/api/publish"))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&json!({ "channel": "news", "data": i }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                v["offset"].as_u64().unwrap(),
                v["epoch"].as_str().unwrap().to_owned(),
            )
        })
    };
    let server = Server::start_in(data.path(), &[]);
    let mut epoch = String::new();
    for i in 1..=3 {
        epoch = publish(&server.url, i).1;
    }
    drop(server); // SIGKILL; every commit so far was durable.
    let server = Server::start_in(data.path(), &["--sync", "none"]);
    let mut seen = Vec::new();
    for i in 4..=8 {
        seen.push(publish(&server.url, i));
    }
    assert_eq!(seen.last().unwrap(), &(8, epoch.clone()));
    drop(server); // SIGKILL: nothing of this run was made durable.
    let server = Server::start_in(data.path(), &[]);
    let (offset, new_epoch) = publish(&server.url, 9);
    assert!(
        new_epoch != epoch || offset == 9,
        "offset {offset} of epoch {epoch} handed out twice"
    );
}

/// Issue #37, item 4: a data file restored from a backup is older than what clients saw.
/// Herald notices (the file's run mark is not the one the directory last recorded) and
/// gives every channel a new epoch, keeping its history: a client that saw publications
/// after the backup is told `recovered: false` instead of being handed reused offsets. The
/// same when a whole directory is restored from a snapshot and the mark is removed, as
/// deployment.md says. A plain restart keeps every epoch.
#[test]
fn a_restored_backup_never_reuses_an_offset_within_an_epoch() {
    let data = tempfile::tempdir().unwrap();
    let backup = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let publish = |url: &str, i: u64| {
        rt.block_on(async {
            let v: Value = reqwest::Client::new()
                .post(format!("{url}/api/publish"))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&json!({ "channel": "news", "data": i }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                v["offset"].as_u64().unwrap(),
                v["epoch"].as_str().unwrap().to_owned(),
            )
        })
    };
    let server = Server::start_in(data.path(), &[]);
    let mut epoch = String::new();
    for i in 1..=3 {
        epoch = publish(&server.url, i).1;
    }
    // SIGKILL. A backup of a stopped server, as deployment.md says: the checkpoint and the
    // files beside it (after a `kill -9` the newest publications may be only in the log).
    drop(server);
    copy_store(data.path(), backup.path());

    // A plain restart keeps the epoch; a client sees 4 and 5 in it.
    let server = Server::start_in(data.path(), &[]);
    assert_eq!(publish(&server.url, 4), (4, epoch.clone()));
    assert_eq!(publish(&server.url, 5), (5, epoch.clone()));
    drop(server);

    // The backup (taken at offset 3) is put back.
    copy_store(backup.path(), data.path());
    let server = Server::start_in(data.path(), &[]);
    let h = history(&rt, &server.url, "news");
    assert_ne!(
        h["epoch"],
        epoch.as_str(),
        "the restored channel kept its epoch: {h}"
    );
    assert_eq!(h["offset"], 3, "{h}");
    assert_eq!(
        h["publications"].as_array().unwrap().len(),
        3,
        "the restored history is kept: {h}"
    );
    let (offset, new_epoch) = publish(&server.url, 6);
    assert!(
        new_epoch != epoch,
        "offset {offset} of epoch {epoch} handed out twice"
    );
    drop(server);

    // A whole directory restored from a snapshot (file and mark), mark removed afterwards.
    let restarted_epoch = new_epoch;
    let snapshot = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(data.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), snapshot.path().join(entry.file_name())).unwrap();
    }
    let server = Server::start_in(data.path(), &[]);
    assert_eq!(
        publish(&server.url, 7).1,
        restarted_epoch,
        "a restart keeps it"
    );
    drop(server);
    for entry in std::fs::read_dir(snapshot.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), data.path().join(entry.file_name())).unwrap();
    }
    std::fs::remove_file(data.path().join("herald.run")).unwrap();
    let server = Server::start_in(data.path(), &[]);
    let (offset, epoch) = publish(&server.url, 8);
    assert!(
        epoch != restarted_epoch,
        "offset {offset} of epoch {epoch} handed out twice"
    );
}

/// Copies the store (its checkpoint `herald.index*`, log `herald.wal.*` and packed history
/// `herald.pack.*`) from one data directory to another, replacing the store there: what
/// deployment.md says a backup and a restore are.
fn copy_store(from: &std::path::Path, to: &std::path::Path) {
    let is_store = |name: &str| {
        name.starts_with("herald.index")
            || name.starts_with("herald.wal.")
            || name.starts_with("herald.pack.")
    };
    for entry in std::fs::read_dir(to).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_str().is_some_and(is_store) {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_str().is_some_and(is_store) {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}
