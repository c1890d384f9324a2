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
            client_subscribe: Some(false),
            client_publish: Some(false),
            client_history: Some(false),
            ..Default::default()
        },
    );
    cfg.namespaces.insert(
        "tiny".into(),
        NamespaceOverride {
            client_publish: Some(true),
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
        let (status, body) = response(
            http.get(server.url(&format!("/connection/{path}channel=locked:a")))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_u64()),
            (403, Some(103)),
            "{path}"
        );
    }
    // Sending over HTTP checks the same rules.
    let body = "{\"id\":1,\"publish\":{\"channel\":\"locked:a\",\"data\":1}}\n{\"id\":2,\"history\":{\"channel\":\"locked:a\"}}\n{\"id\":3,\"publish\":{\"channel\":\"tiny:a\",\"data\":\"far too long\"}}";
    let text = http
        .post(server.url("/connection/send"))
        .body(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let codes: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["error"]["code"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(codes, [103, 103, 113]);
    // The API is the backend's: it may publish anywhere.
    server.publish("locked:a", json!("from the backend")).await;
    server.stop().await.unwrap();
}
