//! The backend HTTP API: keys, publish, broadcast, history, info.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn the_api_refuses_missing_and_wrong_keys() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let body = json!({ "channel": "x", "data": 1 });
    let (status, r) = response(
        http.post(server.url("/api/publish"))
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, r["error"]["code"].as_u64()), (401, Some(101)));
    let wrong = http
        .post(server.url("/api/publish"))
        .header("Authorization", "apikey nope")
        .json(&body);
    let (status, _) = response(wrong.send().await.unwrap()).await;
    assert_eq!(status, 401);
    let (status, _) = response(http.get(server.url("/api/info")).send().await.unwrap()).await;
    assert_eq!(status, 401);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn without_a_configured_key_the_api_is_closed_and_says_how_to_open_it() {
    let mut cfg = config();
    cfg.api_key = None;
    let server = start(cfg).await;
    let (status, r) = server
        .api_post("/api/publish", json!({ "channel": "x", "data": 1 }))
        .await;
    assert_eq!(status, 503);
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("api_key") && message.contains("HERALD_API_KEY"),
        "{message}"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn publish_broadcast_history_and_info() {
    let server = start(config()).await;
    let mut c = server.client().await;
    c.subscribe("b1", None).await;
    let (status, r) = server
        .api_post(
            "/api/broadcast",
            json!({ "channels": ["b1", "b2", "bad name"], "data": { "k": 1 } }),
        )
        .await;
    assert_eq!(status, 200);
    let results = r["results"].as_array().unwrap();
    assert_eq!(results[0]["offset"], 1);
    assert_eq!(results[1]["offset"], 1);
    assert_eq!(results[2]["error"]["code"], 114);
    assert_eq!(c.next_pub().await, ("b1".into(), 1, json!({ "k": 1 })));

    server.publish("b1", json!(2)).await;
    let (status, h) = server.api_get("/api/history?channel=b1&since=1").await;
    assert_eq!(status, 200);
    assert_eq!(h["offset"], 2);
    assert_eq!(h["publications"], json!([{ "offset": 2, "data": 2 }]));
    let (status, h) = server
        .api_get("/api/history?channel=b1&since=1&epoch=stale")
        .await;
    assert_eq!((status, h["error"]["code"].as_u64()), (409, Some(112)));
    // Offset 0 holds nothing of the stale epoch: the whole stream is what it lacks.
    let (status, h) = server
        .api_get("/api/history?channel=b1&since=0&epoch=stale")
        .await;
    assert_eq!(status, 200);
    assert_eq!(h["publications"].as_array().unwrap().len(), 2);

    let (status, info) = server.api_get("/api/info").await;
    assert_eq!(status, 200);
    assert_eq!(info["connections"], 1);
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["storage"], "memory");
    assert!(!info["node"].as_str().unwrap().is_empty(), "{info}");

    let (status, bad) = server
        .api_post("/api/publish", json!({ "channel": "x" }))
        .await;
    assert_eq!((status, bad["error"]["code"].as_u64()), (400, Some(107)));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn removing_history_starts_a_new_epoch() {
    let server = start(config()).await;
    let (_, before) = server.publish("gone", json!(1)).await;
    let r = reqwest::Client::new()
        .delete(server.url("/api/history?channel=gone"))
        .header("Authorization", format!("apikey {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (offset, after) = server.publish("gone", json!(2)).await;
    assert_eq!(offset, 1);
    assert_ne!(after, before);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn api_keys_can_be_limited_to_publishing_or_reading() {
    use herald_server::config::{ApiKey, ApiScope};
    let mut cfg = config();
    cfg.api_keys = vec![
        ApiKey::Scoped {
            key: "pub-only-key-0123".into(),
            scope: ApiScope::Publish,
        },
        ApiKey::Scoped {
            key: "read-only-key-0123".into(),
            scope: ApiScope::Read,
        },
    ];
    let server = start(cfg).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, key: &str| {
        let r = http
            .request(method, server.url(path))
            .header("Authorization", format!("apikey {key}"))
            .json(&json!({ "channel": "news", "data": 1 }));
        async move { response(r.send().await.unwrap()).await }
    };
    use reqwest::Method;
    assert_eq!(
        call(Method::POST, "/api/publish", "pub-only-key-0123")
            .await
            .0,
        200
    );
    let (status, body) = call(
        Method::GET,
        "/api/history?channel=news",
        "pub-only-key-0123",
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (403, Some(103)),
        "{body}"
    );
    assert_eq!(
        call(
            Method::GET,
            "/api/history?channel=news",
            "read-only-key-0123"
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(Method::GET, "/api/info", "read-only-key-0123").await.0,
        200
    );
    assert_eq!(
        call(Method::POST, "/api/publish", "read-only-key-0123")
            .await
            .0,
        403
    );
    assert_eq!(
        call(
            Method::DELETE,
            "/api/history?channel=news",
            "read-only-key-0123"
        )
        .await
        .0,
        403
    );
    assert_eq!(call(Method::POST, "/api/publish", "wrong").await.0, 401);
    // Issue #38, item 6: HEAD is a read, authorised as GET (it used to be the other way
    // round: 200 for the publish-only key, 403 for the read-only one).
    for path in ["/api/history?channel=news", "/api/info"] {
        assert_eq!(
            call(Method::HEAD, path, "pub-only-key-0123").await.0,
            403,
            "{path}"
        );
        assert_eq!(
            call(Method::HEAD, path, "read-only-key-0123").await.0,
            200,
            "{path}"
        );
    }
    // The full key still may do everything.
    assert_eq!(call(Method::GET, "/api/info", KEY).await.0, 200);
    server.stop().await.unwrap();
}
