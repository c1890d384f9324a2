//! Delivery over WebSocket: fan-out, client publish, batching of commands.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn every_subscriber_receives_every_publication_in_order() {
    let server = start(config()).await;
    let mut clients = Vec::new();
    for _ in 0..40 {
        let mut c = server.client().await;
        let r = c.subscribe("news", None).await;
        assert_eq!(r["offset"], 0);
        clients.push(c);
    }
    for i in 1..=25 {
        let (offset, _) = server.publish("news", json!({ "n": i })).await;
        assert_eq!(offset, i);
    }
    for c in &mut clients {
        for i in 1..=25u64 {
            assert_eq!(
                c.next_pub().await,
                ("news".to_string(), i, json!({ "n": i }))
            );
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn clients_publish_where_the_namespace_allows_it() {
    let server = start(config()).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    b.subscribe("open:room", None).await;
    let r = a
        .call(
            "publish",
            json!({ "channel": "open:room", "data": { "text": "hi" } }),
        )
        .await;
    assert_eq!(r["publish"]["offset"], 1, "{r}");
    assert_eq!(
        b.next_pub().await,
        ("open:room".into(), 1, json!({ "text": "hi" }))
    );

    let denied = a
        .call("publish", json!({ "channel": "closed", "data": 1 }))
        .await;
    assert_eq!(denied["error"]["code"], 103, "{denied}");
    assert!(denied["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`publish` is nobody"));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn several_commands_in_one_frame_each_get_a_reply() {
    let server = start(config()).await;
    let mut c = server.client().await;
    c.send_text(
        "{\"id\":1,\"connect\":{}}\n{\"id\":2,\"subscribe\":{\"channel\":\"a\"}}\n{\"id\":3,\"ping\":{}}\n{\"id\":4,\"history\":{\"channel\":\"a\"}}",
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let line = c.next_line().await;
        assert!(line.get("error").is_none(), "{line}");
        ids.push(line["id"].as_u64().unwrap());
    }
    assert_eq!(ids, [1, 2, 3, 4]);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn history_command_reads_since_a_position() {
    let server = start(config()).await;
    let mut epoch = String::new();
    for i in 1..=5 {
        epoch = server.publish("h", json!(i)).await.1;
    }
    let mut c = server.client().await;
    let r = c
        .call(
            "history",
            json!({ "channel": "h", "since": { "offset": 2, "epoch": epoch }, "limit": 2 }),
        )
        .await;
    let offsets: Vec<_> = r["history"]["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [3, 4]);
    assert_eq!(r["history"]["offset"], 5);
    let gone = c
        .call(
            "history",
            json!({ "channel": "h", "since": { "offset": 2, "epoch": "other" } }),
        )
        .await;
    assert_eq!(gone["error"]["code"], 112, "{gone}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_handshake_names_the_json_subprotocol_and_refuses_plain_requests() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let server = start(config()).await;
    let url = format!("ws://{}/connection/websocket", server.addr);
    let mut offered = url.as_str().into_client_request().unwrap();
    offered
        .headers_mut()
        .insert("sec-websocket-protocol", "herald.json".parse().unwrap());
    let (_ws, answer) = tokio_tungstenite::connect_async(offered).await.unwrap();
    assert_eq!(answer.headers()["sec-websocket-protocol"], "herald.json");
    let (_ws, answer) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    assert!(answer.headers().get("sec-websocket-protocol").is_none());

    let (status, body) = response(
        reqwest::get(server.url("/connection/websocket"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body["error"]["code"].as_u64()), (400, Some(107)));
    server.stop().await.unwrap();
}

/// A large reply arrives as one message in frames of at most 16 KiB (a client may bound
/// the frames it takes), and characters are never cut between frames.
#[tokio::test]
async fn large_messages_are_sent_in_small_frames() {
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
    let server = start(config()).await;
    // Multi-byte characters, so that a cut at a fixed byte count would land inside one.
    let text = "é€x".repeat(8_000);
    for _ in 0..4 {
        server.publish("big", json!(text)).await;
    }
    let limits = WebSocketConfig::default()
        .max_frame_size(Some(16 * 1024 + 14))
        .max_message_size(Some(1 << 20));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(
        server
            .url("/connection/websocket")
            .replacen("http", "ws", 1),
        Some(limits),
        false,
    )
    .await
    .unwrap();
    let mut c = Client::from_socket(ws);
    let reply = c
        .call("history", json!({"channel": "big", "since": {"offset": 0}}))
        .await;
    let publications = reply["history"]["publications"].as_array().unwrap();
    assert_eq!(publications.len(), 4);
    assert!(publications.iter().all(|p| p["data"] == json!(text)));
    server.stop().await.unwrap();
}
