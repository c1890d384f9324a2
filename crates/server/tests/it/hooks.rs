//! Backend hooks, against a real HTTP backend started here on a free port: each hook's
//! success and refusal, and a backend that is slow, answers garbage or is down.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{extract::State, http::Uri, response::IntoResponse};
use herald_server::config::{Config, NamespaceOverride, Presence};
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
    /// HTTP 200 with this JSON, once the test lets a request through the gate.
    Gated(Arc<tokio::sync::Semaphore>, Value),
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
        Answer::Gated(gate, v) => {
            let _through = gate.acquire().await;
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

pub(crate) fn ok(result: Value) -> Answer {
    Answer::Json(json!({ "result": result }))
}

pub(crate) fn refuse(code: u16, message: &str) -> Answer {
    Answer::Json(json!({ "error": { "code": code, "message": message } }))
}

/// The example application: a session cookie `sid=alice-session` is alice, who may use
/// `private:*`; `room` channels are asked about (`room:closed` is refused with 1003, others
/// get the room's state); publications to `room` are stored and stamped; rpc echoes.
pub(crate) fn application(path: &str, body: &Value) -> Answer {
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

pub(crate) fn hooked_config(backend: &Backend) -> Config {
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
pub(crate) async fn ws_with_cookie(server: &TestServer, cookie: &str) -> Client {
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

pub(crate) async fn get_with_cookie(
    server: &TestServer,
    path: &str,
    cookie: &str,
) -> reqwest::Response {
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

/// The subscribe hook's `info` is the connection's info in that channel, as a subscription
/// token's: `channel_info` on its presence member and beside its publications (issue #59:
/// a Phoenix join's metas come from it). One that is too large is refused like bad `data`.
#[tokio::test]
async fn the_subscribe_hook_gives_the_connection_its_info_in_the_channel() {
    let backend = Backend::start(|path, body| match path {
        "/connect" => ok(json!({ "user": "alice", "info": { "name": "Alice" } })),
        "/subscribe" if body["channel"] == "room:huge" => {
            ok(json!({ "info": { "pad": "x".repeat(5000) } }))
        }
        "/subscribe" => ok(json!({ "info": { "seat": 7 } })),
        "/publish" => ok(json!({})),
        _ => Answer::Status(404),
    })
    .await;
    let mut c = hooked_config(&backend);
    c.namespaces.get_mut("room").unwrap().presence = Some(Presence::On(Access::Anyone));
    let server = start(c).await;
    let mut alice = ws_with_cookie(&server, "sid=any").await;
    alice.call("connect", json!({})).await;
    alice.subscribe("room:seat", None).await;
    let page = alice
        .call("presence", json!({ "channel": "room:seat" }))
        .await;
    let member = &page["presence"]["members"][0];
    assert_eq!(member["info"], json!({ "name": "Alice" }), "{page}");
    assert_eq!(member["channel_info"], json!({ "seat": 7 }), "{page}");
    alice
        .call(
            "publish",
            json!({ "channel": "room:seat", "data": { "text": "hi" } }),
        )
        .await;
    let (_, history) = server.api_get("/api/history?channel=room:seat").await;
    let from = &history["publications"][0]["from"];
    assert_eq!(from["channel_info"], json!({ "seat": 7 }), "{history}");

    let refused = alice
        .call("subscribe", json!({ "channel": "room:huge" }))
        .await;
    assert_eq!(refused["error"]["code"], 118, "{refused}");
}
