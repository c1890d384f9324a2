//! Who may read a hook-guarded channel, tried on every way of reading on every transport
//! (issue #29): the configuration of docs/hooks.md's "Try it", whose backend admits only
//! alice to `room:staff`. Anonymous clients, bob (signed in by cookie) and a token granted
//! `room:*` get nothing of it: no subscription, no replay from a position, no history, no
//! presence, nothing published into it; alice gets all of it.

use futures_util::StreamExt;
use herald_server::config::{Config, NamespaceOverride, Presence};
use serde_json::{json, Value};

use crate::{
    auth::{claims, hs256, HTTP_OPENS, SECRET},
    hooks::{Answer, Backend},
    http::{urlencode, Lines},
    support::*,
};

const STAFF: &str = "room:staff";

/// docs/examples/hooks-backend.mjs's answers: cookies `session=alice-secret` and
/// `session=bob-secret` sign in; `room:staff` is alice's only, for reading and writing.
fn example_backend(path: &str, body: &Value) -> Answer {
    let ok = |result: Value| Answer::Json(json!({ "result": result }));
    let staff_only = || Answer::Json(json!({ "error": { "code": 1003, "message": "staff only" } }));
    let alice = body["user"] == "alice";
    match path {
        "/connect" => match body["cookies"]["session"].as_str() {
            Some("alice-secret") => ok(json!({ "user": "alice", "subscribe": ["room:*"] })),
            Some("bob-secret") => ok(json!({ "user": "bob", "subscribe": ["room:*"] })),
            _ => ok(json!({})),
        },
        "/subscribe" if body["channel"] == STAFF && !alice => staff_only(),
        "/subscribe" => ok(json!({ "data": { "topic": body["channel"] } })),
        "/publish" if body["channel"] == STAFF && !alice => staff_only(),
        "/publish" => ok(json!({})),
        _ => Answer::Status(404),
    }
}

/// "Try it" (rooms open to anyone by the rules, the hooks decide), with presence on and a
/// token key, so that a token user can try too.
fn try_it(backend: &Backend) -> Config {
    let mut c = config();
    c.auth.hmac_secret = Some(SECRET.into());
    c.hooks.connect_url = backend.at("/connect");
    c.hooks.subscribe_url = backend.at("/subscribe");
    c.hooks.publish_url = backend.at("/publish");
    c.hooks.cookies = vec!["session".into()];
    c.namespaces.insert(
        "room".into(),
        NamespaceOverride {
            subscribe: Some(Access::Anyone),
            history: Some(Access::Anyone),
            publish: Some(Access::Anyone),
            presence: Some(Presence::On(Access::Anyone)),
            subscribe_hook: Some(true),
            publish_hook: Some(true),
            ..Default::default()
        },
    );
    c
}

/// One reader: how it proves who it is on WebSocket and on HTTP.
struct Reader {
    name: &'static str,
    cookie: Option<&'static str>,
    token: Option<String>,
}

impl Reader {
    async fn websocket(&self, server: &TestServer) -> Client {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{}/connection/websocket", server.addr)
            .into_client_request()
            .unwrap();
        if let Some(cookie) = self.cookie {
            request
                .headers_mut()
                .insert("cookie", cookie.parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let mut c = Client::from_socket(ws);
        let connect = match &self.token {
            Some(token) => json!({ "token": token }),
            None => json!({}),
        };
        let reply = c.call("connect", connect).await;
        assert!(reply.get("error").is_none(), "{}: {reply}", self.name);
        c
    }

    /// A GET or POST with this reader's cookie and token (`token=` in the query).
    fn request(
        &self,
        method: reqwest::Method,
        server: &TestServer,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let path = match &self.token {
            Some(token) => {
                let joint = if path.contains('?') { '&' } else { '?' };
                format!("{path}{joint}token={}", urlencode(token))
            }
            None => path.to_string(),
        };
        let r = reqwest::Client::new().request(method, server.url(&path));
        match self.cookie {
            Some(cookie) => r.header("cookie", cookie),
            None => r,
        }
    }
}

/// Every command that reads or writes `room:staff`, as a client sends them.
fn commands() -> Vec<(&'static str, Value)> {
    let since = json!({ "offset": 0 });
    vec![
        ("subscribe", json!({ "channel": STAFF, "since": since })),
        ("history", json!({ "channel": STAFF })),
        ("history", json!({ "channel": STAFF, "since": since })),
        ("presence", json!({ "channel": STAFF })),
        ("presence_stats", json!({ "channel": STAFF })),
        (
            "publish",
            json!({ "channel": STAFF, "data": { "text": "forged" } }),
        ),
    ]
}

/// Asserts that `text` holds none of what was published to the staff room.
fn nothing_of_staff(text: &str, what: &str) {
    assert!(!text.contains("staff-secret"), "{what} leaked: {text}");
}

#[tokio::test]
async fn a_hook_guarded_room_is_read_only_by_whom_the_hook_admits_on_every_path() {
    let backend = Backend::start(example_backend).await;
    let server = start(try_it(&backend)).await;
    server.publish(STAFF, json!("staff-secret-1")).await;
    server.publish(STAFF, json!("staff-secret-2")).await;
    let alice = Reader {
        name: "alice",
        cookie: Some("session=alice-secret"),
        token: None,
    };
    // Alice is in the room, so presence has something to show.
    let mut alice_ws = alice.websocket(&server).await;
    let joined = alice_ws
        .call(
            "subscribe",
            json!({ "channel": STAFF, "since": { "offset": 0 } }),
        )
        .await;
    assert_eq!(offsets(&joined["subscribe"]), vec![1, 2], "{joined}");

    let outsiders = [
        Reader {
            name: "anonymous",
            cookie: None,
            token: None,
        },
        Reader {
            name: "bob",
            cookie: Some("session=bob-secret"),
            token: None,
        },
        Reader {
            name: "a token granted room:*",
            cookie: None,
            token: Some(hs256(&claims("carol", json!({ "subscribe": ["room:*"] })))),
        },
    ];
    for reader in &outsiders {
        let who = reader.name;
        // WebSocket: every command is refused with the backend's own code.
        let mut ws = reader.websocket(&server).await;
        for (method, params) in commands() {
            let reply = ws.call(method, params.clone()).await;
            assert_eq!(
                reply["error"]["code"], 1003,
                "{who} {method} {params}: {reply}"
            );
        }
        while let Some(line) = ws.set_aside_line() {
            nothing_of_staff(&line.to_string(), who);
        }

        // A stateless send: the same commands, the same refusals.
        let body: String = commands()
            .into_iter()
            .enumerate()
            .map(|(id, (method, params))| {
                json!({ "id": id + 1, method: params }).to_string() + "\n"
            })
            .filter(|line| !line.contains("subscribe\":{")) // needs a session: 107
            .collect();
        let sent = reader
            .request(reqwest::Method::POST, &server, "/connection/send")
            .body(body)
            .send()
            .await
            .unwrap();
        let text = sent.text().await.unwrap();
        nothing_of_staff(&text, who);
        for line in text.lines() {
            let line: Value = serde_json::from_str(line).unwrap();
            assert_eq!(line["error"]["code"], 1003, "{who} send: {line}");
        }

        // Every HTTP transport, from the start and resuming (a cursor, Last-Event-ID):
        // refused before anything streams, with the backend's code.
        let cursor = urlencode(&format!("{STAFF};*;0"));
        for open in HTTP_OPENS {
            for query in [format!("channel={STAFF}"), format!("cursor={cursor}")] {
                let r = reader
                    .request(reqwest::Method::GET, &server, &format!("{open}{query}"))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let text = r.text().await.unwrap();
                nothing_of_staff(&text, who);
                assert_eq!(status, 403, "{who} {open}{query}: {text}");
                let body: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(body["error"]["code"], 1003, "{who} {open}{query}");
                // It names the channel, so a client asking for several can drop just it.
                assert_eq!(body["error"]["channel"], STAFF, "{who} {open}{query}");
            }
        }
        let resumed = reader
            .request(reqwest::Method::GET, &server, "/connection/sse")
            .header("last-event-id", format!("{STAFF};*;0"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            status_and_code(resumed).await,
            (403, Some(1003)),
            "{who} Last-Event-ID"
        );

        // A stream opened without channels, then commands through its session.
        let mut stream = Lines::new(
            reader
                .request(reqwest::Method::GET, &server, "/connection/stream")
                .send()
                .await
                .unwrap(),
        );
        let session = stream.session().await;
        let body: String = commands()
            .into_iter()
            .enumerate()
            .map(|(id, (method, params))| {
                json!({ "id": id + 1, method: params }).to_string() + "\n"
            })
            .collect();
        let sent = reqwest::Client::new()
            .post(server.url(&format!("/connection/send?session={session}")))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 200, "{who}");
        for _ in commands() {
            let line = stream.next().await.unwrap();
            nothing_of_staff(&line, who);
            let line: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(line["error"]["code"], 1003, "{who} stream command: {line}");
        }
    }

    // Nothing the outsiders tried was published, and alice still reads all of it.
    let (_, history) = server
        .api_get(&format!("/api/history?channel={STAFF}"))
        .await;
    assert_eq!(offsets(&history), vec![1, 2], "{history}");
    for (method, params) in commands() {
        if method == "subscribe" || method == "publish" {
            continue;
        }
        let reply = alice_ws.call(method, params.clone()).await;
        assert!(reply.get("error").is_none(), "alice {method}: {reply}");
    }
    let stats = alice_ws
        .call("presence_stats", json!({ "channel": STAFF }))
        .await;
    assert_eq!(stats["presence_stats"]["clients"], 1, "{stats}");
    for open in HTTP_OPENS {
        let r = alice
            .request(
                reqwest::Method::GET,
                &server,
                &format!("{open}cursor={}", urlencode(&format!("{STAFF};*;0"))),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "alice {open}");
        let mut body = r.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("staff-secret-2") {
            let chunk = tokio::time::timeout(PATIENCE, body.next())
                .await
                .expect("alice's replay in time")
                .expect("more of alice's replay")
                .unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(seen.contains("staff-secret-1"), "alice {open}: {seen}");
    }
    let published = alice_ws
        .call(
            "publish",
            json!({ "channel": STAFF, "data": "staff-secret-3" }),
        )
        .await;
    assert_eq!(published["publish"]["offset"], 3, "{published}");
    server.stop().await.unwrap();
}
