//! What a failover test checks, whatever moves the primary (Sentinel or a cluster's own
//! election): two nodes publish (through both) and listen while a primary is killed
//! mid-stream; every acknowledged publication is in history once, in order, and both nodes
//! hand every one of them on once, in order; a publish that was not acknowledged may or
//! may not be there.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use herald_broker::{conformance::Recorder, Broker, HistoryQuery, PublicationSink, StreamPolicy};
use herald_broker_redis::{RedisBroker, RedisOptions};
use herald_protocol::{ChannelName, StreamPosition};

/// A node: the broker and what it handed on.
pub type Node = (Arc<RedisBroker>, Arc<Recorder>);

/// A node on `options`, its publications recorded.
pub async fn node(options: RedisOptions) -> Node {
    let sink = Arc::new(Recorder::default());
    let broker = RedisBroker::start(options, sink.clone() as Arc<dyn PublicationSink>)
        .await
        .unwrap();
    (broker, sink)
}

/// Subscribes every node to `channel`, publishes 50 acknowledged publications through
/// them in turn, calls `kill`, publishes until 50 more are acknowledged, and checks
/// history and every node's deliveries. Returns how long publishing stalled after the kill.
pub async fn publish_through(nodes: &[Node], channel: &str, kill: impl FnOnce()) -> Duration {
    let channel = ChannelName::new(channel).unwrap();
    for (broker, _) in nodes {
        broker.subscribe(&channel).await.unwrap();
    }
    let policy = StreamPolicy {
        history_size: 10_000,
        ..StreamPolicy::default()
    };
    let mut kill = Some(kill);
    let mut acked: Vec<(u64, Bytes)> = Vec::new();
    let mut refused = 0;
    let mut killed: Option<Instant> = None;
    let mut stalled = Duration::ZERO;
    let give_up = Instant::now() + Duration::from_secs(90);
    let mut n = 0u64;
    while acked.len() < 100 {
        assert!(
            Instant::now() < give_up,
            "publishing did not recover: {acked:?}"
        );
        if acked.len() == 50 {
            if let Some(kill) = kill.take() {
                kill();
                killed = Some(Instant::now());
            }
        }
        n += 1;
        let data = Bytes::from(format!("{{\"n\":{n}}}"));
        let (broker, _) = &nodes[n as usize % nodes.len()];
        match broker.publish(&channel, data.clone(), policy).await {
            Ok(position) => {
                if let Some(at) = killed.filter(|_| stalled.is_zero()) {
                    stalled = at.elapsed();
                }
                acked.push((position.offset, data));
            }
            Err(e) => {
                if refused < 3 || refused % 20 == 0 {
                    eprintln!("refused after {:?}: {e}", killed.map(|k| k.elapsed()));
                }
                refused += 1;
                // Not a sleep to wait for something: the pace of a publisher that retries.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!("{refused} publishes refused after the kill");
    // History holds every acknowledged publication once, in order.
    let history = nodes[0]
        .0
        .history(&channel, HistoryQuery::newest(10_000))
        .await
        .unwrap();
    let stored: Vec<&Bytes> = history.publications.iter().map(|p| &p.record).collect();
    let acked_data: Vec<&Bytes> = acked.iter().map(|(_, d)| d).collect();
    let kept: Vec<&Bytes> = stored
        .iter()
        .copied()
        .filter(|d| acked_data.contains(d))
        .collect();
    assert_eq!(kept, acked_data, "history after the failover");
    // Each node handed on every acknowledged publication once, in order.
    for (i, (_, sink)) in nodes.iter().enumerate() {
        let wanted: HashSet<&Bytes> = acked_data.iter().copied().collect();
        let all_there = sink
            .wait_until(Duration::from_secs(30), |s| {
                let got = s.records(channel.as_str());
                wanted.iter().all(|w| got.contains(w))
            })
            .await;
        let got = sink.records(channel.as_str());
        let handed: Vec<&Bytes> = got.iter().filter(|d| wanted.contains(d)).collect();
        assert!(all_there, "node {i} missed some: {handed:?}");
        assert_eq!(handed, acked_data, "node {i}: once each, in order");
    }
    stalled
}

/// After a failover that lost `last` and the publications before it down to the third
/// (acknowledged through another node, while nobody listened to `channel`): `reader`, a
/// node that never touched the channel, sees it in a new epoch with the three the promoted
/// replica had, and its next publication is not handed a lost offset in the old epoch.
pub async fn renewed_after_loss(
    reader: &RedisBroker,
    channel: &ChannelName,
    last: &StreamPosition,
) {
    let newest = || HistoryQuery {
        since: None,
        limit: 10,
        max_bytes: None,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let read = loop {
        if let Ok(read) = reader.history(channel, newest()).await {
            if read.position.epoch != last.epoch {
                break read;
            }
            assert!(
                read.position.offset < last.offset,
                "the failover lost nothing: the replicas were not held back"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the stream stands below the acknowledged offset {} in the epoch it was acknowledged in",
            last.offset
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(
        read.publications.len(),
        3,
        "the history the promoted replica had is kept"
    );
    let policy = StreamPolicy::default();
    let next = reader
        .publish(channel, Bytes::from("\"after\""), policy)
        .await
        .unwrap();
    assert_ne!(
        next.epoch, last.epoch,
        "offset {} handed out again",
        next.offset
    );
}
