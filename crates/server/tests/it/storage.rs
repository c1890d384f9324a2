//! The durable store behind a running server: retention with live subscribers,
//! memory-only namespaces, restarts.

use std::time::Duration;

use herald_server::config::NamespaceOverride;
use serde_json::json;

use crate::support::*;

fn durable_config(dir: &std::path::Path) -> herald_server::Config {
    let mut cfg = config();
    cfg.data_dir = dir.to_owned();
    cfg.namespaces.insert(
        "small".into(),
        NamespaceOverride {
            history_size: Some(5),
            ..Default::default()
        },
    );
    cfg.namespaces.insert(
        "brief".into(),
        NamespaceOverride {
            history_ttl: Some(Duration::from_millis(300)),
            ..Default::default()
        },
    );
    cfg.namespaces.insert(
        "tmp".into(),
        NamespaceOverride {
            durable: Some(false),
            ..Default::default()
        },
    );
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_while_subscribers_keep_receiving_everything() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_embedded(durable_config(dir.path())).await;
    let mut c = server.client().await;
    let epoch = c.subscribe("small:x", None).await["epoch"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 1..=50 {
        server.publish("small:x", json!(i)).await;
    }
    for i in 1..=50 {
        assert_eq!(
            c.next_pub().await.1,
            i,
            "live delivery is unaffected by trimming"
        );
    }
    let (_, h) = server.api_get("/api/history?channel=small:x").await;
    assert_eq!(offsets(&h), [46, 47, 48, 49, 50]);
    let mut late = server.client().await;
    assert_eq!(
        late.subscribe("small:x", Some((45, &epoch))).await["recovered"],
        true
    );
    let mut later = server.client().await;
    assert_eq!(
        later.subscribe("small:x", Some((40, &epoch))).await["recovered"],
        false
    );

    // Age: expired publications leave history while a subscriber stays connected.
    let mut b = server.client().await;
    b.subscribe("brief:x", None).await;
    server.publish("brief:x", json!("old")).await;
    assert_eq!(b.next_pub().await.1, 1);
    eventually("expired history is dropped", || async {
        server.api_get("/api/history?channel=brief:x").await.1["publications"]
            .as_array()
            .is_none_or(|p| p.is_empty())
    })
    .await;
    server.publish("brief:x", json!("new")).await;
    assert_eq!(
        b.next_pub().await.1,
        2,
        "offsets keep counting after trimming"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn durable_namespaces_survive_a_restart_and_memory_ones_start_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_embedded(durable_config(dir.path())).await;
    let (_, kept_epoch) = server.publish("chat:x", json!("kept")).await;
    let (_, lost_epoch) = server.publish("tmp:x", json!("lost")).await;
    server.stop().await.unwrap();

    let server = start_embedded(durable_config(dir.path())).await;
    let (_, chat) = server.api_get("/api/history?channel=chat:x&since=0").await;
    assert_eq!(chat["epoch"], kept_epoch.as_str());
    assert_eq!(
        chat["publications"],
        json!([{ "offset": 1, "data": "kept" }])
    );
    let (_, tmp) = server.api_get("/api/history?channel=tmp:x").await;
    assert_ne!(tmp["epoch"], lost_epoch.as_str());
    assert_eq!(tmp["offset"], 0);
    let mut c = server.client().await;
    let r = c.subscribe("tmp:x", Some((1, &lost_epoch))).await;
    assert_eq!(
        r["recovered"], false,
        "the client is told, not silently skipped"
    );
    server.stop().await.unwrap();
}

/// Issue #37, item 4: Redis restarted from an older dump (its data went back from offset 5
/// to 3) under a node whose subscriber saw 4 and 5. The node notices when it catches up
/// after the reconnect (the channel stands below what it handed over, in the same epoch)
/// and gives the channel a new epoch, keeping its history. The next publications are not 4
/// and 5 again in the old epoch, which the subscriber would skip as duplicates: they arrive
/// in the new one, the subscriber is cut, and resuming from 5 it is told `recovered: false`.
#[tokio::test]
async fn redis_restarted_from_an_older_dump_starts_a_new_epoch_under_a_live_subscriber() {
    let mut redis = herald_broker_redis::testkit::RedisServer::start();
    let server = start_on_redis(config(), &redis).await;
    let channel = "chat:dump";
    let mut watcher = server.client().await;
    watcher.subscribe(channel, None).await;
    for i in 1..=3 {
        server.publish(channel, json!(i)).await;
    }
    redis.save();
    let mut epoch = String::new();
    for i in 4..=5 {
        epoch = server.publish(channel, json!(i)).await.1;
    }
    for want in 1..=5 {
        assert_eq!(watcher.next_pub().await.1, want);
    }

    redis.restart_from_dump();
    eventually("the channel continues in a new epoch", || async {
        let (status, h) = server
            .api_get(&format!("/api/history?channel={channel}"))
            .await;
        status == 200 && h["epoch"].as_str().is_some_and(|e| e != epoch)
    })
    .await;
    let (_, h) = server
        .api_get(&format!("/api/history?channel={channel}&since=0"))
        .await;
    assert_eq!(h["offset"], 3, "the dump's history is kept: {h}");
    assert_eq!(offsets(&h), [1, 2, 3], "{h}");

    let (offset, new_epoch) = server.publish(channel, json!(6)).await;
    assert_eq!(offset, 4);
    assert_ne!(
        new_epoch, epoch,
        "offset 4 of epoch {epoch} handed out twice"
    );
    let closed = watcher.closed().await;
    assert_eq!(closed.code, 3002, "{closed:?}");
    let mut resumed = server.client().await;
    let reply = resumed.subscribe(channel, Some((5, &epoch))).await;
    assert_eq!(reply["recovered"], false, "{reply}");
    assert_eq!(reply["epoch"], new_epoch.as_str(), "{reply}");
}
