//! Long-poll sessions kept between requests (`session_key`): a re-poll takes up its parked
//! session with what queued meanwhile; anything that does not continue it exactly starts
//! afresh from its cursor, and nothing is lost either way.

use std::time::Duration;

use herald_server::config::NamespaceOverride;
use serde_json::{json, Value};

use crate::{
    http::{offsets_of, raw_answer, urlencode},
    support::*,
};

pub(crate) fn offsets(answer: &Value) -> Vec<u64> {
    offsets_of(&answer["messages"])
}

async fn get(server: &TestServer, path: &str) -> Value {
    let (status, answer) = response(reqwest::get(server.url(path)).await.unwrap()).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

pub(crate) fn text<'a>(answer: &'a Value, field: &str) -> &'a str {
    answer[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {answer}"))
}

#[tokio::test]
async fn a_re_poll_takes_up_its_parked_session_with_what_queued_meanwhile() {
    let mut c = config();
    // A channel that keeps no history: what it publishes between two polls reaches the
    // poller only if its session stayed subscribed.
    c.namespaces.insert(
        "live".into(),
        NamespaceOverride {
            publish: Some(Access::Anyone),
            history_size: Some(0),
            ..Default::default()
        },
    );
    let server = start(c).await;
    let first = get(
        &server,
        "/connection/longpoll?channel=live:prices&timeout=100ms&session_key=",
    )
    .await;
    let key = text(&first, "session_key").to_string();
    assert!(
        key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{first}"
    );
    assert_eq!(server.node.metrics.longpolls_kept.get(), 1);
    assert!(server
        .metrics()
        .await
        .contains("herald_longpoll_sessions_kept 1"));
    assert_eq!(server.node.hub.channel_count(), 1, "still subscribed");

    // Published while no request is held.
    for i in 1..=3 {
        server.publish("live:prices", json!(i)).await;
    }
    let cursor = urlencode(text(&first, "cursor"));
    let again = get(
        &server,
        &format!("/connection/longpoll?channel=live:prices&cursor={cursor}&session_key={key}"),
    )
    .await;
    assert_eq!(offsets(&again), [1, 2, 3], "{again}");
    assert_eq!(again["client"], first["client"], "the same session");
    assert_eq!(again["session_key"], first["session_key"]);

    // Held, then woken, on the same session.
    let cursor = urlencode(text(&again, "cursor"));
    let held = tokio::spawn({
        let url = server.url(&format!(
            "/connection/longpoll?cursor={cursor}&session_key={key}&timeout=10"
        ));
        async move { response(reqwest::get(url).await.unwrap()).await }
    });
    eventually("the re-poll took its session up", || async {
        server.node.metrics.longpolls_kept.get() == 0
    })
    .await;
    server.publish("live:prices", json!(4)).await;
    let (_, woke) = held.await.unwrap();
    assert_eq!(offsets(&woke), [4], "{woke}");
    assert_eq!(woke["client"], first["client"]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn only_the_same_credentials_from_the_same_position_take_a_parked_session_up() {
    let server = start(config()).await;
    let (_, epoch) = server.publish("open:a", json!(1)).await;
    let first = get(
        &server,
        &format!(
            "/connection/longpoll?cursor={}&client=me&timeout=100ms&session_key=",
            urlencode(&format!("open:a;{epoch};1"))
        ),
    )
    .await;
    let key = text(&first, "session_key").to_string();
    let cursor = text(&first, "cursor").to_string();

    // Someone else's client id with the key: a session of its own, and the parked one is
    // gone (the key is spent).
    let stolen = get(
        &server,
        &format!(
            "/connection/poll?cursor={}&client=someone-else&session_key={key}",
            urlencode(&cursor)
        ),
    )
    .await;
    assert_ne!(stolen["session_key"], first["session_key"], "{stolen}");
    assert_ne!(stolen["client"], first["client"]);

    // A lost answer: the client asks again from before it. The parked session is past that
    // position, so the request starts afresh from its cursor, and replays what it missed.
    let key = text(&stolen, "session_key").to_string();
    server.publish("open:a", json!(2)).await;
    let ahead = get(
        &server,
        &format!(
            "/connection/poll?cursor={}&client=someone-else&session_key={key}",
            urlencode(&cursor)
        ),
    )
    .await;
    assert_eq!(offsets(&ahead), [2], "{ahead}");
    let key = text(&ahead, "session_key").to_string();
    let lost = get(
        &server,
        &format!(
            "/connection/poll?cursor={}&client=someone-else&session_key={key}",
            urlencode(&cursor)
        ),
    )
    .await;
    assert_eq!(offsets(&lost), [2], "replayed from its cursor: {lost}");
    assert_ne!(lost["session_key"], ahead["session_key"]);

    // A key no one was given: a new session, with a new key.
    let made_up = get(
        &server,
        &format!(
            "/connection/poll?cursor={}&session_key={}",
            urlencode(&cursor),
            "0".repeat(32)
        ),
    )
    .await;
    assert_eq!(offsets(&made_up), [2]);
    assert_ne!(text(&made_up, "session_key"), "0".repeat(32));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_parked_session_ends_after_its_grace_and_polls_without_a_key_park_nothing() {
    let mut c = config();
    c.http.longpoll_grace = Duration::from_millis(500);
    let server = start(c).await;
    let plain = get(&server, "/connection/poll?channel=open:b").await;
    assert!(plain.get("session_key").is_none(), "{plain}");
    assert!(server.node.metrics.longpolls_kept.get() == 0);
    eventually("the plain poll's session is gone", || async {
        server.node.connection_count() == 0 && server.node.hub.channel_count() == 0
    })
    .await;

    let parked = get(&server, "/connection/poll?channel=open:b&session_key=").await;
    assert!(parked["session_key"].is_string(), "{parked}");
    assert_eq!(server.node.metrics.longpolls_kept.get(), 1);
    assert_eq!(server.node.connection_count(), 1);
    eventually("the parked session ends after its grace", || async {
        server.node.metrics.longpolls_kept.get() == 0
            && server.node.connection_count() == 0
            && server.node.hub.channel_count() == 0
    })
    .await;

    // Its key now names nothing: the request starts afresh, and is answered.
    let key = text(&parked, "session_key");
    let after = get(
        &server,
        &format!("/connection/poll?channel=open:b&session_key={key}"),
    )
    .await;
    assert_ne!(after["session_key"], parked["session_key"]);
    server.stop().await.unwrap();
}

/// Kept sessions count as their address's connections (`limits.connections_per_address`):
/// an address cannot keep more sessions than it may hold connections, a request that takes
/// up its own kept session is not a new connection, and what was kept is freed after the
/// grace.
#[tokio::test]
async fn kept_sessions_count_as_their_address_connections_until_the_grace_ends() {
    let mut c = config();
    c.limits.connections_per_address = 3;
    c.http.longpoll_grace = Duration::from_millis(500);
    let server = start(c).await;
    // One client: one kept-alive socket, so only the sessions count.
    let http = reqwest::Client::new();
    let poll = |query: String| {
        let request = http.get(server.url(&format!("/connection/poll?{query}")));
        async move { response(request.send().await.unwrap()).await }
    };
    let mut kept = Vec::new();
    for _ in 0..3 {
        let (status, answer) = poll("channel=open:k&session_key=".into()).await;
        assert_eq!(status, 200, "{answer}");
        kept.push(answer);
    }
    assert_eq!(server.node.metrics.longpolls_kept.get(), 3);
    let (status, refused) = poll("channel=open:k&session_key=".into()).await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (503, &json!(106)),
        "{refused}"
    );
    // Taking up a kept session is no new connection: allowed at the limit.
    let first = &kept[0];
    let (status, again) = poll(format!(
        "cursor={}&session_key={}",
        urlencode(text(first, "cursor")),
        text(first, "session_key")
    ))
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["client"], first["client"]);
    eventually("the kept sessions are freed after the grace", || async {
        server.node.metrics.longpolls_kept.get() == 0 && server.node.connection_count() == 0
    })
    .await;
    let (status, answer) = poll("channel=open:k&session_key=".into()).await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await.unwrap();
}

/// The head of `request` for `path`, from `origin` (if any), on `host`.
pub(crate) fn head(host: &str, path: &str, origin: Option<&str>) -> String {
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{origin}\r\n")
}

/// An answer's headers that say what it is, not how it was framed.
pub(crate) fn meaning(head: &str) -> Vec<String> {
    let mut lines: Vec<String> = head
        .lines()
        .skip(1)
        .filter(|l| {
            ![
                "date:",
                "content-length:",
                "connection:",
                "transfer-encoding:",
            ]
            .iter()
            .any(|framing| l.starts_with(framing))
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Parks a session over `s` and takes it up with a second long-poll: that answer's head.
async fn taken_up(s: &mut tokio::net::TcpStream, host: &str, origin: Option<&str>) -> String {
    let first = "/connection/longpoll?channel=open:cors&timeout=20ms&session_key=";
    let (status, body) = raw_answer(s, &head(host, first, origin)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}\n{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    let again = format!(
        "/connection/longpoll?cursor={}&timeout=20ms&session_key={}",
        urlencode(text(&first, "cursor")),
        text(&first, "session_key")
    );
    let (answer, body) = raw_answer(s, &head(host, &again, origin)).await;
    assert!(answer.starts_with("http/1.1 200"), "{answer}\n{body}");
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(again["client"], first["client"], "taken up: {again}");
    answer
}

/// A long-poll held until its timeout (from a cursor, with nothing new): that answer's head.
async fn held(s: &mut tokio::net::TcpStream, host: &str, origin: Option<&str>) -> String {
    let (status, body) =
        raw_answer(s, &head(host, "/connection/poll?channel=open:cors", origin)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}\n{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    let wait = format!(
        "/connection/longpoll?cursor={}&timeout=20ms",
        urlencode(text(&first, "cursor"))
    );
    let (answer, body) = raw_answer(s, &head(host, &wait, origin)).await;
    assert!(answer.starts_with("http/1.1 200"), "{answer}\n{body}");
    let waited: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(waited["messages"], serde_json::json!([]), "held: {waited}");
    answer
}

/// A long-poll that takes up its session on the lean path is answered without the router
/// (`poll::Resumer`), and one held on the lean path is answered after the router let go of
/// it: both must be answered as the router answers them, with the same headers, CORS
/// included, as on a connection hyper serves (whose requests all go through the router),
/// from no origin, the same origin, a listed one and one that is not.
#[tokio::test]
async fn a_taken_up_long_poll_is_answered_as_the_router_answers_it() {
    use tokio::net::TcpStream;
    for allowed in [vec!["https://app.example".to_string()], vec!["*".into()]] {
        let mut c = config();
        c.allowed_origins = allowed.clone();
        let server = start(c).await;
        let host = server.addr.to_string();
        let same = format!("http://{host}");
        for origin in [None, Some(same.as_str()), Some("https://app.example")] {
            let [direct, via_router] = &server.node.metrics.longpolls_taken_up;
            let before = (direct.get(), via_router.get());
            // The long-poll is this connection's first request: the lean path serves it.
            let mut lean = TcpStream::connect(server.addr).await.unwrap();
            let lean = [
                taken_up(&mut lean, &host, origin).await,
                held(&mut lean, &host, origin).await,
            ];
            assert_eq!((direct.get(), via_router.get()), (before.0 + 1, before.1));
            // A connection whose first request is not held stays with hyper.
            let mut routed = TcpStream::connect(server.addr).await.unwrap();
            let (status, _) = raw_answer(&mut routed, &head(&host, "/healthz", None)).await;
            assert!(status.starts_with("http/1.1 200"), "{status}");
            let routed = [
                taken_up(&mut routed, &host, origin).await,
                held(&mut routed, &host, origin).await,
            ];
            assert_eq!(
                (direct.get(), via_router.get()),
                (before.0 + 1, before.1 + 1)
            );
            for (lean, routed) in lean.iter().zip(&routed) {
                assert_eq!(
                    meaning(lean),
                    meaning(routed),
                    "allowed {allowed:?}, origin {origin:?}:\n{lean}\n---\n{routed}"
                );
                if origin == Some("https://app.example") {
                    assert!(lean.contains("access-control-allow-origin: "), "{lean}");
                }
            }
        }
        server.stop().await.unwrap();
    }
}

/// Taking a session up without the router asks what the router asks: a request from an
/// origin or for a host name that is not allowed is refused as always, and the session
/// stays parked for its client.
#[tokio::test]
async fn a_parked_session_is_not_taken_up_from_a_refused_origin_or_host() {
    let server = start(config()).await;
    let host = server.addr.to_string();
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let first = "/connection/longpoll?channel=open:guarded&timeout=20ms&session_key=";
    let (_, body) = raw_answer(&mut s, &head(&host, first, None)).await;
    let first: Value = serde_json::from_str(&body).unwrap();
    let again = format!(
        "/connection/longpoll?cursor={}&timeout=20ms&session_key={}",
        urlencode(text(&first, "cursor")),
        text(&first, "session_key")
    );
    for (name, request) in [
        (
            "a refused origin",
            head(&host, &again, Some("https://evil.example")),
        ),
        ("a refused host", head("evil.example", &again, None)),
    ] {
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let (status, body) = raw_answer(&mut s, &request).await;
        assert!(
            status.starts_with("http/1.1 403"),
            "{name}: {status}\n{body}"
        );
        assert_eq!(server.node.metrics.longpolls_kept.get(), 1, "{name}");
    }
    let (status, body) = raw_answer(&mut s, &head(&host, &again, None)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(again["client"], first["client"], "taken up: {again}");
    server.stop().await.unwrap();
}

/// A parked session is taken up without the router only by an exact continuation (the
/// answer's cursor as it was written); any other request is judged as before: the same
/// positions written another way still take it up, a lost answer starts afresh.
#[tokio::test]
async fn only_an_exact_continuation_is_taken_up_directly() {
    let server = start(config()).await;
    let host = server.addr.to_string();
    server.publish("open:a", json!(1)).await;
    server.publish("open:b", json!(1)).await;
    let [direct, routed] = &server.node.metrics.longpolls_taken_up;
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut poll = async |path: &str| -> Value {
        let (status, body) = raw_answer(&mut s, &head(&host, path, None)).await;
        assert!(status.starts_with("http/1.1 200"), "{status}\n{body}");
        serde_json::from_str(&body).unwrap()
    };
    let again = |cursor: &str, key: &Value| {
        format!(
            "/connection/longpoll?cursor={}&timeout=20ms&session_key={}",
            urlencode(cursor),
            key.as_str().unwrap()
        )
    };
    let first =
        poll("/connection/longpoll?channel=open:a&channel=open:b&timeout=20ms&session_key=").await;
    let exact = poll(&again(text(&first, "cursor"), &first["session_key"])).await;
    assert_eq!(exact["client"], first["client"], "{exact}");
    assert_eq!((direct.get(), routed.get()), (1, 0));

    let cursor = text(&exact, "cursor");
    let reordered: Vec<&str> = cursor.split('|').rev().collect();
    assert_eq!(reordered.len(), 2, "{cursor}");
    let other_order = poll(&again(&reordered.join("|"), &exact["session_key"])).await;
    assert_eq!(other_order["client"], first["client"], "{other_order}");
    assert_eq!((direct.get(), routed.get()), (1, 1));

    server.publish("open:a", json!(2)).await;
    let ahead = poll(&again(
        text(&other_order, "cursor"),
        &other_order["session_key"],
    ))
    .await;
    assert_eq!(offsets(&ahead), [2], "{ahead}");
    assert_eq!((direct.get(), routed.get()), (2, 1));
    // The answer was lost: the client asks from before it, and is replayed what it missed.
    let lost = poll(&again(text(&other_order, "cursor"), &ahead["session_key"])).await;
    assert_eq!(offsets(&lost), [2], "{lost}");
    assert_ne!(lost["client"], first["client"], "started afresh: {lost}");
    assert_eq!((direct.get(), routed.get()), (2, 1));
    server.stop().await.unwrap();
}
