//! Backend hooks, against a real HTTP backend started here on a free port: each hook's
//! success and refusal, and a backend that is slow, answers garbage or is down.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{extract::State, http::Uri, response::IntoResponse};
use herald_server::config::{Config, NamespaceOverride};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::{auth::HTTP_OPENS, http::Lines, support::*};

/// How the backend answers one request.
pub enum Answer {
    /// HTTP 200 with this JSON.
    Json(Value),
    /// This status, empty body.
    Status(u16),
    /// HTTP 200 with this text (not a hook answer).
    Text(&'static str),
    /// Never.
    Hang,
    /// HTTP 200 with this JSON, after this long.
    Slow(Duration, Value),
}

type Handler = dyn Fn(&str, &Value) -> Answer + Send + Sync;

/// An application backend: records every request (path, JSON body) and answers by `handler`.
pub struct Backend {
    pub url: String,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    /// Requests that arrived, answered or not.
    arrived: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct BackendState {
    handler: Arc<Handler>,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    arrived: Arc<AtomicUsize>,
}

async fn answer(State(s): State<BackendState>, uri: Uri, body: String) -> axum::response::Response {
    let body: Value = serde_json::from_str(&body).expect("hook requests are JSON");
    let path = uri.path().to_string();
    let answer = (s.handler)(&path, &body);
    s.requests.lock().push((path, body));
    s.arrived.fetch_add(1, Ordering::SeqCst);
    match answer {
        Answer::Json(v) => axum::Json(v).into_response(),
        Answer::Status(code) => axum::http::StatusCode::from_u16(code)
            .unwrap()
            .into_response(),
        Answer::Text(t) => t.into_response(),
        Answer::Hang => std::future::pending().await,
        Answer::Slow(wait, v) => {
            tokio::time::sleep(wait).await;
            axum::Json(v).into_response()
        }
    }
}

impl Backend {
    pub async fn start(handler: impl Fn(&str, &Value) -> Answer + Send + Sync + 'static) -> Self {
        let state = BackendState {
            handler: Arc::new(handler),
            requests: Arc::default(),
            arrived: Arc::default(),
        };
        let app = axum::Router::new()
            .fallback(axum::routing::post(answer))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            requests: state.requests,
            arrived: state.arrived,
        }
    }

    /// An address where nothing listens.
    pub async fn down() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }

    pub fn at(&self, path: &str) -> Option<String> {
        Some(format!("{}{path}", self.url))
    }

    /// The bodies of requests to `path`, in arrival order.
    pub fn requests(&self, path: &str) -> Vec<Value> {
        self.requests
            .lock()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }

    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }
}

fn ok(result: Value) -> Answer {
    Answer::Json(json!({ "result": result }))
}

fn refuse(code: u16, message: &str) -> Answer {
    Answer::Json(json!({ "error": { "code": code, "message": message } }))
}

/// The example application: a session cookie `sid=alice-session` is alice, who may use
/// `private:*`; `room` channels are asked about (`room:closed` is refused with 1003, others
/// get the room's state); publications to `room` are stored and stamped; rpc echoes.
fn application(path: &str, body: &Value) -> Answer {
    match path {
        "/connect" => match body["cookies"]["sid"].as_str() {
            Some("alice-session") => ok(json!({
                "user": "alice",
                "info": { "name": "Alice" },
                "subscribe": ["private:*"],
            })),
            Some("guest") => ok(json!({})),
            _ if body["token"] == "opaque-bob" => ok(json!({ "user": "bob" })),
            _ => refuse(103, "not signed in"),
        },
        "/subscribe" => match body["channel"].as_str() {
            Some("room:closed") => refuse(1003, "this room is closed"),
            Some(room) => ok(json!({ "data": { "room": room, "members": 2 } })),
            None => Answer::Status(400),
        },
        "/publish" => {
            if body["data"]["text"] == "spam" {
                return refuse(1001, "rejected by moderation");
            }
            let mut data = body["data"].clone();
            data["stored"] = json!(true);
            data["by"] = body["user"].clone();
            ok(json!({ "data": data }))
        }
        "/rpc" => ok(
            json!({ "data": { "method": body["method"], "echo": body["data"], "user": body["user"] } }),
        ),
        _ => Answer::Status(404),
    }
}

fn hooked_config(backend: &Backend) -> Config {
    let mut c = config();
    c.hooks.connect_url = backend.at("/connect");
    c.hooks.subscribe_url = backend.at("/subscribe");
    c.hooks.publish_url = backend.at("/publish");
    c.hooks.rpc_url = backend.at("/rpc");
    c.hooks.cookies = vec!["sid".into()];
    c.hooks.headers = vec!["x-app".into()];
    c.namespaces.insert(
        "private".into(),
        NamespaceOverride {
            subscribe: Some(Access::Granted),
            ..Default::default()
        },
    );
    c.namespaces.insert(
        "room".into(),
        NamespaceOverride {
            subscribe: Some(Access::Granted),
            history: Some(Access::Granted),
            publish: Some(Access::Authenticated),
            subscribe_hook: Some(true),
            publish_hook: Some(true),
            ..Default::default()
        },
    );
    c
}

/// A WebSocket whose upgrade carries `cookie`.
async fn ws_with_cookie(server: &TestServer, cookie: &str) -> Client {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{}/connection/websocket", server.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("cookie", cookie.parse().unwrap());
    request
        .headers_mut()
        .insert("x-app", "web".parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    Client::from_socket(ws)
}

async fn get_with_cookie(server: &TestServer, path: &str, cookie: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(server.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_connect_hook_admits_by_cookie_on_every_transport_and_refuses_with_its_code() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;

    // WebSocket: the cookie of the upgrade request, and only the allowed ones.
    let mut alice = ws_with_cookie(&server, "sid=alice-session; tracking=xyz").await;
    let reply = alice.call("connect", json!({})).await;
    assert_eq!(reply["connect"]["user"], "alice", "{reply}");
    let asked = &backend.requests("/connect")[0];
    assert_eq!(asked["transport"], "websocket");
    assert_eq!(asked["cookies"], json!({ "sid": "alice-session" }));
    assert_eq!(asked["headers"], json!({ "x-app": "web" }));
    assert_eq!(asked["address"], "127.0.0.1");
    assert!(asked["client"].as_str().unwrap().contains('-'));
    // Its grants apply as a token's would.
    alice.subscribe("private:alice-notes", None).await;

    let mut stranger = ws_with_cookie(&server, "sid=forged").await;
    stranger
        .send_text(json!({ "id": 1, "connect": {} }).to_string())
        .await;
    let closed = stranger.closed().await;
    assert_eq!(closed.code, 3502, "{closed:?}");
    assert!(closed.reason.contains("not signed in"), "{closed:?}");

    // A first command other than connect is asked about too.
    let mut implicit = ws_with_cookie(&server, "sid=forged").await;
    implicit
        .send_text(json!({ "id": 1, "subscribe": { "channel": "chat:x" } }).to_string())
        .await;
    assert_eq!(implicit.closed().await.code, 3502);

    // Every HTTP transport: admitted with the cookie, 403 with the hook's code without.
    for open in HTTP_OPENS {
        let path = format!("{open}channel=private:alice-notes");
        let r = get_with_cookie(&server, &path, "sid=alice-session").await;
        assert_eq!(r.status(), 200, "{open}");
        let r = get_with_cookie(&server, &path, "sid=forged").await;
        assert_eq!(status_and_code(r).await, (403, Some(103)), "{open}");
    }
    let transports: Vec<Value> = backend
        .requests("/connect")
        .iter()
        .map(|r| r["transport"].clone())
        .collect();
    for t in ["sse", "stream", "iframe", "longpoll", "poll"] {
        assert!(transports.contains(&json!(t)), "{t} in {transports:?}");
    }

    // A stateless send.
    let http = reqwest::Client::new();
    let sent = answer_lines(
        http.post(server.url("/connection/send"))
            .header("cookie", "sid=alice-session")
            .body(json!({ "id": 1, "rpc": { "method": "whoami" } }).to_string()),
    )
    .await;
    assert_eq!(sent[0]["rpc"]["data"]["user"], "alice", "{sent:?}");
    assert_eq!(
        backend.requests("/connect").last().unwrap()["transport"],
        "send"
    );
}

#[tokio::test]
async fn a_token_is_checked_first_and_the_hook_asked_without_one_or_given_it_without_keys() {
    let backend = Backend::start(application).await;
    let mut c = hooked_config(&backend);
    c.auth.hmac_secret = Some("a-test-secret-of-at-least-32-bytes!".into());
    let server = start(c).await;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({ "sub": "carol" }),
        &jsonwebtoken::EncodingKey::from_secret(b"a-test-secret-of-at-least-32-bytes!"),
    )
    .unwrap();
    let mut carol = ws_with_cookie(&server, "sid=alice-session").await;
    let reply = carol.call("connect", json!({ "token": token })).await;
    assert_eq!(reply["connect"]["user"], "carol");
    assert!(
        backend.requests("/connect").is_empty(),
        "a token needs no hook"
    );
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    let reply = alice.call("connect", json!({})).await;
    assert_eq!(reply["connect"]["user"], "alice");

    // Hook only: with no token key, the hook sees the token (the backend's own kind).
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    let mut bob = server.client().await;
    let reply = bob.call("connect", json!({ "token": "opaque-bob" })).await;
    assert_eq!(reply["connect"]["user"], "bob", "{reply}");
    assert_eq!(backend.requests("/connect")[0]["token"], "opaque-bob");
}

#[tokio::test]
async fn the_subscribe_hook_allows_with_state_or_refuses_with_the_applications_code() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    server
        .publish("room:lobby", json!({ "text": "before" }))
        .await;
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    alice.call("connect", json!({})).await;

    let reply = alice
        .call("subscribe", json!({ "channel": "room:lobby" }))
        .await;
    assert_eq!(
        reply["subscribe"]["data"],
        json!({ "room": "room:lobby", "members": 2 }),
        "{reply}"
    );
    let asked = &backend.requests("/subscribe")[0];
    assert_eq!(asked["user"], "alice");
    assert_eq!(asked["channel"], "room:lobby");
    // The allowance is a grant: `history` is `granted` in `room`.
    let history = alice
        .call("history", json!({ "channel": "room:lobby" }))
        .await;
    assert_eq!(offsets(&history["history"]), vec![1], "{history}");

    let refused = alice
        .call("subscribe", json!({ "channel": "room:closed" }))
        .await;
    assert_eq!(refused["error"]["code"], 1003, "{refused}");
    assert_eq!(refused["error"]["message"], "this room is closed");
    let history = alice
        .call("history", json!({ "channel": "room:closed" }))
        .await;
    assert_eq!(
        history["error"]["code"], 103,
        "no grant without the hook's allowance"
    );

    // On an HTTP stream, the state comes in the subscribe push, before publications.
    let http = reqwest::Client::new();
    let mut stream = Lines::new(
        http.get(server.url("/connection/stream?channel=room:lobby"))
            .header("cookie", "sid=alice-session")
            .send()
            .await
            .unwrap(),
    );
    let _session = stream.session().await;
    let subscribed: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(
        subscribed["subscribe"]["data"]["members"], 2,
        "{subscribed}"
    );
    // A refusal is an HTTP refusal on every transport, before anything streams, with the
    // backend's code and words (issue #29: SSE used to answer 200, then end with 3006).
    for open in HTTP_OPENS {
        let r = get_with_cookie(
            &server,
            &format!("{open}channel=room:closed"),
            "sid=alice-session",
        )
        .await;
        let (status, body) = response(r).await;
        assert_eq!(
            (status, body["error"]["code"].as_u64()),
            (403, Some(1003)),
            "{open}: {body}"
        );
        assert_eq!(body["error"]["message"], "this room is closed", "{open}");
    }
}

#[tokio::test]
async fn the_publish_hook_rewrites_or_refuses_before_anything_is_published() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    alice.call("connect", json!({})).await;
    alice.subscribe("room:lobby", None).await;

    let reply = alice
        .call(
            "publish",
            json!({ "channel": "room:lobby", "data": { "text": "hi" } }),
        )
        .await;
    assert_eq!(reply["publish"]["offset"], 1, "{reply}");
    let (_, _, data) = alice.next_pub().await;
    assert_eq!(data, json!({ "text": "hi", "stored": true, "by": "alice" }));

    let refused = alice
        .call(
            "publish",
            json!({ "channel": "room:lobby", "data": { "text": "spam" } }),
        )
        .await;
    assert_eq!(refused["error"]["code"], 1001, "{refused}");
    let (status, history) = server.api_get("/api/history?channel=room:lobby").await;
    assert_eq!(status, 200);
    assert_eq!(offsets(&history), vec![1], "nothing refused was published");

    // The rules come first: an anonymous client is refused without asking the backend.
    let asked = backend.requests("/publish").len();
    let mut guest = ws_with_cookie(&server, "sid=guest").await;
    let reply = guest.call("connect", json!({})).await;
    assert!(reply["connect"].get("user").is_none(), "anonymous: {reply}");
    let refused = guest
        .call(
            "publish",
            json!({ "channel": "room:lobby", "data": { "text": "hi" } }),
        )
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    assert_eq!(backend.requests("/publish").len(), asked);
}

#[tokio::test]
async fn rpc_is_answered_by_the_backend_on_every_transport() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    let mut alice = ws_with_cookie(&server, "sid=alice-session").await;
    let reply = alice
        .call(
            "rpc",
            json!({ "method": "conversation", "data": { "id": 7 } }),
        )
        .await;
    assert_eq!(
        reply["rpc"]["data"],
        json!({ "method": "conversation", "echo": { "id": 7 }, "user": "alice" }),
        "{reply}"
    );
    // Through a stream's session: the answer arrives in the stream.
    let http = reqwest::Client::new();
    let mut stream = Lines::new(
        http.get(server.url("/connection/stream"))
            .header("cookie", "sid=alice-session")
            .send()
            .await
            .unwrap(),
    );
    let session = stream.session().await;
    let r = http
        .post(server.url(&format!("/connection/send?session={session}")))
        .body(json!({ "id": 5, "rpc": { "method": "m", "data": [1] } }).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let answer: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["rpc"]["data"]["echo"], json!([1]), "{answer}");

    // Without an rpc hook: 108.
    let server = start(config()).await;
    let mut c = server.client().await;
    let reply = c.call("rpc", json!({ "method": "m" })).await;
    assert_eq!(reply["error"]["code"], 108, "{reply}");
}

/// A config whose every hook is at `url`, with a short timeout.
fn failing_config(url: &str) -> Config {
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

/// Issue #38, item 5: a cookie that a browser sent for another site's page (an `<img>` or
/// `<iframe>` load, which carries no `Origin`) does not sign its request in: the connect
/// hook is not shown it. The same cookie from the page's own origin still does.
#[tokio::test]
async fn a_cross_site_request_is_not_signed_in_by_its_cookie() {
    let backend = Backend::start(application).await;
    let server = start(hooked_config(&backend)).await;
    let http = reqwest::Client::new();
    let poll = |site: &str, origin: Option<String>| {
        let mut r = http
            .get(server.url("/connection/poll?channel=private:alice-notes"))
            .header("cookie", "sid=alice-session")
            .header("sec-fetch-site", site);
        if let Some(origin) = origin {
            r = r.header("origin", origin);
        }
        async move { status_and_code(r.send().await.unwrap()).await }
    };
    let own = format!("http://{}", server.addr);
    for (site, origin) in [
        ("cross-site", None),
        ("same-site", None),
        ("cross-site", Some(own.clone())),
    ] {
        assert_eq!(
            poll(site, origin.clone()).await,
            (403, Some(103)),
            "{site} {origin:?}: not signed in"
        );
    }
    for (site, origin) in [
        ("same-origin", None),
        ("none", None),
        ("same-site", Some(own)),
    ] {
        assert_eq!(
            poll(site, origin.clone()).await,
            (200, None),
            "{site} {origin:?}"
        );
    }
    let asked = backend.requests("/connect");
    assert!(
        asked[..3].iter().all(|r| r["cookies"] == json!({})),
        "{asked:?}"
    );
    server.stop().await.unwrap();
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
