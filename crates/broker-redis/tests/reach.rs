//! A node knows whether it reaches Redis: a silent cut of its way there is found within
//! `unreachable_after`, and its return too.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use herald_broker::{conformance::Recorder, Broker, PublicationSink, StreamPolicy};
use herald_broker_redis::{
    testkit::{Partition, RedisServer},
    RedisBroker, RedisOptions,
};
use herald_protocol::ChannelName;

/// How long `done` took to hold, checked every 20 ms, or `None` past `within`.
async fn until(within: Duration, done: impl Fn() -> bool) -> Option<Duration> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while started.elapsed() < within {
        if done() {
            return Some(started.elapsed());
        }
        tick.tick().await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_finds_within_its_limit_that_redis_is_out_of_reach_and_back() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let broker = RedisBroker::start(
        RedisOptions {
            unreachable_after: Duration::from_secs(1),
            ..RedisOptions::at(partition.url(), "herald")
        },
        Arc::new(Recorder::default()) as Arc<dyn PublicationSink>,
    )
    .await
    .unwrap();
    let channel = ChannelName::new("reach").unwrap();
    broker.subscribe(&channel).await.unwrap();
    let reach = broker.reach().unwrap();
    assert_eq!(
        (reach.lost, reach.losses, reach.recoveries, reach.topology),
        (None, 0, 0, "single")
    );

    partition.blackhole();
    let found = until(Duration::from_secs(5), || {
        broker.reach().is_some_and(|r| r.lost.is_some())
    })
    .await
    .expect("the cut was never noticed");
    let reach = broker.reach().unwrap();
    assert!(
        found < Duration::from_millis(1500),
        "noticed after {found:?}"
    );
    assert_eq!(reach.losses, 1, "{reach:?}");
    assert!(
        reach.lost.as_deref().unwrap().starts_with("redis "),
        "{reach:?}"
    );

    partition.heal();
    until(Duration::from_secs(10), || {
        broker.reach().is_some_and(|r| r.lost.is_none())
    })
    .await
    .expect("the way back was never noticed");
    let reach = broker.reach().unwrap();
    assert_eq!((reach.losses, reach.recoveries), (1, 1), "{reach:?}");
    let published = broker
        .publish(&channel, Bytes::from("1"), StreamPolicy::default())
        .await;
    assert!(published.is_ok(), "{published:?}");
}

/// Publications made while a node's way to Redis was cut reach it once the way is back,
/// in order, however the cut ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_published_during_a_cut_arrives_after_it() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let sink = Arc::new(Recorder::default());
    let cut_off = RedisBroker::start(
        RedisOptions {
            unreachable_after: Duration::from_secs(1),
            ..RedisOptions::at(partition.url(), "herald")
        },
        sink.clone() as Arc<dyn PublicationSink>,
    )
    .await
    .unwrap();
    let other = RedisBroker::start(
        RedisOptions::at(redis.url(), "herald"),
        Arc::new(Recorder::default()) as Arc<dyn PublicationSink>,
    )
    .await
    .unwrap();
    let channel = ChannelName::new("cut").unwrap();
    cut_off.subscribe(&channel).await.unwrap();
    other
        .publish(&channel, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(sink.await_offsets("cut", 1).await, [1]);
    partition.blackhole();
    until(Duration::from_secs(5), || {
        cut_off.reach().is_some_and(|r| r.lost.is_some())
    })
    .await
    .expect("the cut was noticed");
    for n in 2..=4 {
        other
            .publish(
                &channel,
                Bytes::from(n.to_string()),
                StreamPolicy::default(),
            )
            .await
            .unwrap();
    }
    partition.heal();
    assert_eq!(sink.await_offsets("cut", 4).await, [1, 2, 3, 4]);
}
