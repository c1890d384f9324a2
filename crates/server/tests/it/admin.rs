//! Operators' actions (issue #16, item 4): find a user's connections, list channels,
//! unsubscribe and disconnect, on any transport and from any node.

use serde_json::{json, Value};

use crate::{
    auth::{auth_config, claims, hs256},
    http::{urlencode, Lines},
    support::*,
};

/// A WebSocket client connected as `user`; returns it and its client id.
async fn connected_as(server: &TestServer, user: &str) -> (Client, String) {
    let mut c = server.client().await;
    let reply = c
        .call(
            "connect",
            json!({ "token": hs256(&claims(user, json!({}))) }),
        )
        .await;
    let id = reply["connect"]["client"].as_str().unwrap().to_string();
    (c, id)
}

/// The next line of an NDJSON stream, as JSON.
async fn next_json(lines: &mut Lines) -> Value {
    serde_json::from_str(&lines.next().await.expect("the stream goes on")).unwrap()
}

#[tokio::test]
async fn an_operator_finds_unsubscribes_and_disconnects_a_users_connections() {
    let server = start(auth_config()).await;
    let (mut ws, ws_id) = connected_as(&server, "42").await;
    ws.subscribe("open:room", None).await;
    let token = hs256(&claims("42", json!({})));
    let http = reqwest::Client::new();
    let stream = http
        .get(server.url(&format!(
            "/connection/stream?channel=open:room&token={}",
            urlencode(&token)
        )))
        .send()
        .await
        .unwrap();
    let mut stream = Lines::new(stream);
    let stream_id = stream.session().await;
    assert_eq!(
        next_json(&mut stream).await["subscribe"]["channel"],
        "open:room"
    );
    let (mut other, _) = connected_as(&server, "7").await;
    other.subscribe("open:room", None).await;
    other.subscribe("open:lobby", None).await;

    // Lookup: both of user 42's connections, with their transports and channels.
    let (status, found) = server.api_get("/api/connections?user=42").await;
    assert_eq!(status, 200, "{found}");
    let mut seen: Vec<(String, String)> = found["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["user"], "42");
            assert_eq!(c["channels"], json!(["open:room"]), "{c}");
            assert_eq!(c["node"], server.node.id.as_ref());
            (
                c["client"].as_str().unwrap().into(),
                c["transport"].as_str().unwrap().into(),
            )
        })
        .collect();
    seen.sort();
    let mut expected = vec![
        (ws_id.clone(), "websocket".to_string()),
        (stream_id, "stream".into()),
    ];
    expected.sort();
    assert_eq!(seen, expected);

    // Channels with their subscribers, paged by name.
    let (_, page) = server.api_get("/api/channels?limit=1").await;
    assert_eq!(
        page["channels"],
        json!([{ "channel": "open:lobby", "subscribers": 1 }])
    );
    let cursor = page["cursor"].as_str().unwrap();
    let (_, page) = server
        .api_get(&format!("/api/channels?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(
        page["channels"],
        json!([{ "channel": "open:room", "subscribers": 3 }])
    );
    let (_, page) = server.api_get("/api/channels?prefix=open:r").await;
    assert_eq!(page["channels"].as_array().unwrap().len(), 1, "{page}");
    assert!(page.get("cursor").is_none(), "{page}");

    // Unsubscribe user 42 from the room: both connections are told (120), the other
    // subscriber keeps receiving, and 42's connections get nothing more of the room.
    let (status, done) = server
        .api_post(
            "/api/unsubscribe",
            json!({ "user": "42", "channel": "open:room" }),
        )
        .await;
    assert_eq!((status, done), (200, json!({ "unsubscribed": 2 })));
    let told = ws.next_line().await;
    assert_eq!(told["unsubscribe"]["channel"], "open:room", "{told}");
    assert_eq!(told["unsubscribe"]["code"], 120, "{told}");
    let told = next_json(&mut stream).await;
    assert_eq!(told["unsubscribe"]["code"], 120, "{told}");
    let (offset, _) = server.publish("open:room", json!("after")).await;
    assert_eq!(other.next_pub().await.1, offset);
    // A ping answered after the publication: had the room still reached 42, its push
    // would have come first.
    let pong = ws.call("ping", json!({})).await;
    assert!(pong.get("error").is_none(), "{pong}");
    assert!(ws.set_aside_line().is_none(), "nothing but the reply");
    let (_, page) = server.api_get("/api/channels?prefix=open:room").await;
    assert_eq!(
        page["channels"],
        json!([{ "channel": "open:room", "subscribers": 1 }])
    );

    // Disconnect one client with the application's own code and reason.
    let (status, done) = server
        .api_post(
            "/api/disconnect",
            json!({ "client": ws_id, "code": 4501, "reason": "banned" }),
        )
        .await;
    assert_eq!((status, done), (200, json!({ "disconnected": 1 })));
    let closed = ws.closed().await;
    assert_eq!((closed.code, closed.reason.as_str()), (4501, "banned"));
    // Then the user's remaining connection, with the default code (reconnect).
    let (_, done) = server
        .api_post("/api/disconnect", json!({ "user": "42" }))
        .await;
    assert_eq!(done, json!({ "disconnected": 1 }));
    let end = next_json(&mut stream).await;
    assert_eq!(end["disconnect"]["code"], 3007, "{end}");
    assert_eq!(end["disconnect"]["reconnect"], true, "{end}");
    assert!(stream.next().await.is_none(), "the stream ended");
    eventually("user 42 has no connection left", || async {
        let (_, found) = server.api_get("/api/connections?user=42").await;
        found["connections"] == json!([])
    })
    .await;
    // The other user was not touched.
    server.publish("open:lobby", json!(1)).await;
    assert_eq!(other.next_pub().await.0, "open:lobby");
}

#[tokio::test]
async fn admin_actions_refuse_what_they_cannot_do_clearly() {
    let mut cfg = auth_config();
    cfg.api_keys = vec![herald_server::config::ApiKey::Scoped {
        key: "publisher-key-0123".into(),
        scope: herald_server::config::ApiScope::Publish,
    }];
    let server = start(cfg).await;
    let http = reqwest::Client::new();
    let post = |path: &str, key: &str, body: Value| {
        http.post(server.url(path))
            .header("authorization", format!("apikey {key}"))
            .json(&body)
            .send()
    };
    for (body, code) in [
        (json!({ "user": "42", "client": "x" }), 107),
        (json!({}), 107),
        (json!({ "user": "42", "code": 1000 }), 107),
        (json!({ "user": "42", "reason": "x".repeat(200) }), 107),
        (json!({ "user": "42", "shout": true }), 107),
    ] {
        let (status, error) =
            response(post("/api/disconnect", KEY, body.clone()).await.unwrap()).await;
        assert_eq!(
            (status, error["error"]["code"].as_u64()),
            (400, Some(code)),
            "{body}: {error}"
        );
    }
    let (status, error) = response(
        post(
            "/api/unsubscribe",
            KEY,
            json!({ "user": "42", "channel": "bad channel" }),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error["error"]["code"].as_u64()),
        (400, Some(114)),
        "{error}"
    );
    // A key that may only publish may not act on other people's connections.
    let (status, error) = response(
        post(
            "/api/disconnect",
            "publisher-key-0123",
            json!({ "user": "42" }),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 403, "{error}");
    let (status, _) = server.api_get("/api/channels?limit=0").await;
    assert_eq!(status, 400);
    // Nobody connected: nothing done, and said so.
    let (_, done) = server
        .api_post("/api/disconnect", json!({ "user": "42" }))
        .await;
    assert_eq!(done, json!({ "disconnected": 0 }));
}

/// With several nodes, any node acts on every node's connections.
#[tokio::test]
async fn any_node_acts_on_the_connections_of_every_node() {
    let redis = RedisServer::start();
    let a = start_on_redis(auth_config(), &redis).await;
    let b = start_on_redis(auth_config(), &redis).await;
    let (mut on_a, on_a_id) = connected_as(&a, "42").await;
    on_a.subscribe("open:room", None).await;
    let (mut on_b, _) = connected_as(&b, "42").await;
    on_b.subscribe("open:room", None).await;
    // B must see A among the live nodes (A reports itself every 2 s).
    eventually("both nodes listed", || async {
        let (_, nodes) = b.api_get("/api/nodes").await;
        nodes["nodes"].as_array().is_some_and(|n| n.len() == 2)
    })
    .await;
    let (_, page) = b.api_get("/api/channels?prefix=open:").await;
    assert_eq!(
        page["channels"],
        json!([{ "channel": "open:room", "subscribers": 2 }])
    );
    let (_, found) = b.api_get("/api/connections?user=42").await;
    let mut nodes: Vec<&str> = found["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["node"].as_str().unwrap())
        .collect();
    nodes.sort();
    let mut expected = vec![a.node.id.as_ref(), b.node.id.as_ref()];
    expected.sort();
    assert_eq!(nodes, expected, "{found}");
    // A client id names its node: only that node is asked.
    let (_, done) = b
        .api_post(
            "/api/disconnect",
            json!({ "client": on_a_id, "code": 3502 }),
        )
        .await;
    assert_eq!(done, json!({ "disconnected": 1 }));
    assert_eq!(on_a.closed().await.code, 3502);
    let (_, done) = a
        .api_post(
            "/api/unsubscribe",
            json!({ "user": "42", "channel": "open:room" }),
        )
        .await;
    assert_eq!(done, json!({ "unsubscribed": 1 }));
    assert_eq!(on_b.next_line().await["unsubscribe"]["code"], 120);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
