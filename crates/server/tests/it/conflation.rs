//! Conflation: a subscription made with `conflate` skips a publication that a later one of
//! the same conflation key replaced while it waited for the client, says which offsets it
//! skipped, and skips nothing else; other subscriptions get everything.

use serde_json::{json, Value};

use crate::{
    http::urlencode,
    longpoll::{offsets, text},
    support::*,
};

async fn publish_keyed(server: &TestServer, channel: &str, data: Value, key: Option<&str>) -> u64 {
    let mut body = json!({ "channel": channel, "data": data });
    if let Some(key) = key {
        body["conflation_key"] = key.into();
    }
    let (status, published) = server.api_post("/api/publish", body).await;
    assert_eq!(status, 200, "{published}");
    published["offset"].as_u64().unwrap()
}

/// A parked long-poll session is the slowest reader there is: everything published between
/// two requests waits. The conflating one gets the newest of each key, told which offsets
/// were skipped; the other gets every publication.
#[tokio::test]
async fn a_parked_long_poll_gets_the_newest_of_each_key_and_is_told_what_it_skipped() {
    let server = start(config()).await;
    let open = |conflate: bool| {
        let flag = if conflate { "&conflate=true" } else { "" };
        format!("/connection/longpoll?channel=prices&timeout=100ms&session_key={flag}")
    };
    let (_, conflating) = response(reqwest::get(server.url(&open(true))).await.unwrap()).await;
    let (_, plain) = response(reqwest::get(server.url(&open(false))).await.unwrap()).await;

    // BTC and ETH each change twice or more; one publication has no key.
    for (data, key) in [
        (json!({"BTC": 1}), Some("BTC")),
        (json!({"ETH": 1}), Some("ETH")),
        (json!({"BTC": 2}), Some("BTC")),
        (json!("news"), None),
        (json!({"BTC": 3}), Some("BTC")),
        (json!({"ETH": 2}), Some("ETH")),
    ] {
        publish_keyed(&server, "prices", data, key).await;
    }

    let again = |answer: &Value| {
        format!(
            "/connection/longpoll?channel=prices&cursor={}&session_key={}",
            urlencode(text(answer, "cursor")),
            text(answer, "session_key"),
        )
    };
    let (status, skipped) =
        response(reqwest::get(server.url(&again(&conflating))).await.unwrap()).await;
    assert_eq!(status, 200, "{skipped}");
    let messages = skipped["messages"].as_array().unwrap();
    // 1 and 3 (BTC) and 2 (ETH) were replaced before 4 went: one notice, then 4, 5, 6.
    assert_eq!(
        messages[0],
        json!({"conflated": {"channel": "prices", "offset": 3}}),
        "{skipped}"
    );
    assert_eq!(offsets(&skipped), [4, 5, 6]);
    let data: Vec<&Value> = messages[1..].iter().map(|m| &m["pub"]["data"]).collect();
    assert_eq!(
        data,
        [&json!("news"), &json!({"BTC": 3}), &json!({"ETH": 2})]
    );
    assert!(text(&skipped, "cursor").ends_with(";6"), "{skipped}");

    let (_, everything) = response(reqwest::get(server.url(&again(&plain))).await.unwrap()).await;
    assert_eq!(offsets(&everything), [1, 2, 3, 4, 5, 6], "{everything}");

    // History keeps every publication; a bad key is refused.
    let (_, history) = server.api_get("/api/history?channel=prices&limit=10").await;
    assert_eq!(
        history["publications"].as_array().unwrap().len(),
        6,
        "{history}"
    );
    for bad in [json!(""), json!("a\u{0}b"), json!("x".repeat(129))] {
        let body = json!({"channel": "prices", "data": 1, "conflation_key": bad});
        let (status, refused) = server.api_post("/api/publish", body).await;
        assert_eq!(
            (status, &refused["error"]["code"]),
            (400, &json!(107)),
            "{refused}"
        );
    }
    let bad = "/connection/longpoll?channel=prices&conflate=maybe";
    let (status, refused) = response(reqwest::get(server.url(bad)).await.unwrap()).await;
    assert_eq!(status, 400, "{refused}");
    server.stop().await.unwrap();
}

/// A client's `publish` command carries a conflation key as the API does (issue #58), over
/// JSON and Protobuf alike (the codecs' tests read the field); a bad key is refused with 107.
#[tokio::test]
async fn a_client_publishes_with_a_conflation_key() {
    let server = start(config()).await;
    let open = "/connection/longpoll?channel=open:prices&timeout=100ms&session_key=&conflate=true";
    let (_, parked) = response(reqwest::get(server.url(open)).await.unwrap()).await;
    let mut publisher = server.client().await;
    publisher.call("connect", json!({})).await;
    for n in 1..=3 {
        let body = json!({"channel": "open:prices", "data": {"BTC": n}, "conflation_key": "BTC"});
        let reply = publisher.call("publish", body).await;
        assert_eq!(reply["publish"]["offset"], n, "{reply}");
    }
    let bad = json!({"channel": "open:prices", "data": 0, "conflation_key": ""});
    let refused = publisher.call("publish", bad).await;
    assert_eq!(refused["error"]["code"], 107, "{refused}");

    let again = format!(
        "/connection/longpoll?channel=open:prices&cursor={}&session_key={}",
        urlencode(text(&parked, "cursor")),
        text(&parked, "session_key"),
    );
    let (status, got) = response(reqwest::get(server.url(&again)).await.unwrap()).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["messages"][0],
        json!({"conflated": {"channel": "open:prices", "offset": 2}}),
        "{got}"
    );
    assert_eq!(offsets(&got), [3]);
    server.stop().await.unwrap();
}

/// A WebSocket client that stops reading while a price changes hundreds of times: the
/// conflating one is not cut off and ends at the newest value, every offset accounted for;
/// the one that does not conflate overflows its queue and is closed as slow (3003).
#[tokio::test]
async fn a_slow_websocket_that_conflates_keeps_up_where_another_is_cut_off() {
    let mut c = config();
    c.client.queue_max_bytes = 64 * 1024;
    let server = start(c).await;
    let mut conflating = server.client().await;
    let reply = conflating
        .call("subscribe", json!({"channel": "ticker", "conflate": true}))
        .await;
    assert!(reply.get("error").is_none(), "{reply}");
    let mut plain = server.client().await;
    plain.subscribe("ticker", None).await;

    // 600 publications of 16 KB: more than the kernel's buffers and the queue hold.
    let padding = "x".repeat(16 * 1024);
    let mut last = 0;
    for i in 1..=600 {
        let data = json!({"price": i, "padding": padding});
        last = publish_keyed(&server, "ticker", data, Some("BTC")).await;
    }

    let mut at = 0;
    let (mut received, mut skipped) = (0, 0);
    while at < last {
        let line = conflating.next_line().await;
        if let Some(c) = line.get("conflated") {
            let to = c["offset"].as_u64().unwrap();
            assert!(to > at, "{line} at {at}");
            skipped += to - at;
            at = to;
        } else if let Some(p) = line.get("pub") {
            let offset = p["offset"].as_u64().unwrap();
            assert_eq!(offset, at + 1, "every offset is delivered or told skipped");
            at = offset;
            received += 1;
            if at == last {
                assert_eq!(p["data"]["price"], 600, "the newest value");
            }
        }
    }
    assert_eq!(received + skipped, last);
    assert!(
        skipped > 0,
        "the client fell behind, so something was skipped"
    );
    // Still connected: it answers.
    let pong = conflating.call("ping", json!({})).await;
    assert!(pong.get("error").is_none(), "{pong}");

    // Closed as slow: the close frame, if the server could still write it (it waits a
    // moment for a client that does not read), and counted either way.
    let closed = plain.closed().await;
    assert!([3003, 1005, 1006].contains(&closed.code), "{closed:?}");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("herald_disconnects_total{code=\"3003\"} 1\n"),
        "{metrics}"
    );
    server.stop().await.unwrap();
}
