//! Several `herald serve` processes on one address (`--reuse-port`) sharing channels through
//! Redis or NATS JetStream: a node killed with `kill -9` loses nothing, and its clients
//! resume on another.

mod support;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use herald_broker_nats::testkit::NatsServer;
use herald_broker_redis::testkit::RedisServer;
use serde_json::{json, Value};
use support::{api_post, fails, herald, history, serve_logging, Server, KEY};

const CHANNEL: &str = "chat:ha";

/// A node on the shared address (`--reuse-port`) with the engine's flags.
fn node(listen: &str, engine: &[&str], data: &std::path::Path) -> Server {
    let mut args = engine.to_vec();
    args.push("--reuse-port");
    Server::start_at(listen, data, &args)
}

/// Publishes `n` through the shared address, retrying a request a dying node dropped;
/// returns the offset it got.
async fn publish(http: &reqwest::Client, url: &str, n: u64) -> u64 {
    for _ in 0..50 {
        let sent = http
            .post(format!("{url}/api/publish"))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&json!({ "channel": CHANNEL, "data": { "n": n } }))
            .send()
            .await;
        if let Ok(r) = sent {
            if let Ok(v) = r.json::<Value>().await {
                if let Some(offset) = v["offset"].as_u64() {
                    return offset;
                }
            }
        }
        // The request hit the node being killed; the kernel sends the retry to a live one.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("publication {n} was never accepted");
}

/// A child process that is killed and reaped however the test ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_node_loses_nothing_and_its_subscribers_resume_on_another() {
    let redis = RedisServer::start();
    killed_nodes_lose_nothing(&["--storage", "redis", "--redis-url", &redis.url()], 2);
}

/// The same on NATS JetStream (issue #32), with three nodes: the subscriber resumes on
/// whichever live node the kernel hands its new connection to.
#[test]
fn on_nats_a_killed_node_loses_nothing_and_its_subscribers_resume_on_another() {
    let nats = NatsServer::start();
    killed_nodes_lose_nothing(&["--storage", "nats", "--nats-url", &nats.url()], 3);
}

/// `count` nodes on one address with `engine`'s flags; a subscriber from the start and 150
/// publications through the shared address. Node A dies (SIGKILL) after 50; after 100, A
/// is back and B dies. The subscriber sees every offset once, in order, and history holds
/// all 150.
fn killed_nodes_lose_nothing(engine: &[&str], count: usize) {
    let data = tempfile::tempdir().unwrap();
    let mut a = node("127.0.0.1:0", engine, data.path());
    let address = a.url.trim_start_matches("http://").to_string();
    let mut b = node(&address, engine, data.path());
    let _others: Vec<Server> = (2..count)
        .map(|_| node(&address, engine, data.path()))
        .collect();
    let url = a.url.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A request caught by a SIGKILL must fail (and be retried), never wait forever.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    let mut sub = Reaped(
        herald()
            .args([
                "sub", CHANNEL, "--since", "0", "--count", "150", "--url", &url,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Lines arrive through a channel so that a silent subscriber fails the test in time.
    let (lines, printed) = std::sync::mpsc::channel::<String>();
    let stdout = sub.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut offsets = Vec::new();
    let read = |until: u64, offsets: &mut Vec<u64>| {
        while offsets.last().copied().unwrap_or(0) < until {
            let line = printed
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| {
                    panic!("the subscriber printed nothing more after {offsets:?}")
                });
            let v: Value = serde_json::from_str(&line).unwrap();
            offsets.push(v["offset"].as_u64().unwrap());
        }
    };

    // Whichever node the subscriber is on dies once: first A, then (after A is back) B.
    for (i, n) in (1..=150u64).enumerate() {
        assert_eq!(rt.block_on(publish(&http, &url, n)), n);
        if i == 49 {
            read(50, &mut offsets);
            a.child.kill().unwrap(); // SIGKILL
            a.child.wait().unwrap();
        }
        if i == 99 {
            read(100, &mut offsets);
            a = node(&address, engine, data.path());
            b.child.kill().unwrap();
            b.child.wait().unwrap();
        }
    }
    read(150, &mut offsets);
    assert_eq!(
        offsets,
        (1..=150).collect::<Vec<_>>(),
        "every offset once, in order"
    );
    let history = history(&rt, &url, CHANNEL);
    assert_eq!(
        history["publications"].as_array().unwrap().len(),
        150,
        "{history}"
    );
    drop(a);
}

mod presence {
    //! Presence over Redis when a node dies without a word.

    use std::time::{Duration, Instant};

    use futures_util::{SinkExt, StreamExt};
    use herald_broker_redis::testkit::{ClusterSet, RedisServer};
    use serde_json::{json, Value};
    use tokio_tungstenite::tungstenite::Message;

    use super::support::{api_get, Server};

    type Ws = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;

    /// What docs/configuration.md promises: a silent node's members are removed within 14 s.
    const DOCUMENTED: Duration = Duration::from_secs(14);
    /// The test's own delays on top: polling every 100 ms and one join/leave window.
    const SLACK: Duration = Duration::from_secs(1);

    async fn subscribed(url: &str, channel: &str) -> Ws {
        let url = format!("{}/connection/websocket", url.replacen("http", "ws", 1));
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let subscribe = json!({"id": 1, "subscribe": {"channel": channel}});
        ws.send(Message::text(subscribe.to_string())).await.unwrap();
        next(&mut ws, Duration::from_secs(5), |v| v["id"] == 1).await;
        ws
    }

    /// The next message that `wanted` accepts, failing after `limit`.
    async fn next(ws: &mut Ws, limit: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let frame = tokio::time::timeout_at(deadline, ws.next())
                .await
                .unwrap_or_else(|_| panic!("nothing wanted arrived within {limit:?}"))
                .expect("connection open")
                .unwrap();
            let Message::Text(text) = frame else { continue };
            for line in text.as_str().lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                if wanted(&v) {
                    return v;
                }
            }
        }
    }

    /// The one member a `presence` push announces as joined (or left).
    fn announced(v: &Value, key: &str) -> Option<String> {
        let list = v["presence"][key].as_array()?;
        (list.len() == 1).then(|| list[0]["client"].as_str().unwrap().to_string())
    }

    async fn clients(url: &str, channel: &str) -> u64 {
        let stats = api_get(&format!("{url}/api/presence_stats?channel={channel}")).await;
        stats["clients"].as_u64().unwrap()
    }

    #[test]
    fn a_killed_nodes_members_leave_within_the_documented_time() {
        let redis = RedisServer::start();
        let shared = ["--storage", "redis", "--redis-url", &redis.url()];
        members_of_a_killed_node_leave(|| Server::start(&shared));
    }

    /// The same on NATS JetStream (issue #32): members live in a watched bucket, and a node
    /// that stops beating is taken for dead by the others.
    #[test]
    fn on_nats_a_killed_nodes_members_leave_within_the_documented_time() {
        let nats = herald_broker_nats::testkit::NatsServer::start();
        let shared = ["--storage", "nats", "--nats-url", &nats.url()];
        members_of_a_killed_node_leave(|| Server::start(&shared));
    }

    /// The same on a Redis Cluster (issue #31): presence keeps to one slot per script, and
    /// the sweep of a dead node's members goes channel by channel.
    #[test]
    fn on_a_cluster_a_killed_nodes_members_leave_within_the_documented_time() {
        let set = ClusterSet::start(0);
        let nodes: Vec<String> = set.addresses().iter().map(|a| format!("{a:?}")).collect();
        let nodes = format!("[{}]", nodes.join(","));
        let data = tempfile::tempdir().unwrap();
        // The URL's address is a placeholder: the cluster's nodes say where each slot is.
        let shared = ["--storage", "redis", "--redis-url", "redis://127.0.0.1:1"];
        members_of_a_killed_node_leave(|| {
            let mut command = super::support::herald();
            command.env("HERALD_REDIS__CLUSTER", &nodes);
            Server::spawn_with(&mut command, data.path(), &shared)
        });
    }

    /// Two nodes from `start`: a member joins through A, B sees it; A is killed (SIGKILL)
    /// and B counts it gone, and tells its watcher, within the documented time.
    fn members_of_a_killed_node_leave(start: impl Fn() -> Server) {
        let mut a = start();
        let b = start();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let channel = "chat:who";
        rt.block_on(async {
            // The watcher on B sees its own join first, then the member's on A (through Redis).
            let mut watcher = subscribed(&b.url, channel).await;
            let wait = Duration::from_secs(5);
            let own = announced(
                &next(&mut watcher, wait, |v| announced(v, "join").is_some()).await,
                "join",
            );
            let _member = subscribed(&a.url, channel).await;
            let joined = next(&mut watcher, wait, |v| {
                announced(v, "join").is_some_and(|id| Some(&id) != own.as_ref())
            })
            .await;
            let member = announced(&joined, "join").unwrap();
            assert_eq!(clients(&b.url, channel).await, 2);
            // Issue #16: B lists both nodes, until A dies.
            let nodes = || async {
                api_get(&format!("{}/api/nodes", b.url)).await["nodes"]
                    .as_array()
                    .unwrap()
                    .len()
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while nodes().await != 2 {
                assert!(Instant::now() < deadline, "B never listed A");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }

            a.child.kill().unwrap(); // SIGKILL: A says nothing to Redis or B
            a.child.wait().unwrap();
            let killed = Instant::now();
            while clients(&b.url, channel).await != 1 {
                assert!(
                    killed.elapsed() < DOCUMENTED + SLACK,
                    "the killed node's member still counted after {:?}",
                    killed.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let gone_in = killed.elapsed();
            let left = next(&mut watcher, SLACK, |v| announced(v, "leave").is_some()).await;
            assert_eq!(announced(&left, "leave"), Some(member), "{left}");
            // A node's figures last 10 s after its last report (every 2 s).
            while nodes().await != 1 {
                assert!(
                    killed.elapsed() < Duration::from_secs(12) + SLACK,
                    "the killed node still listed after {:?}",
                    killed.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!("the killed node's member left after {gone_in:?}");
        });
    }
}

/// Two nodes on a Redis that speaks TLS only and takes only clients with a certificate its
/// CA signed (issue #31), configured through the environment as the deployment docs say:
/// what one node stores, the other reads. Without the CA, a node stops at start and says
/// why (the system's roots do not know Redis's issuer); with `tls_insecure` it starts
/// unverified, and says so.
#[test]
fn nodes_share_channels_through_a_redis_that_speaks_only_mutual_tls() {
    let redis = RedisServer::start_tls(true);
    let files = redis.tls().unwrap().clone();
    let data = tempfile::tempdir().unwrap();
    let url = redis.url();
    let args = ["--storage", "redis", "--redis-url", url.as_str()];
    let proving = |command: &mut Command| {
        command
            .env("HERALD_REDIS__CERT_FILE", &files.client_cert)
            .env("HERALD_REDIS__KEY_FILE", &files.client_key);
    };
    let start = || {
        let mut command = herald();
        proving(command.env("HERALD_REDIS__CA_FILE", &files.ca));
        Server::spawn_with(&mut command, data.path(), &args)
    };
    let (a, b) = (start(), start());
    what_one_stores_the_other_reads(&a, &b);

    let mut without_ca = herald();
    proving(&mut without_ca);
    let err = fails(
        without_ca
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .args(args),
    );
    assert!(
        err.contains("cannot use redis at rediss://127.0.0.1:") && err.contains("UnknownIssuer"),
        "{err}"
    );

    let (said, _) = serve_logging(|command| {
        proving(command.args(args).env("HERALD_REDIS__TLS_INSECURE", "true"));
    })
    .until_listening();
    assert!(
        said.iter().any(|v| v["level"] == "WARN"
            && v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("certificate is not verified"))),
        "{said:?}"
    );
}

/// Two nodes on a NATS that speaks TLS only, takes only clients with a certificate its CA
/// signed, and a user with a password (issue #32), all configured through the environment
/// as docs/nats.md says: what one node stores, the other reads. Without the CA a node stops
/// at start and says why.
#[test]
fn nodes_share_channels_through_a_nats_with_mutual_tls_and_a_password() {
    use herald_broker_nats::testkit::{Auth, NatsServer, Setup};
    let nats = NatsServer::start_with(Setup {
        auth: Auth::Password("herald".into(), "pa55word".into()),
        tls: Some(true),
        ..Setup::default()
    });
    let files = nats.tls().unwrap().clone();
    let data = tempfile::tempdir().unwrap();
    let url = nats.url();
    let args = ["--storage", "nats", "--nats-url", url.as_str()];
    let signed_in = |command: &mut Command| {
        command
            .env("HERALD_NATS__USER", "herald")
            .env("HERALD_NATS__PASSWORD", "pa55word")
            .env("HERALD_NATS__CERT_FILE", &files.client_cert)
            .env("HERALD_NATS__KEY_FILE", &files.client_key);
    };
    let start = || {
        let mut command = herald();
        signed_in(command.env("HERALD_NATS__CA_FILE", &files.ca));
        Server::spawn_with(&mut command, data.path(), &args)
    };
    let (a, b) = (start(), start());
    what_one_stores_the_other_reads(&a, &b);

    let mut without_ca = herald();
    signed_in(&mut without_ca);
    let err = fails(
        without_ca
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .args(args),
    );
    assert!(err.contains("cannot use nats at tls://127.0.0.1:"), "{err}");
    assert!(!err.contains("pa55word"), "{err}");
}

/// A publication through node `a` is in node `b`'s history.
fn what_one_stores_the_other_reads(a: &Server, b: &Server) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(api_post(
        &format!("{}/api/publish", a.url),
        json!({ "channel": "chat:tls", "data": { "text": "over tls" } }),
    ));
    assert_eq!(answer["offset"], 1, "{answer}");
    let seen = history(&rt, &b.url, "chat:tls");
    assert_eq!(
        seen["publications"][0]["data"]["text"], "over tls",
        "{seen}"
    );
}
