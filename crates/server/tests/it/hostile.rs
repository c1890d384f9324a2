//! Issue #56: what one hostile client can make the server hold or do: on the Phoenix front,
//! its WebSocket and its long-poll fallback (`/socket/longpoll`), and on every WebSocket.

use std::{sync::Arc, time::Duration};

use futures_util::{SinkExt, StreamExt};
use herald_server::config::Config;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::{
    auth::{auth_config, claims, hs256, now},
    support::*,
};

/// A phoenix.js long-poll client, spoken by hand.
#[derive(Clone)]
pub(crate) struct LongPoll {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) token: String,
}

impl LongPoll {
    /// Opens a session (`connection`: the socket's `token` param).
    pub(crate) async fn open(server: &TestServer, connection: Option<&str>) -> Self {
        let http = reqwest::Client::new();
        let mut url = server.url("/socket/longpoll?vsn=2.0.0");
        if let Some(t) = connection {
            url.push_str(&format!("&token={t}"));
        }
        let opened: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        assert_eq!(opened["status"], 410, "{opened}");
        let token = opened["token"].as_str().unwrap().to_string();
        Self { http, url, token }
    }

    fn session_url(&self) -> String {
        format!("{}&token={}", self.url, self.token)
    }

    /// POSTs `lines`; the answer's status (in its body, as phoenix.js reads it).
    pub(crate) async fn post(&self, lines: &str) -> u64 {
        let r = self.http.post(self.session_url()).body(lines.to_string());
        let answer: Value = r.send().await.unwrap().json().await.unwrap();
        answer["status"].as_u64().unwrap()
    }

    /// One `GET`: its status and messages.
    pub(crate) async fn get(&self) -> (u64, Vec<Value>) {
        let r = self.http.get(self.session_url()).send().await.unwrap();
        let answer: Value = r.json().await.unwrap();
        let messages = answer["messages"].as_array().cloned().unwrap_or_default();
        let messages = messages
            .iter()
            .map(|m| serde_json::from_str(m.as_str().unwrap()).unwrap())
            .collect();
        (answer["status"].as_u64().unwrap(), messages)
    }
}

/// `n` heartbeats, one per line, with refs from `first`.
fn heartbeats(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!(r#"[null,"{i}","phoenix","heartbeat",{{}}]"#))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The status of a reply (`[join_ref, ref, topic, "phx_reply", {"status": …}]`).
pub(crate) fn reply_status(m: &Value) -> &str {
    assert_eq!(m[3], "phx_reply", "{m}");
    m[4]["status"].as_str().unwrap()
}

/// Item 1: one session's replies waiting for a `GET` are bounded in bytes. A client that
/// only POSTs (each 48 KiB of heartbeats here) made the server hold every reply: +1 GB in
/// 15 s from one connection. Now the `POST` that would pass `client.queue_max_bytes` ends
/// the session (410), and its token is gone.
#[tokio::test]
async fn replies_nobody_reads_end_a_long_poll_session_at_its_bound() {
    let mut c = config();
    c.client.max_commands_per_second = 0;
    c.client.queue_max_bytes = 64 * 1024;
    let server = start(c).await;
    let session = LongPoll::open(&server, None).await;
    let mut statuses = Vec::new();
    for round in 0..8 {
        let status = session.post(&heartbeats(round * 1000, 1000)).await;
        statuses.push(status);
        if status != 200 {
            break;
        }
    }
    // Each POST leaves about 60 KB of replies: the second passes 64 KiB.
    assert_eq!(statuses, [200, 410], "POST statuses");
    assert_eq!(session.get().await.0, 410, "the session is gone");
    // Others are unaffected: a new session works.
    let next = LongPoll::open(&server, None).await;
    assert_eq!(next.post(&heartbeats(0, 3)).await, 200);
    let (status, messages) = next.get().await;
    assert_eq!((status, messages.len()), (200, 3));
    server.stop().await.unwrap();
}

/// Item 1, per address: sessions of one address together hold at most
/// `limits.held_bytes_per_address` of replies; reading them gives the room back.
#[tokio::test]
async fn one_address_holds_at_most_its_share_of_waiting_replies() {
    let mut c = config();
    c.client.max_commands_per_second = 0;
    c.limits.held_bytes_per_address = 100 * 1024;
    let server = start(c).await;
    let first = LongPoll::open(&server, None).await;
    let second = LongPoll::open(&server, None).await;
    // About 60 KB of replies each: the first fits, the second would pass 100 KiB.
    assert_eq!(first.post(&heartbeats(0, 1000)).await, 200);
    assert_eq!(second.post(&heartbeats(0, 1000)).await, 410);
    let (status, messages) = first.get().await;
    assert_eq!((status, messages.len()), (200, 1000));
    // Read: the address holds nothing now, and another session has room.
    let third = LongPoll::open(&server, None).await;
    assert_eq!(third.post(&heartbeats(0, 1000)).await, 200);
    server.stop().await.unwrap();
}

/// Item 1: only reading keeps a session. A client that POSTs every few hundred
/// milliseconds and never GETs kept its session (and what it held) forever; now it is
/// dropped once no GET asked for `longpoll_grace` plus the long-poll timeout.
#[tokio::test]
async fn posts_alone_do_not_keep_a_long_poll_session() {
    let mut c = config();
    c.http.longpoll_grace = Duration::ZERO;
    c.http.longpoll_timeout = Duration::from_millis(100);
    let server = start(c).await;
    let session = LongPoll::open(&server, None).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for i in 0.. {
        if session.post(&heartbeats(i, 1)).await == 410 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a session only POSTed to was kept"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    server.stop().await.unwrap();
}

/// Item 3: the Phoenix front charges every message to the connection's command allowance
/// (`client.max_commands_per_second`, bursts of twice it), as Herald's own protocol and the
/// Pusher front do. One socket had 5,000 heartbeats answered in a burst and stored 20,000
/// publications a second.
#[tokio::test]
async fn phoenix_messages_are_charged_to_the_command_allowance() {
    let mut c = config();
    c.client.max_commands_per_second = 10;
    let server = start(c).await;
    let url = format!("ws://{}/socket/websocket?vsn=2.0.0", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    ws.send(Message::text(r#"["1","1","open:x","phx_join",{}]"#))
        .await
        .unwrap();
    let mut sent = 1;
    for i in 0..100 {
        let m = format!(r#"["1","e{i}","open:x","shout",{{"n":{i}}}]"#);
        ws.send(Message::text(m)).await.unwrap();
        sent += 1;
    }
    let (mut ok, mut refused) = (0, 0);
    while ok + refused < sent {
        let m = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
        let m: Value = serde_json::from_str(m.unwrap().unwrap().to_text().unwrap()).unwrap();
        if m[3] != "phx_reply" {
            continue;
        }
        match reply_status(&m) {
            "ok" => ok += 1,
            _ => {
                assert_eq!(m[4]["response"]["code"], 111, "{m}");
                refused += 1;
            }
        }
    }
    // The burst (20) and what a second refills while they arrive, not 101.
    assert!(ok <= 25, "{ok} answered, {refused} refused");
    assert!(refused >= 75, "{ok} answered, {refused} refused");
    let (_, info) = server.api_get("/api/history?channel=open:x&limit=0").await;
    let stored = info["offset"].as_u64().unwrap_or(0);
    assert!(stored < 25, "{stored} publications stored: {info}");

    // The same on long-poll lines.
    let session = LongPoll::open(&server, None).await;
    assert_eq!(session.post(&heartbeats(0, 100)).await, 200);
    let (_, replies) = session.get().await;
    let ok = replies.iter().filter(|m| reply_status(m) == "ok").count();
    assert_eq!(replies.len(), 100);
    assert!(ok <= 25, "{ok} of 100 long-poll heartbeats answered");
    server.stop().await.unwrap();
}

/// A long-poll session holds a few commands waiting for it (`queue::MAX_COMMANDS`, 4),
/// as a WebSocket's reader holds its socket: a `POST` past them is answered 429 at once
/// ("too many messages at once") rather than queued without bound, and nothing of it is
/// obeyed; every accepted message is obeyed and answered once, and the session goes on.
#[tokio::test]
async fn posts_past_the_commands_a_session_holds_are_refused_with_429() {
    use crate::hooks::{application, hooked_config, Answer, Backend};
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let backend = Backend::start(move |path, body| match path {
        // The join whose hook waits at the gate keeps the session busy.
        "/subscribe" if body["channel"] == "room:slow" => {
            Answer::Gated(held.clone(), json!({ "result": {} }))
        }
        "/connect" => Answer::Json(json!({ "result": { "user": "poller" } })),
        _ => application(path, body),
    })
    .await;
    let mut c = hooked_config(&backend);
    c.hooks.timeout = Duration::from_secs(60);
    c.http.longpoll_timeout = Duration::from_secs(2);
    let server = start(c).await;
    let session = LongPoll::open(&server, None).await;
    let join = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .post(r#"["1","join","room:slow","phx_join",{}]"#)
                .await
        })
    };
    eventually("the join's hook is asked", || async {
        backend.requests("/subscribe").len() == 1
    })
    .await;

    // More POSTs than the session holds, all at once, while it is busy.
    let mut posts: futures_util::stream::FuturesUnordered<_> = (0..6)
        .map(|i| {
            let session = session.clone();
            async move {
                let line = format!(r#"[null,"hb{i}","phoenix","heartbeat",{{}}]"#);
                (i, session.post(&line).await)
            }
        })
        .collect();
    let (_, first) = tokio::time::timeout(PATIENCE, posts.next())
        .await
        .expect("a POST past what the session holds is answered at once")
        .unwrap();
    assert_eq!(
        first, 429,
        "refused at once; the accepted wait for the session"
    );
    gate.add_permits(1);
    let (mut accepted, mut refused) = (Vec::new(), 1);
    while let Some((i, status)) = posts.next().await {
        match status {
            200 => accepted.push(format!("hb{i}")),
            429 => refused += 1,
            other => panic!("POST answered {other}"),
        }
    }
    assert_eq!(join.await.unwrap(), 200);
    assert!(accepted.len() <= 4, "at most 4 held: {accepted:?}");

    // Every accepted message answered once, the join first; nothing refused obeyed.
    let mut replies: Vec<String> = Vec::new();
    loop {
        let (status, got) = session.get().await;
        if status == 204 {
            // The hold ran out with nothing more to say: the session is still there.
            assert!(got.is_empty());
            break;
        }
        assert_eq!(status, 200, "the session goes on");
        for m in got {
            assert_eq!(reply_status(&m), "ok", "{m}");
            replies.push(m[1].as_str().unwrap().to_owned());
        }
    }
    let mut expected = vec!["join".to_owned()];
    expected.extend(accepted.iter().cloned());
    let mut sorted = replies.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "{refused} refused; replies {replies:?}");
    assert_eq!(replies[0], "join", "in the order obeyed");
    server.stop().await.unwrap();
}

/// Item 4: a long-poll session ends at its connection token's expiry as the WebSocket
/// does (3504): it received a publication 8 s after `exp`.
#[tokio::test]
async fn a_long_poll_session_ends_when_its_token_expires() {
    let mut c: Config = auth_config();
    c.namespaces.get_mut("private").unwrap().publish = Some(Access::Anyone);
    let server = start(c).await;
    let exp = now() + 2;
    let token = hs256(&claims(
        "42",
        json!({ "exp": exp, "subscribe": ["private:*"] }),
    ));
    let session = LongPoll::open(&server, Some(&token)).await;
    assert_eq!(
        session.post(r#"["1","1","private:a","phx_join",{}]"#).await,
        200
    );
    let (status, joined) = session.get().await;
    assert_eq!((status, reply_status(&joined[0])), (200, "ok"));
    // While the token is valid, publications arrive.
    server.publish("private:a", json!("before")).await;
    let (status, got) = session.get().await;
    assert_eq!((status, got.len()), (200, 1), "{got:?}");
    // After `exp` (leeway 0), the session's next answer ends it; nothing more is sent.
    while now() <= exp {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.publish("private:a", json!("after")).await;
    let (status, got) = session.get().await;
    assert_eq!(status, 410, "{got:?}");
    server.stop().await.unwrap();
}

/// Item 1 (fragments): a fragmented message must be finished within `http.body_timeout`
/// of its first frame. 900 unfinished compressed messages held +119 MB until the idle
/// timeout, and a client that answers pings held them for as long as it liked. Here the
/// client answers every ping (tungstenite does) and never sends the last fragment.
#[tokio::test]
async fn an_unfinished_fragmented_message_closes_its_connection_in_time() {
    use tokio_tungstenite::tungstenite::protocol::frame::{coding::Data, coding::OpCode, Frame};
    let mut c = config();
    c.http.body_timeout = Duration::from_millis(500);
    c.client.ping_interval = Duration::from_millis(100);
    let server = start(c).await;
    let url = format!("ws://{}/connection/websocket", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let first = Frame::message(vec![b' '; 1000], OpCode::Data(Data::Text), false);
    ws.send(Message::Frame(first)).await.unwrap();
    let closed = tokio::time::timeout(PATIENCE, async {
        while let Some(m) = ws.next().await {
            if let Ok(Message::Close(close)) = m {
                return close;
            }
        }
        None
    })
    .await
    .expect("closed before the idle timeout");
    let close = closed.expect("a close frame");
    assert!(
        close.reason.contains("not finished"),
        "{}: {}",
        u16::from(close.code),
        close.reason
    );
    server.stop().await.unwrap();
}
