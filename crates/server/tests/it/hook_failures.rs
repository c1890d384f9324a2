//! Backend hooks when the backend fails: slow, garbled, erring or down (118 within the
//! timeout), the circuit that opens and closes, a hook that hangs, the refresh hook, and
//! the budgets that keep one address from exhausting the hooks for everyone.

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use herald_server::config::{Config, NamespaceOverride};
use serde_json::json;

use crate::{hooks::*, support::*};

/// A config whose every hook is at `url`, with a short timeout.
pub(crate) fn failing_config(url: &str) -> Config {
    let mut c = config();
    c.hooks.timeout = Duration::from_millis(300);
    c.hooks.circuit_failures = 1000;
    c.hooks.connect_url = Some(format!("{url}/connect"));
    c.hooks.subscribe_url = Some(format!("{url}/subscribe"));
    c.hooks.publish_url = Some(format!("{url}/publish"));
    c.hooks.rpc_url = Some(format!("{url}/rpc"));
    c.namespaces.insert(
        "room".into(),
        NamespaceOverride {
            publish: Some(Access::Anyone),
            subscribe_hook: Some(true),
            publish_hook: Some(true),
            ..Default::default()
        },
    );
    c
}

/// What a client gets from each hook of a failing backend at `url`: 118 (3008 for connect)
/// within the timeout, whatever the failure.
async fn every_hook_answers_118(what: &str, url: &str, backend: Option<&Backend>) {
    let server = start(failing_config(url)).await;
    let started = Instant::now();
    let mut c = server.client().await;
    c.send_text(json!({ "id": 1, "connect": {} }).to_string())
        .await;
    let closed = c.closed().await;
    assert_eq!(closed.code, 3008, "{what}: {closed:?}");
    let r = reqwest::get(server.url("/connection/poll?channel=chat:x"))
        .await
        .unwrap();
    assert_eq!(status_and_code(r).await, (503, Some(118)), "{what}");

    // The other hooks, for a client the connect hook never sees (a server without one).
    let mut c = failing_config(url);
    c.hooks.connect_url = None;
    let server = start(c).await;
    let mut client = server.client().await;
    for (method, params) in [
        ("subscribe", json!({ "channel": "room:a" })),
        ("publish", json!({ "channel": "room:a", "data": 1 })),
        ("rpc", json!({ "method": "m" })),
    ] {
        let reply = client.call(method, params).await;
        assert_eq!(reply["error"]["code"], 118, "{what} {method}: {reply}");
        // The cause is the operator's (the log has it); the client gets the generic reason.
        assert_eq!(
            reply["error"]["message"], "backend unavailable; retry later",
            "{what} {method}"
        );
    }
    // Four calls (plus the two connects), each at most the timeout and a little.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(6 * 300 + 1500),
        "{what}: {elapsed:?}"
    );
    // Nothing the publish hook did not allow was published.
    let (_, history) = server.api_get("/api/history?channel=room:a").await;
    assert_eq!(offsets(&history), Vec::<u64>::new(), "{what}");
    if let Some(b) = backend {
        assert!(b.arrived() >= 5, "{what}: the backend was asked");
    }
}

#[tokio::test]
async fn a_slow_a_garbled_an_erring_or_a_dead_backend_gives_118_within_the_timeout() {
    let slow = Backend::start(|_, _| Answer::Hang).await;
    every_hook_answers_118("slow", &slow.url, Some(&slow)).await;
    let garbled = Backend::start(|_, _| Answer::Text("<html>oops</html>")).await;
    every_hook_answers_118("garbage", &garbled.url, Some(&garbled)).await;
    let erring = Backend::start(|_, _| Answer::Status(500)).await;
    every_hook_answers_118("500", &erring.url, Some(&erring)).await;
    let unknown_code = Backend::start(|_, _| refuse(3000, "not a code Herald knows")).await;
    every_hook_answers_118("unknown code", &unknown_code.url, None).await;
    every_hook_answers_118("down", &Backend::down().await, None).await;
}

#[tokio::test]
async fn a_failing_backend_opens_the_circuit_and_the_first_success_closes_it() {
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = healthy.clone();
    let backend = Backend::start(move |_, _| {
        if flag.load(Ordering::SeqCst) {
            ok(json!({ "data": "fine" }))
        } else {
            Answer::Status(502)
        }
    })
    .await;
    let mut c = config();
    c.hooks.rpc_url = backend.at("/rpc");
    c.hooks.circuit_failures = 3;
    c.hooks.circuit_open = Duration::from_millis(300);
    let server = start(c).await;
    let mut client = server.client().await;
    for _ in 0..10 {
        let reply = client.call("rpc", json!({ "method": "m" })).await;
        assert_eq!(reply["error"]["code"], 118);
    }
    assert_eq!(
        backend.arrived(),
        3,
        "after 3 failures the backend is left alone"
    );
    healthy.store(true, Ordering::SeqCst);
    // Polled: the circuit reopens by the clock (`circuit_open`), nothing to wait on.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = client.call("rpc", json!({ "method": "m" })).await;
        if reply["rpc"]["data"] == "fine" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the circuit never closed: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        backend.arrived(),
        4,
        "one request tried the backend, and succeeded"
    );
}

#[tokio::test]
async fn a_hanging_hook_stalls_neither_fan_out_nor_other_connections() {
    let backend = Backend::start(|path, _| {
        if path == "/publish" {
            Answer::Hang
        } else {
            ok(json!({}))
        }
    })
    .await;
    let mut c = failing_config(&backend.url);
    c.hooks.connect_url = None;
    c.hooks.timeout = Duration::from_secs(10);
    c.hooks.max_in_flight = 1;
    let server = start(c).await;

    let mut stuck = server.client().await;
    stuck
        .send_text(json!({ "id": 1, "publish": { "channel": "room:a", "data": 1 } }).to_string())
        .await;
    eventually("the publish hook is asked", || async {
        backend.requests("/publish").len() == 1
    })
    .await;

    // Meanwhile: another connection subscribes, a publication fans out to it, and it
    // publishes into a namespace without a hook.
    let mut other = server.client().await;
    other.subscribe("open:x", None).await;
    server.publish("open:x", json!("fan-out")).await;
    assert_eq!(other.next_pub().await.2, json!("fan-out"));
    let reply = other
        .call("publish", json!({ "channel": "open:x", "data": "mine" }))
        .await;
    assert_eq!(reply["publish"]["offset"], 2, "{reply}");
    assert_eq!(backend.requests("/publish").len(), 1, "still in flight");
}

#[tokio::test]
async fn the_refresh_hook_extends_a_hook_given_expiry_and_without_it_the_connection_ends() {
    let backend = Backend::start(|path, _| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        match path {
            "/connect" => ok(json!({ "user": "dave", "expires": now + 1 })),
            "/refresh" => ok(json!({ "expires": now + 600 })),
            _ => Answer::Status(404),
        }
    })
    .await;
    let mut c = config();
    c.auth.leeway = Duration::ZERO;
    c.hooks.connect_url = backend.at("/connect");
    c.hooks.refresh_url = backend.at("/refresh");
    let server = start(c.clone()).await;
    let mut dave = server.client().await;
    let reply = dave.call("connect", json!({})).await;
    assert!(reply["connect"]["ttl"].as_u64().unwrap() <= 1, "{reply}");
    eventually("the refresh hook is asked", || async {
        !backend.requests("/refresh").is_empty()
    })
    .await;
    assert_eq!(backend.requests("/refresh")[0]["user"], "dave");
    let pong = dave.call("ping", json!({})).await;
    assert!(pong.get("error").is_none(), "still connected: {pong}");

    c.hooks.refresh_url = None;
    let server = start(c).await;
    let mut dave = server.client().await;
    dave.call("connect", json!({})).await;
    assert_eq!(dave.closed().await.code, 3504);
}

/// Issue #38, item 4: one address cannot make the backend fail for everyone. A flood of
/// stateless sends from one address (each of which would ask the connect hook) is held to
/// that address's `limits.hook_calls_per_address`, so the backend (slow, with few slots)
/// keeps up, its circuit stays closed, and a signed-in user at another address is answered
/// throughout. Addresses are told apart by `X-Forwarded-For` from a trusted proxy (the
/// test's own 127.0.0.1).
#[tokio::test]
async fn one_address_cannot_open_the_hook_circuit_for_everyone() {
    let backend = Backend::start(|path, body| match (path, body["cookies"]["sid"].as_str()) {
        ("/connect", Some("alice-session")) => Answer::Slow(
            Duration::from_millis(100),
            json!({ "result": { "user": "alice" } }),
        ),
        ("/connect", _) => Answer::Slow(Duration::from_millis(100), json!({ "result": {} })),
        _ => Answer::Status(404),
    })
    .await;
    let mut c = config();
    c.hooks.connect_url = backend.at("/connect");
    c.hooks.cookies = vec!["sid".into()];
    c.hooks.max_in_flight = 16;
    c.hooks.timeout = Duration::from_secs(1);
    c.limits.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    c.limits.hook_calls_per_address = 50;
    c.limits.connection_rate_per_address = 200;
    let server = start(c).await;
    let http = reqwest::Client::new();
    let send = |from: &'static str, cookie: &'static str| {
        let r = http
            .post(server.url("/connection/send"))
            .header("x-forwarded-for", from)
            .header("cookie", cookie)
            .body(r#"{"id":1,"ping":{}}"#)
            .send();
        async move { r.await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    let flooding = Instant::now();
    let flood = futures_util::future::join_all((0..50).map(|_| async {
        let mut answered = 0u32;
        while flooding.elapsed() < Duration::from_secs(3) {
            send("10.9.9.9", "sid=nobody").await;
            answered += 1;
        }
        answered
    }));
    let alice = async {
        let mut statuses = Vec::new();
        while flooding.elapsed() < Duration::from_secs(3) {
            statuses.push(send("10.1.1.1", "sid=alice-session").await);
        }
        statuses
    };
    let (sent, statuses) = tokio::join!(flood, alice);
    let sent: u32 = sent.iter().sum();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "alice's sends during a flood of {sent}: {statuses:?}"
    );
    // The flood's address got at most its burst and three seconds of its rate.
    let asked = backend
        .requests("/connect")
        .iter()
        .filter(|r| r["address"] == "10.9.9.9")
        .count();
    assert!(
        asked <= 100 + 3 * 50 + 10,
        "the backend was asked {asked} times for the flood"
    );
    server.stop().await.unwrap();
}

/// The budget's refusal on WebSocket: past `hook_calls_per_address` a subscribe that would
/// ask the backend gets 111, and a connect closes with 3008 (reconnect later), neither
/// asking the backend. (The bucket refills at 1/s, so each is tried until the budget is
/// spent, which takes its burst of two on a machine of any speed.)
#[tokio::test]
async fn past_the_hook_budget_a_websocket_is_told_to_come_back_later() {
    let backend = Backend::start(application).await;
    let mut c = hooked_config(&backend);
    c.limits.hook_calls_per_address = 1;
    let server = start(c).await;
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    let reply = alice.call("connect", json!({})).await;
    assert_eq!(reply["connect"]["user"], "alice", "{reply}");
    let mut refused = None;
    for i in 0..20 {
        let asked = backend.arrived();
        let reply = alice
            .call("subscribe", json!({ "channel": format!("room:r{i}") }))
            .await;
        if reply.get("error").is_some() {
            assert_eq!(backend.arrived(), asked, "the backend was not asked");
            refused = Some(reply);
            break;
        }
    }
    let refused = refused.expect("a subscribe past the budget is refused");
    assert_eq!(refused["error"]["code"], 111, "{refused}");
    let mut closed = None;
    for _ in 0..20 {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        let asked = backend.arrived();
        let mut late = ws_with_cookie(&server, "sid=alice-session").await;
        late.send_text(json!({ "id": 1, "connect": {} }).to_string())
            .await;
        let answer = tokio::time::timeout(PATIENCE, late.ws.next())
            .await
            .expect("an answer in time");
        if let Some(Ok(Message::Close(Some(frame)))) = answer {
            assert_eq!(backend.arrived(), asked, "the backend was not asked");
            closed = Some(u16::from(frame.code));
            break;
        }
    }
    assert_eq!(
        closed,
        Some(3008),
        "a connect past the budget closes with 3008"
    );
    server.stop().await.unwrap();
}
