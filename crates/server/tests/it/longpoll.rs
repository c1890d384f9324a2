//! Long-poll sessions kept between requests (`session_key`): a re-poll takes up its parked
//! session with what queued meanwhile; anything that does not continue it exactly starts
//! afresh from its cursor, and nothing is lost either way.

use std::time::Duration;

use herald_server::config::NamespaceOverride;
use serde_json::{json, Value};

use crate::{
    http::{offsets_of, urlencode},
    support::*,
};

fn offsets(answer: &Value) -> Vec<u64> {
    offsets_of(&answer["messages"])
}

async fn get(server: &TestServer, path: &str) -> Value {
    let (status, answer) = response(reqwest::get(server.url(path)).await.unwrap()).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

fn text<'a>(answer: &'a Value, field: &str) -> &'a str {
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
