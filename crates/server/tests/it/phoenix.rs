//! The Phoenix front says what ends a topic in Phoenix's words, on its WebSocket and its
//! long-poll alike (one expiry path: `Speaker::expire`).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::{
    auth::{auth_config, claims, hs256, now},
    hostile::{reply_status, LongPoll},
    support::*,
};

/// A connection token for user 42 (valid 10 minutes), and a subscription token for
/// `private:a` that expires in 2 s.
fn tokens() -> (String, String, u64) {
    let connection = hs256(&claims("42", json!({})));
    let exp = now() + 2;
    let subscription = hs256(&claims("42", json!({ "channel": "private:a", "exp": exp })));
    (connection, subscription, exp)
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next message, which must be a Phoenix message.
async fn next(ws: &mut Socket) -> Value {
    let m = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
    let m: Value = serde_json::from_str(m.unwrap().unwrap().to_text().unwrap()).unwrap();
    assert!(m.is_array(), "not a Phoenix message: {m}");
    m
}

/// A subscription token that expires ends its topic with `phx_error` (with the join's
/// ref), as Phoenix tells a channel that crashed (phoenix.js rejoins it). The WebSocket was sent Herald's own
/// `{"unsubscribe": …}`, which phoenix.js cannot read; the long-poll was told nothing.
#[tokio::test]
async fn an_expired_subscription_token_errors_its_topic_on_both_transports() {
    let server = start(auth_config()).await;
    let (connection, subscription, exp) = tokens();
    let join =
        |r: &str| json!(["1", r, "private:a", "phx_join", { "token": subscription }]).to_string();

    // The WebSocket.
    let url = format!(
        "ws://{}/socket/websocket?vsn=2.0.0&token={connection}",
        server.addr
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    ws.send(Message::text(join("1"))).await.unwrap();
    assert_eq!(reply_status(&next(&mut ws).await), "ok");
    let error = next(&mut ws).await;
    assert!(now() > exp, "told before the token expired: {error}");
    assert_eq!(error, json!(["1", "1", "private:a", "phx_error", {}]));
    // Its rejoin, with the same token, is refused: it may no longer read the topic.
    ws.send(Message::text(join("2"))).await.unwrap();
    assert_eq!(reply_status(&next(&mut ws).await), "error");

    // The long-poll.
    let (connection, subscription, exp) = tokens();
    let session = LongPoll::open(&server, Some(&connection)).await;
    let join = json!(["1", "1", "private:a", "phx_join", { "token": subscription }]);
    assert_eq!(session.post(&join.to_string()).await, 200);
    let (status, joined) = session.get().await;
    assert_eq!((status, reply_status(&joined[0])), (200, "ok"));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let error = loop {
        let (status, got) = session.get().await;
        assert!(status == 200 || status == 204, "{status}: {got:?}");
        if let Some(m) = got.into_iter().next() {
            break m;
        }
        // Each `GET` waits for something to say: a 204 is its hold ending.
        assert!(tokio::time::Instant::now() < deadline, "never told");
    };
    assert!(now() > exp, "told before the token expired: {error}");
    assert_eq!(error, json!(["1", "1", "private:a", "phx_error", {}]));
    server.stop().await.unwrap();
}

/// Phoenix long-poll sessions wait in the node's one store, beside Herald's parked
/// long-polls: counted in the same gauge, and neither transport finds the other's under
/// its key (a Phoenix token sent as a Herald `session_key` starts a new Herald session
/// and leaves the Phoenix one as it was).
#[tokio::test]
async fn phoenix_and_herald_long_polls_share_one_store_and_keep_to_their_own() {
    let server = start(config()).await;
    let phoenix = LongPoll::open(&server, None).await;
    assert_eq!(server.node.metrics.longpolls_kept.get(), 1);
    let join = r#"["1","1","open:x","phx_join",{}]"#;
    assert_eq!(phoenix.post(join).await, 200);

    let url = server.url(&format!(
        "/connection/longpoll?channel=open:y&timeout=100ms&session_key={}",
        phoenix.token
    ));
    let herald: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    let key = herald["session_key"].as_str().unwrap();
    assert_ne!(key, phoenix.token, "{herald}");
    assert_eq!(server.node.metrics.longpolls_kept.get(), 2);

    // The Phoenix session is there, with its reply; Herald's key is nothing to Phoenix.
    let (status, replies) = phoenix.get().await;
    assert_eq!((status, reply_status(&replies[0])), (200, "ok"));
    let wrong = LongPoll {
        token: key.to_string(),
        ..phoenix
    };
    assert_eq!(wrong.get().await.0, 410);
    assert_eq!(server.node.metrics.longpolls_kept.get(), 2);
    server.stop().await.unwrap();
}

/// A join of a topic already joined under another `join_ref` closes the old join with
/// `phx_close` (its own ref) and joins afresh, as Phoenix does; the same join asked again
/// goes on. The old join was kept, and its presence beside the new one's.
#[tokio::test]
async fn a_new_join_of_a_joined_topic_closes_the_old_one() {
    let server = start(config()).await;
    let url = format!("ws://{}/socket/websocket?vsn=2.0.0", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let join = |join_ref: &str, r: &str| json!([join_ref, r, "open:x", "phx_join", {}]).to_string();
    ws.send(Message::text(join("1", "1"))).await.unwrap();
    assert_eq!(reply_status(&next(&mut ws).await), "ok");
    ws.send(Message::text(join("1", "2"))).await.unwrap();
    let again = next(&mut ws).await;
    assert_eq!((again[1].as_str(), reply_status(&again)), (Some("2"), "ok"));
    ws.send(Message::text(join("3", "3"))).await.unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!(["1", "1", "open:x", "phx_close", {}])
    );
    let joined = next(&mut ws).await;
    assert_eq!(
        (joined[0].as_str(), reply_status(&joined)),
        (Some("3"), "ok")
    );
    // Subscribed once: one broadcast per publication.
    server.publish("open:x", json!({ "n": 1 })).await;
    server.publish("open:x", json!({ "n": 2 })).await;
    let (first, second) = (next(&mut ws).await, next(&mut ws).await);
    assert_eq!((&first[4]["n"], &second[4]["n"]), (&json!(1), &json!(2)));
    server.stop().await.unwrap();
}

/// An `authToken` subprotocol entry that is not base64 is refused at the upgrade (400),
/// not taken for no token.
#[tokio::test]
async fn a_malformed_auth_token_is_refused_at_the_upgrade() {
    let server = start(config()).await;
    let url = format!("ws://{}/socket/websocket?vsn=2.0.0", server.addr);
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "phoenix, base64url.bearer.phx.!!!".parse().unwrap(),
    );
    let refused = tokio_tungstenite::connect_async(request).await.unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else {
        panic!("not refused over HTTP: {refused}");
    };
    assert_eq!(response.status(), 400);
    server.stop().await.unwrap();
}

/// A `POST` while a `GET` is held: the held `GET` obeys its messages (they are commands
/// for the session it holds) and answers with their replies at once, not at the end of
/// its hold; a `POST` with no `GET` waiting obeys them itself, and the next `GET` answers
/// with them at once. Either way each reply comes once, and the `POST` is answered 200.
#[tokio::test]
async fn a_post_is_answered_in_the_get_that_holds_its_session_at_once() {
    let mut c = config();
    c.http.longpoll_timeout = Duration::from_secs(20);
    let server = start(c).await;
    let phoenix = LongPoll::open(&server, None).await;
    assert_eq!(
        phoenix.post(r#"["1","1","open:x","phx_join",{}]"#).await,
        200
    );
    let (_, joined) = phoenix.get().await;
    assert_eq!(reply_status(&joined[0]), "ok");
    for round in 0..5 {
        let started = std::time::Instant::now();
        let held = {
            let phoenix = phoenix.clone();
            tokio::spawn(async move { phoenix.get().await })
        };
        let line = format!(r#"[null,"hb{round}","phoenix","heartbeat",{{}}]"#);
        assert_eq!(phoenix.post(&line).await, 200);
        let (status, got) = held.await.unwrap();
        assert_eq!((status, got.len()), (200, 1), "round {round}: {got:?}");
        assert_eq!(got[0][1], format!("hb{round}"), "{got:?}");
        assert_eq!(reply_status(&got[0]), "ok");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "held to its end"
        );
    }
    server.stop().await.unwrap();
}
