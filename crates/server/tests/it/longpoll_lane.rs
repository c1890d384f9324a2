//! Held long-polls that the hub answers itself (`transport::poll::lane`): a long-poll held
//! on the lean path with its session key is answered by whoever fans the publication out,
//! as its connection's task would have answered it, and its session goes on with the next
//! request, on the same connection or another.

use serde_json::{json, Value};
use tokio::{io::AsyncWriteExt, net::TcpStream};

use crate::{
    http::{raw_answer, read_answer, urlencode},
    longpoll::{head, meaning, offsets, text},
    support::*,
};

/// The long-poll that continues the session `answer` parked, held up to a minute.
fn continuation(answer: &Value) -> String {
    format!(
        "/connection/longpoll?cursor={}&timeout=60&session_key={}",
        urlencode(text(answer, "cursor")),
        text(answer, "session_key")
    )
}

/// The first long-poll of a session on `s` (answered at once, with the subscription).
async fn subscribed(server: &TestServer, s: &mut TcpStream, channel: &str) -> Value {
    let host = server.addr.to_string();
    let path = format!("/connection/longpoll?channel={channel}&session_key=");
    let (status, body) = raw_answer(s, &head(&host, &path, None)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}\n{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body["messages"][0].get("subscribe").is_some(), "{body}");
    body
}

/// Sends the long-poll `path` that continues a parked session on `s`, then publishes
/// `offset` on `channel` once the server holds it: the answer's head and body.
async fn held_then_published(
    server: &TestServer,
    s: &mut TcpStream,
    (path, origin): (&str, Option<&str>),
    (channel, offset): (&str, u64),
) -> (String, Value) {
    let host = server.addr.to_string();
    let kept = server.node.metrics.longpolls_kept.get();
    s.write_all(head(&host, path, origin).as_bytes())
        .await
        .unwrap();
    eventually("the long-poll took its session up", || async {
        server.node.metrics.longpolls_kept.get() < kept
    })
    .await;
    let (published, _) = server.publish(channel, json!(offset)).await;
    assert_eq!(published, offset);
    let (status, body) = read_answer(s).await;
    assert!(status.starts_with("http/1.1 200"), "{status}\n{body}");
    assert!(status.contains("\r\ndate: "), "{status}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(offsets(&body), [offset], "{body}");
    (status, body)
}

/// Answered by the hub, the answer carries what the task's answer carries (the
/// publication, the cursor after it, the client and the session key) with the same
/// headers, CORS included, as a long-poll held on a connection hyper serves, whose answer
/// its task writes; and the session goes on over the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_long_poll_is_answered_by_the_hub_as_its_task_answers_it() {
    let mut c = config();
    c.allowed_origins = vec!["https://app.example".into()];
    let server = start(c).await;
    let host = server.addr.to_string();
    let by_hub = server.node.metrics.longpolls_answered_by_hub.clone();
    let origin = Some("https://app.example");

    // Hyper's connection: its task answers.
    let mut routed = TcpStream::connect(server.addr).await.unwrap();
    let (status, _) = raw_answer(&mut routed, &head(&host, "/healthz", None)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    let first = subscribed(&server, &mut routed, "open:lane").await;
    let (routed_head, routed_body) = held_then_published(
        &server,
        &mut routed,
        (&continuation(&first), origin),
        ("open:lane", 1),
    )
    .await;
    assert_eq!(by_hub.get(), 0, "answered by its task");

    // The lean path: the hub answers.
    let mut lean = TcpStream::connect(server.addr).await.unwrap();
    let first = subscribed(&server, &mut lean, "open:lane").await;
    let (lean_head, lean_body) = held_then_published(
        &server,
        &mut lean,
        (&continuation(&first), origin),
        ("open:lane", 2),
    )
    .await;
    assert_eq!(by_hub.get(), 1, "answered by the hub: {lean_head}");
    assert_eq!(meaning(&lean_head), meaning(&routed_head), "{lean_head}");
    assert!(lean_head.contains("access-control-allow-origin: https://app.example"));
    let fields = |v: &Value| {
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(fields(&lean_body), fields(&routed_body), "{lean_body}");
    assert_eq!(text(&lean_body, "session_key").len(), 32);
    // The cursor after the publication it carries.
    // (Its last field: an epoch may begin with the digit, too.)
    let routed_cursor = text(&routed_body, "cursor");
    let before = routed_cursor.strip_suffix(";1").expect("at offset 1");
    assert_eq!(text(&lean_body, "cursor"), format!("{before};2"));

    // The next request on the same connection takes the session up, and is answered by
    // the hub again.
    let mut last = lean_body;
    for offset in 3..=5 {
        let (_, next) = held_then_published(
            &server,
            &mut lean,
            (&continuation(&last), origin),
            ("open:lane", offset),
        )
        .await;
        assert_eq!(next["client"], last["client"], "the same session: {next}");
        assert_eq!(next["session_key"], last["session_key"]);
        last = next;
    }
    assert_eq!(by_hub.get(), 4);
    server.stop().await.unwrap();
}

/// A session the hub answered on one connection is taken up by a request on another (a
/// browser's pool, a proxy's), and later again on the first: nothing lost, nothing twice,
/// the same session throughout, and the first connection still serves requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_hub_answered_goes_on_over_another_connection() {
    let server = start(config()).await;
    let by_hub = server.node.metrics.longpolls_answered_by_hub.clone();
    let mut a = TcpStream::connect(server.addr).await.unwrap();
    let mut b = TcpStream::connect(server.addr).await.unwrap();
    let first = subscribed(&server, &mut a, "open:moving").await;
    let (_, one) = held_then_published(
        &server,
        &mut a,
        (&continuation(&first), None),
        ("open:moving", 1),
    )
    .await;
    let (_, two) = held_then_published(
        &server,
        &mut b,
        (&continuation(&one), None),
        ("open:moving", 2),
    )
    .await;
    // Published while no request is held: it waits in the parked session.
    server.publish("open:moving", json!(3)).await;
    let host = server.addr.to_string();
    let (status, three) = raw_answer(&mut a, &head(&host, &continuation(&two), None)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    let three: Value = serde_json::from_str(&three).unwrap();
    assert_eq!(offsets(&three), [3], "{three}");
    let (_, four) = held_then_published(
        &server,
        &mut b,
        (&continuation(&three), None),
        ("open:moving", 4),
    )
    .await;
    for answer in [&two, &three, &four] {
        assert_eq!(
            answer["client"], one["client"],
            "the same session: {answer}"
        );
    }
    assert_eq!(by_hub.get(), 3, "1, 2 and 4 by the hub; 3 waited");
    server.stop().await.unwrap();
}

/// A client that stops reading while the hub answers its long-poll: what the socket did
/// not take is left for the connection's task, which cuts the connection at the write
/// deadline. Nothing is lost: the client's next request, from the position it had, does
/// not continue the parked session (whose cursor is past the answer it never read), so it
/// starts afresh and the publication is replayed from history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_client_does_not_read_is_cut_at_the_write_deadline() {
    use std::sync::atomic::Ordering;
    let mut c = config();
    c.client.write_timeout = std::time::Duration::from_millis(300);
    c.client.max_frame_size = 16 << 20;
    c.client.queue_max_bytes = 64 << 20;
    c.namespaces.insert(
        "open".into(),
        herald_server::config::NamespaceOverride {
            publish: Some(Access::Anyone),
            max_message_size: Some(1 << 20),
            ..Default::default()
        },
    );
    let server = start(c).await;
    let by_hub = server.node.metrics.longpolls_answered_by_hub.clone();
    // A small window and small segments: the server's socket takes a few kilobytes of the
    // answer, not all of it (loopback's own segments would let it take megabytes).
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.set_tcp_mss(536).unwrap();
    socket.connect(&server.addr.into()).unwrap();
    socket.set_nonblocking(true).unwrap();
    let mut s = TcpStream::from_std(socket.into()).unwrap();
    let first = subscribed(&server, &mut s, "open:unread").await;
    let host = server.addr.to_string();
    let kept = server.node.metrics.longpolls_kept.get();
    s.write_all(head(&host, &continuation(&first), None).as_bytes())
        .await
        .unwrap();
    eventually("the long-poll took its session up", || async {
        server.node.metrics.longpolls_kept.get() < kept
    })
    .await;
    // The API client's connection is open before the count is read (it publishes on it).
    server.publish("open:other", json!(0)).await;
    let sockets = server.node.sockets.load(Ordering::Relaxed);
    // Far more than the socket buffers take.
    let payload = "u".repeat(900 << 10);
    server.publish("open:unread", json!(payload)).await;
    eventually("the unread answer's connection is cut", || async {
        server.node.sockets.load(Ordering::Relaxed) < sockets
    })
    .await;
    assert_eq!(by_hub.get(), 1, "the hub wrote the answer's first bytes");
    drop(s);
    let mut again = TcpStream::connect(server.addr).await.unwrap();
    let path = continuation(&first).replace("timeout=60", "timeout=20ms");
    let (status, body) = raw_answer(&mut again, &head(&host, &path, None)).await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(offsets(&body), [1], "replayed from history");
    assert_eq!(
        body["messages"][0]["pub"]["data"].as_str().map(str::len),
        Some(900 << 10)
    );
    server.stop().await.unwrap();
}

/// A session the hub answered on one connection and now held on another: the first
/// connection's task still waits on the session's queue (it wakes only for its next
/// request), and a wake-up meant for the second (a presence push is queued, never written
/// by the lane) that reaches it first is passed on, so the second answers at once instead
/// of at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_for_a_session_that_moved_on_reaches_its_new_connection() {
    // `room`: presence with join and leave pushes, gathered until the test ends a window.
    let c = crate::presence::presence_config();
    let server = start(c).await;
    let host = server.addr.to_string();
    let mut a = TcpStream::connect(server.addr).await.unwrap();
    let mut b = TcpStream::connect(server.addr).await.unwrap();
    let first = subscribed(&server, &mut a, "room:r").await;
    // Its own join, queued, answers the next request at once.
    server.node.presence.end_window().await;
    let (_, joined) = raw_answer(&mut a, &head(&host, &continuation(&first), None)).await;
    let joined: Value = serde_json::from_str(&joined).unwrap();
    assert!(joined["messages"][0].get("presence").is_some(), "{joined}");
    let (_, one) = held_then_published(
        &server,
        &mut a,
        (&continuation(&joined), None),
        ("room:r", 1),
    )
    .await;
    // Held on B; A's task still waits (for A's next request).
    let kept = server.node.metrics.longpolls_kept.get();
    b.write_all(head(&host, &continuation(&one), None).as_bytes())
        .await
        .unwrap();
    eventually("B took the session up", || async {
        server.node.metrics.longpolls_kept.get() < kept
    })
    .await;
    let mut other = server.client().await;
    other.call("connect", json!({})).await;
    other.subscribe("room:r", None).await;
    server.node.presence.end_window().await;
    let (status, body) = tokio::time::timeout(PATIENCE, read_answer(&mut b))
        .await
        .expect("B answered before its timeout");
    assert!(status.starts_with("http/1.1 200"), "{status}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body["messages"][0].get("presence").is_some(), "{body}");
    assert_eq!(body["client"], first["client"]);
    server.stop().await.unwrap();
}
