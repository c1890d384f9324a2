//! A node cut off from its engine (issue #33), end to end: three `herald serve` nodes on one
//! Redis (or NATS, or a Redis found through Sentinel, or a Redis Cluster), one of them (C)
//! reaching it through relays that fail the way networks do, and a
//! load balancer in front that routes new connections by `/readyz`. A `herald sub` on every
//! transport (the forever frame too: `--transport iframe`) starts on C; two publishers send
//! through A, B and C in turn, retrying elsewhere what was not acknowledged, one with
//! idempotency keys and one without. Then C's way to Redis is blackholed past the grace,
//! reset, and slowed by 3 s a byte.

mod support;

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use herald_broker_nats::testkit::{NatsServer, Partition as Relay};
use herald_broker_redis::testkit::{ClusterSet, Partition, RedisServer, SentinelSet, MASTER_NAME};
use serde_json::{json, Value};
use support::{balancer::Balancer, herald, history, Server, KEY};

const KEYED: &str = "chat:partition";
const UNKEYED: &str = "chat:partition-unkeyed";
const TRANSPORTS: [&str; 6] = ["ws", "sse", "stream", "iframe", "longpoll", "poll"];
/// The defaults the nodes run with: `broker.unreachable_after`, `broker.clients_move_after`,
/// `broker.publish_timeout`.
const DETECTION: Duration = Duration::from_secs(3);
const GRACE: Duration = Duration::from_secs(2);
const PUBLISH_DEADLINE: Duration = Duration::from_secs(2);

/// A `herald sub` and when each publication (its `n`) reached it.
struct Subscriber {
    transport: &'static str,
    child: std::process::Child,
    seen: Arc<Mutex<Vec<(Instant, u64)>>>,
    /// What it said on stderr (its reconnects), and when.
    said: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Subscriber {
    fn start(url: &str, transport: &'static str) -> Self {
        let mut child = herald()
            .args([
                "sub",
                KEYED,
                "--since",
                "0",
                "--url",
                url,
                "--transport",
                transport,
            ])
            .args(["--interval", "200ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let said = Arc::new(Mutex::new(Vec::new()));
        let errors = BufReader::new(child.stderr.take().unwrap());
        let record_said = said.clone();
        std::thread::spawn(move || {
            for line in errors.lines().map_while(Result::ok) {
                record_said.lock().unwrap().push((Instant::now(), line));
            }
        });
        let lines = BufReader::new(child.stdout.take().unwrap());
        let record = seen.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let n = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v["data"]["n"].as_u64());
                if let Some(n) = n {
                    record.lock().unwrap().push((Instant::now(), n));
                }
            }
        });
        Self {
            transport,
            child,
            seen,
            said,
        }
    }

    fn numbers(&self) -> Vec<u64> {
        self.seen.lock().unwrap().iter().map(|(_, n)| *n).collect()
    }

    /// The longest time after `from` without a publication.
    fn longest_silence_after(&self, from: Instant) -> Duration {
        let seen = self.seen.lock().unwrap();
        let mut last = from;
        let mut longest = Duration::ZERO;
        for (at, _) in seen.iter().filter(|(at, _)| *at > from) {
            longest = longest.max(*at - last);
            last = *at;
        }
        longest
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a publisher did: the numbers acknowledged, in order, and every attempt on the node
/// behind the relay with how long its answer took.
#[derive(Default)]
struct Published {
    acked: Vec<u64>,
    on_cut_node: Vec<(Duration, Option<u16>)>,
}

/// Publishes 1, 2, … on `channel` at about 20 a second until `stop`, each first through
/// node `n % 3`, then through the next until one acknowledges it; with `keyed`, every
/// attempt at `n` carries the key `n`.
async fn publish(
    nodes: [String; 3],
    channel: &'static str,
    keyed: bool,
    stop: Arc<AtomicBool>,
) -> Published {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut done = Published::default();
    let mut n = 0u64;
    while !stop.load(SeqCst) {
        n += 1;
        let mut body = json!({ "channel": channel, "data": { "n": n } });
        if keyed {
            body["idempotency_key"] = json!(format!("n{n}"));
        }
        for attempt in 0.. {
            let node = (n as usize + attempt) % 3;
            let started = Instant::now();
            let answer = http
                .post(format!("{}/api/publish", nodes[node]))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&body)
                .send()
                .await;
            let status = answer.as_ref().ok().map(|a| a.status().as_u16());
            if node == 2 {
                done.on_cut_node.push((started.elapsed(), status));
            }
            if status == Some(200) {
                break;
            }
            assert!(attempt < 60, "publication {n} never acknowledged");
        }
        done.acked.push(n);
        // A publisher's pace, not a wait for something to happen.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done
}

/// Polls C's `/readyz` until it answers `status`; how long that took.
fn readyz_becomes(
    rt: &tokio::runtime::Runtime,
    url: &str,
    status: u16,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    loop {
        let asked = rt.block_on(async { http.get(format!("{url}/readyz")).send().await });
        let got = asked.ok().map(|r| r.status().as_u16());
        if got == Some(status) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "/readyz did not answer {status} within {within:?} (last: {got:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_cut_off_from_redis_loses_nothing_repeats_nothing_and_moves_its_clients() {
    let redis = RedisServer::start();
    let relay = Partition::start(&redis);
    let url = |relayed| if relayed { relay.url() } else { redis.url() };
    cut_off(
        |relayed| Server::start(&["--storage", "redis", "--redis-url", &url(relayed)]),
        &[&*relay],
    );
}

/// The same on NATS JetStream (issue #32): C's NATS connection is pinged every third of
/// `broker.unreachable_after` and declared lost after two unanswered pings.
#[test]
fn a_node_cut_off_from_nats_loses_nothing_repeats_nothing_and_moves_its_clients() {
    let nats = NatsServer::start();
    let relay = Relay::start_to(nats.port());
    let through_relay = format!("nats://127.0.0.1:{}", relay.port());
    let url = |relayed| {
        if relayed {
            through_relay.clone()
        } else {
            nats.url()
        }
    };
    cut_off(
        |relayed| Server::start(&["--storage", "nats", "--nats-url", &url(relayed)]),
        &[&relay],
    );
}

/// The same through Sentinel (issue #57 item 6): C asks a Sentinel whose answers name a
/// relay in front of the primary instead of the primary (see `Relay::rewrite_ports`), so it
/// reaches the primary through that relay, which fails.
#[test]
fn a_node_cut_off_from_a_sentinel_primary_loses_nothing_repeats_nothing_and_moves_its_clients() {
    let set = SentinelSet::start();
    let (to_primary, to_sentinels) = set.relays();
    let sentinels = |relayed: bool| match relayed {
        true => toml_list(
            to_sentinels
                .iter()
                .map(|r| format!("127.0.0.1:{}", r.port())),
        ),
        false => toml_list(set.sentinels()),
    };
    cut_off(
        |relayed| {
            let mut command = herald();
            command
                .env("HERALD_REDIS__SENTINELS", sentinels(relayed))
                .env("HERALD_REDIS__MASTER_NAME", MASTER_NAME);
            Server::spawn_in_temp(&mut command, &REDIS)
        },
        &[&to_primary],
    );
}

/// The same on a Redis Cluster: C reaches every cluster node through a relay of its own,
/// whose answers (slot maps, redirections) name the relays instead of the nodes; all of
/// them fail at once.
#[test]
fn a_node_cut_off_from_a_cluster_loses_nothing_repeats_nothing_and_moves_its_clients() {
    let set = ClusterSet::start(0);
    let relays = set.relays();
    let nodes = |relayed: bool| match relayed {
        true => toml_list(relays.iter().map(|r| format!("127.0.0.1:{}", r.port()))),
        false => toml_list(set.addresses()),
    };
    cut_off(
        |relayed| {
            let mut command = herald();
            command.env("HERALD_REDIS__CLUSTER", nodes(relayed));
            Server::spawn_in_temp(&mut command, &REDIS)
        },
        &relays.iter().collect::<Vec<_>>(),
    );
}

/// `host:port` addresses as a TOML list, for a `HERALD_REDIS__*` variable.
fn toml_list(addresses: impl IntoIterator<Item = String>) -> String {
    let quoted: Vec<String> = addresses.into_iter().map(|a| format!("{a:?}")).collect();
    format!("[{}]", quoted.join(","))
}

/// The URL's address is only a placeholder: the Sentinels or the cluster say where the
/// servers are.
const REDIS: [&str; 4] = ["--storage", "redis", "--redis-url", "redis://127.0.0.1:1"];

/// Nodes A and B reach the engine directly (`node(false)`), C through the `relays`
/// (`node(true)`), which fail together.
fn cut_off(node: impl Fn(bool) -> Server, relays: &[&Relay]) {
    let (a, b, c) = (node(false), node(false), node(true));
    let balancer = Balancer::start(&[&a.url, &b.url, &c.url]);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Every subscriber starts on C.
    balancer.pin(Some(2));
    let subscribers: Vec<Subscriber> = TRANSPORTS
        .iter()
        .map(|t| Subscriber::start(&balancer.url(), t))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let nodes = [a.url.clone(), b.url.clone(), c.url.clone()];
    let keyed = rt.spawn(publish(nodes.clone(), KEYED, true, stop.clone()));
    let unkeyed = rt.spawn(publish(nodes, UNKEYED, false, stop.clone()));
    let started = Instant::now();
    // Each subscriber's first lines may come from `herald sub`'s catch-up (a history read
    // before it subscribes), so a first number does not say it is subscribed yet: a cut
    // then caught it mid-subscribe, and its silence measured a 3 s history read, not its
    // move. Ten numbers (half a second of publications) do.
    while subscribers.iter().any(|s| s.numbers().len() < 10) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not all subscribed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    balancer.pin(None);

    // 1. A partition that outlasts the grace: C says so, and its clients move.
    let cut = Instant::now();
    relays.iter().for_each(|r| r.blackhole());
    let unready_after = readyz_becomes(&rt, &c.url, 503, Duration::from_secs(10));
    // The partition lasts 3 s past detection and the grace: the length of the fault.
    std::thread::sleep((DETECTION + GRACE + Duration::from_secs(3)).saturating_sub(cut.elapsed()));
    relays.iter().for_each(|r| r.heal());
    readyz_becomes(&rt, &c.url, 200, Duration::from_secs(15));
    let silences: Vec<(&str, Duration)> = subscribers
        .iter()
        .map(|s| (s.transport, s.longest_silence_after(cut)))
        .collect();

    // 2. Every connection to Redis reset at once.
    relays.iter().for_each(|r| r.reset());
    std::thread::sleep(Duration::from_secs(3));

    // 3. Every byte between C and Redis 3 s late.
    relays
        .iter()
        .for_each(|r| r.latency(Duration::from_secs(3)));
    std::thread::sleep(Duration::from_secs(8));
    relays.iter().for_each(|r| r.latency(Duration::ZERO));
    readyz_becomes(&rt, &c.url, 200, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));

    stop.store(true, SeqCst);
    let keyed = rt.block_on(keyed).unwrap();
    let unkeyed = rt.block_on(unkeyed).unwrap();

    // Every subscriber has every acknowledged publication once, in order.
    for s in &subscribers {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !keyed.acked.iter().all(|n| s.numbers().contains(n)) {
            assert!(
                Instant::now() < deadline,
                "{}: missing {:?}",
                s.transport,
                keyed
                    .acked
                    .iter()
                    .filter(|n| !s.numbers().contains(n))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            s.numbers(),
            keyed.acked,
            "{}: once each, in order",
            s.transport
        );
    }
    // With keys, a retry of a publication that was stored is a repeat, never a copy.
    let stored = |channel: &str| -> Vec<u64> {
        history(&rt, &a.url, channel)["publications"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["data"]["n"].as_u64())
            .collect()
    };
    assert_eq!(stored(KEYED), keyed.acked, "the keyed channel's history");
    let copies = |stored: &[u64]| {
        stored.len() - {
            let mut distinct = stored.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len()
        }
    };
    let unkeyed_copies = copies(&stored(UNKEYED));

    // C said it was cut within the detection time; every publish it took was answered
    // within the deadline (plus the way there and back).
    assert!(
        unready_after <= DETECTION + Duration::from_millis(300),
        "/readyz 503 after {unready_after:?}"
    );
    let slowest = keyed
        .on_cut_node
        .iter()
        .chain(&unkeyed.on_cut_node)
        .map(|(took, _)| *took)
        .max()
        .unwrap();
    assert!(
        slowest <= PUBLISH_DEADLINE + Duration::from_millis(500),
        "a publish on C took {slowest:?}"
    );
    // What each subscriber went through after the cut (its reconnects, and any pause over a
    // second), for when the assertions below fail.
    for s in &subscribers {
        for (at, line) in s.said.lock().unwrap().iter().filter(|(at, _)| *at > cut) {
            eprintln!("{} at +{:?}: {line}", s.transport, *at - cut);
        }
        let mut last = cut;
        for (at, n) in s.seen.lock().unwrap().iter().filter(|(at, _)| *at > cut) {
            if *at - last > Duration::from_secs(1) {
                eprintln!(
                    "{}: {:?} without a publication before {n}",
                    s.transport,
                    *at - last
                );
            }
            last = *at;
        }
    }
    // Its clients resumed elsewhere within detection, grace and one reconnect.
    for (transport, silence) in &silences {
        assert!(
            *silence <= DETECTION + GRACE + Duration::from_secs(3),
            "{transport}: silent for {silence:?} after the cut"
        );
    }
    let refused_on_c = |p: &Published| {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, status) in &p.on_cut_node {
            *by.entry(status.map_or("none".into(), |s| s.to_string()))
                .or_default() += 1;
        }
        by
    };
    eprintln!(
        "detection: /readyz 503 after {unready_after:?}; silences after the cut: {silences:?}; \
         slowest publish answer on C: {slowest:?}; answers on C (keyed): {:?}, (unkeyed): {:?}; \
         {} keyed publications, 0 copies; {} unkeyed, {unkeyed_copies} copies",
        refused_on_c(&keyed),
        refused_on_c(&unkeyed),
        keyed.acked.len(),
        unkeyed.acked.len(),
    );
}
