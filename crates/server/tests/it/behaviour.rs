//! The same behaviours over every transport (issue #30, section 1): what a client sees, and
//! what operators count, when it stops reading or when the server shuts down, row by row.
//! A transport that differs is a bug this table finds. Where a row cannot apply (a poll is
//! one request: there is nothing to stop reading from between requests), it says so.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// The transports that hold a connection open.
const HELD: [&str; 4] = ["websocket", "sse", "stream", "iframe"];

/// The request that opens `transport` on `channel`, as a raw HTTP/1.1 head.
fn opening(transport: &str, channel: &str, host: std::net::SocketAddr) -> String {
    let path = match transport {
        "websocket" => "/connection/websocket".to_string(),
        "iframe" => format!("/connection/iframe?channel={channel}&callback=h"),
        other => format!("/connection/{other}?channel={channel}"),
    };
    let upgrade = if transport == "websocket" {
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    } else {
        ""
    };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{upgrade}\r\n")
}

/// A WebSocket text frame from the client (masked, as clients must).
fn client_frame(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    assert!(bytes.len() < 126);
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | bytes.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(bytes.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// Row 1: a client that stops reading is cut as a slow consumer, 3003, on every transport
/// that holds a connection, when its writes have waited `client.write_timeout` (its queue
/// is large enough here that the write timeout, not the queue, cuts it). Operators count it
/// as a 3003 disconnect and a slow-consumer cut. (Polls: their answer is written after
/// their session ended; an unread one is reset at the same deadline, see
/// `errors::an_answer_nobody_reads_is_dropped_at_the_write_deadline`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_as_slow_on_every_transport() {
    for transport in HELD {
        let mut cfg = config();
        cfg.client.write_timeout = Duration::from_millis(300);
        cfg.client.queue_max_bytes = 256 << 20;
        cfg.http.iframe_max_bytes = 256 << 20;
        let server = start(cfg).await;
        let channel = format!("open:slow-{transport}");
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(server.addr).await.unwrap();
        s.write_all(opening(transport, &channel, server.addr).as_bytes())
            .await
            .unwrap();
        if transport == "websocket" {
            let subscribe = json!({ "id": 1, "subscribe": { "channel": channel } }).to_string();
            s.write_all(&client_frame(&subscribe)).await.unwrap();
        }
        eventually("the client is subscribed", || async {
            server.node.hub.subscriber_count(&channel.parse().unwrap()) == 1
        })
        .await;
        // Several megabytes: more than the socket buffers take, far less than the queue.
        let payload = "s".repeat(60 * 1024);
        for _ in 0..150 {
            server.publish(&channel, json!(payload)).await;
            if server.node.connection_count() == 0 {
                break;
            }
        }
        eventually(&format!("{transport}: the client is cut"), || async {
            server.node.connection_count() == 0
        })
        .await;
        let metrics = server.metrics().await;
        assert!(
            metrics.contains("herald_disconnects_total{code=\"3003\"} 1\n")
                && metrics.contains("herald_slow_consumer_cuts_total 1\n"),
            "{transport}: not counted as a slow consumer:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("disconnects_total") || l.contains("slow"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        drop(s);
        server.stop().await.unwrap();
    }
}

/// Opens SSE, stream, forever frame and two held long-polls with `query` (channels and
/// token), each on a socket of its own, waiting until the server holds each (`before`
/// connections are open already). A long-poll's first request answers at once with the
/// subscription; the one held is the next, with its cursor (and the same token). The
/// second long-poll keeps its session between requests (`session_key`), so the hub may
/// answer it itself (`transport::poll::lane`); the first is answered by its task.
async fn hold_open(
    server: &TestServer,
    query: &str,
    before: usize,
) -> Vec<(&'static str, tokio::net::TcpStream)> {
    let addr = server.addr;
    let mut held = Vec::new();
    for (i, transport) in ["sse", "stream", "iframe", "longpoll", "longpoll+key"]
        .into_iter()
        .enumerate()
    {
        let kept = transport == "longpoll+key";
        let path = match transport {
            "longpoll" | "longpoll+key" => {
                let key = if kept { "&session_key=" } else { "" };
                let first: serde_json::Value =
                    reqwest::get(server.url(&format!("/connection/longpoll?{query}{key}")))
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                let cursor = crate::http::urlencode(first["cursor"].as_str().unwrap());
                let token = query.split('&').find(|p| p.starts_with("token="));
                let key = first["session_key"]
                    .as_str()
                    .map_or(String::new(), |k| format!("&session_key={k}"));
                format!(
                    "longpoll?cursor={cursor}&timeout=60{key}&{}",
                    token.unwrap_or("")
                )
            }
            "iframe" => format!("iframe?{query}&callback=h"),
            _ => format!("{transport}?{query}"),
        };
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!("GET /connection/{path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        eventually(&format!("{transport} is held"), || async {
            server.node.connection_count() == before + i + 1
                && server.node.metrics.longpolls_kept.get() == 0
        })
        .await;
        held.push((transport, s));
    }
    held
}

/// Row 2: when the server shuts down, every transport's client is told to reconnect with
/// 3001: WebSocket in its close frame, streams in a last `disconnect` push, a held long-poll
/// in its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_every_transport_to_reconnect_with_3001() {
    let server = start(config()).await;
    let mut ws = server.client().await;
    ws.subscribe("open:down", None).await;
    let held = hold_open(&server, "channel=open:down", 1).await;
    let stopping = tokio::spawn(server.stop());
    assert_eq!(ws.closed().await.code, 3001, "websocket");
    for (transport, mut s) in held {
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer))
            .await
            .expect("the answer ends")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.contains(r#""disconnect":{"code":3001"#),
            "{transport}: no disconnect 3001 in\n{answer}"
        );
    }
    stopping.await.unwrap().unwrap();
}

/// Reads from `s` until what it has read contains `needle` (a stream that ends a session
/// may keep its connection for the next request, so the end of the bytes is no signal).
async fn read_until(s: &mut tokio::net::TcpStream, needle: &str, what: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let found = tokio::time::timeout(PATIENCE, async {
        loop {
            if String::from_utf8_lossy(&seen).contains(needle) {
                return true;
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or(false);
    let seen = String::from_utf8_lossy(&seen).into_owned();
    assert!(found, "{what}: no {needle} in\n{seen}");
    seen
}

/// Row 3: a connection token that expires ends the connection with 3504 and `reconnect:
/// false` on every transport, while it is open: WebSocket in its close frame, streams in a
/// last `disconnect` push, a held long-poll in its answer (it used to be held to its
/// timeout and answered with publications past the token's expiry). A poll is refused
/// with 401 and error 109 (`auth::a_token_that_expires_while_connected_...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_ends_every_transport_with_3504() {
    use crate::auth::{auth_config, claims, hs256};
    let server = start(auth_config()).await;
    let soon = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3;
    let token = hs256(&claims(
        "42",
        json!({ "exp": soon, "subscribe": ["private:*"] }),
    ));
    let mut ws = server.client().await;
    let reply = ws.call("connect", json!({ "token": token })).await;
    assert_eq!(reply["connect"]["expires"], soon, "{reply}");
    ws.subscribe("private:expiring", None).await;
    let query = format!("channel=private:expiring&token={token}");
    let held = hold_open(&server, &query, 1).await;
    let closed = ws.closed().await;
    assert_eq!(closed.code, 3504, "websocket");
    for (transport, mut s) in held {
        let seen = read_until(&mut s, r#""disconnect":{"code":3504"#, transport).await;
        assert!(seen.contains(r#""reconnect":false"#), "{transport}: {seen}");
    }
    eventually("every session ended", || async {
        server.node.connection_count() == 0
    })
    .await;
    server.stop().await.unwrap();
}

/// A stream's client may ask for keepalives more often than `client.ping_interval`
/// (`ping=`, at least 250 ms), to take a stream that stays silent longer for dead: the SDK's
/// forever frame asks for 500 ms, since a frame's page is told of no cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_gets_keepalives_as_often_as_its_client_asked() {
    let server = start(config()).await;
    assert_eq!(
        server.node.settings.config.client.ping_interval,
        Duration::from_secs(25)
    );
    let mut held = hold_open(&server, "channel=open:asked&ping=300ms", 0).await;
    held.retain(|(transport, _)| !transport.starts_with("longpoll"));
    for (transport, s) in &mut held {
        let started = std::time::Instant::now();
        for _ in 0..3 {
            read_until(s, r#"{"ping":{}}"#, transport).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{transport}: three keepalives took {:?}",
            started.elapsed()
        );
    }
    server.stop().await.unwrap();
}

/// Row 4: idleness. A WebSocket client that answers no ping for `client.idle_timeout` is
/// closed with 3005 (`lifecycle::a_silent_peer_is_closed_after_the_idle_timeout`). A stream
/// carries nothing from its client (commands are posted), so silence means nothing there:
/// the driver keeps writing keepalives on the same cadence, and a client that stops reading
/// them meets the write deadline (row 1). A long-poll's session is its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_get_keepalives_and_are_not_cut_for_the_clients_silence() {
    let mut cfg = config();
    cfg.client.ping_interval = Duration::from_millis(100);
    cfg.client.idle_timeout = Duration::from_millis(300);
    let server = start(cfg).await;
    let mut held = hold_open(&server, "channel=open:quiet", 0).await;
    held.retain(|(transport, _)| !transport.starts_with("longpoll"));
    for (transport, s) in &mut held {
        let keepalive = r#"{"ping":{}}"#;
        // Keepalives for well past the idle timeout (each read waits for a new one).
        for _ in 0..5 {
            let seen = read_until(s, keepalive, transport).await;
            assert!(!seen.contains("disconnect"), "{transport}: {seen}");
        }
    }
    eventually("the three streams are open, the long-poll gone", || async {
        server.node.connection_count() == 3
    })
    .await;
    server.stop().await.unwrap();
}

/// Row 3, the other half: a subscription token that expires while a long-poll is held
/// answers it with that channel's `unsubscribe` (109), as WebSocket and the streams push
/// it (`auth::an_expired_subscription_token_ends_only_its_subscription`), instead of
/// holding the request on to its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_subscription_token_answers_a_held_long_poll() {
    use crate::auth::{auth_config, claims, hs256};
    let server = start(auth_config()).await;
    let token = hs256(&claims("42", json!({})));
    // Held by its task, and with its session kept (the hub may answer it).
    for key in ["", "&session_key="] {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let grant = hs256(&claims(
            "42",
            json!({ "channel": "private:lapsing", "exp": now + 2 }),
        ));
        let auth = format!("token={token}&sub_token={grant}");
        let first: serde_json::Value = reqwest::get(server.url(&format!(
            "/connection/longpoll?channel=private:lapsing&{auth}{key}"
        )))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let cursor = crate::http::urlencode(first["cursor"].as_str().expect("a cursor"));
        let key = first["session_key"]
            .as_str()
            .map_or(String::new(), |k| format!("&session_key={k}"));
        let held = reqwest::get(server.url(&format!(
            "/connection/longpoll?cursor={cursor}&timeout=60&{auth}{key}"
        )));
        let answer: serde_json::Value = tokio::time::timeout(PATIENCE, held)
            .await
            .expect("answered before its timeout")
            .unwrap()
            .json()
            .await
            .unwrap();
        let unsubscribed = answer["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|m| m.get("unsubscribe"))
            .unwrap_or_else(|| panic!("no unsubscribe in {answer}"));
        assert_eq!(unsubscribed["channel"], "private:lapsing");
        assert_eq!(unsubscribed["code"], 109, "{key}");
    }
    server.stop().await.unwrap();
}

/// A polling session parked while its connection token expires, with a publication
/// queued meanwhile: the request that takes it up (a long-poll, or a poll) is answered
/// with 3504, and the publication is not in it. The session was taken up and its queue
/// answered before anything looked at the token (every answer now ends what expired
/// before it drains, as the driver does before it wakes for the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_poll_taken_up_after_its_token_expired_gets_3504_and_nothing_past_it() {
    use crate::auth::{auth_config, claims, hs256};
    let mut cfg = auth_config();
    cfg.http.longpoll_grace = Duration::from_secs(30);
    let server = start(cfg).await;
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let exp = unix() + 2;
    let token = hs256(&claims(
        "42",
        json!({ "exp": exp, "subscribe": ["private:*"] }),
    ));
    let mut parked = Vec::new();
    for (path, channel) in [("longpoll", "private:held"), ("poll", "private:polled")] {
        let first: serde_json::Value = reqwest::get(server.url(&format!(
            "/connection/{path}?channel={channel}&token={token}&timeout=100ms&session_key="
        )))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let cursor = crate::http::urlencode(first["cursor"].as_str().expect("a cursor"));
        let key = first["session_key"].as_str().expect("parked").to_owned();
        parked.push((path, channel, cursor, key));
    }
    while unix() <= exp {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (path, channel, cursor, key) in parked {
        server.publish(channel, json!("past the token")).await;
        let answer: serde_json::Value = reqwest::get(server.url(&format!(
            "/connection/{path}?cursor={cursor}&token={token}&timeout=60&session_key={key}"
        )))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let text = answer.to_string();
        assert!(!text.contains("past the token"), "{path}: {text}");
        assert!(text.contains(r#""code":3504"#), "{path}: {text}");
    }
    server.stop().await.unwrap();
}
