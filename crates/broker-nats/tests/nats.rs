//! The NATS broker against a real `nats-server -js`: the shared contract, presence, nodes
//! on one NATS, restarts, sign-in and a cluster. A node's link cut off or slowed: `links.rs`.

mod support;

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use bytes::Bytes;
use herald_broker::{
    conformance::{self, Recorder},
    default_policies, Broker, HistoryQuery, SharedBroker, SharedPresence, StreamPolicy,
};
use herald_broker_nats::{testkit::NatsServer, NatsBroker, NatsOptions};
use herald_protocol::ChannelName;
use support::{block_on, ch, eventually, node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_broker_contract() {
    let nats = NatsServer::start();
    // Every broker the suite builds gets its own prefix: a fresh, empty store.
    let runs = AtomicUsize::new(0);
    conformance::run_all(|sink| {
        let prefix = format!("conformance{}", runs.fetch_add(1, Ordering::Relaxed));
        let options = NatsOptions::at(nats.url(), prefix);
        let broker: SharedBroker =
            block_on(NatsBroker::start(options, conformance::policies(), sink)).unwrap();
        broker
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fulfils_the_presence_contract() {
    let nats = NatsServer::start();
    let runs = AtomicUsize::new(0);
    conformance::run_presence(|| {
        let prefix = format!("presence{}", runs.fetch_add(1, Ordering::Relaxed));
        let options = NatsOptions::at(nats.url(), prefix);
        let sink = Arc::new(Recorder::default());
        let broker = block_on(NatsBroker::start(options, default_policies(), sink)).unwrap();
        let presence: SharedPresence = broker.presence();
        // The store lives as long as the broker's presence handle.
        std::mem::forget(broker);
        presence
    })
    .await;
}

/// Every publication a compare-and-set race between two nodes; the third only reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_share_one_order() {
    let nats = NatsServer::start();
    let (a, b, c) = (node(&nats).await, node(&nats).await, node(&nats).await);
    let shared = |(broker, seen): (Arc<NatsBroker>, Arc<Recorder>)| (broker as SharedBroker, seen);
    conformance::nodes_share_one_order([shared(a), shared(b), shared(c)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_offsets_survive_a_nats_restart() {
    let mut nats = NatsServer::start();
    let (broker, sink) = node(&nats).await;
    let c = ch("durable:room");
    broker.subscribe(&c).await.unwrap();
    let mut epoch = None;
    for i in 1..=20 {
        let at = broker
            .publish(&c, Bytes::from(i.to_string()), StreamPolicy::default())
            .await
            .unwrap();
        epoch = Some(at.epoch);
    }
    nats.kill_and_restart();
    let after = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            match broker
                .publish(&c, Bytes::from_static(b"21"), StreamPolicy::default())
                .await
            {
                Ok(at) => return at,
                // Until the client is back.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("publishing works again once NATS is back");
    assert_eq!(after.offset, 21, "offsets go on");
    assert_eq!(Some(after.epoch), epoch, "the same epoch: nothing was lost");
    let history = broker.history(&c, HistoryQuery::newest(100)).await.unwrap();
    assert_eq!(history.publications.len(), 21);
    let all: Vec<u64> = (1..=21).collect();
    assert_eq!(sink.await_offsets("durable:room", 21).await, all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_shared_and_a_dead_nodes_members_expire() {
    use herald_broker::{Member, PresenceEvents};
    #[derive(Default)]
    struct Heard(parking_lot::Mutex<Vec<(String, Vec<Member>)>>);
    impl PresenceEvents for Heard {
        fn heard(&self, _: Bytes) {}
        fn expired(&self, channel: &ChannelName, gone: Vec<Member>) {
            self.0.lock().push((channel.to_string(), gone));
        }
    }
    let nats = NatsServer::start();
    let (a, _) = node(&nats).await;
    let (b, _) = node(&nats).await;
    let heard: Arc<Heard> = Arc::default();
    let events: Arc<dyn PresenceEvents> = heard.clone();
    b.presence().listen(Arc::downgrade(&events));
    let c = ch("presence:room");
    let member = |id: u64, user: &str| Member {
        id,
        info: Bytes::from(format!(r#"{{"user":"{user}"}}"#)),
    };
    assert!(a
        .presence()
        .join(&c, &member(1, "ann"), Some("ann"))
        .await
        .unwrap());
    assert!(b
        .presence()
        .join(&c, &member(2, "bob"), Some("bob"))
        .await
        .unwrap());
    let both = |p: &SharedPresence| {
        let p = p.clone();
        let c = c.clone();
        move || {
            let stats = block_on(p.stats(&c)).unwrap();
            (stats.clients, stats.users) == (2, 2)
        }
    };
    let within = std::time::Duration::from_secs(5);
    assert!(eventually(within, both(&a.presence())).await, "a sees both");
    assert!(eventually(within, both(&b.presence())).await, "b sees both");
    assert!(
        !b.presence()
            .join(&c, &member(1, "ann"), Some("ann"))
            .await
            .unwrap(),
        "a member another node holds is not new"
    );
    assert!(
        !b.presence().leave(&c, 1).await.unwrap(),
        "a still holds it"
    );
    // a stops without a word (its tasks and connection end with it): b drops its members.
    drop(a);
    let bp = b.presence();
    let only_bob = || {
        let members = block_on(bp.members(&c, None, 10)).unwrap();
        members.iter().map(|m| m.id).collect::<Vec<_>>() == [2]
    };
    assert!(
        eventually(
            herald_broker_nats::NODE_TTL + 3 * herald_broker_nats::BEAT_EVERY,
            only_bob
        )
        .await,
        "a's member expires"
    );
    assert_eq!(
        heard.0.lock().clone(),
        [("presence:room".to_string(), vec![member(1, "ann")])],
        "the member that left, with its info"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_answer_each_other_and_report_their_figures() {
    use herald_broker::{NodeLink, NodeRequests};
    struct Echo;
    #[async_trait::async_trait]
    impl NodeRequests for Echo {
        async fn answer(&self, request: Bytes) -> Bytes {
            [&b"echo "[..], &request].concat().into()
        }
    }
    let nats = NatsServer::start();
    let (a, _) = node(&nats).await;
    let (b, _) = node(&nats).await;
    let echo: Arc<dyn NodeRequests> = Arc::new(Echo);
    a.answer_nodes_with(Arc::downgrade(&echo));
    let answer = b
        .ask_node(a.node_id(), Bytes::from_static(b"hi"))
        .await
        .unwrap();
    assert_eq!(&answer[..], b"echo hi");
    let nobody = b.ask_node("nobody", Bytes::new()).await;
    assert!(matches!(
        nobody,
        Err(herald_broker::BrokerError::Unavailable(_))
    ));
    a.report_node(Bytes::from_static(b"{\"n\":\"a\"}"))
        .await
        .unwrap();
    b.report_node(Bytes::from_static(b"{\"n\":\"b\"}"))
        .await
        .unwrap();
    let mut figures = b.nodes().await.unwrap();
    figures.sort();
    assert_eq!(figures, [&b"{\"n\":\"a\"}"[..], b"{\"n\":\"b\"}"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_fail_at_start_with_the_reason() {
    let refused = |options: NatsOptions| async move {
        match NatsBroker::connect(options, default_policies()).await {
            Ok(_) => panic!("connected"),
            Err(e) => e.to_string(),
        }
    };
    let nats = NatsServer::start_with_password("herald", "secret");
    let e = refused(NatsOptions::at(nats.url(), "a.b")).await;
    assert!(e.contains("prefix"), "{e}");
    let e = refused(NatsOptions::at("nats://127.0.0.1:1", "herald")).await;
    assert!(e.contains("nats"), "{e}");
    let e = refused(NatsOptions::at(nats.url(), "herald")).await;
    assert!(e.to_lowercase().contains("author"), "{e}");
    let mut options = NatsOptions::at(nats.url(), "herald");
    options.auth = herald_broker_nats::NatsAuth::Password {
        user: "herald".into(),
        password: "secret".into(),
    };
    assert!(NatsBroker::connect(options, default_policies())
        .await
        .is_ok());
    let core_only = NatsServer::start_without_jetstream();
    let e = refused(NatsOptions::at(core_only.url(), "herald")).await;
    assert!(e.contains("jetstream"), "{e}");
    let url = format!("nats://herald:secret@127.0.0.1:{}", nats.port());
    let from_url = NatsBroker::connect(NatsOptions::at(url, "herald"), default_policies()).await;
    assert!(from_url.is_ok(), "{:?}", from_url.err());
}

/// Every way to sign in that `[nats]` offers, against a server that takes only that way,
/// and TLS with the server's CA, with and without a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_to_sign_in_and_tls_work_and_the_wrong_one_is_refused() {
    use herald_broker_nats::{
        testkit::{Auth, Setup},
        NatsAuth, NatsTls,
    };
    let connects = |url: String, auth: NatsAuth, tls: NatsTls| async move {
        let mut options = NatsOptions::at(url, "herald");
        options.auth = auth;
        options.tls = tls;
        NatsBroker::connect(options, default_policies())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let token = NatsServer::start_with(Setup {
        auth: Auth::Token("s3cret-token".into()),
        ..Setup::default()
    });
    let with_token = NatsAuth::Token("s3cret-token".into());
    connects(token.url(), with_token, NatsTls::default())
        .await
        .unwrap();
    let wrong = connects(
        token.url(),
        NatsAuth::Token("nope".into()),
        NatsTls::default(),
    )
    .await;
    assert!(wrong.is_err(), "a wrong token is refused");

    let user = nkeys::KeyPair::new_user();
    let nkey = NatsServer::start_with(Setup {
        auth: Auth::NKey(user.public_key()),
        ..Setup::default()
    });
    let seed = NatsAuth::NKey(user.seed().unwrap());
    connects(nkey.url(), seed, NatsTls::default())
        .await
        .unwrap();
    let stranger = NatsAuth::NKey(nkeys::KeyPair::new_user().seed().unwrap());
    assert!(connects(nkey.url(), stranger, NatsTls::default())
        .await
        .is_err());

    let tls = NatsServer::start_with(Setup {
        tls: Some(false),
        ..Setup::default()
    });
    let files = tls.tls().unwrap().clone();
    let trusting = NatsTls {
        ca_file: Some(files.ca.clone()),
        ..NatsTls::default()
    };
    connects(tls.url(), NatsAuth::None, trusting.clone())
        .await
        .unwrap();
    let untrusted = connects(tls.url(), NatsAuth::None, NatsTls::default()).await;
    assert!(
        untrusted.is_err(),
        "the system's roots do not know the test CA"
    );

    let mutual = NatsServer::start_with(Setup {
        tls: Some(true),
        ..Setup::default()
    });
    let files = mutual.tls().unwrap().clone();
    let with_certificate = NatsTls {
        ca_file: Some(files.ca.clone()),
        cert_file: Some(files.client_cert.clone()),
        key_file: Some(files.client_key.clone()),
        required: false,
    };
    connects(mutual.url(), NatsAuth::None, with_certificate)
        .await
        .unwrap();
    let without = NatsTls {
        ca_file: Some(files.ca.clone()),
        ..NatsTls::default()
    };
    assert!(
        connects(mutual.url(), NatsAuth::None, without)
            .await
            .is_err(),
        "no client certificate, no connection"
    );
}

/// A keyed publication stored whose key's record never made it (its node died, or was cut
/// off or slowed past the record's write, as in the partition test): publishing the key
/// again is still a repeat, never a second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_record_was_lost_is_still_a_repeat() {
    let nats = NatsServer::start();
    let (broker, _) = node(&nats).await;
    let c = ch("once:lost-record");
    let window = std::time::Duration::from_secs(60);
    let policy = StreamPolicy::default();
    let (first, repeat) = broker
        .publish_once(&c, Bytes::from_static(b"1"), policy, "k1", window)
        .await
        .unwrap();
    assert!(!repeat);
    // What a node that stored the publication and then died leaves behind: no record.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.get_stream("herald_once")
        .await
        .unwrap()
        .purge()
        .filter(">")
        .await
        .unwrap();
    let (again, repeat) = broker
        .publish_once(&c, Bytes::from_static(b"1 again"), policy, "k1", window)
        .await
        .unwrap();
    assert_eq!((again, repeat), (first, true), "a repeat of the first");
    let history = broker.history(&c, HistoryQuery::newest(10)).await.unwrap();
    assert_eq!(history.publications.len(), 1, "stored once");
}

/// A NATS cluster of three servers and `replicas = 3` (issue #32): one server killed
/// (SIGKILL) mid-stream, while two nodes publish with keys and retry what was not
/// acknowledged, loses nothing and stores nothing twice; both nodes hear every publication
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_three_replicas_loses_nothing_when_a_server_dies() {
    use herald_broker_nats::testkit::NatsCluster;
    use std::time::{Duration, Instant};
    let mut cluster = NatsCluster::start(3);
    let mut options = NatsOptions::at("nats://unused", "herald");
    options.urls = cluster.urls();
    options.replicas = 3;
    options.unreachable_after = Duration::from_millis(900);
    // JetStream elects its leaders once the servers meet: connect until it answers.
    let start = |options: NatsOptions| async move {
        let sink = Arc::new(Recorder::default());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let started =
                NatsBroker::start(options.clone(), default_policies(), sink.clone()).await;
            match started {
                Ok(broker) => return (broker, sink),
                Err(e) => {
                    assert!(Instant::now() < deadline, "the cluster never answered: {e}");
                    // A client's pace between attempts, not a wait for something.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let (a, seen_a) = start(options.clone()).await;
    let (b, seen_b) = start(options).await;
    let c = ch("cluster:room");
    a.subscribe(&c).await.unwrap();
    b.subscribe(&c).await.unwrap();
    let policy = StreamPolicy::default();
    let window = Duration::from_secs(60);
    let mut killed = None;
    for n in 1..=100u64 {
        if n == 51 {
            cluster.kill(0);
            killed = Some(Instant::now());
        }
        let broker = if n % 2 == 0 { &a } else { &b };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sent = broker
                .publish_once(
                    &c,
                    Bytes::from(n.to_string()),
                    policy,
                    &format!("k{n}"),
                    window,
                )
                .await;
            match sent {
                Ok(_) => {
                    if let (51, Some(at)) = (n, killed) {
                        eprintln!("publishing stalled {:?} after the kill", at.elapsed());
                    }
                    break;
                }
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "publication {n} never acknowledged: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    let all: Vec<u64> = (1..=100).collect();
    assert_eq!(seen_a.await_offsets("cluster:room", 100).await, all);
    assert_eq!(seen_b.await_offsets("cluster:room", 100).await, all);
    let history = a.history(&c, HistoryQuery::newest(1000)).await.unwrap();
    let data: Vec<String> = history
        .publications
        .iter()
        .map(|p| String::from_utf8_lossy(&p.record).into_owned())
        .collect();
    let expected: Vec<String> = (1..=100).map(|n| n.to_string()).collect();
    assert_eq!(data, expected, "each once, in order");
}
