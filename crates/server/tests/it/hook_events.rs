//! Connection events for the backend (`hooks.events_url`): in order per client, through
//! the backend's outage, one message per line; and the hooks' figures in the metrics.

use std::sync::{atomic::Ordering, Arc};

use herald_server::config::NamespaceOverride;
use serde_json::{json, Value};

use crate::{hook_failures::failing_config, hooks::*, http::Lines, support::*};

/// The events the backend received, each once (by id), in the order first received.
fn unique_events(backend: &Backend) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    backend
        .requests("/events")
        .iter()
        .flat_map(|post| post["events"].as_array().cloned().unwrap_or_default())
        .filter(|e| seen.insert(e["id"].as_str().unwrap().to_string()))
        .collect()
}

fn kinds(events: &[Value], client: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["client"] == client)
        .map(|e| match e["channel"].as_str() {
            Some(c) => format!("{} {c}", e["type"].as_str().unwrap()),
            None => e["type"].as_str().unwrap().to_string(),
        })
        .collect()
}

#[tokio::test]
async fn events_reach_the_backend_in_order_per_client_and_survive_its_outage() {
    // The backend fails every post until told otherwise: events wait, in order.
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = healthy.clone();
    let backend = Backend::start(move |path, _| match path {
        "/events" if flag.load(Ordering::SeqCst) => ok(json!({})),
        "/events" => Answer::Status(503),
        _ => Answer::Status(404),
    })
    .await;
    let mut c = config();
    c.hooks.events_url = backend.at("/events");
    c.hooks.circuit_failures = 1000;
    let server = start(c).await;

    let mut a = server.client().await;
    let reply = a.call("connect", json!({})).await;
    let client = reply["connect"]["client"].as_str().unwrap().to_string();
    a.subscribe("chat:one", None).await;
    a.subscribe("chat:two", None).await;
    a.call("unsubscribe", json!({ "channel": "chat:one" }))
        .await;
    drop(a);
    // A stream connection too.
    let http = reqwest::Client::new();
    let mut stream = Lines::new(
        http.get(server.url("/connection/stream?channel=chat:one"))
            .send()
            .await
            .unwrap(),
    );
    let streamed = stream.session().await;
    let _subscribed = stream.next().await;
    drop(stream);

    eventually("the deliverer has tried the stored events", || async {
        backend.requests("/events").len() >= 2
    })
    .await;
    healthy.store(true, Ordering::SeqCst);
    eventually("every event is delivered", || async {
        let events = unique_events(&backend);
        kinds(&events, &client).len() == 5 && kinds(&events, &streamed).len() == 3
    })
    .await;
    let events = unique_events(&backend);
    assert_eq!(
        kinds(&events, &client),
        [
            "connect",
            "subscribe chat:one",
            "subscribe chat:two",
            "unsubscribe chat:one",
            "disconnect"
        ]
    );
    assert_eq!(
        kinds(&events, &streamed),
        ["connect", "subscribe chat:one", "disconnect"]
    );
    let disconnect = events
        .iter()
        .find(|e| e["client"] == client.as_str() && e["type"] == "disconnect")
        .unwrap();
    assert_eq!(disconnect["transport"], "websocket");
    assert!(
        disconnect["code"].is_u64() && disconnect["time"].is_u64(),
        "{disconnect}"
    );
    let stream_connect = events
        .iter()
        .find(|e| e["client"] == streamed.as_str())
        .unwrap();
    assert_eq!(stream_connect["transport"], "stream");
    // Retried posts carried the same ids: every id posted maps to one event.
    let posted: usize = backend
        .requests("/events")
        .iter()
        .map(|p| p["events"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(
        posted > events.len(),
        "some posts were retried ({posted} events posted)"
    );

    // Polls are requests, not connections: no events.
    let before = unique_events(&backend).len();
    let r = http
        .get(server.url("/connection/poll?channel=chat:one"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut b = server.client().await;
    let reply = b.call("connect", json!({})).await;
    let marker = reply["connect"]["client"].as_str().unwrap().to_string();
    eventually("a later connection's event arrives", || async {
        !kinds(&unique_events(&backend), &marker).is_empty()
    })
    .await;
    assert_eq!(
        unique_events(&backend).len(),
        before + 1,
        "the poll made none"
    );
}

#[tokio::test]
async fn a_backends_pretty_printed_data_keeps_one_message_per_line() {
    // Many backends indent their JSON: its line breaks must not reach a line framing.
    let backend = Backend::start(|path, _| {
        let pretty = match path {
            "/rpc" | "/subscribe" => "{\n  \"result\": {\n    \"data\": {\n      \"a\": [\n        1,\n        2\n      ]\n    }\n  }\n}",
            _ => return Answer::Status(404),
        };
        Answer::Text(pretty)
    })
    .await;
    let mut c = config();
    c.hooks.subscribe_url = backend.at("/subscribe");
    c.hooks.rpc_url = backend.at("/rpc");
    c.namespaces.insert(
        "room".into(),
        NamespaceOverride {
            subscribe_hook: Some(true),
            ..Default::default()
        },
    );
    let server = start(c).await;
    let mut client = server.client().await;
    // The client reads each line as one JSON value: a line break inside one fails it.
    let reply = client.call("rpc", json!({ "method": "m" })).await;
    assert_eq!(reply["rpc"]["data"], json!({ "a": [1, 2] }), "{reply}");
    let reply = client
        .call("subscribe", json!({ "channel": "room:a" }))
        .await;
    assert_eq!(
        reply["subscribe"]["data"],
        json!({ "a": [1, 2] }),
        "{reply}"
    );

    let http = reqwest::Client::new();
    let mut sse = Lines::new(
        http.get(server.url("/connection/sse?channel=room:b"))
            .send()
            .await
            .unwrap(),
    );
    let _connect = sse.next_event().await.unwrap();
    let (_, subscribed) = sse.next_event().await.unwrap();
    assert_eq!(
        subscribed["subscribe"]["data"],
        json!({ "a": [1, 2] }),
        "{subscribed}"
    );
}

/// Issue #16: each hook's calls are timed and its failures counted in `/metrics`.
#[tokio::test]
async fn hook_calls_and_failures_are_counted_in_the_metrics() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    for _ in 0..2 {
        let reply = alice.call("rpc", json!({ "method": "m" })).await;
        assert!(reply.get("rpc").is_some(), "{reply}");
    }
    let text = server.metrics().await;
    assert!(
        text.contains("herald_hook_duration_seconds_count{hook=\"rpc\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("herald_hook_duration_seconds_count{hook=\"connect\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("herald_hook_failures_total{hook=\"rpc\"} 0"),
        "{text}"
    );

    let erring = Backend::start(|_, _| Answer::Status(500)).await;
    let mut c = failing_config(&erring.url);
    c.hooks.connect_url = None;
    let server = start(c).await;
    let mut client = server.client().await;
    let reply = client.call("rpc", json!({ "method": "m" })).await;
    assert_eq!(reply["error"]["code"], 118, "{reply}");
    let text = server.metrics().await;
    assert!(
        text.contains("herald_hook_failures_total{hook=\"rpc\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("hook=\"connect\""),
        "no connect hook here: {text}"
    );
}

/// Nodes on one Redis share the events log; only one of them posts it, so the backend gets
/// each event once, not once per node. (Before, every node's deliverer posted every batch.)
#[tokio::test]
async fn nodes_sharing_a_broker_post_each_event_once() {
    let backend = Backend::start(|path, _| match path {
        "/events" => ok(json!({})),
        _ => Answer::Status(404),
    })
    .await;
    let redis = RedisServer::start();
    let mut c = config();
    c.hooks.events_url = backend.at("/events");
    let a = start_on_redis(c.clone(), &redis).await;
    let b = start_on_redis(c, &redis).await;
    // Each node reports when it starts, then every 2 s; until each knows of the other,
    // both may deliver.
    let delivers = |v: Value| v["delivers_hooks"] == json!(["events"]);
    eventually("one node delivers", || async {
        delivers(a.api_get("/api/info").await.1) != delivers(b.api_get("/api/info").await.1)
    })
    .await;
    let before = backend.requests("/events").len();
    // A client on each node connects and leaves: four events, stored by two nodes.
    for server in [&a, &b] {
        let mut client = server.client().await;
        client.call("connect", json!({})).await;
        drop(client);
    }
    let posted = || {
        backend.requests("/events")[before..]
            .iter()
            .flat_map(|post| post["events"].as_array().cloned().unwrap_or_default())
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    eventually("four events posted", || async {
        posted()
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            >= 4
    })
    .await;
    // The other node reads the shared log every second: three seconds in which it would
    // have posted the same batches again.
    let repeated = tokio::time::timeout(std::time::Duration::from_secs(3), async {
        loop {
            let ids = posted();
            let unique: std::collections::HashSet<_> = ids.iter().collect();
            if unique.len() < ids.len() {
                return ids;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(repeated.is_err(), "posted twice: {:?}", repeated.unwrap());
}
