//! The Redis broker against a real redis-server: the shared contract, two nodes on one
//! Redis, and a pub/sub connection lost mid-stream.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use bytes::Bytes;
use herald_broker::{
    conformance::{self, Recorder},
    Broker, BrokerError, HistoryQuery, PublicationSink, SharedBroker, StreamPolicy,
};
use herald_broker_redis::{
    testkit::{self, RedisServer},
    RedisBroker, RedisOptions,
};
use herald_protocol::ChannelName;

fn options(redis: &RedisServer, prefix: &str) -> RedisOptions {
    RedisOptions {
        url: redis.url(),
        prefix: prefix.into(),
    }
}

fn ch(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_broker_contract() {
    let redis = RedisServer::start();
    // Every broker the suite builds gets its own prefix: a fresh, empty store.
    let runs = AtomicUsize::new(0);
    conformance::run_all(|sink| {
        let prefix = format!("conformance{}", runs.fetch_add(1, Ordering::Relaxed));
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(RedisBroker::start(options(&redis, &prefix), sink))
        });
        let broker: SharedBroker = broker.unwrap();
        broker
    })
    .await;
}

async fn node(redis: &RedisServer) -> (Arc<RedisBroker>, Arc<Recorder>) {
    let sink = Arc::new(Recorder::default());
    let broker = RedisBroker::start(
        options(redis, "herald"),
        sink.clone() as Arc<dyn PublicationSink>,
    )
    .await
    .unwrap();
    (broker, sink)
}

#[tokio::test]
async fn two_nodes_share_one_order() {
    let redis = RedisServer::start();
    let (a, seen_a) = node(&redis).await;
    let (b, seen_b) = node(&redis).await;
    let c = ch("shared:room");
    a.subscribe(&c).await.unwrap();
    b.subscribe(&c).await.unwrap();
    let publishers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|broker| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    broker
                        .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for p in publishers {
        p.await.unwrap();
    }
    let all: Vec<u64> = (1..=200).collect();
    assert_eq!(seen_a.await_offsets("shared:room", 200).await, all);
    assert_eq!(seen_b.await_offsets("shared:room", 200).await, all);
    // One epoch for both nodes.
    let epochs: std::collections::HashSet<String> = seen_a
        .0
        .lock()
        .iter()
        .chain(seen_b.0.lock().iter())
        .map(|r| r.1.clone())
        .collect();
    assert_eq!(epochs.len(), 1, "{epochs:?}");
    // A node that never subscribed is handed nothing, but reads the same history.
    let (c_node, seen_c) = node(&redis).await;
    let h = c_node
        .history(
            &c,
            HistoryQuery {
                since: None,
                limit: 3,
                max_bytes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(h.position.offset, 200);
    assert_eq!(
        h.publications.iter().map(|p| p.offset).collect::<Vec<_>>(),
        [198, 199, 200]
    );
    assert!(seen_c.0.lock().is_empty());
}

#[tokio::test]
async fn a_lost_pubsub_connection_is_caught_up_from_history() {
    let redis = RedisServer::start();
    let (a, _) = node(&redis).await;
    let (b, seen_b) = node(&redis).await;
    let c = ch("shared:blip");
    b.subscribe(&c).await.unwrap();
    let publisher = {
        let (a, c) = (a.clone(), c.clone());
        tokio::spawn(async move {
            for i in 0..600u32 {
                a.publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
                    .await
                    .unwrap();
            }
        })
    };
    // Cut every pub/sub connection while publications keep coming.
    seen_b.await_offsets("shared:blip", 50).await;
    redis.kill_clients();
    publisher.await.unwrap();
    let all: Vec<u64> = (1..=600).collect();
    assert_eq!(
        seen_b.await_offsets("shared:blip", 600).await,
        all,
        "every offset once, in order, across the reconnect"
    );
    let (reconnects, caught_up) = b.recoveries();
    assert!(reconnects >= 1, "the listener reconnected");
    eprintln!("read back from history after the reconnect: {caught_up}");
}

#[tokio::test]
async fn history_older_than_its_ttl_is_gone() {
    let redis = RedisServer::start();
    let (a, _) = node(&redis).await;
    let c = ch("ttl:x");
    let policy = StreamPolicy {
        history_ttl: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let first = a.publish(&c, Bytes::from("1"), policy).await.unwrap();
    // Expiry is about elapsed time: nothing to await but the clock.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    a.publish(&c, Bytes::from("2"), policy).await.unwrap();
    let since = |offset| HistoryQuery {
        since: Some(herald_protocol::Since {
            offset,
            epoch: Some(first.epoch.clone()),
        }),
        limit: 10,
        max_bytes: None,
    };
    let h = a.history(&c, since(1)).await.unwrap();
    assert_eq!(h.publications.len(), 1);
    assert_eq!(h.publications[0].offset, 2);
    let from_start = a.history(&c, since(0)).await.unwrap();
    assert_eq!(
        from_start.publications[0].offset, 2,
        "offset 1 expired: a read from the start begins at 2 (a resume reports the gap)"
    );
}

#[tokio::test]
async fn an_unreachable_redis_is_a_clear_error() {
    let err = RedisBroker::connect(RedisOptions {
        url: testkit::unreachable_url(),
        prefix: "herald".into(),
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, BrokerError::Unavailable(ref m) if m.starts_with("redis:")),
        "{err}"
    );
}
