//! A publish with an `idempotency_key` is stored once per channel within the window, by
//! the API and by clients, and on every node that shares Redis.

use herald_broker_redis::testkit::RedisServer;
use serde_json::{json, Value};

use crate::support::*;

async fn publish(server: &TestServer, channel: &str, data: Value, key: &str) -> (u16, Value) {
    server
        .api_post(
            "/api/publish",
            json!({ "channel": channel, "data": data, "idempotency_key": key }),
        )
        .await
}

#[tokio::test]
async fn a_retried_publish_with_its_key_is_stored_once() {
    let server = start(config()).await;
    let (status, first) = publish(&server, "news", json!("a"), "order-17").await;
    assert_eq!(status, 200, "{first}");
    assert!(first.get("repeat").is_none(), "{first}");
    let (_, again) = publish(&server, "news", json!("a, sent again"), "order-17").await;
    assert_eq!(again["offset"], first["offset"], "{again}");
    assert_eq!(again["repeat"], true);
    let (_, other) = publish(&server, "news", json!("b"), "order-18").await;
    assert_eq!(other["offset"], 2, "{other}");
    let (status, history) = server.api_get("/api/history?channel=news&limit=10").await;
    assert_eq!(status, 200);
    let data: Vec<&Value> = history["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["data"])
        .collect();
    assert_eq!(data, [&json!("a"), &json!("b")], "a repeat stores nothing");

    // A client's publish command takes a key too.
    let mut client = server.client().await;
    let reply = client
        .call(
            "publish",
            json!({"channel": "chat:x", "data": 1, "idempotency_key": "k"}),
        )
        .await;
    let again = client
        .call(
            "publish",
            json!({"channel": "chat:x", "data": 1, "idempotency_key": "k"}),
        )
        .await;
    assert_eq!(
        again["publish"]["offset"], reply["publish"]["offset"],
        "{again}"
    );
    assert_eq!(again["publish"]["repeat"], true, "{again}");

    let (status, bad) = publish(&server, "news", json!(1), "has space").await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], 107);
    server.stop().await.unwrap();
}

/// The key lives in Redis, beside the channel's stream: a publisher whose answer was lost
/// on one node and who retries on another stores the publication once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holds_across_nodes() {
    let redis = RedisServer::start();
    let (a, b) = (
        start_on_redis(config(), &redis).await,
        start_on_redis(config(), &redis).await,
    );
    let (_, first) = publish(&a, "news", json!("once"), "retry-me").await;
    let (_, again) = publish(&b, "news", json!("once"), "retry-me").await;
    assert_eq!(again["offset"], first["offset"], "{first} {again}");
    assert_eq!(again["epoch"], first["epoch"]);
    assert_eq!(again["repeat"], true);
    let (_, history) = b.api_get("/api/history?channel=news&limit=10").await;
    assert_eq!(
        history["publications"].as_array().unwrap().len(),
        1,
        "{history}"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Issue #56 item 5: a key is scoped to who published it. An anonymous client that
/// publishes first with the backend's next key (`order-42`) made the backend's publish
/// answer `repeat: true` with the client's offset, and nothing of the backend's was stored.
/// Now the backend's publish is stored; each publisher still gets its own retries merged,
/// and two anonymous clients (connections) do not share keys.
#[tokio::test]
async fn a_client_cannot_use_a_key_against_another_publisher() {
    let server = start(config()).await;
    let key = json!({"channel": "open:orders", "data": "forged", "idempotency_key": "order-42"});
    let mut attacker = server.client().await;
    let forged = attacker.call("publish", key.clone()).await;
    assert_eq!(forged["publish"]["offset"], 1, "{forged}");
    let (status, real) = publish(&server, "open:orders", json!("real"), "order-42").await;
    assert_eq!(status, 200, "{real}");
    assert!(
        real.get("repeat").is_none(),
        "the backend's was suppressed: {real}"
    );
    assert_eq!(real["offset"], 2, "{real}");
    // Each publisher's own retry is still merged.
    let (_, again) = publish(&server, "open:orders", json!("real"), "order-42").await;
    assert_eq!(
        (&again["offset"], &again["repeat"]),
        (&json!(2), &json!(true))
    );
    let retried = attacker.call("publish", key.clone()).await;
    assert_eq!(retried["publish"]["offset"], 1, "{retried}");
    assert_eq!(retried["publish"]["repeat"], true, "{retried}");
    // Another anonymous connection has keys of its own.
    let mut other = server.client().await;
    let others = other.call("publish", key).await;
    assert_eq!(others["publish"]["offset"], 3, "{others}");
    assert!(others["publish"].get("repeat").is_none(), "{others}");
    // A stateless sender (the poll transports publish so) has no connection: its retries
    // meet by its address, and still not the backend's.
    let http = reqwest::Client::new();
    let send = || {
        let line = r#"{"id":1,"publish":{"channel":"open:orders","data":"polled","idempotency_key":"order-42"}}"#;
        answer_lines(http.post(server.url("/connection/send")).body(line))
    };
    let first = send().await;
    assert_eq!(first[0]["publish"]["offset"], 4, "{first:?}");
    let again = send().await;
    assert_eq!(again[0]["publish"]["offset"], 4, "{again:?}");
    assert_eq!(again[0]["publish"]["repeat"], true, "{again:?}");
    server.stop().await.unwrap();
}
