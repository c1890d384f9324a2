//! Resuming after a disconnect: exactly the missed publications, or `recovered: false`.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use herald_server::config::NamespaceOverride;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn resume_replays_exactly_the_missed_publications_then_continues_live() {
    let server = start(config()).await;
    let mut c = server.client().await;
    let sub = c.subscribe("r", None).await;
    let epoch = sub["epoch"].as_str().unwrap().to_string();
    for i in 1..=3 {
        server.publish("r", json!(i)).await;
    }
    for i in 1..=3 {
        assert_eq!(c.next_pub().await.1, i);
    }
    drop(c);
    for i in 4..=8 {
        server.publish("r", json!(i)).await;
    }
    let mut c = server.client().await;
    let r = c.subscribe("r", Some((3, &epoch))).await;
    assert_eq!(r["recovered"], true);
    assert_eq!(r["epoch"], epoch.as_str());
    let replayed: Vec<_> = r["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["offset"].as_u64().unwrap(), p["data"].clone()))
        .collect();
    assert_eq!(replayed, (4..=8).map(|i| (i, json!(i))).collect::<Vec<_>>());
    server.publish("r", json!(9)).await;
    assert_eq!(c.next_pub().await.1, 9);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_gap_history_cannot_cover_is_reported_not_skipped() {
    let mut cfg = config();
    cfg.namespaces.insert(
        "short".into(),
        NamespaceOverride {
            history_size: Some(2),
            ..Default::default()
        },
    );
    let server = start(cfg).await;
    let mut epoch = String::new();
    for i in 1..=10 {
        epoch = server.publish("short:x", json!(i)).await.1;
    }
    let mut c = server.client().await;
    let r = c.subscribe("short:x", Some((3, &epoch))).await;
    assert_eq!(r["recovered"], false);
    assert_eq!(r["offset"], 10);
    assert!(r.get("publications").is_none(), "no partial replay: {r}");
    // The subscription continues live from the reported position.
    server.publish("short:x", json!(11)).await;
    assert_eq!(c.next_pub().await.1, 11);

    let mut other = server.client().await;
    let r = other
        .subscribe("short:x", Some((10, "not-the-epoch")))
        .await;
    assert_eq!(r["recovered"], false, "a different epoch is never trusted");
    server.stop().await.unwrap();
}

/// A publisher runs flat out while a client keeps dropping its connection and resuming;
/// publications that land during a replay must be neither lost nor repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_under_concurrent_publishing_loses_and_repeats_nothing() {
    const TOTAL: u64 = 400;
    let server = Arc::new(start(config()).await);
    let mut c = server.client().await;
    let first = c.subscribe("busy", None).await;
    let epoch = first["epoch"].as_str().unwrap().to_string();

    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (server, done) = (server.clone(), done.clone());
        tokio::spawn(async move {
            for i in 1..=TOTAL {
                server.publish("busy", json!(i)).await;
            }
            done.store(true, Ordering::SeqCst);
        })
    };

    let mut seen = Vec::new();
    let mut round = 0;
    while seen.last().copied().unwrap_or(0) < TOTAL {
        round += 1;
        // Read a few publications, then drop the connection mid-stream and resume.
        for _ in 0..(round % 7 + 1) {
            if seen.last() == Some(&TOTAL) {
                break;
            }
            seen.push(c.next_pub().await.1);
        }
        drop(c);
        c = server.client().await;
        let last = seen.last().copied().unwrap_or(0);
        let r = c.subscribe("busy", Some((last, &epoch))).await;
        assert_eq!(r["recovered"], true, "{r}");
        seen.extend(offsets(&r));
    }
    publisher.await.unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(
        seen,
        (1..=TOTAL).collect::<Vec<_>>(),
        "after {round} reconnects"
    );
    Arc::into_inner(server).unwrap().stop().await.unwrap();
}
