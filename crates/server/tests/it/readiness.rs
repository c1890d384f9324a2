//! `/readyz` says whether a node can serve: 503 with the reason while its way to Redis is
//! cut, 200 again once it is back; `/healthz` (is the process alive) stays 200.

use std::time::{Duration, Instant};

use herald_broker_redis::testkit::{Partition, RedisServer};
use herald_server::BrokerLimits;

use crate::support::*;

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Asks `url` every 50 ms until it answers `status`; how long that took.
async fn until_status(url: &str, status: u16, within: Duration) -> (Duration, String) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        let (now, body) = get(url).await;
        if now == status {
            return (started.elapsed(), body);
        }
        assert!(
            started.elapsed() < within,
            "{url} still answers {now}: {body}"
        );
        tick.tick().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_with_the_reason_while_redis_is_out_of_reach() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let limits = BrokerLimits::default();
    let server = start_on_redis_at(config(), partition.url(), Duration::from_secs(1), limits).await;
    let (ready, health) = (server.url("/readyz"), server.url("/healthz"));
    assert_eq!(get(&ready).await, (200, "ready\n".into()));

    partition.blackhole();
    let (took, body) = until_status(&ready, 503, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(1600), "503 after {took:?}");
    assert!(body.starts_with("not ready: redis "), "{body}");
    assert_eq!(get(&health).await.0, 200, "/healthz says the process lives");
    let metrics = server.metrics().await;
    assert!(metrics.contains("herald_broker_up 0"), "{metrics}");

    partition.heal();
    until_status(&ready, 200, Duration::from_secs(10)).await;
    let metrics = server.metrics().await;
    for line in [
        "herald_broker_up 1",
        "herald_broker_losses_total 1",
        "herald_broker_recoveries_total 1",
        "herald_broker_topology{topology=\"single\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }
    assert!(
        metrics.contains("herald_broker_resubscriptions_total "),
        "{metrics}"
    );
    server.stop().await.unwrap();
}

/// A node cut off from Redis past `clients_move_after` ends its clients' connections with
/// 3009, so they reconnect elsewhere; one whose Redis is back within it keeps them, and
/// they go on receiving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_node_cut_off_from_redis_are_told_to_move() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let limits = BrokerLimits {
        clients_move_after: Duration::from_millis(2500),
        ..BrokerLimits::default()
    };
    let server = start_on_redis_at(config(), partition.url(), Duration::from_secs(1), limits).await;
    let mut stays = server.client().await;
    stays.subscribe("news", None).await;

    // Back within the grace: nobody is told to move.
    partition.blackhole();
    until_status(&server.url("/readyz"), 503, Duration::from_secs(5)).await;
    partition.heal();
    until_status(&server.url("/readyz"), 200, Duration::from_secs(10)).await;
    server
        .publish("news", serde_json::json!("still here"))
        .await;
    let (_, _, data) = stays.next_pub().await;
    assert_eq!(data, "still here");

    // Out of reach past the grace: told to move, with a code that says reconnect.
    let mut moves = server.client().await;
    moves.subscribe("news", None).await;
    // A long-poll held meanwhile is answered with the same word. (It keeps its session, so
    // taking it up asks Redis nothing: it is held whenever it arrives.)
    let first: serde_json::Value =
        reqwest::get(server.url("/connection/longpoll?channel=news&session_key="))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let held = tokio::spawn(reqwest::get(server.url(&format!(
        "/connection/longpoll?cursor={}&timeout=30s&session_key={}",
        crate::http::urlencode(first["cursor"].as_str().unwrap()),
        first["session_key"].as_str().unwrap()
    ))));
    partition.blackhole();
    let cut = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), moves.closed())
        .await
        .expect("the client was never told to move");
    let took = cut.elapsed();
    assert_eq!(closed.code, 3009, "{}", closed.reason);
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_millis(4500),
        "told after {took:?}: detection (1 s) plus the grace (2.5 s)"
    );
    assert!(herald_protocol::reconnect_allowed(closed.code));
    let answer: serde_json::Value = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("the held long-poll was answered")
        .unwrap()
        .unwrap()
        .json()
        .await
        .unwrap();
    let last = answer["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .last()
        .cloned();
    assert_eq!(
        last.as_ref().map(|m| &m["disconnect"]["code"]),
        Some(&serde_json::json!(3009)),
        "{answer}"
    );
    partition.heal();
    server.stop().await.unwrap();
}

/// A publish on a node that knows it cannot reach Redis is refused at once as not stored
/// (121, 503 with `Retry-After`); one sent into a cut not yet found is answered within
/// `publish_timeout` as "outcome unknown" (122, 504), never left hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_on_a_cut_node_fails_fast_and_says_whether_it_was_stored() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let limits = BrokerLimits {
        publish_timeout: Duration::from_millis(1500),
        ..BrokerLimits::default()
    };
    let server = start_on_redis_at(config(), partition.url(), Duration::from_secs(3), limits).await;
    let publish = || async {
        let started = Instant::now();
        let r = reqwest::Client::new()
            .post(server.url("/api/publish"))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&serde_json::json!({ "channel": "news", "data": 1 }))
            .send()
            .await
            .unwrap();
        let retry = r.headers().get("retry-after").cloned();
        let (status, body) = response(r).await;
        (
            started.elapsed(),
            status,
            body["error"]["code"].clone(),
            retry,
        )
    };
    assert_eq!(publish().await.1, 200);

    // Cut, not yet found (3 s): sent, and not confirmed within the deadline.
    partition.blackhole();
    let (took, status, code, retry) = publish().await;
    assert_eq!((status, code), (504, serde_json::json!(122)));
    assert!(
        took < Duration::from_millis(2000),
        "answered after {took:?}"
    );
    assert!(retry.is_some());

    // Found: refused at once, nothing sent. (When the pub/sub connection finds the cut
    // first, the command connection's own probe follows within a third of the limit: a
    // publish meanwhile is sent, and answered 122 by the deadline.)
    until_status(&server.url("/readyz"), 503, Duration::from_secs(6)).await;
    let mut answers = Vec::new();
    loop {
        let (took, status, code, retry) = publish().await;
        if code == serde_json::json!(121) {
            assert_eq!(status, 503);
            assert!(took < Duration::from_millis(300), "answered after {took:?}");
            assert_eq!(retry.unwrap(), "1");
            break;
        }
        answers.push((took, status, code));
        assert!(answers.len() < 3, "never refused at once: {answers:?}");
    }
    partition.heal();
    server.stop().await.unwrap();
}

/// What a node that cannot reach Redis cannot do for a client now (here: open a poll, which
/// subscribes) is refused as a passing state, 121 (503 with `Retry-After`), so the client
/// tries again (elsewhere, through a load balancer), never as an internal error it may take
/// for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_cut_node_cannot_serve_now_is_refused_for_now() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let limits = BrokerLimits::default();
    let server = start_on_redis_at(config(), partition.url(), Duration::from_secs(1), limits).await;
    partition.blackhole();
    until_status(&server.url("/readyz"), 503, Duration::from_secs(6)).await;

    let poll = reqwest::get(server.url("/connection/poll?channel=news"))
        .await
        .unwrap();
    let retry = poll.headers().get("retry-after").cloned();
    let (status, body) = response(poll).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (503, serde_json::json!(121)),
        "{body}"
    );
    assert!(retry.is_some());

    partition.heal();
}

/// A node on a relay to Redis that finds a cut within 1 s, moves its clients 1 s later, and
/// gives up a command waiting on Redis after 1.5 s.
async fn quick_to_move(partition: &Partition) -> TestServer {
    let limits = BrokerLimits {
        clients_move_after: Duration::from_secs(1),
        command_timeout: Duration::from_millis(1500),
        ..BrokerLimits::default()
    };
    start_on_redis_at(config(), partition.url(), Duration::from_secs(1), limits).await
}

/// Cuts Redis off, has `client` subscribe to `channel` (a command that then waits on
/// Redis), and checks that the client is told to move (3009) within detection, the grace
/// and the command's limit.
async fn subscribing_when_cut_is_moved(partition: &Partition, client: &mut Client, channel: &str) {
    partition.blackhole();
    let cut = Instant::now();
    let subscribe = serde_json::json!({ "id": 99, "subscribe": { "channel": channel } });
    client.send_text(subscribe.to_string()).await;
    let closed = tokio::time::timeout(Duration::from_secs(15), client.closed())
        .await
        .expect("the client was never told to move");
    let took = cut.elapsed();
    assert_eq!(closed.code, 3009, "{}", closed.reason);
    assert!(
        took < Duration::from_millis(4000),
        "told after {took:?}: detection (1 s), the grace (1 s), the command's limit (1.5 s)"
    );
    partition.heal();
}

/// A client whose subscribe waits on Redis when the cut comes is moved like the others:
/// the command is given up after `command_timeout` (121), so its connection sees the order
/// to move within detection, the grace and that timeout, not after Redis's own timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_on_the_broker_is_moved_within_the_grace_too() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let server = quick_to_move(&partition).await;
    let mut client = server.client().await;
    client.subscribe("news", None).await;
    subscribing_when_cut_is_moved(&partition, &mut client, "other").await;
}

/// The same when what waits is the presence store: a second subscriber of a channel the
/// node already listens to (no broker call) joins its presence, which waits on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_joining_presence_on_a_cut_node_is_moved_within_the_grace_too() {
    let redis = RedisServer::start();
    let partition = Partition::start(&redis);
    let server = quick_to_move(&partition).await;
    let mut first = server.client().await;
    first.subscribe("chat:room", None).await;
    let mut second = server.client().await;
    subscribing_when_cut_is_moved(&partition, &mut second, "chat:room").await;
}
