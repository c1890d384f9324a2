//! The dashboard's channel (issue #16, item 3): figures published every second while a
//! dashboard watches, readable only with a ticket from the API.

use serde_json::json;

use crate::{
    auth::{auth_config, claims, hs256},
    support::*,
};

#[tokio::test]
async fn herald_channels_are_read_by_dashboard_tickets_only() {
    let server = start(auth_config()).await;
    // Anonymous, and a user whose token grants every channel: refused alike.
    let mut anonymous = server.client().await;
    let refused = anonymous
        .call("subscribe", json!({ "channel": "herald:stats" }))
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    let mut everything = server.client().await;
    everything
        .call(
            "connect",
            json!({ "token": hs256(&claims("42", json!({ "subscribe": ["*"] }))) }),
        )
        .await;
    let refused = everything
        .call("subscribe", json!({ "channel": "herald:stats" }))
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/api/dashboard/ticket"),
        "{refused}"
    );

    // A ticket from the API opens a connection that reads them, and the node publishes
    // its figures once someone watches.
    let (status, ticket) = server.api_get("/api/dashboard/ticket").await;
    assert_eq!(status, 200, "{ticket}");
    let mut dashboard = server.client().await;
    let connected = dashboard
        .call("connect", json!({ "token": ticket["token"] }))
        .await;
    assert!(connected.get("error").is_none(), "{connected}");
    dashboard.subscribe("herald:stats", None).await;
    let (channel, _, data) = dashboard.next_pub().await;
    assert_eq!(channel, "herald:stats");
    let own = &data["nodes"][0];
    assert_eq!(own["node"], server.node.id.as_ref(), "{data}");
    assert_eq!(own["connections"]["websocket"], 3.0, "{own}");
    assert!(own["thread_cpu_seconds_total"].is_object(), "{own}");
    assert!(own["latency_ms"]["command"].is_object(), "{own}");
    // Read only: not even a dashboard publishes there.
    let refused = dashboard
        .call("publish", json!({ "channel": "herald:stats", "data": 1 }))
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    // And a ticket (which any API key gets, a read-only one too) is no application user:
    // the channels authenticated users may read or write stay closed to it.
    for (method, params) in [
        ("subscribe", json!({ "channel": "user:42" })),
        ("subscribe", json!({ "channel": "chat:room" })),
        ("history", json!({ "channel": "chat:room" })),
        ("publish", json!({ "channel": "open:room", "data": 1 })),
        ("rpc", json!({ "method": "x", "data": {} })),
    ] {
        let refused = dashboard.call(method, params.clone()).await;
        assert_eq!(
            refused["error"]["code"], 103,
            "{method} {params}: {refused}"
        );
    }

    // A ticket of a server with other API keys is refused like a bad token (nodes that
    // share their keys accept each other's).
    let mut other_keys = config();
    other_keys.api_keys = vec![herald_server::config::ApiKey::Full(
        KEY.to_string() + "-other",
    )];
    let other = start(other_keys).await;
    let (_, foreign) = other.api_get("/api/dashboard/ticket").await;
    let mut forger = server.client().await;
    forger
        .send_text(json!({ "id": 1, "connect": { "token": foreign["token"] } }).to_string())
        .await;
    let closed = forger.closed().await;
    assert_eq!(closed.code, 3500);
    assert!(closed.reason.contains("dashboard ticket"), "{closed:?}");
}

#[test]
fn a_configuration_cannot_take_the_herald_namespace() {
    let mut c = config();
    c.namespaces.insert("herald".into(), Default::default());
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("namespaces.herald"), "{e}");
}

/// With several nodes, the watched node publishes every node's figures (the others'
/// from their reports, every 2 s).
#[tokio::test]
async fn a_dashboard_on_one_node_sees_every_node() {
    let redis = RedisServer::start();
    let a = start_on_redis(config(), &redis).await;
    let b = start_on_redis(config(), &redis).await;
    let _on_a = a.client().await;
    let (_, ticket) = b.api_get("/api/dashboard/ticket").await;
    let mut dashboard = b.client().await;
    dashboard
        .call("connect", json!({ "token": ticket["token"] }))
        .await;
    dashboard.subscribe("herald:stats", None).await;
    // Each publication comes within a second; the other node's within two reports.
    let (first, other) = tokio::time::timeout(PATIENCE, async {
        loop {
            let (_, _, data) = dashboard.next_pub().await;
            let nodes = data["nodes"].as_array().unwrap().clone();
            if let Some(other) = nodes.iter().find(|n| n["node"] == a.node.id.as_ref()) {
                return (nodes[0]["node"].clone(), other.clone());
            }
        }
    })
    .await
    .expect("the other node's figures in time");
    assert_eq!(first, b.node.id.as_ref(), "the watched node first");
    assert_eq!(other["connections"]["websocket"], 1.0, "{other}");
    let (_, listed) = b.api_get("/api/nodes").await;
    assert!(listed["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["digest"]["node"] == a.node.id.as_ref()));
}
