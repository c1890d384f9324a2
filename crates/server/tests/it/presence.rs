//! Presence: who is in a channel, join/leave pushes in batches, and the reconnect grace.
//!
//! Windows end when a test says so (`end_window`): the configured window is an hour, so
//! no batch is cut by the clock behind a test's back.

use std::time::Duration;

use herald_server::config::{Config, NamespaceOverride, Presence};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{json, Value};

use crate::{http::Lines, support::*};

const SECRET: &str = "a-presence-test-secret-of-32-bytes!";

pub(crate) fn presence_config() -> Config {
    let mut c = config();
    c.auth.hmac_secret = Some(SECRET.into());
    c.presence.join_leave_window = Duration::from_secs(3600);
    c.presence.grace = Duration::from_secs(3600);
    c.namespaces.insert(
        "room".into(),
        NamespaceOverride {
            subscribe: Some(Access::Anyone),
            presence: Some(Presence::On(Access::Anyone)),
            join_leave: Some(true),
            publish: Some(Access::Anyone),
            ..Default::default()
        },
    );
    c.namespaces.insert(
        "quiet".into(),
        NamespaceOverride {
            subscribe: Some(Access::Anyone),
            ..Default::default()
        },
    );
    c.namespaces.insert(
        "staff".into(),
        NamespaceOverride {
            subscribe: Some(Access::Anyone),
            presence: Some(Presence::On(Access::Granted)),
            ..Default::default()
        },
    );
    c
}

pub(crate) fn token(user: &str, info: Value) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({ "sub": user, "info": info, "exp": exp });
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// A WebSocket client connected (with `connect` params) and subscribed to `channel`;
/// returns it and its client id.
async fn member(server: &TestServer, connect: Value, channel: &str) -> (Client, String) {
    let mut c = server.client().await;
    let reply = c.call("connect", connect).await;
    let id = reply["connect"]["client"]
        .as_str()
        .unwrap_or_else(|| panic!("connected: {reply}"))
        .to_string();
    c.subscribe(channel, None).await;
    (c, id)
}

/// A client watching `channel`: subscribed, its own join already read.
async fn watcher(server: &TestServer, channel: &str) -> Client {
    let (mut c, _) = member(server, json!({}), channel).await;
    server.node.presence.end_window().await;
    let own = next_presence(&mut c).await;
    assert_eq!(
        own["join"].as_array().unwrap().len(),
        1,
        "its own join: {own}"
    );
    c
}

/// The next `presence` push, skipping nothing else: a publication first fails the test.
async fn next_presence(c: &mut Client) -> Value {
    let line = c.next_line().await;
    assert!(
        line.get("presence").is_some(),
        "a presence push, got {line}"
    );
    line["presence"].clone()
}

fn clients(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["client"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn presence_pages_members_with_their_info_and_counts_users() {
    let server = start(presence_config()).await;
    let ch = "room:pages";
    let alice = json!({ "token": token("alice", json!({ "name": "Alice" })) });
    let (_a1, a1) = member(&server, alice.clone(), ch).await;
    let (_a2, _) = member(&server, alice, ch).await;
    let (_b, b) = member(&server, json!({ "token": token("bob", json!(null)) }), ch).await;
    let (mut anon, anon_id) = member(&server, json!({}), ch).await;

    let stats = anon.call("presence_stats", json!({ "channel": ch })).await;
    assert_eq!(
        stats["presence_stats"],
        json!({ "clients": 4, "users": 2 }),
        "four clients, two of them alice: {stats}"
    );
    let first = anon
        .call("presence", json!({ "channel": ch, "limit": 3 }))
        .await["presence"]
        .clone();
    assert_eq!(first["members"].as_array().unwrap().len(), 3);
    let cursor = first["cursor"].as_str().expect("a full page has a cursor");
    let rest = anon
        .call(
            "presence",
            json!({ "channel": ch, "limit": 3, "cursor": cursor }),
        )
        .await["presence"]
        .clone();
    assert_eq!(rest["members"].as_array().unwrap().len(), 1);
    assert!(
        rest.get("cursor").is_none(),
        "the last page has none: {rest}"
    );
    let mut all: Vec<Value> = first["members"].as_array().unwrap().clone();
    all.extend(rest["members"].as_array().unwrap().iter().cloned());
    let ids = clients(&Value::Array(all.clone()));
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), 4, "every member once: {all:?}");
    for secret in [&a1, &b, &anon_id] {
        assert!(
            !Value::from(all.clone())
                .to_string()
                .contains(secret.as_str()),
            "a connection's own id ({secret}) is a capability and never shown"
        );
    }
    let alices: Vec<&Value> = all.iter().filter(|m| m["user"] == "alice").collect();
    assert_eq!(alices.len(), 2);
    assert_eq!(alices[0]["info"], json!({ "name": "Alice" }));
    assert_eq!(all.iter().filter(|m| m.get("user").is_none()).count(), 1);

    // The API answers the same, with the key.
    let (status, api) = server
        .api_get(&format!("/api/presence_stats?channel={ch}"))
        .await;
    assert_eq!((status, api), (200, json!({ "clients": 4, "users": 2 })));
    let (status, page) = server
        .api_get(&format!("/api/presence?channel={ch}&limit=10"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(clients(&page["members"]), ids);
    let bad = anon
        .call("presence", json!({ "channel": ch, "cursor": "zz" }))
        .await;
    assert_eq!(bad["error"]["code"], 107, "{bad}");
}

#[tokio::test]
async fn presence_follows_the_namespace_rules() {
    let server = start(presence_config()).await;
    let (mut c, _) = member(&server, json!({}), "quiet:x").await;
    for method in ["presence", "presence_stats"] {
        let off = c.call(method, json!({ "channel": "quiet:x" })).await;
        assert_eq!(off["error"]["code"], 108, "presence is off there: {off}");
        // Issue #29: what a client is told holds no advice for the operator, and a client
        // that may not read a channel (anonymous, where `[channels]` needs a token) learns
        // nothing of whether presence is on: the rules refuse first.
        let said = off["error"]["message"].as_str().unwrap();
        assert!(!said.contains("turn it on"), "{said}");
        let unread = c.call(method, json!({ "channel": "other:x" })).await;
        assert_eq!(unread["error"]["code"], 103, "{unread}");
        let closed = c.call(method, json!({ "channel": "staff:x" })).await;
        assert_eq!(
            closed["error"]["code"], 103,
            "only granted clients see it: {closed}"
        );
    }
    let (status, body) = server.api_get("/api/presence_stats?channel=quiet:x").await;
    assert_eq!((status, body["error"]["code"].as_u64()), (503, Some(108)));
    let granted = json!({ "token": token("boss", json!(null)) });
    let mut boss = server.client().await;
    boss.call("connect", granted).await;
    let refused = boss
        .call("presence_stats", json!({ "channel": "staff:x" }))
        .await;
    assert_eq!(
        refused["error"]["code"], 103,
        "a user without a grant: {refused}"
    );
}

#[tokio::test]
async fn an_earlier_client_id_that_cannot_be_one_is_refused() {
    let server = start(presence_config()).await;
    let long = "k".repeat(65);
    let mut c = server.client().await;
    let reply = c.call("connect", json!({ "client": long })).await;
    assert_eq!(reply["error"]["code"], 107, "{reply}");
    let r = reqwest::get(server.url(&format!("/connection/poll?channel=room:x&client={long}")))
        .await
        .unwrap();
    assert_eq!(status_and_code(r).await, (400, Some(107)));
}

#[tokio::test]
async fn joins_and_leaves_arrive_in_one_batch_per_window() {
    let server = start(presence_config()).await;
    let ch = "room:batch";
    let mut watcher = watcher(&server, ch).await;
    let mut joiners = Vec::new();
    for i in 0..20 {
        let connect = json!({ "token": token(&format!("u{i}"), json!(null)) });
        joiners.push(member(&server, connect, ch).await.0);
    }
    server.node.presence.end_window().await;
    let batch = next_presence(&mut watcher).await;
    assert_eq!(batch["channel"], ch);
    assert_eq!(batch["join"].as_array().unwrap().len(), 20, "{batch}");
    assert_eq!(batch["leave"], json!([]));

    // One that joins and leaves within a window is never announced.
    let (mut brief, _) = member(&server, json!({}), ch).await;
    brief.call("unsubscribe", json!({ "channel": ch })).await;
    for j in &mut joiners[..5] {
        let r = j.call("unsubscribe", json!({ "channel": ch })).await;
        assert!(r.get("error").is_none(), "{r}");
    }
    server.node.presence.end_window().await;
    let batch = next_presence(&mut watcher).await;
    assert_eq!(
        batch["join"],
        json!([]),
        "the brief member cancelled out: {batch}"
    );
    assert_eq!(batch["leave"].as_array().unwrap().len(), 5);
    assert!(
        batch["leave"][0]["user"].is_string(),
        "a leave says who: {batch}"
    );
}

#[tokio::test]
async fn above_the_threshold_nothing_is_pushed_and_crossing_it_says_so() {
    let mut config = presence_config();
    config.presence.join_leave_max_members = 5;
    let server = start(config).await;
    let ch = "room:big";
    let mut watcher = watcher(&server, ch).await;
    let mut joiners = Vec::new();
    for _ in 0..10 {
        joiners.push(member(&server, json!({}), ch).await.0);
    }
    // Crossing the threshold: one push that lists nothing and says changes are left out.
    server.node.presence.end_window().await;
    let crossed = next_presence(&mut watcher).await;
    assert_eq!(
        (
            crossed["join"].clone(),
            crossed["leave"].clone(),
            crossed["missed"].clone()
        ),
        (json!([]), json!([]), json!(true)),
        "{crossed}"
    );
    // Above it: nothing at all.
    joiners.push(member(&server, json!({}), ch).await.0);
    server.node.presence.end_window().await;
    server.publish(ch, json!("marker")).await;
    let line = watcher.next_line().await;
    assert!(
        line.get("pub").is_some(),
        "no presence push above 5 members, got {line}"
    );
    let stats = watcher
        .call("presence_stats", json!({ "channel": ch }))
        .await;
    assert_eq!(
        stats["presence_stats"]["clients"], 12,
        "stats still count: {stats}"
    );
    // Back under it: the changes of that window, again marked, then plain batches.
    for mut c in joiners.drain(..8) {
        c.call("unsubscribe", json!({ "channel": ch })).await;
    }
    server.node.presence.end_window().await;
    let back = next_presence(&mut watcher).await;
    assert_eq!(back["leave"].as_array().unwrap().len(), 8, "{back}");
    assert_eq!(back["missed"], true, "{back}");
    let _late = member(&server, json!({}), ch).await;
    server.node.presence.end_window().await;
    let plain = next_presence(&mut watcher).await;
    assert_eq!(plain["join"].as_array().unwrap().len(), 1, "{plain}");
    assert!(plain.get("missed").is_none(), "{plain}");
}

#[tokio::test]
async fn above_the_threshold_only_the_count_is_pushed_at_most_every_ten_windows() {
    let mut config = presence_config();
    config.presence.join_leave_max_members = 3;
    config.presence.join_leave_window = Duration::from_millis(30);
    let server = start(config).await;
    let ch = "room:counted";
    let (mut watcher, _) = member(&server, json!({}), ch).await;
    let mut joiners = Vec::new();
    for _ in 0..5 {
        joiners.push(member(&server, json!({}), ch).await.0);
    }
    // Each push carries the count; crossing the threshold says changes are left out.
    let crossed = loop {
        let push = next_presence(&mut watcher).await;
        assert!(push["clients"].is_u64(), "every push counts: {push}");
        if push["missed"] == true {
            break std::time::Instant::now();
        }
    };
    joiners.push(member(&server, json!({}), ch).await.0);
    // Above it: no lists, only the count, and not before ten windows after the last.
    let counted = next_presence(&mut watcher).await;
    assert!(
        crossed.elapsed() >= Duration::from_millis(250),
        "counts above the threshold wait ten windows ({:?})",
        crossed.elapsed()
    );
    assert_eq!(
        (counted["join"].clone(), counted["leave"].clone()),
        (json!([]), json!([])),
        "{counted}"
    );
    assert!(counted.get("missed").is_none(), "{counted}");
    assert_eq!(counted["clients"], 7, "{counted}");
    // Nothing changed since: nothing more.
    server.publish(ch, json!("marker")).await;
    let line = watcher.next_line().await;
    assert!(
        line.get("pub").is_some(),
        "no count without a change: {line}"
    );
}

#[tokio::test]
async fn a_client_that_reconnects_within_the_grace_is_neither_a_leave_nor_a_join() {
    let server = start(presence_config()).await;
    let ch = "room:grace";
    let mut watcher = watcher(&server, ch).await;
    let alice = token("alice", json!(null));
    let (first, first_id) = member(&server, json!({ "token": alice }), ch).await;
    server.node.presence.end_window().await;
    assert_eq!(
        next_presence(&mut watcher).await["join"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    drop(first);
    // The old connection is gone (its membership held) before the new one comes.
    eventually("the first connection ended", || async {
        server.node.connection_count() == 1
    })
    .await;
    let again = json!({ "token": alice, "client": first_id });
    let (_second, _) = member(&server, again, ch).await;
    server.node.presence.end_window().await;
    server.publish(ch, json!("marker")).await;
    let line = watcher.next_line().await;
    assert!(
        line.get("pub").is_some(),
        "no leave and no join, got {line}"
    );
    let stats = watcher
        .call("presence_stats", json!({ "channel": ch }))
        .await;
    assert_eq!(stats["presence_stats"]["clients"], 2);
}

#[tokio::test]
async fn a_client_that_does_not_come_back_leaves_after_the_grace() {
    let mut config = presence_config();
    config.presence.grace = Duration::from_millis(100);
    let server = start(config).await;
    let ch = "room:gone";
    let mut watcher = watcher(&server, ch).await;
    let (gone, _) = member(&server, json!({ "token": token("bob", json!(null)) }), ch).await;
    server.node.presence.end_window().await;
    next_presence(&mut watcher).await;
    drop(gone);
    eventually("bob's membership expired", || async {
        server.node.presence.end_window().await;
        server
            .node
            .presence
            .stats(&"room:gone".parse().unwrap())
            .await
            .unwrap()
            .clients
            == 1
    })
    .await;
    let batch = next_presence(&mut watcher).await;
    assert_eq!(batch["leave"][0]["user"], "bob", "{batch}");
}

/// Issue #59: one presence clock. A connection the client closes saying so (a WebSocket
/// close frame: a tab closed, `disconnect()`) leaves at once, as an unsubscribe does; the
/// grace (an hour here) is for connections that drop, as the test above has it.
#[tokio::test]
async fn a_client_that_closes_its_connection_leaves_at_once() {
    let server = start(presence_config()).await;
    let ch = "room:closed";
    let mut watcher = watcher(&server, ch).await;
    let (mut carol, _) = member(&server, json!({ "token": token("carol", json!(null)) }), ch).await;
    server.node.presence.end_window().await;
    next_presence(&mut watcher).await;
    carol.ws.close(None).await.unwrap();
    let channel = ch.parse().unwrap();
    eventually("carol left at once", || async {
        server.node.presence.stats(&channel).await.unwrap().clients == 1
    })
    .await;
    server.node.presence.end_window().await;
    let batch = next_presence(&mut watcher).await;
    assert_eq!(batch["leave"][0]["user"], "carol", "{batch}");

    // A close whose code says the client comes back (the SDK's own, when it drops a
    // connection to open another) is held for the grace, as a drop is.
    let (mut dave, _) = member(&server, json!({ "token": token("dave", json!(null)) }), ch).await;
    server.node.presence.end_window().await;
    next_presence(&mut watcher).await;
    use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
    let reconnecting = CloseFrame {
        code: CloseCode::from(3402),
        reason: "no pong".into(),
    };
    dave.ws.close(Some(reconnecting)).await.unwrap();
    eventually("dave's connection ended", || async {
        server.node.connection_count() == 1
    })
    .await;
    server.node.presence.end_window().await;
    assert_eq!(
        server.node.presence.stats(&channel).await.unwrap().clients,
        2,
        "dave is held for the grace"
    );
}

#[tokio::test]
async fn stream_and_poll_clients_are_members() {
    let mut config = presence_config();
    config.presence.poll_grace = Duration::from_millis(100);
    config.presence.grace = Duration::from_millis(100);
    let server = start(config).await;
    let ch = "room:http";
    let http = reqwest::Client::new();
    let stats = || async {
        let (_, body) = server
            .api_get(&format!("/api/presence_stats?channel={ch}"))
            .await;
        body["clients"].as_u64().unwrap()
    };
    let sse = http
        .get(server.url(&format!("/connection/sse?channel={ch}")))
        .send()
        .await
        .unwrap();
    let mut lines = Lines::new(sse);
    lines.next().await;
    eventually("the SSE client is a member", || async {
        stats().await == 1
    })
    .await;

    // Polls that send back their client id count once, however many.
    let poll = |client: Option<String>| {
        let mut url = format!("/connection/poll?channel={ch}");
        if let Some(c) = client {
            url.push_str(&format!("&client={c}"));
        }
        let request = http.get(server.url(&url));
        async move { response(request.send().await.unwrap()).await.1 }
    };
    let first = poll(None).await;
    let client = first["client"]
        .as_str()
        .expect("a poll answer names the client")
        .to_string();
    for _ in 0..3 {
        let again = poll(Some(client.clone())).await;
        assert_eq!(again["client"], client.as_str());
    }
    assert_eq!(stats().await, 2, "the SSE client and one poller");
    drop(lines);
    eventually(
        "both left: the stream closed, the poller stopped",
        || async {
            server.node.presence.end_window().await;
            stats().await == 0
        },
    )
    .await;
}

#[tokio::test]
async fn nodes_on_redis_share_members_and_pushes() {
    let redis = RedisServer::start();
    let a = start_on_redis(presence_config(), &redis).await;
    let b = start_on_redis(presence_config(), &redis).await;
    let ch = "room:cluster";
    let mut watcher = watcher(&a, ch).await;
    let (_bob, _) = member(&b, json!({ "token": token("bob", json!(null)) }), ch).await;
    b.node.presence.end_window().await;
    let batch = next_presence(&mut watcher).await;
    assert_eq!(
        batch["join"][0]["user"], "bob",
        "b's join reached a's subscriber: {batch}"
    );
    let stats = watcher
        .call("presence_stats", json!({ "channel": ch }))
        .await;
    assert_eq!(stats["presence_stats"], json!({ "clients": 2, "users": 1 }));
}

/// Issue #38: a poll's memberships are held for `presence.poll_grace` after it is answered,
/// but never more than `presence.max_held` at once: past it, a poll's membership leaves at
/// once. A flood of polls naming new channels of a presence namespace cannot make the server
/// keep one membership per channel named for the grace.
#[tokio::test]
async fn memberships_held_through_their_grace_are_bounded() {
    let mut c = presence_config();
    c.presence.poll_grace = Duration::from_secs(3600);
    c.presence.max_held = 5;
    let server = start(c).await;
    for i in 0..10 {
        let r = reqwest::get(server.url(&format!("/connection/poll?channel=room:held{i}")))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    let mut held = 0;
    for i in 0..10 {
        let (_, stats) = server
            .api_get(&format!("/api/presence_stats?channel=room:held{i}"))
            .await;
        held += stats["clients"].as_u64().unwrap();
    }
    assert_eq!(held, 5, "memberships still held after their polls");
    server.stop().await.unwrap();
}

/// Issue #38: one client address holds at most `presence.max_held_per_address` memberships
/// through their grace. A flood of polls from one address cannot take every place, so
/// another address's poller is still held between its polls.
#[tokio::test]
async fn one_address_cannot_take_every_held_membership() {
    let mut c = presence_config();
    c.presence.poll_grace = Duration::from_secs(3600);
    c.presence.max_held = 10;
    c.presence.max_held_per_address = 3;
    let server = start(c).await;
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .build()
            .unwrap()
    };
    let poll = |client: reqwest::Client, channel: String| {
        let url = server.url(&format!("/connection/poll?channel={channel}"));
        async move {
            let r = client.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap();
        }
    };
    let flood = from([127, 0, 0, 2]);
    for i in 0..10 {
        poll(flood.clone(), format!("room:flood{i}")).await;
    }
    poll(from([127, 0, 0, 3]), "room:other".into()).await;
    let mut held = 0;
    for i in 0..10 {
        let (_, stats) = server
            .api_get(&format!("/api/presence_stats?channel=room:flood{i}"))
            .await;
        held += stats["clients"].as_u64().unwrap();
    }
    assert_eq!(held, 3, "the flooding address's memberships still held");
    let (_, stats) = server
        .api_get("/api/presence_stats?channel=room:other")
        .await;
    assert_eq!(
        stats["clients"], 1,
        "another address's poller is still held: {stats}"
    );
    server.stop().await.unwrap();
}
