//! Namespace rules hold on every transport.

use herald_server::config::NamespaceOverride;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn namespace_rules_are_enforced_on_every_transport() {
    let mut cfg = config();
    cfg.namespaces.insert(
        "locked".into(),
        NamespaceOverride {
            subscribe: Some(Access::Nobody),
            publish: Some(Access::Nobody),
            history: Some(Access::Nobody),
            ..Default::default()
        },
    );
    cfg.namespaces.insert(
        "tiny".into(),
        NamespaceOverride {
            publish: Some(Access::Anyone),
            max_message_size: Some(10),
            ..Default::default()
        },
    );
    let server = start(cfg).await;

    // WebSocket.
    let mut c = server.client().await;
    for (method, params) in [
        ("subscribe", json!({ "channel": "locked:a" })),
        ("publish", json!({ "channel": "locked:a", "data": 1 })),
        ("history", json!({ "channel": "locked:a" })),
    ] {
        assert_eq!(
            c.call(method, params).await["error"]["code"],
            103,
            "websocket {method}"
        );
    }
    assert_eq!(
        c.call(
            "publish",
            json!({ "channel": "tiny:a", "data": "far too long" })
        )
        .await["error"]["code"],
        113
    );

    // Every HTTP transport refuses to open the channel.
    let http = reqwest::Client::new();
    for path in [
        "sse?",
        "stream?",
        "iframe?callback=cb&",
        "longpoll?",
        "poll?",
    ] {
        let r = http
            .get(server.url(&format!("/connection/{path}channel=locked:a")))
            .send()
            .await
            .unwrap();
        assert_eq!(status_and_code(r).await, (403, Some(103)), "{path}");
    }
    // Sending over HTTP checks the same rules.
    let body = "{\"id\":1,\"publish\":{\"channel\":\"locked:a\",\"data\":1}}\n{\"id\":2,\"history\":{\"channel\":\"locked:a\"}}\n{\"id\":3,\"publish\":{\"channel\":\"tiny:a\",\"data\":\"far too long\"}}";
    let codes = server.send_codes(&http, body).await;
    assert_eq!(codes, [Some(103), Some(103), Some(113)]);
    // The API is the backend's: it may publish anywhere.
    server.publish("locked:a", json!("from the backend")).await;
    server.stop().await.unwrap();
}

/// Review item 9: each read path is checked against the rules of every other, so a
/// namespace closed to history is not replayed through `since` or a cursor, and one closed
/// to subscribers is not readable through `history`.
#[tokio::test]
async fn no_read_path_reaches_further_than_another() {
    let mut cfg = config();
    cfg.namespaces.insert(
        "secret".into(),
        NamespaceOverride {
            history: Some(Access::Nobody),
            ..Default::default()
        },
    );
    cfg.namespaces.insert(
        "backend".into(),
        NamespaceOverride {
            subscribe: Some(Access::Nobody),
            history: Some(Access::Anyone),
            ..Default::default()
        },
    );
    let server = start(cfg).await;
    let mut epoch = String::new();
    for i in 1..=3 {
        epoch = server.publish("secret:x", json!(i)).await.1;
        server.publish("backend:x", json!(i)).await;
    }
    let http = reqwest::Client::new();

    // Polling from offset 0 replays nothing and says the position was not recovered.
    let (status, answer) = response(
        http.get(server.url("/connection/poll?cursor=secret:x%3B*%3B0"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let messages = answer["messages"].as_array().unwrap();
    assert!(
        messages.iter().all(|m| m.get("pub").is_none()),
        "no history through a cursor: {answer}"
    );
    assert_eq!(messages[0]["subscribe"]["recovered"], false);
    assert_eq!(answer["cursor"], format!("secret:x;{epoch};3"));

    // Over WebSocket: a resume from behind replays nothing; one that missed nothing is whole.
    let mut c = server.client().await;
    let behind = c.subscribe("secret:x", Some((0, &epoch))).await;
    assert_eq!(behind["recovered"], false, "{behind}");
    assert!(offsets(&behind).is_empty());
    let mut d = server.client().await;
    let current = d.subscribe("secret:x", Some((3, &epoch))).await;
    assert_eq!(current["recovered"], true, "{current}");
    assert_eq!(
        c.call("history", json!({ "channel": "secret:x" })).await["error"]["code"],
        103
    );

    // A namespace closed to subscribers is not readable by polling its history.
    let refused = c.call("history", json!({ "channel": "backend:x" })).await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`subscribe` is nobody"));
    server.stop().await.unwrap();
}
