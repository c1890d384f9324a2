//! The Redis broker through Redis Sentinel, against real servers: a primary, two replicas
//! and three Sentinels on loopback ports.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use herald_broker::{
    conformance::{self, Recorder},
    Broker, HistoryQuery, PublicationSink, SharedBroker, StreamPolicy,
};
use herald_broker_redis::{
    testkit::{SentinelSet, MASTER_NAME},
    RedisBroker, RedisOptions, RedisSentinel,
};
use herald_protocol::ChannelName;

fn options(set: &SentinelSet, prefix: &str, replicas_ack: u32) -> RedisOptions {
    RedisOptions {
        sentinel: Some(RedisSentinel {
            addresses: set.sentinels(),
            master_name: MASTER_NAME.into(),
            password: None,
        }),
        replicas_ack,
        replicas_timeout: Duration::from_secs(1),
        ..RedisOptions::at(set.url(), prefix)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_broker_contract_through_sentinel() {
    let set = SentinelSet::start();
    let runs = AtomicUsize::new(0);
    conformance::run_all(|sink| {
        let prefix = format!("conformance{}", runs.fetch_add(1, Ordering::Relaxed));
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(RedisBroker::start(options(&set, &prefix, 1), sink))
        });
        let broker: SharedBroker = broker.unwrap();
        broker
    })
    .await;
}

/// A start with no Sentinel that knows the primary says which were asked and why.
#[tokio::test]
async fn sentinels_that_name_no_primary_are_a_clear_error() {
    let set = SentinelSet::start();
    let mut wrong = options(&set, "herald", 0);
    if let Some(s) = wrong.sentinel.as_mut() {
        s.master_name = "nobody".into();
    }
    let err = RedisBroker::connect(wrong).await.unwrap_err().to_string();
    assert!(
        err.contains("no sentinel named a primary for \"nobody\""),
        "{err}"
    );
    assert!(err.contains(&set.sentinels()[0]), "{err}");
}

/// The failover: two nodes publish (through both) and listen while the primary is killed
/// (SIGKILL) mid-stream. With `replicas_ack = 1`, every acknowledged publication is in the
/// new primary's history once, in order, and both nodes hand every one of them on once, in
/// order; a publish that was not acknowledged may or may not be there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_no_acknowledged_publication() {
    let mut set = SentinelSet::start();
    let channel = ChannelName::new("chaos").unwrap();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let sink = Arc::new(Recorder::default());
        let broker = RedisBroker::start(
            options(&set, "herald", 1),
            sink.clone() as Arc<dyn PublicationSink>,
        )
        .await
        .unwrap();
        broker.subscribe(&channel).await.unwrap();
        nodes.push((broker, sink));
    }
    let policy = StreamPolicy {
        history_size: 10_000,
        ..StreamPolicy::default()
    };
    let mut acked: Vec<(u64, Bytes)> = Vec::new();
    let mut refused = 0;
    let mut killed: Option<Instant> = None;
    let mut stalled = Duration::ZERO;
    let give_up = Instant::now() + Duration::from_secs(90);
    let mut n = 0u64;
    // 50 acknowledged before the kill, 50 after.
    while acked.len() < 100 {
        assert!(
            Instant::now() < give_up,
            "publishing did not recover: {acked:?}"
        );
        if acked.len() == 50 && killed.is_none() {
            set.kill_primary();
            killed = Some(Instant::now());
        }
        n += 1;
        let data = Bytes::from(format!("{{\"n\":{n}}}"));
        let (broker, _) = &nodes[(n % 2) as usize];
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
    eprintln!(
        "failover: publishing stalled {stalled:?} after the kill; {refused} publishes refused meanwhile"
    );
    // The new primary's history holds every acknowledged publication once, in order.
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
                let got = s.records("chaos");
                wanted.iter().all(|w| got.contains(w))
            })
            .await;
        let got = sink.records("chaos");
        let handed: Vec<&Bytes> = got.iter().filter(|d| wanted.contains(d)).collect();
        assert!(all_there, "node {i} missed some: {handed:?}");
        assert_eq!(handed, acked_data, "node {i}: once each, in order");
    }
}
