//! A node's link to NATS cut off, stalled or slowed (through a relay in between): it
//! catches up, says how far behind it is, and hears what is published from the moment a
//! subscription returns.

mod support;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use herald_broker::{
    conformance::Recorder, default_policies, relay::Partition, Broker, StreamPolicy,
};
use herald_broker_nats::{testkit::NatsServer, NatsBroker, NatsOptions};
use herald_protocol::ChannelName;
use support::{block_on, ch, eventually, node};

/// A node whose connection to NATS goes through `relay`, taken for cut off after
/// `unreachable_after` (the default when `None`).
async fn node_through(
    relay: &Partition,
    unreachable_after: Option<Duration>,
) -> (Arc<NatsBroker>, Arc<Recorder>) {
    let sink = Arc::new(Recorder::default());
    let mut options = NatsOptions::at(format!("nats://127.0.0.1:{}", relay.port()), "herald");
    if let Some(after) = unreachable_after {
        options.unreachable_after = after;
    }
    let broker = NatsBroker::start(options, default_policies(), sink.clone())
        .await
        .unwrap();
    (broker, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_catches_up_from_history() {
    let nats = NatsServer::start();
    let relay = Partition::start_to(nats.port());
    let (cut_off, sink) = node_through(&relay, Some(Duration::from_millis(600))).await;
    let (writer, _) = node(&nats).await;
    let c = ch("cut:room");
    cut_off.subscribe(&c).await.unwrap();
    let publish = |range: std::ops::RangeInclusive<u32>| {
        let (writer, c) = (writer.clone(), c.clone());
        async move {
            for i in range {
                writer
                    .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
                    .await
                    .unwrap();
            }
        }
    };
    publish(1..=50).await;
    assert_eq!(sink.await_offsets("cut:room", 50).await.len(), 50);
    relay.blackhole();
    publish(51..=100).await;
    assert!(
        eventually(Duration::from_secs(10), || cut_off
            .reach()
            .unwrap()
            .lost
            .is_some())
        .await,
        "the cut-off node notices"
    );
    relay.heal();
    relay.reset();
    let all: Vec<u64> = (1..=100).collect();
    assert_eq!(
        sink.await_offsets("cut:room", 100).await,
        all,
        "every publication once, in order"
    );
    assert!(cut_off.caught_up() >= 50, "read back from history");
    let reach = cut_off.reach().unwrap();
    assert_eq!((reach.losses, reach.recoveries), (1, 1), "{reach:?}");
}

/// A subscription is in place at the server when `subscribe` returns, however slow the
/// link: what is published from then on is heard, with nothing read from history. (Writing
/// the subscription to the socket is not enough: 1 run in 8 of the test above lost every
/// publication this way, behind the relay's threads.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_is_in_place_when_subscribe_returns() {
    let nats = NatsServer::start();
    let relay = Partition::start_to(nats.port());
    let (slow, sink) = node_through(&relay, None).await;
    let (writer, _) = node(&nats).await;
    let c = ch("slow:room");
    relay.latency(Duration::from_millis(100));
    slow.subscribe(&c).await.unwrap();
    for i in 1..=5u32 {
        writer
            .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
            .await
            .unwrap();
    }
    assert_eq!(sink.await_offsets("slow:room", 5).await, [1, 2, 3, 4, 5]);
    assert_eq!(slow.caught_up(), 0, "heard live, not read back");
}

/// The same for presence batches (joins and leaves other nodes announce): a node hears the
/// first one announced after its start returns, even behind a slow link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_batches_are_heard_from_the_moment_start_returns() {
    use herald_broker::{Member, PresenceEvents};
    struct Heard(tokio::sync::mpsc::UnboundedSender<Bytes>);
    impl PresenceEvents for Heard {
        fn heard(&self, batch: Bytes) {
            let _ = self.0.send(batch);
        }
        fn expired(&self, _: &ChannelName, _: Vec<Member>) {}
    }
    let nats = NatsServer::start();
    let (other, _) = node(&nats).await;
    let relay = Partition::start_to(nats.port());
    relay.latency(Duration::from_millis(100));
    let (slow, _) = node_through(&relay, None).await;
    let (sender, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let events: Arc<dyn PresenceEvents> = Arc::new(Heard(sender));
    slow.presence().listen(Arc::downgrade(&events));
    other
        .presence()
        .announce(Bytes::from_static(b"joined"))
        .await;
    let batch = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(
        batch.ok().flatten(),
        Some(Bytes::from_static(b"joined")),
        "the batch announced right after the start is heard"
    );
}

/// The lag a node reports is measured on the publications' own path (a JetStream publish,
/// republished to the node), and grows while that path is stalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_lag_is_measured_and_grows_while_the_path_is_stalled() {
    let nats = NatsServer::start();
    let relay = Partition::start_to(nats.port());
    let (broker, _) = node_through(&relay, Some(Duration::from_millis(300))).await;
    let lag = || broker.delivery_lag().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || lag() > Duration::ZERO).await,
        "a probe came back"
    );
    assert!(lag() < Duration::from_millis(500), "{:?}", lag());
    relay.blackhole();
    assert!(
        eventually(Duration::from_secs(5), || lag() > Duration::from_secs(1)).await,
        "a stalled path shows as a growing lag: {:?}",
        lag()
    );
}

/// A node cut off longer than `NODE_TTL` is taken for dead: the others drop its members.
/// Once it is back, it writes them again, and the others count them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_past_its_ttl_has_its_members_back_after_it_returns() {
    use herald_broker::Member;
    use herald_broker_nats::{BEAT_EVERY, NODE_TTL};
    let nats = NatsServer::start();
    let relay = Partition::start_to(nats.port());
    let (cut, _) = node_through(&relay, Some(Duration::from_millis(900))).await;
    let (other, _) = node(&nats).await;
    let c = ch("presence:cut");
    let member = Member {
        id: 7,
        info: Bytes::from_static(br#"{"user":"ann"}"#),
    };
    assert!(cut.presence().join(&c, &member, Some("ann")).await.unwrap());
    let seen = other.presence();
    let clients = || block_on(seen.stats(&c)).unwrap().clients;
    assert!(
        eventually(Duration::from_secs(5), || clients() == 1).await,
        "joined"
    );
    relay.blackhole();
    assert!(
        eventually(NODE_TTL + 3 * BEAT_EVERY, || clients() == 0).await,
        "a node silent past its TTL has its members dropped"
    );
    relay.heal();
    relay.reset();
    assert!(
        eventually(Duration::from_secs(15), || clients() == 1).await,
        "back, it writes them again"
    );
    // And they stay: the others see it beating.
    let stays = !eventually(2 * BEAT_EVERY + Duration::from_millis(500), || {
        clients() == 0
    })
    .await;
    assert!(stays, "its members were dropped again");
}
