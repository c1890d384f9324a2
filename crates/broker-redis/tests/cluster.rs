//! The Redis broker on a Redis Cluster, against real servers: three primaries (with a
//! replica each where a failover is tested) on loopback ports.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use herald_broker::{
    conformance::{self, Recorder},
    Broker, Member, PresenceEvents, SharedBroker, StreamPolicy,
};
use herald_broker_redis::{testkit::ClusterSet, RedisBroker, RedisOptions, BEAT_EVERY, NODE_TTL};
use herald_protocol::ChannelName;

mod failover;
mod partition;

fn options(set: &ClusterSet, prefix: &str) -> RedisOptions {
    RedisOptions {
        cluster: set.addresses(),
        ..RedisOptions::at(format!("redis://{}", set.addresses()[0]), prefix)
    }
}

async fn start(set: &ClusterSet, prefix: &str) -> Arc<RedisBroker> {
    RedisBroker::start(options(set, prefix), Arc::new(Recorder::default()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_broker_contract_on_a_cluster() {
    let set = ClusterSet::start(0);
    let runs = AtomicUsize::new(0);
    conformance::run_all(|sink| {
        let prefix = format!("conformance{}", runs.fetch_add(1, Ordering::Relaxed));
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(RedisBroker::start(options(&set, &prefix), sink))
        });
        let broker: SharedBroker = broker.unwrap();
        broker
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_presence_contract_on_a_cluster() {
    let set = ClusterSet::start(0);
    let runs = AtomicUsize::new(0);
    conformance::run_presence(|| {
        let prefix = format!("presence{}", runs.fetch_add(1, Ordering::Relaxed));
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(start(&set, &prefix))
        });
        broker.presence()
    })
    .await;
}

/// A channel's publications travel on a shard channel at its slot's primary: no classic
/// pub/sub channel carries them, so no Redis node relays them to nodes that do not listen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publications_travel_on_shard_channels() {
    let set = ClusterSet::start(0);
    let (node, sink) = failover::node(options(&set, "herald")).await;
    let channel = ChannelName::new("sharded").unwrap();
    node.subscribe(&channel).await.unwrap();
    node.publish(&channel, Bytes::from_static(b"{}"), StreamPolicy::default())
        .await
        .unwrap();
    sink.await_offsets("sharded", 1).await;
    let primary = set.primary_of("herald:{sharded}:p");
    let shard = set.cli(primary, &["PUBSUB", "SHARDCHANNELS"]);
    assert!(shard.contains("herald:{sharded}:p"), "{shard:?}");
    for address in set.addresses() {
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        let classic = set.cli(port, &["PUBSUB", "CHANNELS"]);
        assert!(!classic.contains("sharded"), "{address}: {classic:?}");
    }
}

/// Joins and leaves a node's presence heard.
#[derive(Default)]
struct Expired {
    members: parking_lot::Mutex<Vec<(String, u64)>>,
    changed: tokio::sync::Notify,
}

impl PresenceEvents for Expired {
    fn heard(&self, _batch: Bytes) {}
    fn expired(&self, channel: &ChannelName, gone: Vec<Member>) {
        let mut members = self.members.lock();
        members.extend(gone.into_iter().map(|m| (channel.to_string(), m.id)));
        self.changed.notify_waiters();
    }
}

fn anonymous(id: u64) -> Member {
    Member {
        id,
        info: Bytes::new(),
    }
}

/// Two nodes share presence in channels of different slots; the members only a dead node
/// held (it never says goodbye) are removed by the other within the node TTL and two beats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_shared_across_slots_and_a_dead_nodes_members_expire() {
    let set = ClusterSet::start(0);
    let a = start(&set, "herald").await;
    let b = start(&set, "herald").await;
    let (pa, pb) = (a.presence(), b.presence());
    let expired = Arc::new(Expired::default());
    pa.listen(Arc::downgrade(&expired) as std::sync::Weak<dyn PresenceEvents>);
    let rooms: Vec<ChannelName> = (0..8)
        .map(|i| ChannelName::new(&format!("room:{i}")).unwrap())
        .collect();
    for room in &rooms {
        assert!(pa.join(room, &anonymous(1), None).await.unwrap());
        assert!(pb.join(room, &anonymous(2), Some("bo")).await.unwrap());
        assert!(
            !pb.join(room, &anonymous(1), None).await.unwrap(),
            "held twice"
        );
        let stats = pa.stats(room).await.unwrap();
        assert_eq!((stats.clients, stats.users), (2, 1), "{room}");
    }
    // b leaves one room itself: nothing of it is left there to sweep.
    assert!(pb.leave(&rooms[0], 2).await.unwrap());
    assert!(!pb.leave(&rooms[0], 1).await.unwrap(), "a still holds 1");
    drop(pb);
    drop(b);
    let started = std::time::Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let changed = expired.changed.notified();
            if expired.members.lock().len() >= rooms.len() - 1 {
                return;
            }
            changed.await;
        }
    })
    .await;
    assert!(waited.is_ok(), "expired: {:?}", expired.members.lock());
    assert!(
        started.elapsed() <= NODE_TTL + 2 * BEAT_EVERY,
        "within the documented time: {:?}",
        started.elapsed()
    );
    let mut gone = expired.members.lock().clone();
    gone.sort();
    let wanted: Vec<(String, u64)> = rooms[1..].iter().map(|r| (r.to_string(), 2)).collect();
    assert_eq!(gone, wanted, "b's member, once per room it still held");
    for room in &rooms {
        let stats = pa.stats(room).await.unwrap();
        assert_eq!(
            (stats.clients, stats.users),
            (1, 0),
            "{room}: a's member stays"
        );
        assert_eq!(
            pa.members(room, None, 10).await.unwrap(),
            vec![anonymous(1)]
        );
    }
}

/// A primary killed (SIGKILL) mid-stream: a replica takes over its slots (two replicas
/// each, so the new primary still has one for `WAIT`), and with `replicas_ack = 1`
/// nothing acknowledged is lost or doubled, on two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_on_a_cluster_loses_no_acknowledged_publication() {
    let mut set = ClusterSet::start(2);
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let options = RedisOptions {
            replicas_ack: 1,
            replicas_timeout: Duration::from_secs(1),
            ..options(&set, "herald")
        };
        nodes.push(failover::node(options).await);
    }
    let primary = set.primary_of("herald:{chaos}:m");
    let stalled = failover::publish_through(&nodes, "chaos", || set.kill(primary)).await;
    eprintln!("cluster failover: publishing stalled {stalled:?} after the kill");
}

/// A channel's slot moved to another primary mid-stream (resharding): Redis unsubscribes
/// its shard channel, the nodes subscribe again where it went and catch up, and nothing
/// acknowledged is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_moves_loses_no_acknowledged_publication() {
    let set = ClusterSet::start(0);
    let mut nodes = Vec::new();
    for _ in 0..2 {
        nodes.push(failover::node(options(&set, "herald")).await);
    }
    let stalled = failover::publish_through(&nodes, "moving", || {
        set.move_slot_of("herald:{moving}:m");
    })
    .await;
    eprintln!("slot move: publishing stalled {stalled:?}");
    for (broker, _) in &nodes {
        let reach = broker.reach().unwrap();
        assert_eq!(reach.topology, "cluster");
        assert!(reach.moves >= 1, "the node followed the slot");
        assert!(reach.resubscriptions >= 1, "and subscribed again");
    }
}

/// A node listening to 2,000 channels (about 120 slots hold two or more) loses its pub/sub
/// connections: it subscribes to all of them again, one `SSUBSCRIBE` per slot (one that
/// spanned slots would be refused with CROSSSLOT, and its channels left unsubscribed), and
/// every channel's next publication reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_channels_are_subscribed_again_slot_by_slot() {
    let set = ClusterSet::start(0);
    let (listening, sink) = failover::node(options(&set, "herald")).await;
    let publishing = start(&set, "herald").await;
    let channels: Vec<ChannelName> = (0..2000)
        .map(|i| ChannelName::new(&format!("c{i}")).unwrap())
        .collect();
    for channel in &channels {
        listening.subscribe(channel).await.unwrap();
    }
    set.kill_pubsub_clients();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while listening.reach().unwrap().resubscriptions == 0
        || listening.reach().unwrap().lost.is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never subscribed again"
        );
        // Polling the node's own account of itself, not waiting for time to pass.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for channel in &channels {
        publishing
            .publish(channel, Bytes::from_static(b"{}"), StreamPolicy::default())
            .await
            .unwrap();
    }
    let all = sink
        .wait_until(Duration::from_secs(30), |s| {
            channels.iter().all(|c| s.offsets(c.as_str()) == vec![1])
        })
        .await;
    let missing: Vec<&ChannelName> = channels
        .iter()
        .filter(|c| sink.offsets(c.as_str()) != vec![1])
        .collect();
    assert!(
        all,
        "{} channels missed their publication: {missing:?}",
        missing.len()
    );
}

/// Issue #57 item 6 on a cluster: the channel's primary fails over to a replica that lacked
/// acknowledged publications, while no node listened to the channel. The node that
/// acknowledged them reads every primary's replication id, sees the shard's change, and
/// the channel goes on in a new epoch (see the Sentinel test of the same name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_writes_nobody_listened_to_gives_a_new_epoch() {
    let mut set = ClusterSet::start(1);
    let c = ChannelName::new("lagged").unwrap();
    let policy = StreamPolicy::default();
    let primary = set.primary_of("herald:{lagged}:m");
    let replicas = set.replicas_of(primary);
    assert_eq!(replicas.len(), 1, "the primary has its replica");
    // The first three on the replica too (the publish waits for it).
    let careful = RedisOptions {
        replicas_ack: 1,
        replicas_timeout: Duration::from_secs(5),
        ..options(&set, "herald")
    };
    let (careful, _) = failover::node(careful).await;
    for i in 0..3 {
        careful
            .publish(&c, Bytes::from(i.to_string()), policy)
            .await
            .unwrap();
    }
    let (a, _) = failover::node(options(&set, "herald")).await;
    let (b, _) = failover::node(options(&set, "herald")).await;
    set.pause(&replicas, true);
    set.cli(primary, &["CLIENT", "KILL", "TYPE", "replica"]);
    let mut last = None;
    for i in 3..6 {
        last = Some(
            a.publish(&c, Bytes::from(i.to_string()), policy)
                .await
                .unwrap(),
        );
    }
    let last = last.unwrap();
    set.kill(primary);
    set.pause(&replicas, false);
    failover::renewed_after_loss(&b, &c, &last).await;
}

/// The partition test (see `partition`) on a cluster: the cut-off node reaches every
/// cluster node through a relay of its own, whose answers (slot maps, redirections) name
/// the relays instead of the nodes; the test silences them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_is_noticed_and_caught_up() {
    use herald_broker::relay::Partition;

    let set = ClusterSet::start(0);
    let relays = set.relays();
    let (publisher, _) = failover::node(options(&set, "herald")).await;
    let behind = RedisOptions {
        cluster: relays
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.port()))
            .collect(),
        ..RedisOptions::at(format!("redis://127.0.0.1:{}", relays[0].port()), "herald")
    };
    partition::a_node_cut_off_catches_up(&publisher, behind, || {
        relays.iter().for_each(Partition::cut)
    })
    .await;
}
