//! The Redis broker through Redis Sentinel, against real servers: a primary, two replicas
//! and three Sentinels on loopback ports.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use herald_broker::{conformance, SharedBroker};
use herald_broker_redis::{
    testkit::{SentinelSet, MASTER_NAME},
    RedisBroker, RedisOptions, RedisSentinel,
};

mod failover;
mod partition;

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
/// (SIGKILL) mid-stream. With `replicas_ack = 1`, nothing acknowledged is lost or doubled
/// (see [`failover::publish_through`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_no_acknowledged_publication() {
    let mut set = SentinelSet::start();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        nodes.push(failover::node(options(&set, "herald", 1)).await);
    }
    let stalled = failover::publish_through(&nodes, "chaos", || {
        set.kill_primary();
    })
    .await;
    eprintln!("sentinel failover: publishing stalled {stalled:?} after the kill");
}

/// Issue #57 item 6: a failover to a replica that lacked acknowledged publications, while
/// no node listened to the channel. The promoted replica continues the replication history,
/// so the scripts keep the epoch; its copy of the stream went back with the writes it
/// lacked, and the next publication took an acknowledged offset again in the same epoch.
/// Now the node that acknowledged them checks after the failover, and the channel goes on
/// in a new epoch, which every node sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_writes_nobody_listened_to_gives_a_new_epoch() {
    use bytes::Bytes;
    use herald_broker::{Broker, StreamPolicy};
    use herald_protocol::ChannelName;

    let mut set = SentinelSet::start();
    let c = ChannelName::new("lagged:unwatched").unwrap();
    let policy = StreamPolicy::default();
    // The first three on both replicas (the publish waits for them), so the stream the
    // promoted replica holds is this one, three publications short.
    let (careful, _) = failover::node(options(&set, "herald", 2)).await;
    for i in 0..3 {
        careful
            .publish(&c, Bytes::from(i.to_string()), policy)
            .await
            .unwrap();
    }
    let (a, _) = failover::node(options(&set, "herald", 0)).await;
    // A node that never touches the channel before the failover: it reads it after.
    let (b, _) = failover::node(options(&set, "herald", 0)).await;
    set.pause_replicas(true);
    let mut acked = Vec::new();
    for i in 3..6 {
        acked.push(
            a.publish(&c, Bytes::from(i.to_string()), policy)
                .await
                .unwrap(),
        );
    }
    set.kill_primary();
    set.pause_replicas(false);
    let last = acked.last().unwrap().clone();
    failover::renewed_after_loss(&b, &c, &last).await;
}

/// The partition test (see `partition`) through Sentinel: the cut-off node finds the
/// primary through a Sentinel whose answers name a relay in front of it, which the test
/// silences; the node must notice, ask again and catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_is_noticed_and_caught_up() {
    let set = SentinelSet::start();
    let (to_primary, to_sentinels) = set.relays();
    let (publisher, _) = failover::node(options(&set, "herald", 0)).await;
    let mut behind = options(&set, "herald", 0);
    if let Some(s) = &mut behind.sentinel {
        s.addresses = (to_sentinels.iter())
            .map(|r| format!("127.0.0.1:{}", r.port()))
            .collect();
    }
    partition::a_node_cut_off_catches_up(&publisher, behind, || to_primary.cut()).await;
}
