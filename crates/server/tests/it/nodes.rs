//! Nodes sharing channels through Redis: what one node's client does reaches another's.

use serde_json::{json, Value};

use crate::{http::Lines, support::*};

#[tokio::test]
async fn a_send_reaches_a_stream_held_by_another_node() {
    let redis = RedisServer::start();
    let a = start_on_redis(config(), &redis).await;
    let b = start_on_redis(config(), &redis).await;
    let http = reqwest::Client::new();
    let mut stream = Lines::new(
        http.get(a.url("/connection/stream?channel=open:a"))
            .send()
            .await
            .unwrap(),
    );
    let connect: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    let session = connect["connect"]["client"].as_str().unwrap().to_string();
    let _subscribed = stream.next().await.unwrap();

    // The load balancer sent this POST to the other node.
    let send = |body: &'static str| {
        http.post(b.url(&format!("/connection/send?session={session}")))
            .body(body)
            .send()
    };
    let r = send("{\"id\":1,\"publish\":{\"channel\":\"open:a\",\"data\":\"hi\"}}\n{\"id\":2,\"subscribe\":{\"channel\":\"open:b\"}}").await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        lines.push(serde_json::from_str::<Value>(&stream.next().await.unwrap()).unwrap());
    }
    assert_eq!(lines[0]["id"], 1, "{lines:?}");
    assert_eq!(lines[0]["publish"]["offset"], 1);
    assert_eq!(lines[1]["id"], 2);
    assert_eq!(lines[2]["pub"]["data"], "hi");
    b.publish("open:b", json!("b1")).await;
    let pushed: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(
        (&pushed["pub"]["channel"], &pushed["pub"]["data"]),
        (&json!("open:b"), &json!("b1"))
    );

    // The owner's refusal comes back through the other node as it would locally.
    let (status, body) = response(send("{\"id\":3,\"publish\":").await.unwrap()).await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (400, Some(107)),
        "{body}"
    );
    let end: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(end["disconnect"]["code"], 3501, "{end}");
    let (status, body) = response(send("{\"ping\":{}}").await.unwrap()).await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (409, Some(116)),
        "the stream is gone: {body}"
    );

    // A session of a node that is not there.
    let r = http
        .post(b.url("/connection/send?session=nonode-1-0"))
        .body("{\"ping\":{}}")
        .send()
        .await
        .unwrap();
    let (status, body) = response(r).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not connected"),
        "{body}"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
