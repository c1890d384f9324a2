//! Replies, replays and HTTP answers are bounded in bytes: large history is read in pages,
//! and a request of many reads is answered in pieces (review item 2).

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

fn text(bytes: usize) -> Value {
    json!("x".repeat(bytes))
}

#[tokio::test]
async fn history_is_read_in_pages_bounded_in_bytes() {
    let mut cfg = config();
    cfg.client.max_history_bytes = 2000;
    let server = start(cfg).await;
    let mut epoch = String::new();
    for _ in 0..10 {
        epoch = server.publish("open:big", text(500)).await.1;
    }
    let mut c = server.client().await;
    let mut since = 0;
    let mut read = Vec::new();
    let mut pages = 0;
    while since < 10 {
        let page = c
            .call(
                "history",
                json!({ "channel": "open:big", "since": { "offset": since, "epoch": epoch } }),
            )
            .await;
        let got = offsets(&page["history"]);
        assert!(
            (1..=3).contains(&got.len()),
            "a page holds what fits in 2000 bytes: {got:?}"
        );
        assert_eq!(
            page["history"]["offset"], 10,
            "the answer says where the stream is"
        );
        since = *got.last().unwrap();
        read.extend(got);
        pages += 1;
    }
    assert_eq!(read, (1..=10).collect::<Vec<_>>());
    assert!(pages >= 4);
    // The API pages the same way.
    let (status, api) = server
        .api_get(&format!(
            "/api/history?channel=open:big&since=0&epoch={epoch}"
        ))
        .await;
    assert_eq!(status, 200, "{api}");
    assert_eq!(offsets(&api), [1, 2, 3]);

    // A resume that needs more than the bound is not partly sent: it says so.
    let resumed = c.subscribe("open:big", Some((0, &epoch))).await;
    assert_eq!(resumed["recovered"], false);
    assert!(offsets(&resumed).is_empty());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_frame_of_many_history_reads_is_answered_in_pieces() {
    let server = start(config()).await;
    for _ in 0..10 {
        server.publish("open:many", text(5000)).await;
    }
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/connection/websocket", server.addr))
            .await
            .unwrap();
    let frame: Vec<String> = (1..=40)
        .map(|id| json!({ "id": id, "history": { "channel": "open:many" } }).to_string())
        .collect();
    ws.send(Message::Text(frame.join("\n").into()))
        .await
        .unwrap();
    let (mut replies, mut messages, mut largest) = (0, 0, 0);
    while replies < 40 {
        let message = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("replies in time")
            .unwrap()
            .unwrap();
        let Message::Text(t) = message else { continue };
        messages += 1;
        largest = largest.max(t.len());
        for line in t.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(offsets(&v["history"]).len(), 10, "{line:.200}");
            replies += 1;
        }
    }
    assert!(messages > 1, "2 MB of replies came as one message");
    assert!(largest < 200_000, "a message of {largest} bytes");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_poll_answer_is_bounded_and_its_cursor_carries_what_is_left() {
    let server = start(config()).await;
    for c in ["open:p1", "open:p2", "open:p3"] {
        for _ in 0..10 {
            server.publish(c, text(60_000)).await;
        }
    }
    let http = reqwest::Client::new();
    let poll = |cursor: String| {
        let http = http.clone();
        let url = server.url(&format!(
            "/connection/poll?cursor={}",
            cursor.replace(';', "%3B").replace('|', "%7C")
        ));
        async move {
            let body = http.get(url).send().await.unwrap().bytes().await.unwrap();
            (body.len(), serde_json::from_slice::<Value>(&body).unwrap())
        }
    };
    let channels = |answer: &Value| -> Vec<(String, u64)> {
        answer["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m.get("pub"))
            .map(|p| {
                (
                    p["channel"].as_str().unwrap().to_owned(),
                    p["offset"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (size, first) = poll("open:p1;*;0|open:p2;*;0|open:p3;*;0".into()).await;
    assert!(size < 2 << 20, "an answer of {size} bytes");
    let got = channels(&first);
    assert_eq!(got.len(), 20, "two channels' replays fit: {:?}", &got[..]);
    assert!(got.iter().all(|(c, _)| c != "open:p3"));
    let cursor = first["cursor"].as_str().unwrap().to_owned();
    assert!(cursor.contains("open:p3;*;0"), "{cursor}");
    let (_, second) = poll(cursor).await;
    let rest = channels(&second);
    assert_eq!(
        rest,
        (1..=10)
            .map(|o| ("open:p3".to_owned(), o))
            .collect::<Vec<_>>(),
        "the next poll continues where the first stopped"
    );
    server.stop().await.unwrap();
}

/// Review item 19: the same positions give the same ETag, whatever the channel count.
#[tokio::test]
async fn a_poll_of_several_channels_has_a_stable_etag() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let query: Vec<String> = (0..8).map(|i| format!("channel=e{i}")).collect();
    let url = server.url(&format!("/connection/poll?{}", query.join("&")));
    let etag = || async {
        let r = http.get(&url).send().await.unwrap();
        r.headers()["etag"].to_str().unwrap().to_owned()
    };
    let first = etag().await;
    for _ in 0..5 {
        assert_eq!(etag().await, first);
    }
    server.stop().await.unwrap();
}
