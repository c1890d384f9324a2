//! Bad input gets a clear error and leaves other connections alone.

use serde_json::json;

use crate::support::*;

/// A bystander subscribed to `calm` must keep receiving while another client misbehaves.
async fn bystander(server: &TestServer) -> Client {
    let mut c = server.client().await;
    c.subscribe("calm", None).await;
    c
}

async fn bystander_still_served(server: &TestServer, c: &mut Client) {
    let (offset, _) = server.publish("calm", json!("still here")).await;
    assert_eq!(c.next_pub().await.1, offset);
}

#[tokio::test]
async fn malformed_json_closes_only_that_connection_with_a_reason() {
    let server = start(config()).await;
    let mut calm = bystander(&server).await;
    let mut bad = server.client().await;
    bad.send_text("{\"id\":1,\"subscribe\":").await;
    let closed = bad.closed().await;
    assert_eq!(closed.code, 3501);
    assert!(closed.reason.contains("malformed"), "{closed:?}");
    bystander_still_served(&server, &mut calm).await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_methods_and_bad_parameters_get_error_replies_and_the_connection_lives() {
    let server = start(config()).await;
    let mut c = server.client().await;
    let r = c.call("teleport", json!({})).await;
    assert_eq!(r["error"]["code"], 104);
    assert!(r["error"]["message"].as_str().unwrap().contains("teleport"));
    let r = c
        .call("subscribe", json!({ "channel": "no spaces please" }))
        .await;
    assert_eq!(r["error"]["code"], 114);
    let r = c.call("subscribe", json!({ "chanel": "typo" })).await;
    assert_eq!(r["error"]["code"], 107);
    assert!(r["error"]["message"].as_str().unwrap().contains("chanel"));
    let r = c.call("unsubscribe", json!({ "channel": "never" })).await;
    assert_eq!(r["error"]["code"], 115);
    c.subscribe("twice", None).await;
    let r = c.call("subscribe", json!({ "channel": "twice" })).await;
    assert_eq!(r["error"]["code"], 105);
    let r = c.call("ping", json!({})).await;
    assert!(r.get("error").is_none(), "connection still works: {r}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_frames_close_with_message_too_large() {
    let mut cfg = config();
    cfg.client.max_frame_size = 4096;
    cfg.client.queue_max_bytes = 4096;
    let server = start(cfg).await;
    let mut calm = bystander(&server).await;
    let mut big = server.client().await;
    let huge = json!({ "id": 1, "publish": { "channel": "open:x", "data": "x".repeat(10_000) } });
    big.send_text(huge.to_string()).await;
    let closed = big.closed().await;
    assert_eq!(closed.code, 3503, "{closed:?}");
    assert!(closed.reason.contains("4096"), "{closed:?}");
    bystander_still_served(&server, &mut calm).await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn publications_over_the_namespace_limit_are_refused() {
    let mut cfg = config();
    cfg.channels.max_message_size = Some(100);
    let server = start(cfg).await;
    let mut c = server.client().await;
    let r = c
        .call(
            "publish",
            json!({ "channel": "open:x", "data": "y".repeat(200) }),
        )
        .await;
    assert_eq!(r["error"]["code"], 113, "{r}");
    let (status, body) = server
        .api_post(
            "/api/publish",
            json!({ "channel": "x", "data": "y".repeat(200) }),
        )
        .await;
    assert_eq!((status, body["error"]["code"].as_u64()), (413, Some(113)));
    server.stop().await.unwrap();
}

/// A subscriber that stops reading is cut off with "slow" once its queue fills; the others
/// keep receiving everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_disconnected_and_others_keep_receiving() {
    let mut cfg = config();
    cfg.client.queue_max_bytes = 64 * 1024;
    cfg.client.write_timeout = std::time::Duration::from_millis(500);
    let server = start(cfg).await;
    let mut fast = server.client().await;
    fast.subscribe("flood", None).await;
    let mut slow = server.client().await;
    slow.subscribe("flood", None).await;
    assert_eq!(server.node.connection_count(), 2);

    let payload = "z".repeat(8 * 1024);
    let mut offset = 0;
    // Enough to fill the slow client's socket buffers and then its queue. The fast client
    // reads as we go, so only the slow one falls behind.
    for _ in 0..4000 {
        offset = server.publish("flood", json!(payload)).await.0;
        assert_eq!(fast.next_pub().await.1, offset);
        if server.node.connection_count() == 1 {
            break;
        }
    }
    eventually("the slow client is dropped", || async {
        server.node.connection_count() == 1
    })
    .await;
    let (after, _) = server.publish("flood", json!("after")).await;
    while fast.next_pub().await.1 != after {}
    assert!(after > offset);
    // Operators see the cut, and the slow client's queue no longer counts as queued.
    eventually("the cut is counted and its queue let go", || async {
        let text = server.metrics().await;
        text.contains("herald_slow_consumer_cuts_total 1\n")
            && text.contains("herald_queued_bytes{transport=\"websocket\"} 0\n")
    })
    .await;
    drop(slow);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_command_flood_is_rate_limited_without_closing_or_disturbing_others() {
    let mut cfg = config();
    cfg.client.max_commands_per_second = 50;
    let server = start(cfg).await;
    let mut calm = bystander(&server).await;
    let mut flooder = server.client().await;
    let frame: Vec<String> = (1..=300)
        .map(|id| format!("{{\"id\":{id},\"ping\":{{}}}}"))
        .collect();
    flooder.send_text(frame.join("\n")).await;
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..300 {
        let line = flooder.next_line().await;
        match line["error"]["code"].as_u64() {
            Some(111) => limited += 1,
            None => ok += 1,
            other => panic!("unexpected {other:?}: {line}"),
        }
    }
    // A burst of twice the rate passes (plus what refills while the frame is handled).
    assert!((100..150).contains(&ok), "{ok} passed, {limited} limited");
    assert_eq!(ok + limited, 300);
    bystander_still_served(&server, &mut calm).await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn connections_beyond_the_limit_are_refused_clearly() {
    let mut cfg = config();
    cfg.max_connections = 2;
    let server = start(cfg).await;
    let _a = server.client().await;
    let _b = server.client().await;
    eventually("both connections are established", || async {
        server.node.connection_count() == 2
    })
    .await;
    let refused =
        tokio_tungstenite::connect_async(format!("ws://{}/connection/websocket", server.addr))
            .await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 503),
        other => panic!("expected 503, got {other:?}"),
    }
    let (status, body) = response(
        reqwest::get(server.url("/connection/poll?channel=x"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body["error"]["code"].as_u64()), (503, Some(106)));
    server.stop().await.unwrap();
}

/// The review's probes: data that `RawValue` accepts and `serde_json::Value` refuses, with a
/// raw CR that once forced a re-parse, panicked the task (empty reply, no close frame).
#[tokio::test]
async fn payloads_with_odd_numbers_deep_nesting_or_lone_surrogates_get_answers() {
    let server = start(config()).await;
    let mut calm = bystander(&server).await;
    let http = reqwest::Client::new();
    let deep = format!("{}\r{}", "[".repeat(200), "]".repeat(200));
    for data in ["[1e400,\r1]", "[\"\\ud800\",\r1]", deep.as_str()] {
        let body = format!("{{\"id\":1,\"publish\":{{\"channel\":\"chat:x\",\"data\":{data}}}}}");
        let r = http
            .post(server.url("/connection/send"))
            .body(body.clone())
            .send()
            .await
            .expect("an answer, not an empty reply");
        let (status, reply) = response(r).await;
        assert_eq!(status, 200, "{reply}");
        assert!(
            reply.get("publish").is_some() || reply["error"]["code"] == 107,
            "{reply}"
        );
        let mut ws = server.client().await;
        ws.send_text(body).await;
        let reply = ws.next_line().await;
        assert!(
            reply.get("publish").is_some() || reply["error"]["code"] == 107,
            "{reply}"
        );
    }
    bystander_still_served(&server, &mut calm).await;
    server.stop().await.unwrap();
}

/// Issue #38, item 1: an answer hyper writes has a write deadline too. A stateless send of
/// history reads whose client never reads the (20 MB) answer is dropped once its writes
/// have waited `client.write_timeout`, and what it held (its session, the answer) is freed:
/// it used to be kept for as long as the client stayed connected.
#[tokio::test]
async fn an_answer_nobody_reads_is_dropped_at_the_write_deadline() {
    use tokio::io::AsyncWriteExt;
    let mut cfg = config();
    cfg.client.write_timeout = std::time::Duration::from_millis(500);
    let server = start(cfg).await;
    let payload = "h".repeat(60 * 1024);
    for _ in 0..18 {
        server.publish("open:big", json!(payload)).await;
    }
    let body: String = (0..20)
        .map(|i| {
            json!({ "id": i, "history": { "channel": "open:big", "limit": 1000 } }).to_string()
                + "\n"
        })
        .collect();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(server.addr).await.unwrap();
    let request = format!(
        "POST /connection/send HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    eventually("the send's session is held while it answers", || async {
        server.node.connection_count() == 1
    })
    .await;
    // Never read: the server gives up after the deadline and lets the answer go.
    eventually("the unread answer is dropped", || async {
        server.node.connection_count() == 0
    })
    .await;
    drop(s);
    server.stop().await.unwrap();
}
