//! Token keys that change: keys fetched from a JWKS address, rotated and retired; and what
//! `refresh` and `send` refuse, and the sender a publication names.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::{auth::*, http::Lines, support::*};

/// A JWKS endpoint: a real HTTP server whose key set the test changes, counting fetches.
struct Jwks {
    url: String,
    keys: Arc<parking_lot::Mutex<String>>,
    fetches: Arc<std::sync::atomic::AtomicUsize>,
}

async fn jwks_server(initial: &str) -> Jwks {
    let keys = Arc::new(parking_lot::Mutex::new(
        std::fs::read_to_string(fixture(initial)).unwrap(),
    ));
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (k, f) = (keys.clone(), fetches.clone());
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let (k, f) = (k.clone(), f.clone());
            async move {
                f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = k.lock().clone();
                ([("content-type", "application/json")], body)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Jwks { url, keys, fetches }
}

#[tokio::test]
async fn jwks_keys_are_fetched_rotated_and_retired() {
    let jwks = jwks_server("rsa1.jwks.json").await;
    let mut cfg = auth_config();
    cfg.auth.hmac_secret = None;
    cfg.auth.jwks_url = Some(jwks.url.clone());
    let server = start(cfg).await;
    let user = claims("42", json!({}));

    let (_, reply) = connect(&server, &rs256("rsa1", Some("rsa1"), &user)).await;
    assert_eq!(reply["connect"]["user"], "42", "{reply}");

    // The provider rotates: rsa2 replaces rsa1. A token with the new key id makes Herald
    // fetch the set again; one with the retired key is refused after that fetch.
    *jwks.keys.lock() = std::fs::read_to_string(fixture("rsa2.jwks.json")).unwrap();
    let (_, reply) = connect(&server, &rs256("rsa2", Some("rsa2"), &user)).await;
    assert_eq!(reply["connect"]["user"], "42", "{reply}");
    let mut old = server.client().await;
    old.send_text(
        json!({ "id": 1, "connect": { "token": rs256("rsa1", Some("rsa1"), &user) } }).to_string(),
    )
    .await;
    assert_eq!(old.closed().await.code, 3500);
    // An HMAC token is no use against published keys.
    let mut hs = server.client().await;
    hs.send_text(json!({ "id": 1, "connect": { "token": hs256(&user) } }).to_string())
        .await;
    assert_eq!(hs.closed().await.code, 3500);

    // Made-up key ids cannot make Herald hammer the provider: fetches stay about one a
    // second however many such tokens come at once.
    let before = jwks.fetches.load(std::sync::atomic::Ordering::SeqCst);
    let started = std::time::Instant::now();
    let forged: Vec<_> = (0..20)
        .map(|i| {
            let token = rs256("rsa2", Some(&format!("made-up-{i}")), &user);
            let url = server.url(&format!("/connection/poll?channel=chat:x&token={token}"));
            tokio::spawn(async move { status_and_code(reqwest::get(url).await.unwrap()).await })
        })
        .collect();
    for f in forged {
        assert_eq!(f.await.unwrap(), (401, Some(101)));
    }
    let fetched = jwks.fetches.load(std::sync::atomic::Ordering::SeqCst) - before;
    let allowed = started.elapsed().as_secs() as usize + 2;
    assert!(
        fetched <= allowed,
        "{fetched} fetches in {:?}",
        started.elapsed()
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn refresh_and_send_refuse_what_they_cannot_do() {
    let mut cfg = auth_config();
    cfg.client.max_subscriptions = 2;
    let server = start(cfg).await;
    // Anonymous connections have no token to refresh.
    let mut anonymous = server.client().await;
    let r = anonymous
        .call(
            "refresh",
            json!({ "token": hs256(&claims("42", json!({}))) }),
        )
        .await;
    assert_eq!(r["error"]["code"], 116, "{r}");
    // A subscription token is refreshed only for a channel subscribed to.
    let (mut c, _) = connect(&server, &hs256(&claims("42", json!({})))).await;
    let grant = hs256(&claims("42", json!({ "channel": "private:x" })));
    let r = c
        .call("refresh", json!({ "channel": "private:x", "token": grant }))
        .await;
    assert_eq!(r["error"]["code"], 115, "{r}");
    // An expired connection token in a refresh is 109, and the connection stays.
    let expired = hs256(&claims("42", json!({ "exp": now() - 120 })));
    let r = c.call("refresh", json!({ "token": expired })).await;
    assert_eq!(r["error"]["code"], 109, "{r}");
    assert!(c.call("ping", json!({})).await.get("error").is_none());

    // Commands for a stream's session use the stream's token: a token there is a mistake.
    let stream = get(&server, "/connection/stream?channel=chat:x").await;
    let mut lines = Lines::new(stream);
    let session = lines.session().await;
    let token = hs256(&claims("42", json!({})));
    let sent = reqwest::Client::new()
        .post(server.url(&format!("/connection/send?session={session}&token={token}")))
        .body(r#"{"id":1,"ping":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(status_and_code(sent).await, (400, Some(107)));

    // More subscription tokens than subscriptions a connection may hold.
    let many: String = (0..=server.node.settings.config.client.max_subscriptions)
        .map(|i| {
            format!(
                "&sub_token={}",
                hs256(&claims(
                    "",
                    json!({ "channel": format!("private:{i}"), "sub": null })
                ))
            )
        })
        .collect();
    let r = get(&server, &format!("/connection/poll?channel=chat:x{many}")).await;
    assert_eq!(status_and_code(r).await, (400, Some(107)));
    server.stop().await.unwrap();
}

/// A client's publication says who sent it (`from`: the token's user and `info`) to every
/// subscriber, on every transport and in history; the API's publications and anonymous
/// ones say nothing.
#[tokio::test]
async fn publications_say_which_user_sent_them() {
    let mut c = auth_config();
    c.namespaces.get_mut("private").unwrap().history_size = Some(10);
    let server = start(c).await;
    let reader = hs256(&claims("7", json!({ "subscribe": ["private:*"] })));
    let writer = hs256(&claims(
        "42",
        json!({ "publish": ["private:*"], "info": { "name": "Ann", "avatar": 3 } }),
    ));
    let (mut ws, _) = connect(&server, &reader).await;
    assert!(ws
        .subscribe("private:room", None)
        .await
        .get("error")
        .is_none());
    let stream = get(
        &server,
        &format!("/connection/stream?channel=private:room&token={reader}"),
    )
    .await;
    let mut stream = Lines::new(stream);
    // The connect push and the subscribe push.
    for _ in 0..2 {
        stream.next().await.unwrap();
    }
    let (mut w, _) = connect(&server, &writer).await;
    let sent = w
        .call(
            "publish",
            json!({ "channel": "private:room", "data": { "text": "hi" } }),
        )
        .await;
    assert!(sent.get("error").is_none(), "{sent}");
    server
        .publish("private:room", json!("from the backend"))
        .await;

    let from = json!({ "user": "42", "info": { "name": "Ann", "avatar": 3 } });
    let live = ws.next_line().await;
    assert_eq!(live["pub"]["data"], json!({ "text": "hi" }), "{live}");
    assert_eq!(live["pub"]["from"], from, "{live}");
    assert!(ws.next_line().await["pub"].get("from").is_none());
    let line: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(line["pub"]["from"], from, "{line}");
    let history = ws
        .call(
            "history",
            json!({ "channel": "private:room", "since": { "offset": 0 } }),
        )
        .await;
    let publications = &history["history"]["publications"];
    assert_eq!(publications[0]["from"], from, "{history}");
    assert!(publications[1].get("from").is_none(), "{history}");

    // A subscription token's `info` is the writer's in that channel: `channel_info`.
    let sub_token = hs256(&claims(
        "42",
        json!({ "channel": "private:room", "info": { "role": "host" } }),
    ));
    let joined = w
        .call(
            "subscribe",
            json!({ "channel": "private:room", "token": sub_token }),
        )
        .await;
    assert!(joined.get("error").is_none(), "{joined}");
    w.call("publish", json!({ "channel": "private:room", "data": 3 }))
        .await;
    let live = ws.next_line().await;
    assert_eq!(
        live["pub"]["from"],
        json!({ "user": "42", "info": { "name": "Ann", "avatar": 3 }, "channel_info": { "role": "host" } }),
        "{live}"
    );
    server.stop().await.unwrap();
}
