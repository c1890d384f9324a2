//! Two `herald serve` nodes on a Redis whose primary moves: found through Sentinel, or a
//! Redis Cluster's; or on a NATS JetStream that restarts. The primary (or NATS) is killed
//! (SIGKILL) while both take publications and serve subscribers, and every acknowledged
//! publication still reaches every subscriber once, in order.

mod support;

use std::{
    collections::HashSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use herald_broker_redis::testkit::{ClusterSet, SentinelSet, MASTER_NAME};
use serde_json::{json, Value};
use support::{fails, herald, Server, KEY};

const CHANNEL: &str = "chat:failover";

/// A child process that is killed and reaped however the test ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn through_sentinels(command: &mut Command, sentinels: &[String]) {
    let sentinels: Vec<String> = sentinels.iter().map(|s| format!("{s:?}")).collect();
    command
        .env(
            "HERALD_REDIS__SENTINELS",
            format!("[{}]", sentinels.join(",")),
        )
        .env("HERALD_REDIS__MASTER_NAME", MASTER_NAME)
        .env("HERALD_REDIS__REPLICAS_ACK", "1");
}

/// `herald sub` on `url`: its lines arrive through the receiver.
fn subscriber(url: &str) -> (Reaped, mpsc::Receiver<Value>) {
    let mut sub = Reaped(
        herald()
            .args(["sub", CHANNEL, "--since", "0", "--url", url])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (lines, printed) = mpsc::channel();
    let stdout = sub.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if lines.send(v).is_err() {
                return;
            }
        }
    });
    (sub, printed)
}

fn on_cluster(command: &mut Command, addresses: &[String]) {
    let nodes: Vec<String> = addresses.iter().map(|s| format!("{s:?}")).collect();
    command
        .env("HERALD_REDIS__CLUSTER", format!("[{}]", nodes.join(",")))
        .env("HERALD_REDIS__REPLICAS_ACK", "1");
}

#[test]
fn a_sentinel_failover_loses_no_acknowledged_publication_on_any_node() {
    let mut set = SentinelSet::start();
    let sentinels = set.sentinels();
    survives(
        &REDIS,
        |command| through_sentinels(command, &sentinels),
        || {
            set.kill_primary();
        },
        ("sentinel", "herald_broker_moves_total"),
    );
}

#[test]
fn a_cluster_failover_loses_no_acknowledged_publication_on_any_node() {
    let mut set = ClusterSet::start(2);
    let primary = set.primary_of(&format!("herald:{{{CHANNEL}}}:m"));
    let addresses = set.addresses();
    survives(
        &REDIS,
        |command| on_cluster(command, &addresses),
        || set.kill(primary),
        ("cluster", "herald_broker_moves_total"),
    );
}

/// NATS JetStream killed (SIGKILL) and started again on its files (issue #32): history and
/// offsets survive, and each node's connection comes back and catches up.
#[test]
fn a_nats_restart_loses_no_acknowledged_publication_on_any_node() {
    let nats = herald_broker_nats::testkit::NatsServer::start();
    let url = nats.url();
    let nats = std::sync::Arc::new(std::sync::Mutex::new(nats));
    let down = nats.clone();
    survives(
        &["--storage", "nats", "--nats-url", &url],
        |_| {},
        move || {
            down.lock().unwrap().kill();
            // NATS stays down for two seconds (an outage, not a wait for something), while
            // publishers are refused and subscribers miss what the other node stored.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                down.lock().unwrap().restart();
            });
        },
        ("single", "herald_broker_resubscriptions_total"),
    );
    drop(nats);
}

/// The URL's address is only a placeholder: the Sentinels or the cluster say where the
/// primaries are.
const REDIS: [&str; 4] = ["--storage", "redis", "--redis-url", "redis://127.0.0.1:1"];

/// Two nodes with `args`, configured by `configure`; 30 publications acknowledged through
/// them in turn, `kill`, 30 more; then every subscriber has each acknowledged one once, in
/// order, and each node's `/metrics` names the `topology` and counts at least one of
/// `followed` (the move, or the resubscription).
fn survives(
    args: &[&str],
    configure: impl Fn(&mut Command),
    kill: impl FnOnce(),
    (topology, followed): (&str, &str),
) {
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let mut command = herald();
        configure(&mut command);
        Server::spawn_with(&mut command, data.path(), args)
    };
    let nodes = [start(), start()];
    let subscribers: Vec<_> = nodes.iter().map(|n| subscriber(&n.url)).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let mut acked: Vec<u64> = Vec::new();
    let mut kill = Some(kill);
    let (mut killed, mut stalled, mut refused) = (None::<Instant>, None, 0);
    let give_up = Instant::now() + Duration::from_secs(90);
    let mut n = 0u64;
    while acked.len() < 60 {
        assert!(
            Instant::now() < give_up,
            "publishing never recovered: {acked:?}"
        );
        if acked.len() == 30 {
            if let Some(kill) = kill.take() {
                kill();
                killed = Some(Instant::now());
            }
        }
        n += 1;
        let node = &nodes[(n % 2) as usize];
        let answer: Option<Value> = rt.block_on(async {
            let sent = http
                .post(format!("{}/api/publish", node.url))
                .header("Authorization", format!("apikey {KEY}"))
                .json(&json!({ "channel": CHANNEL, "data": { "n": n } }))
                .send()
                .await
                .ok()?;
            sent.json().await.ok()
        });
        if answer.as_ref().is_some_and(|a| a["offset"].is_u64()) {
            if let (Some(at), None) = (killed, stalled) {
                stalled = Some(at.elapsed());
            }
            acked.push(n);
        } else {
            refused += 1;
            // A publisher's pace between retries, not a wait for something to happen.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    eprintln!(
        "{topology}: publishing stalled {stalled:?} after the kill; {refused} refused meanwhile"
    );

    // Each node says how it reaches its engine, and that it followed the failover.
    for node in &nodes {
        let metrics = rt.block_on(async {
            http.get(format!("{}/metrics", node.url))
                .header("Authorization", format!("apikey {KEY}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        });
        assert!(
            metrics.contains(&format!(
                "herald_broker_topology{{topology=\"{topology}\"}} 1"
            )),
            "{metrics}"
        );
        let moves = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{followed} ")))
            .and_then(|v| v.parse::<u64>().ok());
        assert!(moves.is_some_and(|m| m >= 1), "{followed} {moves:?}");
    }
    let wanted: HashSet<u64> = acked.iter().copied().collect();
    for (i, (_, printed)) in subscribers.iter().enumerate() {
        let mut seen = Vec::new();
        while !wanted.iter().all(|w| seen.contains(w)) {
            let line = printed
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("subscriber {i} printed nothing more after {seen:?}"));
            if let Some(n) = line["data"]["n"].as_u64() {
                seen.push(n);
            }
        }
        let got: Vec<u64> = seen.into_iter().filter(|n| wanted.contains(n)).collect();
        assert_eq!(
            got, acked,
            "subscriber {i}: each acknowledged publication once, in order"
        );
    }
}

/// What `herald serve --storage redis` with these `HERALD_*` variables says when it refuses
/// to start.
fn refused_at_start(env: &[(&str, &str)]) -> String {
    let data = tempfile::tempdir().unwrap();
    let mut command = herald();
    command.envs(env.iter().copied()).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "redis",
        "--data-dir",
    ]);
    fails(command.arg(data.path()))
}

/// Sentinels without a master name are refused before anything starts.
#[test]
fn sentinels_without_a_master_name_are_refused_at_start() {
    let err = refused_at_start(&[("HERALD_REDIS__SENTINELS", r#"["127.0.0.1:26379"]"#)]);
    assert!(err.contains("redis.master_name"), "{err}");
}

/// A cluster none of whose nodes answers stops the start with one line naming them; a
/// cluster beside Sentinels is refused before anything starts.
#[test]
fn a_cluster_that_cannot_work_is_refused_at_start_with_the_reason() {
    let err = refused_at_start(&[("HERALD_REDIS__CLUSTER", r#"["127.0.0.1:1","127.0.0.1:2"]"#)]);
    assert!(
        err.contains("cannot use redis at redis cluster at 127.0.0.1:1, 127.0.0.1:2"),
        "{err}"
    );
    let err = refused_at_start(&[
        ("HERALD_REDIS__CLUSTER", r#"["127.0.0.1:1"]"#),
        ("HERALD_REDIS__SENTINELS", r#"["127.0.0.1:2"]"#),
        ("HERALD_REDIS__MASTER_NAME", "herald"),
    ]);
    assert!(err.contains("`redis.cluster`"), "{err}");
}
