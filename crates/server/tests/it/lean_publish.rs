//! `POST /api/publish` answered on the socket, without hyper or the router
//! (`transport::http1`): the same answers as the router's, refusals included; bodies framed
//! any other way go to hyper; a body that does not come is answered as the router answers
//! it.

use std::time::Duration;

use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{http::read_answer, support::*};

/// An answer as compared across the two paths: status line, header names and values but
/// the date and the connection's (each path words those its own way), and the body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: String,
    headers: Vec<String>,
    body: Value,
}

async fn exchange(s: &mut TcpStream, request: &[u8]) -> Answer {
    s.write_all(request).await.unwrap();
    let (head, body) = read_answer(s).await;
    let mut lines = head.lines();
    let status = lines.next().unwrap().to_owned();
    let mut headers: Vec<String> = lines
        .filter(|l| !l.starts_with("date: ") && !l.starts_with("connection: "))
        .map(str::to_owned)
        .collect();
    headers.sort();
    assert!(head.contains("\r\ndate: "), "{head}");
    let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
    Answer {
        status,
        headers,
        body,
    }
}

/// What arrives on `s` until it holds `text`.
async fn read_until(s: &mut TcpStream, text: &str) -> String {
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains(text) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("answers in time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).unwrap()
}

fn post(host: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /api/publish HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection whose first request is a publication is served on the lean path, one
/// whose first request is anything else by hyper for its whole life: the same requests on
/// each get the same answers, refusals included.
#[tokio::test]
async fn a_publication_on_the_socket_is_answered_as_the_router_answers_it() {
    let mut cfg = config();
    cfg.api_keys = vec![herald_server::config::ApiKey::Scoped {
        key: "read-only-key-0123".into(),
        scope: herald_server::config::ApiScope::Read,
    }];
    let server = start(cfg).await;
    let host = server.addr.to_string();
    let key = format!("Authorization: apikey {KEY}\r\n");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "no key",
            post(&host, "", r#"{"channel":"open:a","data":1}"#),
        ),
        (
            "a wrong key",
            post(
                &host,
                "Authorization: apikey nope\r\n",
                r#"{"channel":"open:a","data":1}"#,
            ),
        ),
        (
            "a key that may only read",
            post(
                &host,
                "Authorization: apikey read-only-key-0123\r\n",
                r#"{"channel":"open:a","data":1}"#,
            ),
        ),
        (
            "a host not served",
            post("evil.example", &key, r#"{"channel":"open:a","data":1}"#),
        ),
        ("not JSON", post(&host, &key, "{")),
        (
            "an unknown field",
            post(&host, &key, r#"{"channel":"open:a","data":1,"x":2}"#),
        ),
        (
            "a bad channel",
            post(&host, &key, r#"{"channel":"","data":1}"#),
        ),
        ("no data", post(&host, &key, r#"{"channel":"open:a"}"#)),
    ];
    let mut hyper = TcpStream::connect(server.addr).await.unwrap();
    let info = format!("GET /api/info HTTP/1.1\r\nHost: {host}\r\n{key}\r\n");
    exchange(&mut hyper, info.as_bytes()).await;
    for (what, request) in &cases {
        // A fresh connection for each: a refusal may end it.
        let mut lean = TcpStream::connect(server.addr).await.unwrap();
        let here = exchange(&mut lean, request).await;
        let there = exchange(&mut hyper, request).await;
        assert_eq!(here, there, "{what}");
        assert_ne!(here.status, "http/1.1 200 ok", "{what}: {here:?}");
    }

    // Publications: the same fields, offsets one after the other, on one kept-alive
    // connection each.
    let mut lean = TcpStream::connect(server.addr).await.unwrap();
    let publish = post(&host, &key, r#"{"channel":"open:b","data":{"n":1}}"#);
    let first = exchange(&mut lean, &publish).await;
    let second = exchange(&mut hyper, &publish).await;
    let third = exchange(&mut lean, &publish).await;
    assert_eq!(first.status, "http/1.1 200 ok", "{first:?}");
    assert_eq!(first.headers, second.headers);
    for (n, answer) in [&first, &second, &third].into_iter().enumerate() {
        assert_eq!(answer.body["offset"], n as u64 + 1, "{answer:?}");
        assert_eq!(answer.body["epoch"], first.body["epoch"], "{answer:?}");
    }
    // A repeated idempotency key says so on both.
    let keyed = post(
        &host,
        &key,
        r#"{"channel":"open:b","data":2,"idempotency_key":"k1"}"#,
    );
    let stored = exchange(&mut lean, &keyed).await;
    assert_eq!(exchange(&mut hyper, &keyed).await.body["repeat"], true);
    assert_eq!(exchange(&mut lean, &keyed).await.body["repeat"], true);
    assert_eq!(stored.body.get("repeat"), None, "{stored:?}");
    let (_, history) = server.api_get("/api/history?channel=open:b").await;
    assert_eq!(
        history["publications"].as_array().unwrap().len(),
        4,
        "{history}"
    );
    server.stop().await.unwrap();
}

/// What the lean path does not read itself goes to hyper with what was read of it:
/// chunks, `expect: 100-continue`, a body over 64 KiB; pipelined publications and bodies
/// that come in pieces are read here; a body that never comes is answered as the router
/// answers one (413, code 113) and the connection ends.
#[tokio::test]
async fn publications_framed_any_way_are_read_by_one_path_or_the_other() {
    let mut cfg = config();
    cfg.http.body_timeout = Duration::from_millis(300);
    let server = start(cfg).await;
    let host = server.addr.to_string();
    let key = format!("Authorization: apikey {KEY}\r\n");
    let published = |answer: &Answer| answer.body["offset"].as_u64();

    // Chunks.
    let body = r#"{"channel":"open:c","data":"chunked"}"#;
    let chunked = format!(
        "POST /api/publish HTTP/1.1\r\nHost: {host}\r\n{key}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(
        published(&exchange(&mut s, chunked.as_bytes()).await),
        Some(1)
    );
    // Expect: 100-continue (hyper answers 100 first).
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let body = r#"{"channel":"open:c","data":"continued"}"#;
    let head = format!(
        "POST /api/publish HTTP/1.1\r\nHost: {host}\r\n{key}Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = [0u8; 64];
    let n = tokio::time::timeout(PATIENCE, s.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got[..n].starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"));
    assert_eq!(published(&exchange(&mut s, body.as_bytes()).await), Some(2));
    // Over 64 KiB: the API's limit is hyper's and the publication's, not this path's.
    let big = format!(
        r#"{{"channel":"open:c","data":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    // Whether a connection starts with it or with a request hyper reads, the answer is the
    // same: a publication over its namespace's limit (64 KiB), refused.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let answer = exchange(&mut s, &post(&host, &key, &big)).await;
    let mut hyper = TcpStream::connect(server.addr).await.unwrap();
    let info = format!("GET /api/info HTTP/1.1\r\nHost: {host}\r\n{key}\r\n");
    exchange(&mut hyper, info.as_bytes()).await;
    assert_eq!(answer, exchange(&mut hyper, &post(&host, &key, &big)).await);
    assert_eq!(
        answer.status, "http/1.1 413 payload too large",
        "{answer:?}"
    );
    assert_eq!(answer.body["error"]["code"], 113, "{answer:?}");
    // A head larger than the lean path reads (24 KiB), as hyper reads it.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let big_head = format!("{key}X-Large: {}\r\n", "y".repeat(30 * 1024));
    let answer = exchange(
        &mut s,
        &post(&host, &big_head, r#"{"channel":"open:c","data":3}"#),
    )
    .await;
    assert!(published(&answer).is_some(), "{answer:?}");
    // Two publications in one write, then one in pieces, on one connection.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let one = post(&host, &key, r#"{"channel":"open:d","data":1}"#);
    s.write_all(&[one.clone(), one.clone()].concat())
        .await
        .unwrap();
    // Both answers, in order (they may come in one read).
    let both = read_until(&mut s, "\"offset\":2").await;
    assert_eq!(both.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{both}");
    assert!(
        both.find("\"offset\":1") < both.find("\"offset\":2"),
        "{both}"
    );
    for piece in one.chunks(9) {
        s.write_all(piece).await.unwrap();
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    let (_, third) = read_answer(&mut s).await;
    assert!(third.contains("\"offset\":3"), "{third}");
    // A body that never comes.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let cut = post(&host, &key, r#"{"channel":"open:d","data":1}"#);
    let answer = exchange(&mut s, &cut[..cut.len() - 5]).await;
    assert_eq!(
        answer.status, "http/1.1 413 payload too large",
        "{answer:?}"
    );
    assert_eq!(answer.body["error"]["code"], 113, "{answer:?}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0))), "the connection ends: {read:?}");
    let (_, history) = server.api_get("/api/history?channel=open:d").await;
    assert_eq!(
        history["publications"].as_array().unwrap().len(),
        3,
        "{history}"
    );
    server.stop().await.unwrap();
}

/// A publication refused by its head (no key, a wrong one, a host not served) is refused
/// at once, as the router's layers refuse it: its body is neither waited for nor kept, and
/// the connection ends unless all of it had arrived.
#[tokio::test]
async fn a_publication_refused_by_its_head_is_refused_before_its_body() {
    let mut cfg = config();
    // Longer than any wait below: a connection left open would not be closed by it.
    cfg.http.header_timeout = PATIENCE * 2;
    let server = start(cfg).await;
    let host = server.addr.to_string();
    for (what, headers) in [
        ("no key", format!("Host: {host}\r\n")),
        (
            "a wrong key",
            format!("Host: {host}\r\nAuthorization: apikey nope\r\n"),
        ),
        (
            "a host not served",
            format!("Host: evil.example\r\nAuthorization: apikey {KEY}\r\n"),
        ),
    ] {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        // A body announced at the lean path's largest, and never sent.
        let head = format!("POST /api/publish HTTP/1.1\r\n{headers}Content-Length: 65536\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let (status, body) = read_answer(&mut s).await;
        assert!(
            status.starts_with("http/1.1 401") || status.starts_with("http/1.1 403"),
            "{what}: {status}\n{body}"
        );
        // Its body not read, what follows cannot be told from a next request: the end.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "{what}: the connection ends: {read:?}"
        );
    }
    // Refused with all of its body there already, the connection carries the next request.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let refused = post(
        &host,
        "Authorization: apikey nope\r\n",
        r#"{"channel":"open:e","data":1}"#,
    );
    let key = format!("Authorization: apikey {KEY}\r\n");
    let next = post(&host, &key, r#"{"channel":"open:e","data":2}"#);
    s.write_all(&[refused, next].concat()).await.unwrap();
    let both = read_until(&mut s, "\"offset\":1").await;
    assert!(both.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{both}");
    server.stop().await.unwrap();
}
