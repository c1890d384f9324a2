//! The HTTP transports: SSE, NDJSON streaming, forever frame, long-poll, poll, send.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::support::*;

/// Reads a streaming response one line at a time.
pub struct Lines {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    pending: Vec<u8>,
}

impl Lines {
    pub fn new(r: reqwest::Response) -> Self {
        Self {
            body: Box::pin(r.bytes_stream()),
            pending: Vec::new(),
        }
    }

    /// The next line, or None when the response ended.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(
                    String::from_utf8(line)
                        .unwrap()
                        .trim_end_matches('\n')
                        .to_string(),
                );
            }
            match tokio::time::timeout(PATIENCE, self.body.next())
                .await
                .expect("line in time")
            {
                Some(Ok(chunk)) => self.pending.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Reads a stream's first line, its `connect` push, and returns the session id
    /// (`client`), which `/connection/send?session=` takes.
    pub async fn session(&mut self) -> String {
        let connect: Value = serde_json::from_str(&self.next().await.unwrap()).unwrap();
        connect["connect"]["client"]
            .as_str()
            .expect("a stream starts with its connect push")
            .to_string()
    }

    /// The next SSE event: (id, data), skipping comments and `retry:`.
    pub async fn next_event(&mut self) -> Option<(Option<String>, Value)> {
        let mut id = None;
        loop {
            let line = self.next().await?;
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(data) = line.strip_prefix("data: ") {
                return Some((id, serde_json::from_str(data).unwrap()));
            }
        }
    }
}

pub fn offsets_of(messages: &Value) -> Vec<u64> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pub"]["offset"].as_u64())
        .collect()
}

#[tokio::test]
async fn sse_delivers_and_the_browser_style_reconnect_resumes_with_last_event_id() {
    let mut cfg = config();
    cfg.client.ping_interval = Duration::from_millis(200);
    cfg.client.idle_timeout = Duration::from_secs(5);
    let server = start(cfg).await;
    let http = reqwest::Client::new();
    let r = http
        .get(server.url("/connection/sse?channel=news"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert!(r.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("no-cache"));
    assert_eq!(r.headers()["x-accel-buffering"], "no");
    let mut sse = Lines::new(r);
    assert!(sse.next().await.unwrap().starts_with("retry: "));
    let (_, connect) = sse.next_event().await.unwrap();
    assert!(connect["connect"]["client"].is_string());
    let (_, sub) = sse.next_event().await.unwrap();
    assert_eq!(sub["subscribe"]["offset"], 0);
    for i in 1..=3 {
        server.publish("news", json!(i)).await;
    }
    let mut last_id = None;
    for i in 1..=3u64 {
        let (id, e) = sse.next_event().await.unwrap();
        assert_eq!(e["pub"]["offset"], i);
        last_id = id;
    }
    // Keepalives (a `ping` push the page sees, without an id) arrive on a quiet stream.
    while sse.next().await.unwrap() != r#"data: {"ping":{}}"# {}
    drop(sse);
    for i in 4..=5 {
        server.publish("news", json!(i)).await;
    }
    let r = http
        .get(server.url("/connection/sse?channel=news"))
        .header("Last-Event-ID", last_id.unwrap())
        .send()
        .await
        .unwrap();
    let mut sse = Lines::new(r);
    let mut got = Vec::new();
    while got.len() < 2 {
        let (_, e) = sse.next_event().await.unwrap();
        assert!(
            e.get("subscribe").is_none(),
            "a complete resume needs no announcement: {e}"
        );
        if let Some(o) = e["pub"]["offset"].as_u64() {
            got.push(o);
        }
    }
    assert_eq!(got, [4, 5]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn http_streaming_sends_commands_through_the_session_and_replies_in_order() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let session = commands_for_a_stream_travel_in_it(&server, &server).await;
    let (status, _) = response(
        http.post(server.url(&format!("/connection/send?session={session}")))
            .body("{\"ping\":{}}")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 409, "the stream is gone");
    let unknown = http
        .post(server.url("/connection/send?session=nope"))
        .body("{\"ping\":{}}")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 409);
    // Without a session, stateless commands are answered in the response.
    let r = http
        .post(server.url("/connection/send"))
        .body("{\"id\":7,\"history\":{\"channel\":\"open:a\"}}")
        .send()
        .await
        .unwrap();
    let reply: Value = serde_json::from_str(r.text().await.unwrap().trim()).unwrap();
    assert_eq!(reply["history"]["offset"], 1);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_stream_may_open_empty_and_take_its_channels_through_send() {
    let server = start(config()).await;
    server.publish("open:later", json!("old")).await;
    let http = reqwest::Client::new();
    let mut s = Lines::new(
        http.get(server.url("/connection/stream"))
            .send()
            .await
            .unwrap(),
    );
    let session = s.session().await;
    let r = http
        .post(server.url(&format!("/connection/send?session={session}")))
        .body("{\"id\":1,\"subscribe\":{\"channel\":\"open:later\",\"since\":{\"offset\":0}}}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let reply: Value = serde_json::from_str(&s.next().await.unwrap()).unwrap();
    assert_eq!(reply["id"], 1, "{reply}");
    assert_eq!(reply["subscribe"]["recovered"], true, "{reply}");
    assert_eq!(
        reply["subscribe"]["publications"][0]["data"], "old",
        "{reply}"
    );
    server.publish("open:later", json!("new")).await;
    let live: Value = serde_json::from_str(&s.next().await.unwrap()).unwrap();
    assert_eq!(
        (live["pub"]["offset"].as_u64(), &live["pub"]["data"]),
        (Some(2), &json!("new"))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn long_poll_batches_what_is_new_holds_when_nothing_is_and_times_out() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let (_, epoch) = server.publish("lp", json!(0)).await;
    for i in 1..=4 {
        server.publish("lp", json!(i)).await;
    }
    let poll = |cursor: String, timeout: &str| {
        let url = server.url(&format!(
            "/connection/longpoll?channel=lp&cursor={}&timeout={timeout}",
            urlencode(&cursor)
        ));
        let http = http.clone();
        async move { response(http.get(url).send().await.unwrap()).await }
    };
    let (status, answer) = poll(format!("lp;{epoch};1"), "10").await;
    assert_eq!(status, 200);
    assert_eq!(
        offsets_of(&answer["messages"]),
        [2, 3, 4, 5],
        "everything new in one answer"
    );
    let cursor = answer["cursor"].as_str().unwrap().to_string();
    assert_eq!(cursor, format!("lp;{epoch};5"));

    let started = Instant::now();
    let (_, empty) = poll(cursor.clone(), "300ms").await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(empty["messages"], json!([]));
    assert_eq!(empty["cursor"], cursor.as_str());

    let held = tokio::spawn(poll(cursor, "10"));
    eventually("the long-poll is waiting", || async {
        server.node.hub.channel_count() == 1
    })
    .await;
    server.publish("lp", json!(6)).await;
    let (_, woke) = held.await.unwrap();
    assert_eq!(offsets_of(&woke["messages"]), [6]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn polling_answers_at_once_with_nothing_then_something() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let (status, first) = response(
        http.get(server.url("/connection/poll?channel=p"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(first["messages"][0]["subscribe"]["offset"], 0);
    let cursor = urlencode(first["cursor"].as_str().unwrap());
    let url = server.url(&format!("/connection/poll?cursor={cursor}"));
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.headers()["cache-control"], "private, no-cache");
    let etag = r.headers()["etag"].clone();
    assert_eq!(response(r).await.1["messages"], json!([]));
    let r = http
        .get(&url)
        .header("If-None-Match", etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        304,
        "nothing new: the cached answer is still good"
    );
    server.publish("p", json!("x")).await;
    let r = http
        .get(&url)
        .header("If-None-Match", etag)
        .send()
        .await
        .unwrap();
    let (status, answer) = response(r).await;
    assert_eq!(status, 200);
    assert_eq!(offsets_of(&answer["messages"]), [1]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_forever_frame_is_html_that_no_payload_can_break_out_of() {
    let mut cfg = config();
    cfg.http.iframe_max_lifetime = Duration::from_millis(300);
    let server = start(cfg).await;
    let hostile = "</script><script>alert(1)</script><!-- \u{2028}";
    let (_, epoch) = server.publish("f", json!({ "t": hostile })).await;
    let url = server.url(&format!(
        "/connection/iframe?callback=onHerald&cursor={}",
        urlencode(&format!("f;{epoch};0"))
    ));
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    // The response ends by itself at its maximum lifetime.
    let page = r.text().await.unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.len() > 2048, "padding for incremental rendering");
    assert!(page.trim_end().ends_with("</body></html>"));
    let mut calls = Vec::new();
    for line in page.lines().filter(|l| l.starts_with("<script>")) {
        let inner = line
            .strip_prefix("<script>parent.onHerald(")
            .unwrap()
            .strip_suffix(");</script>")
            .unwrap();
        assert!(!inner.contains('<'), "no markup inside a script: {inner}");
        calls.push(serde_json::from_str::<Value>(inner).unwrap());
    }
    assert_eq!(calls.len(), page.matches("<script").count());
    let publication = calls.iter().find(|c| c.get("pub").is_some()).unwrap();
    assert_eq!(publication["pub"]["data"]["t"], hostile);
    assert_eq!(
        calls.last().unwrap()["disconnect"]["code"],
        3007,
        "tells the page to reopen"
    );

    for bad in ["alert(1)", "a.b", ""] {
        let r = reqwest::get(server.url(&format!(
            "/connection/iframe?channel=f&callback={}",
            urlencode(bad)
        )))
        .await
        .unwrap();
        assert_eq!(r.status(), 400, "{bad:?}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn http_transports_refuse_bad_requests_clearly() {
    let server = start(config()).await;
    for (path, code) in [
        ("/connection/poll", 107),
        ("/connection/longpoll", 107),
        ("/connection/sse?channel=a%20b", 114),
        ("/connection/poll?channel=a&cursor=garbage", 107),
        ("/connection/longpoll?channel=a&bogus=1", 107),
    ] {
        let (status, body) = response(reqwest::get(server.url(path)).await.unwrap()).await;
        assert_eq!(body["error"]["code"], code, "{path}: {status} {body}");
    }
    let forbidden = reqwest::Client::new()
        .get(server.url("/connection/sse?channel=a"))
        .header("Origin", "https://elsewhere.example")
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 403);
    server.stop().await.unwrap();
}

/// Sends `request` on `s` and reads one answer: its head (lowercased) and the body its
/// content-length says.
pub async fn raw_answer(s: &mut tokio::net::TcpStream, request: &str) -> (String, String) {
    use tokio::io::AsyncWriteExt;
    s.write_all(request.as_bytes()).await.unwrap();
    read_answer(s).await
}

/// The next answer on `s`: its head (lowercased) and its body.
pub async fn read_answer(s: &mut tokio::net::TcpStream) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.parse::<usize>().unwrap());
            if got.len() >= end + 4 + length {
                return (head, text[end + 4..end + 4 + length].to_owned());
            }
        }
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("answer in time")
            .unwrap();
        assert!(n > 0, "closed before the answer: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Opens a stream on `stream_on` and sends it commands through `send_to` (the same node, or
/// another): their replies arrive in the stream in order, then a publication on a channel
/// the send subscribed to; a malformed frame is refused and ends the stream. Returns the
/// (now closed) session id.
pub async fn commands_for_a_stream_travel_in_it(
    stream_on: &TestServer,
    send_to: &TestServer,
) -> String {
    let http = reqwest::Client::new();
    let mut s = Lines::new(
        http.get(stream_on.url("/connection/stream?channel=open:a"))
            .send()
            .await
            .unwrap(),
    );
    let session = s.session().await;
    let _subscribed = s.next().await.unwrap();

    let send = |body: &'static str| {
        http.post(send_to.url(&format!("/connection/send?session={session}")))
            .body(body)
            .send()
    };
    let r = send("{\"id\":1,\"publish\":{\"channel\":\"open:a\",\"data\":\"hi\"}}\n{\"id\":2,\"subscribe\":{\"channel\":\"open:b\"}}").await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        lines.push(serde_json::from_str::<Value>(&s.next().await.unwrap()).unwrap());
    }
    // The frame's replies first, then what was published meanwhile.
    assert_eq!(lines[0]["id"], 1, "{lines:?}");
    assert_eq!(lines[0]["publish"]["offset"], 1);
    assert_eq!(lines[1]["id"], 2);
    assert_eq!(lines[2]["pub"]["data"], "hi");
    send_to.publish("open:b", json!("b1")).await;
    let b: Value = serde_json::from_str(&s.next().await.unwrap()).unwrap();
    assert_eq!(b["pub"]["channel"], "open:b");

    // A frame the session cannot trust ends the stream with a reason, and the sender is told.
    let (status, body) = response(send("{\"id\":3,\"publish\":").await.unwrap()).await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (400, Some(107)),
        "{body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("malformed"));
    let end: Value = serde_json::from_str(&s.next().await.unwrap()).unwrap();
    assert_eq!(end["disconnect"]["code"], 3501, "{end}");
    assert_eq!(s.next().await, None, "the stream ends");
    session
}

/// Review item 15: an SSE event id carries the whole cursor and returns as `Last-Event-ID`;
/// subscriptions that would make it longer than a header can carry are refused up front.
#[tokio::test]
async fn an_sse_stream_takes_no_more_channels_than_its_event_id_can_carry() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let names = |n: usize| -> String {
        (0..n)
            .map(|i| format!("channel={}{i:03}", "n".repeat(240)))
            .collect::<Vec<_>>()
            .join("&")
    };
    let r = http
        .get(server.url(&format!("/connection/sse?{}", names(40))))
        .send()
        .await
        .unwrap();
    assert_eq!(status_and_code(r).await, (503, Some(106)));
    let fits = http
        .get(server.url(&format!("/connection/sse?{}", names(20))))
        .send()
        .await
        .unwrap();
    assert_eq!(fits.status(), 200);
    server.stop().await.unwrap();
}
