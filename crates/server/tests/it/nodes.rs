//! Nodes sharing channels through Redis: what one node's client does reaches another's.

use serde_json::Value;

use crate::{http::commands_for_a_stream_travel_in_it, support::*};

#[tokio::test]
async fn a_send_reaches_a_stream_held_by_another_node() {
    let redis = RedisServer::start();
    let a = start_on_redis(config(), &redis).await;
    let b = start_on_redis(config(), &redis).await;
    // The load balancer sends the stream to A and every POST to B.
    let session = commands_for_a_stream_travel_in_it(&a, &b).await;
    let (_, info) = a.api_get("/api/info").await;
    assert_eq!(info["storage"], "redis");
    assert!(
        session.starts_with(&format!("{}-", info["node"].as_str().unwrap())),
        "a session id names its node: {session} {info}"
    );
    let http = reqwest::Client::new();
    let send = |session: String| {
        http.post(b.url(&format!("/connection/send?session={session}")))
            .body("{\"ping\":{}}")
            .send()
    };
    let (status, body) = response(send(session).await.unwrap()).await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (409, Some(116)),
        "the stream is gone: {body}"
    );
    // A session of a node that is not there fails at once.
    let (status, body): (u16, Value) = response(send("nonode-1-0".into()).await.unwrap()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not connected"),
        "{body}"
    );
    // The failed request counts as a broker error; the pub/sub lag probe is measured.
    eventually("the failed ask is counted and the lag measured", || async {
        let text = b.metrics().await;
        text.contains("herald_broker_errors_total{operation=\"ask_node\"} 1\n")
            && text.contains("herald_broker_lag_seconds ")
    })
    .await;
    // One that cannot be any node's is refused without asking anyone.
    let (status, body): (u16, Value) =
        response(send("not%20a%20node-1-0".into()).await.unwrap()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no open stream"),
        "{body}"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Issue #16, item 2: one request lists every live node with its figures.
#[tokio::test]
async fn every_node_lists_every_live_node() {
    let redis = RedisServer::start();
    let a = start_on_redis(config(), &redis).await;
    let b = start_on_redis(config(), &redis).await;
    let ids = |v: &Value| -> Vec<String> {
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["node"].as_str().unwrap().to_string())
            .collect()
    };
    let mut expected = vec![a.node.id.to_string(), b.node.id.to_string()];
    expected.sort();
    // Each node reports when it starts, then every 2 s.
    eventually("both nodes listed by each", || async {
        ids(&a.api_get("/api/nodes").await.1) == expected
            && ids(&b.api_get("/api/nodes").await.1) == expected
    })
    .await;
    let (_, listed) = a.api_get("/api/nodes").await;
    for n in listed["nodes"].as_array().unwrap() {
        assert_eq!(n["storage"], "redis", "{n}");
        assert!(n["connections"].is_u64() && n["deliveries"].is_u64(), "{n}");
    }
}

#[tokio::test]
async fn a_node_alone_lists_itself() {
    let server = start(config()).await;
    let (status, listed) = server.api_get("/api/nodes").await;
    assert_eq!(status, 200);
    let nodes = listed["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{listed}");
    assert_eq!(nodes[0]["node"], &*server.node.id);
}
