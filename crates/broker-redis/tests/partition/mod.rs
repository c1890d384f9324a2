//! The silent partition, whatever the topology (one Redis, Sentinel, a cluster): one node
//! is cut off from Redis without a word (every connection it has open goes silent) while
//! another publishes; it must notice, reconnect, catch up every channel it listens to and
//! work again, as the issue of the node-cut-off work asked (#57 runs it on each topology).

use std::sync::Arc;

use bytes::Bytes;
use herald_broker::{conformance::Recorder, Broker, PublicationSink, StreamPolicy};
use herald_broker_redis::{RedisBroker, RedisOptions};
use herald_protocol::ChannelName;

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

/// `publisher` reaches Redis directly; the node on `behind` (its way to Redis through
/// relays) is cut off by `cut` mid-stream. Checks that a subscribe across the partition
/// returns, that every channel is caught up (one with no delivery before the cut too),
/// and that publications reach the node and go through it again afterwards.
pub async fn a_node_cut_off_catches_up(
    publisher: &RedisBroker,
    behind: RedisOptions,
    cut: impl Fn(),
) {
    let seen = Arc::new(Recorder::default());
    let behind = RedisBroker::start(behind, seen.clone() as Arc<dyn PublicationSink>)
        .await
        .unwrap();
    let (busy, quiet) = (ch("room:busy"), ch("room:quiet"));
    behind.subscribe(&busy).await.unwrap();
    behind.subscribe(&quiet).await.unwrap();
    publisher
        .publish(&busy, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    seen.await_offsets("room:busy", 1).await;

    cut();
    for c in [&busy, &quiet] {
        publisher
            .publish(c, Bytes::from("2"), StreamPolicy::default())
            .await
            .unwrap();
    }
    // Before the fix this never returned, and held every other join of the node behind it.
    let late = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        behind.subscribe(&ch("room:late")),
    )
    .await;
    assert!(late.is_ok(), "a subscribe across a partition returns");

    let done = seen
        .wait_until(std::time::Duration::from_secs(30), |seen| {
            seen.offsets("room:busy").len() >= 2 && !seen.offsets("room:quiet").is_empty()
        })
        .await;
    let (b, q) = (seen.offsets("room:busy"), seen.offsets("room:quiet"));
    assert!(done, "not caught up: busy {b:?}, quiet {q:?}");
    assert_eq!(b, [1, 2]);
    assert_eq!(
        q,
        [1],
        "a channel with no delivery before the cut is caught up too"
    );
    assert!(behind.recoveries().0 >= 1, "the node reconnected");
    // And the node works again: publications reach it live.
    behind.subscribe(&ch("room:late")).await.unwrap();
    publisher
        .publish(&busy, Bytes::from("3"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(seen.await_offsets("room:busy", 3).await, [1, 2, 3]);
    // Publishing through the partitioned node works again too (its command connection was
    // silenced as well).
    let published = async {
        loop {
            if let Ok(p) = behind
                .publish(&busy, Bytes::from("4"), StreamPolicy::default())
                .await
            {
                return p;
            }
        }
    };
    let p = tokio::time::timeout(std::time::Duration::from_secs(30), published)
        .await
        .expect("the command connection is replaced");
    assert_eq!(p.offset, 4);
}
