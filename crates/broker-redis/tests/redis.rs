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
    testkit::{self, Partition, RedisServer},
    RedisBroker, RedisOptions, RedisTls,
};
use herald_protocol::ChannelName;

mod partition;

fn options(redis: &RedisServer, prefix: &str) -> RedisOptions {
    RedisOptions::at(redis.url(), prefix)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_share_one_order() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis).await, node(&redis).await, node(&redis).await);
    let shared = |(broker, seen): (Arc<RedisBroker>, Arc<Recorder>)| (broker as SharedBroker, seen);
    conformance::nodes_share_one_order([shared(a), shared(b), shared(c)]).await;
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
    let err = RedisBroker::connect(RedisOptions::at(testkit::unreachable_url(), "herald"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BrokerError::Unavailable(ref m) if m.starts_with("redis:")),
        "{err}"
    );
}

/// A redis-cli call against `redis`; its output.
fn redis_cli(redis: &RedisServer, args: &[&[u8]]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string()])
        .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Review items 10 and 20: a partition that drops packets without a reset is noticed (the
/// connection answers no PING), a subscribe made meanwhile does not hang, and after the
/// reconnect every channel is caught up, including one that had delivered nothing yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_is_noticed_and_caught_up() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let (publisher, _) = node(&redis).await;
    let behind = RedisOptions::at(partition.url(), "herald");
    partition::a_node_cut_off_catches_up(&publisher, behind, || partition.cut()).await;
}

/// Review item 11: whoever can write to the Redis can forge messages. Data that is not
/// JSON (a forever frame's script, an SSE field, bytes that are not UTF-8) or an epoch
/// Herald did not make never reaches the sink or a history read.
#[tokio::test]
async fn data_herald_did_not_write_never_reaches_a_client() {
    let redis = RedisServer::start();
    let (a, seen) = node(&redis).await;
    let c = ch("chat:lobby");
    a.subscribe(&c).await.unwrap();
    let first = a
        .publish(&c, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    seen.await_offsets("chat:lobby", 1).await;
    let epoch = first.epoch.as_str().as_bytes();
    let forged: [Vec<u8>; 4] = [
        [epoch, b"\n2\n0}});alert(document.domain)//"].concat(),
        [epoch, b"\n2\n\"\xff\xfe\""].concat(),
        [epoch, b"\n2\n1\r\nid: x\r\n"].concat(),
        [&b"e\"}</script>\n2\n1"[..]].concat(),
    ];
    for message in &forged {
        redis_cli(&redis, &[b"PUBLISH", b"herald:p:chat:lobby", message]);
    }
    // Forged history entries, as the review's probe writes them.
    redis_cli(
        &redis,
        &[
            b"XADD",
            b"herald:{chat:lobby}:h",
            b"2-0",
            b"d",
            b"0}});alert(document.domain)//",
            b"t",
            b"1",
        ],
    );
    redis_cli(&redis, &[b"HINCRBY", b"herald:{chat:lobby}:m", b"o", b"1"]);
    // The next real publication is 3: the sink gets 1 and 3, nothing forged in between.
    a.publish(&c, Bytes::from("3"), StreamPolicy::default())
        .await
        .unwrap();
    assert_eq!(seen.await_offsets("chat:lobby", 2).await, [1, 3]);
    let history = a.history(&c, HistoryQuery::newest(10)).await.unwrap();
    let data: Vec<&[u8]> = history.publications.iter().map(|p| p.data()).collect();
    assert_eq!(data, [&b"1"[..], b"3"], "the forged entry is not served");
    // A stream whose epoch Herald did not write is an error, not text sent to clients.
    redis_cli(
        &redis,
        &[b"HSET", b"herald:{chat:lobby}:m", b"e", b"x\"</script>"],
    );
    let err = a.history(&c, HistoryQuery::newest(10)).await.unwrap_err();
    assert!(matches!(err, BrokerError::Unavailable(_)), "{err}");
}

/// Review item 4 (Redis): reading or subscribing to a channel nobody published to leaves
/// a key that lives about a minute, not 24 hours; publishing gives the namespace's TTL.
#[tokio::test]
async fn naming_a_channel_leaves_nothing_lasting_in_redis() {
    let redis = RedisServer::start();
    let (a, _) = node(&redis).await;
    let c = ch("q1");
    a.history(&c, HistoryQuery::newest(10)).await.unwrap();
    let ttl: u64 = redis_cli(&redis, &[b"PTTL", b"herald:{q1}:m"])
        .parse()
        .unwrap();
    assert!(
        (1..=60_000).contains(&ttl),
        "a read-made stream lives a minute at most, not {ttl} ms"
    );
    a.publish(&c, Bytes::from("1"), StreamPolicy::default())
        .await
        .unwrap();
    let ttl: u64 = redis_cli(&redis, &[b"PTTL", b"herald:{q1}:m"])
        .parse()
        .unwrap();
    assert!(
        ttl > 60_000,
        "a published stream keeps its namespace's TTL ({ttl} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_presence_contract() {
    let redis = RedisServer::start();
    let runs = AtomicUsize::new(0);
    conformance::run_presence(|| {
        let prefix = format!("presence{}", runs.fetch_add(1, Ordering::Relaxed));
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(RedisBroker::start(
                options(&redis, &prefix),
                Arc::new(Recorder::default()),
            ))
        });
        broker.unwrap().presence()
    })
    .await;
}

/// What a node's presence heard from the others.
#[derive(Default)]
struct Heard {
    batches: parking_lot::Mutex<Vec<Bytes>>,
    expired: parking_lot::Mutex<Vec<(String, u64, Bytes)>>,
    changed: tokio::sync::Notify,
}

impl herald_broker::PresenceEvents for Heard {
    fn heard(&self, batch: Bytes) {
        self.batches.lock().push(batch);
        self.changed.notify_waiters();
    }
    fn expired(&self, channel: &ChannelName, gone: Vec<herald_broker::Member>) {
        self.expired.lock().extend(
            gone.into_iter()
                .map(|m| (channel.to_string(), m.id, m.info)),
        );
        self.changed.notify_waiters();
    }
}

impl Heard {
    async fn wait(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let waited = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let changed = self.changed.notified();
                if done(self) {
                    return;
                }
                changed.await;
            }
        })
        .await;
        assert!(waited.is_ok(), "timed out waiting until {what}");
    }
}

fn anonymous(id: u64) -> herald_broker::Member {
    herald_broker::Member {
        id,
        info: Bytes::new(),
    }
}

#[tokio::test]
async fn presence_is_shared_by_nodes_and_a_dead_nodes_members_expire() {
    let redis = RedisServer::start();
    let (a, _) = node(&redis).await;
    let (b, _) = node(&redis).await;
    let (pa, pb) = (a.presence(), b.presence());
    let heard = Arc::new(Heard::default());
    let weak: std::sync::Weak<dyn herald_broker::PresenceEvents> = Arc::downgrade(&heard) as _;
    pa.listen(weak);
    let c = ch("room:nodes");
    assert!(pa.join(&c, &anonymous(1), None).await.unwrap());
    let bo = herald_broker::Member {
        id: 2,
        info: Bytes::from_static(br#"{"user":"bo"}"#),
    };
    assert!(pb.join(&c, &bo, Some("bo")).await.unwrap());
    assert!(
        !pb.join(&c, &anonymous(1), None).await.unwrap(),
        "held on both nodes"
    );
    let stats = pa.stats(&c).await.unwrap();
    assert_eq!(
        (stats.clients, stats.users),
        (2, 1),
        "either node sees both"
    );

    pb.announce(Bytes::from_static(b"room:nodes\n{\"presence\":{}}\n"))
        .await;
    heard
        .wait("b's batch reached a", |h| !h.batches.lock().is_empty())
        .await;

    // The pub/sub connection dropping loses no member: they live in keys.
    redis.kill_clients();
    assert_eq!(pa.stats(&c).await.unwrap().clients, 2);

    // b stops as a node killed with -9 would (no leave is ever sent); a's heartbeat
    // removes what only b held, within the node TTL and a beat.
    drop(pb);
    drop(b);
    let started = std::time::Instant::now();
    heard
        .wait("b's member expired, with its info", |h| {
            h.expired
                .lock()
                .contains(&("room:nodes".to_string(), 2, bo.info.clone()))
        })
        .await;
    assert!(
        started.elapsed() <= herald_broker_redis::NODE_TTL + 2 * herald_broker_redis::BEAT_EVERY,
        "expired within the documented time: {:?}",
        started.elapsed()
    );
    let stats = pa.stats(&c).await.unwrap();
    assert_eq!(
        (stats.clients, stats.users),
        (1, 0),
        "a's member 1 stays: a still holds it"
    );
    assert_eq!(pa.members(&c, None, 10).await.unwrap(), vec![anonymous(1)]);
}

fn over_tls(redis: &RedisServer, prefix: &str, tls: RedisTls) -> RedisOptions {
    RedisOptions {
        tls,
        ..RedisOptions::at(redis.url(), prefix)
    }
}

/// The whole contract over TLS, on a Redis that takes only clients with a certificate its
/// CA signed (mutual TLS, as managed offerings may ask).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_broker_contract_over_mutual_tls() {
    let redis = RedisServer::start_tls(true);
    let files = redis.tls().unwrap().clone();
    let tls = RedisTls {
        ca_file: Some(files.ca),
        cert_file: Some(files.client_cert),
        key_file: Some(files.client_key),
        insecure: false,
    };
    let runs = AtomicUsize::new(0);
    conformance::run_all(|sink| {
        let prefix = format!("tls{}", runs.fetch_add(1, Ordering::Relaxed));
        let options = over_tls(&redis, &prefix, tls.clone());
        let broker = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(RedisBroker::start(options, sink))
        });
        let broker: SharedBroker = broker.unwrap();
        broker
    })
    .await;
}

/// Redis's certificate is verified (against the system's roots, or the CA given), the
/// node proves itself with its certificate when asked, and every refusal says why at
/// connect, before the node starts: the start-up error an operator reads.
#[tokio::test]
async fn tls_is_verified_and_every_refusal_says_why() {
    let redis = RedisServer::start_tls(true);
    let files = redis.tls().unwrap().clone();
    let connect = |tls: RedisTls| RedisBroker::connect(over_tls(&redis, "herald", tls));
    let refused = |result: Result<_, BrokerError>| match result {
        Err(BrokerError::Unavailable(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    let ca = Some(files.ca.clone());
    let (cert, key) = (
        Some(files.client_cert.clone()),
        Some(files.client_key.clone()),
    );
    let cases = [
        (
            "the system's roots do not know the test CA",
            RedisTls::default(),
        ),
        (
            "the server asks for a client certificate",
            RedisTls {
                ca_file: ca.clone(),
                ..Default::default()
            },
        ),
        (
            "a certificate the server's CA did not sign",
            RedisTls {
                ca_file: ca.clone(),
                cert_file: Some(files.stranger_cert.clone()),
                key_file: Some(files.stranger_key.clone()),
                ..Default::default()
            },
        ),
    ];
    for ((case, tls), says) in
        cases
            .into_iter()
            .zip(["UnknownIssuer", "CertificateRequired", "UnknownCA"])
    {
        let why = refused(connect(tls).await);
        assert!(
            why.starts_with("redis:") && why.contains(says),
            "{case}: {why}"
        );
    }
    let why = refused(
        connect(RedisTls {
            ca_file: ca.clone(),
            cert_file: cert.clone(),
            ..Default::default()
        })
        .await,
    );
    assert!(why.contains("cert_file and key_file go together"), "{why}");
    let why = refused(
        connect(RedisTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        })
        .await,
    );
    assert!(why.contains("cannot read /nonexistent/ca.pem"), "{why}");
    let plain = RedisOptions {
        tls: RedisTls {
            ca_file: ca.clone(),
            ..Default::default()
        },
        ..RedisOptions::at(redis.url().replace("rediss://", "redis://"), "herald")
    };
    let why = refused(RedisBroker::connect(plain).await);
    assert!(why.contains("need a rediss:// URL"), "{why}");

    // Not verified when asked in so many words (a self-signed test server), still proving
    // itself; and verified, proving itself: both connect.
    connect(RedisTls {
        cert_file: cert.clone(),
        key_file: key.clone(),
        insecure: true,
        ..Default::default()
    })
    .await
    .unwrap();
    connect(RedisTls {
        ca_file: ca,
        cert_file: cert,
        key_file: key,
        insecure: false,
    })
    .await
    .unwrap();
}

/// Issue #57 item 6: Redis restarted from an older dump (or failed over to a replica that
/// lagged) while no node listened to a channel: its history went back, nobody noticed,
/// and the next publication was handed an offset already acknowledged, in the same epoch.
/// Now a stream last written by another Redis process continues in a new epoch, derived
/// from the old one and the new process alike on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_from_an_older_dump_gives_unwatched_channels_a_new_epoch() {
    let mut redis = RedisServer::start();
    let (a, _) = node(&redis).await;
    let (b, _) = node(&redis).await;
    let c = ch("rollback:unwatched");
    let policy = StreamPolicy::default();
    let newest = || HistoryQuery {
        since: None,
        limit: 10,
        max_bytes: None,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // Each node's connection is dropped by the restart: its first calls may fail.
    macro_rules! until_ok {
        ($call:expr) => {
            loop {
                match $call.await {
                    Ok(v) => break v,
                    Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
                }
                tokio::task::yield_now().await;
            }
        };
    }
    for i in 0..3 {
        a.publish(&c, Bytes::from(i.to_string()), policy)
            .await
            .unwrap();
    }
    redis.save();
    let mut acked = Vec::new();
    for i in 3..5 {
        let p = a.publish(&c, Bytes::from(i.to_string()), policy).await;
        acked.push(p.unwrap());
    }
    redis.restart_from_dump();
    let next = until_ok!(b.publish(&c, Bytes::from("\"after\""), policy));
    let last = acked.last().unwrap();
    assert!(
        next.epoch != last.epoch || next.offset > last.offset,
        "offset {} handed out again in epoch {}",
        next.offset,
        next.epoch.as_str()
    );
    // Every node sees the same epoch.
    let read = until_ok!(a.history(&c, newest()));
    assert_eq!(read.position.epoch, next.epoch);
    // A read reaching a stream first after a restart sees the new epoch too.
    let d = ch("rollback:read-first");
    let before = a.publish(&d, Bytes::from("\"x\""), policy).await.unwrap();
    redis.save();
    redis.restart_from_dump();
    let read = until_ok!(b.history(&d, newest()));
    assert_ne!(
        read.position.epoch, before.epoch,
        "a restart of Redis renews every epoch"
    );
    assert_eq!(read.publications.len(), 1, "history is kept");
}
