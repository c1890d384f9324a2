//! The lean path: held requests (streams, long-polls, polls) served on the socket itself,
//! framed there, read by the same rules as hyper's, and ended with their client.

use serde_json::{json, Value};

use crate::{
    http::{raw_answer as answer, urlencode, Lines},
    support::*,
};

/// Streams are served on the socket itself (`transport::http1`), not by hyper: the answer
/// is framed right for HTTP/1.1 (chunks) and 1.0 (until the close), a request it cannot
/// frame is refused with a 400 that says why, and a client that leaves is noticed at once.
#[tokio::test]
async fn streams_are_framed_on_the_socket_and_a_client_that_leaves_is_noticed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(config()).await;
    async fn read_until(s: &mut tokio::net::TcpStream, text: &str) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(text) {
            let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .expect("answer in time")
                .unwrap();
            assert!(
                n > 0,
                "closed before {text:?}: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /connection/stream?channel=open:raw HTTP/1.1\r\nHost: {}\r\n\r\n",
        server.addr
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let answer = read_until(&mut s, "\"subscribe\"").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("transfer-encoding: chunked\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("content-type: application/x-ndjson\r\n"),
        "{answer}"
    );
    assert!(!answer.contains("content-length"), "{answer}");
    // The connect push is the first chunk: its size, in hex, then the line.
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let (size, rest) = body.split_once("\r\n").unwrap();
    let size = usize::from_str_radix(size, 16).unwrap();
    assert!(rest[..size].starts_with("{\"connect\""), "{body}");
    let (offset, _) = server.publish("open:raw", json!("hi")).await;
    read_until(&mut s, &format!("\"offset\":{offset}")).await;
    assert_eq!(server.node.connection_count(), 1);
    drop(s);
    eventually("the stream's session ends with its socket", || async {
        server.node.connection_count() == 0
    })
    .await;

    // HTTP/1.0 has no chunks: the answer runs until the connection closes.
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /connection/sse?channel=open:raw HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until(&mut s, "data: {\"subscribe\"").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(!answer.contains("transfer-encoding"), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    drop(s);

    // A GET with a body is not one to frame: a 400 that says why, then the close.
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /connection/sse HTTP/1.1\r\nContent-Length: 2\r\n\r\nab")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer))
        .await
        .expect("closed in time")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    assert!(answer.contains("\r\ndate: "), "{answer}");
    let body: Value =
        serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(body["error"]["code"], 107, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no body"),
        "{body}"
    );
    // Everything else still goes to hyper on the same listener.
    let (status, info) = server.api_get("/api/info").await;
    assert_eq!(status, 200, "{info}");
    server.stop().await.unwrap();
}

/// Polls are served on the socket too (`transport::http1`): one keep-alive connection
/// carries a poll, its revalidation (304, no length), and held long-polls, each answered
/// with a length; a long-poller that leaves while held ends its session at once.
#[tokio::test]
async fn polls_are_answered_on_the_socket_and_a_held_poll_ends_with_its_client() {
    use tokio::io::AsyncWriteExt;
    let server = start(config()).await;
    let host = server.addr;
    let get =
        |path: &str, extra: &str| format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n");

    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (head, body) = answer(&mut s, &get("/connection/poll?channel=open:lp", "")).await;
    assert!(head.starts_with("http/1.1 200 ok"), "{head}\n{body}");
    assert!(head.contains("connection: keep-alive"), "{head}");
    assert!(head.contains("\r\ndate: "), "{head}");
    let etag = head
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .expect("an etag")
        .to_owned();
    let cursor = serde_json::from_str::<Value>(&body).unwrap()["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let (head, body) = answer(
        &mut s,
        &get(
            &format!("/connection/poll?cursor={}", urlencode(&cursor)),
            &format!("If-None-Match: {etag}\r\n"),
        ),
    )
    .await;
    assert!(head.starts_with("http/1.1 304"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(body.is_empty());

    // Held on the same connection until a publication arrives.
    let held = get(
        &format!("/connection/longpoll?cursor={}", urlencode(&cursor)),
        "",
    );
    let publish = async {
        eventually("the long-poll is held", || async {
            server.node.connection_count() == 1
        })
        .await;
        server.publish("open:lp", json!("hi")).await
    };
    let ((head, body), (offset, _)) = tokio::join!(answer(&mut s, &held), publish);
    assert!(head.starts_with("http/1.1 200 ok"), "{head}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["messages"][0]["pub"]["offset"], offset, "{body}");

    // Held again, then the client leaves: its session ends without waiting for the hold.
    let cursor = body["cursor"].as_str().unwrap().to_owned();
    s.write_all(
        get(
            &format!("/connection/longpoll?cursor={}", urlencode(&cursor)),
            "",
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    eventually("the long-poll is held", || async {
        server.node.connection_count() == 1
    })
    .await;
    drop(s);
    eventually("the held poll's session ends with its socket", || async {
        server.node.connection_count() == 0
    })
    .await;
    server.stop().await.unwrap();
}

/// While a stream waits, the hub writes publications to its socket itself (the direct
/// lane); a socket that takes only part of one keeps the rest for the stream's task, which
/// sends it before anything else. A client that reads slowly through a small buffer still
/// gets every publication once, in order, whole.
#[tokio::test]
async fn a_stream_read_slowly_gets_every_publication_once_in_order() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(config()).await;
    for (path, prefix) in [("stream", ""), ("sse", "data: ")] {
        let channel = format!("open:slow-{path}");
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(server.addr).await.unwrap();
        let request = format!(
            "GET /connection/{path}?channel={channel} HTTP/1.1\r\nHost: {}\r\n\r\n",
            server.addr
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !String::from_utf8_lossy(&got).contains("\"subscribe\"") {
            let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .expect("subscribed in time")
                .unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        // Publications of 3 KB, while the client reads nothing: the socket's buffers fill
        // and writes are cut short.
        let text = "x".repeat(3000);
        let mut last = 0;
        for _ in 0..100 {
            last = server.publish(&channel, json!(text)).await.0;
        }
        let want = format!("\"offset\":{last},");
        let whole = |got: &[u8]| {
            let got = String::from_utf8_lossy(got);
            got.rfind(&want).is_some_and(|at| got[at..].contains('\n'))
        };
        while !whole(&got) {
            let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .expect("every publication in time")
                .unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
        }
        let got = String::from_utf8(got).unwrap();
        let offsets: Vec<u64> = got
            .split('\n')
            .filter_map(|line| line.strip_prefix(prefix))
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|push| push["pub"]["offset"].as_u64())
            .collect();
        assert_eq!(offsets, (1..=last).collect::<Vec<_>>(), "{path}");

        // Everything read, the stream idle: one publication larger than the socket takes
        // at once is cut by the hub's direct write; its task sends the rest by itself.
        let big = "y".repeat(60_000);
        let offset = server.publish(&channel, json!(big)).await.0;
        let want = format!("\"offset\":{offset},");
        let mut got = Vec::new();
        loop {
            let text = String::from_utf8_lossy(&got);
            if text.find(&want).is_some_and(|at| text[at..].contains('\n')) {
                break;
            }
            let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .expect("the large publication whole in time")
                .unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
        }
    }
    server.stop().await.unwrap();
}

/// With the direct lane an SSE event's id is its own channel's position, which is the
/// connection's whole cursor only while it has one channel: with two, every event's id
/// still names both (the lane stays closed), so `Last-Event-ID` resumes both.
#[tokio::test]
async fn sse_ids_carry_every_channel_of_a_connection_with_several() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let r = http
        .get(server.url("/connection/sse?channel=open:a&channel=open:b"))
        .send()
        .await
        .unwrap();
    let mut sse = Lines::new(r);
    let mut subscribed = 0;
    while subscribed < 2 {
        let (_, e) = sse.next_event().await.unwrap();
        if e.get("subscribe").is_some() {
            subscribed += 1;
        }
    }
    for i in 1..=3 {
        server.publish("open:a", json!(i)).await;
        server.publish("open:b", json!(i)).await;
    }
    let mut ids = Vec::new();
    while ids.len() < 6 {
        let (id, e) = sse.next_event().await.unwrap();
        if e.get("pub").is_some() {
            ids.push(id.expect("every publication has an id"));
        }
    }
    for id in &ids {
        assert!(
            id.contains("open:a;") && id.contains("open:b;"),
            "an id names both channels: {id}"
        );
    }
    server.stop().await.unwrap();
}

/// Issue #38, item 7: heads are read by one set of rules on both paths. Two pipelined
/// requests whose lines end in a bare LF (which httparse, and so hyper, accept) get two
/// answers on a route served on the socket, as on one served by hyper; a head that arrives
/// a few bytes at a time is read whole.
#[tokio::test]
async fn heads_are_read_by_one_set_of_rules_on_both_paths() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(config()).await;
    let host = server.addr;
    /// Reads until `n` answers have begun.
    async fn answers(s: &mut tokio::net::TcpStream, n: usize) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if text.matches("HTTP/1.1 200 OK\r\n").count() >= n {
                return text;
            }
            let read = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{n} answers in time, got: {text}"))
                .unwrap();
            assert!(read > 0, "closed before {n} answers: {text}");
            got.extend_from_slice(&buf[..read]);
        }
    }
    for path in ["/connection/poll?channel=open:lf", "/healthz"] {
        let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
        let one = format!("GET {path} HTTP/1.1\nHost: {host}\n\n");
        s.write_all(format!("{one}{one}").as_bytes()).await.unwrap();
        answers(&mut s, 2).await;
    }
    // A held request and one for hyper in one write: the lean path reads past the first
    // head, and hands hyper the bytes it read of the next (a body's too).
    let body = r#"{"channel":"open:lf","data":"x"}"#;
    let publish = format!(
        "POST /api/publish HTTP/1.1\r\nHost: {host}\r\nAuthorization: apikey {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    let poll = format!("GET /connection/poll?channel=open:lf HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(format!("{poll}{publish}").as_bytes())
        .await
        .unwrap();
    let both = answers(&mut s, 2).await;
    assert!(both.contains("\"offset\""), "{both}");
    // The same header limit: a head of 70 headers is refused on both paths.
    let many: String = (0..70).map(|i| format!("x-h{i}: v\r\n")).collect();
    for path in ["/connection/poll?channel=open:lf", "/healthz"] {
        let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{many}\r\n");
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 400") || answer.starts_with("HTTP/1.1 431"),
            "{path}: {answer}"
        );
    }
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!("GET /connection/poll?channel=open:lf HTTP/1.1\r\nHost: {host}\r\n\r\n");
    for piece in request.as_bytes().chunks(7) {
        s.write_all(piece).await.unwrap();
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    answers(&mut s, 1).await;
    server.stop().await.unwrap();
}
