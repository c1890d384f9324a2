//! Tokens and permissions, tried as an attacker would, on every transport.

use std::time::Duration;

use herald_server::config::{Config, NamespaceOverride};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::{
    http::{urlencode, Lines},
    support::*,
};

pub(crate) const SECRET: &str = "a-test-secret-of-at-least-32-bytes!";
pub(crate) const AUDIENCE: &str = "herald-test";
pub(crate) const ISSUER: &str = "test-backend";

pub(crate) fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A config whose tokens are HS256 with [`SECRET`], with a namespace of granted channels
/// (`private`) and one of personal channels (`user`).
pub(crate) fn auth_config() -> Config {
    let mut c = config();
    c.auth.hmac_secret = Some(SECRET.into());
    c.auth.audience = Some(AUDIENCE.into());
    c.auth.issuer = Some(ISSUER.into());
    c.auth.leeway = Duration::ZERO;
    c.namespaces.insert(
        "private".into(),
        NamespaceOverride {
            subscribe: Some(Access::Granted),
            publish: Some(Access::Granted),
            ..Default::default()
        },
    );
    c.namespaces.insert(
        "user".into(),
        NamespaceOverride {
            subscribe: Some(Access::Authenticated),
            personal: Some(true),
            ..Default::default()
        },
    );
    c
}

/// Claims a valid token carries, with `extra` over them.
pub(crate) fn claims(user: &str, extra: Value) -> Value {
    let mut c = json!({ "sub": user, "aud": AUDIENCE, "iss": ISSUER, "exp": now() + 600 });
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

pub(crate) fn sign_with(
    alg: Algorithm,
    key: &EncodingKey,
    kid: Option<&str>,
    claims: &Value,
) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(String::from);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

pub(crate) fn hs256(claims: &Value) -> String {
    sign_with(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        None,
        claims,
    )
}

pub(crate) fn rs256(key: &str, kid: Option<&str>, claims: &Value) -> String {
    let pem = std::fs::read(fixture(&format!("{key}.key.pem"))).unwrap();
    sign_with(
        Algorithm::RS256,
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
        kid,
        claims,
    )
}

pub(crate) fn b64(v: &Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// Tokens that must never open anything, with whether each is refused as expired.
pub(crate) fn bad_tokens() -> Vec<(&'static str, String, bool)> {
    let alice = claims("42", json!({}));
    vec![
        ("garbage", "not.a.token".into(), false),
        (
            "expired",
            hs256(&claims("42", json!({ "exp": now() - 120 }))),
            true,
        ),
        (
            "not yet valid",
            hs256(&claims("42", json!({ "nbf": now() + 300 }))),
            false,
        ),
        (
            "wrong key",
            sign_with(
                Algorithm::HS256,
                &EncodingKey::from_secret(b"another-secret-another-secret-another"),
                None,
                &alice,
            ),
            false,
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(&json!({ "alg": "none", "typ": "JWT" })),
                b64(&alice)
            ),
            false,
        ),
        (
            "wrong audience",
            hs256(&claims("42", json!({ "aud": "other" }))),
            false,
        ),
        (
            "no audience",
            hs256(&claims("42", json!({ "aud": null }))),
            false,
        ),
        (
            "wrong issuer",
            hs256(&claims("42", json!({ "iss": "other" }))),
            false,
        ),
        (
            "no user",
            hs256(&claims("42", json!({ "sub": null }))),
            false,
        ),
        (
            "subscription token as connection token",
            hs256(&claims("42", json!({ "channel": "private:a" }))),
            false,
        ),
    ]
}

/// Every HTTP way in, as (method, path with its query so far).
pub const HTTP_OPENS: &[&str] = &[
    "/connection/sse?",
    "/connection/stream?",
    "/connection/iframe?callback=cb&",
    "/connection/longpoll?timeout=1&",
    "/connection/poll?",
];

pub(crate) async fn get(server: &TestServer, path_and_query: &str) -> reqwest::Response {
    reqwest::get(server.url(path_and_query)).await.unwrap()
}

/// Opens a WebSocket and sends `connect` with `token`.
pub(crate) async fn connect(server: &TestServer, token: &str) -> (Client, Value) {
    let mut c = server.client().await;
    let reply = c.call("connect", json!({ "token": token })).await;
    (c, reply)
}

/// Asserts that `c` received no publication: two pings, since a publication queued while
/// the first was handled leaves right after its reply.
pub(crate) async fn assert_no_pub(c: &mut Client) {
    for _ in 0..2 {
        let id_reply = c.call("ping", json!({})).await;
        assert!(id_reply.get("error").is_none());
    }
    while let Some(line) = c.set_aside_line() {
        assert!(line.get("pub").is_none(), "a publication arrived: {line}");
    }
}

#[tokio::test]
pub(crate) async fn bad_tokens_are_refused_on_every_transport_with_the_documented_codes() {
    let server = start(auth_config()).await;
    for (what, token, expired) in bad_tokens() {
        // WebSocket: the upgrade completes, and the close code says why.
        let mut c = server.client().await;
        c.send_text(json!({ "id": 1, "connect": { "token": token } }).to_string())
            .await;
        let closed = c.closed().await;
        assert_eq!(
            closed.code,
            if expired { 3504 } else { 3500 },
            "{what}: {closed:?}"
        );

        // Every HTTP transport answers 401 before a stream starts: the query parameter and
        // the Authorization header alike.
        let code = if expired { 109 } else { 101 };
        for open in HTTP_OPENS {
            let path = format!("{open}channel=chat:x&token={}", urlencode(&token));
            assert_eq!(
                status_and_code(get(&server, &path).await).await,
                (401, Some(code)),
                "{what} {open}"
            );
            let with_header = reqwest::Client::new()
                .get(server.url(&format!("{open}channel=chat:x")))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(
                status_and_code(with_header).await,
                (401, Some(code)),
                "{what} {open} (Bearer)"
            );
        }
        let sent = reqwest::Client::new()
            .post(server.url(&format!("/connection/send?token={}", urlencode(&token))))
            .body(r#"{"id":1,"publish":{"channel":"private:a","data":1}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            status_and_code(sent).await,
            (401, Some(code)),
            "{what} send"
        );
    }
    let history = server.api_get("/api/history?channel=private:a").await;
    assert_eq!(history.1["offset"], 0, "nothing was published: {history:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
pub(crate) async fn an_hmac_token_made_with_the_public_key_is_status_and_code() {
    let mut cfg = auth_config();
    cfg.auth.hmac_secret = None;
    cfg.auth.public_key = Some(fixture("rsa1.pub.pem"));
    let server = start(cfg).await;
    let public = std::fs::read(fixture("rsa1.pub.pem")).unwrap();
    let confused = sign_with(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public),
        None,
        &claims("42", json!({})),
    );
    let mut c = server.client().await;
    c.send_text(json!({ "id": 1, "connect": { "token": confused } }).to_string())
        .await;
    assert_eq!(c.closed().await.code, 3500);
    let path = format!("/connection/poll?channel=chat:x&token={confused}");
    assert_eq!(
        status_and_code(get(&server, &path).await).await,
        (401, Some(101))
    );

    // The real thing passes.
    let (_, reply) = connect(&server, &rs256("rsa1", None, &claims("42", json!({})))).await;
    assert_eq!(reply["connect"]["user"], "42", "{reply}");
    server.stop().await.unwrap();
}

#[tokio::test]
pub(crate) async fn channels_are_opened_only_to_connections_granted_them_on_every_transport() {
    let server = start(auth_config()).await;
    let alice = hs256(&claims("42", json!({ "subscribe": ["private:a*"] })));
    let bob = hs256(&claims("43", json!({})));
    let for_alice = |channel: &str| hs256(&claims("42", json!({ "channel": channel })));
    let for_bob = |channel: &str| hs256(&claims("43", json!({ "channel": channel })));

    // WebSocket.
    let (mut a, reply) = connect(&server, &alice).await;
    assert_eq!(reply["connect"]["user"], "42");
    assert!(reply["connect"]["ttl"].as_u64().unwrap() <= 600);
    a.subscribe("private:a", None).await;
    a.subscribe("user:42", None).await;
    let (mut b, _) = connect(&server, &bob).await;
    let mut anonymous = server.client().await;
    let code = |r: Value| r["error"]["code"].as_u64();
    // (bob's connection?, subscribe parameters, expected error)
    let attempts = [
        (false, json!({ "channel": "private:a" }), 103),
        (true, json!({ "channel": "private:a" }), 103),
        (true, json!({ "channel": "user:42" }), 103),
        (false, json!({ "channel": "user:42" }), 103),
        // A subscription token for another user, and one for another channel.
        (
            true,
            json!({ "channel": "private:b", "token": for_alice("private:b") }),
            101,
        ),
        (
            true,
            json!({ "channel": "private:b", "token": for_bob("private:c") }),
            101,
        ),
    ];
    for (bobs, params, expected) in attempts {
        let client = if bobs { &mut b } else { &mut anonymous };
        let r = client.call("subscribe", params.clone()).await;
        assert_eq!(code(r.clone()), Some(expected), "{params}: {r}");
    }
    for (client, channel) in [(&mut b, "user:42"), (&mut anonymous, "private:a")] {
        let r = client.call("history", json!({ "channel": channel })).await;
        assert!(
            matches!(code(r.clone()), Some(101 | 103)),
            "history {channel}: {r}"
        );
    }
    let r = b
        .call(
            "publish",
            json!({ "channel": "private:a", "data": "forged" }),
        )
        .await;
    assert_eq!(code(r), Some(103));
    // A valid subscription token opens its channel.
    let ok = b
        .call(
            "subscribe",
            json!({ "channel": "private:b", "token": for_bob("private:b") }),
        )
        .await;
    assert!(ok.get("error").is_none(), "{ok}");

    // HTTP transports: the same answers, before anything streams.
    for open in HTTP_OPENS {
        let tries = [
            ("channel=private:a".to_string(), (403, Some(103))),
            (format!("channel=private:a&token={bob}"), (403, Some(103))),
            (format!("channel=user:42&token={bob}"), (403, Some(103))),
            (
                format!(
                    "channel=private:b&token={bob}&sub_token={}",
                    for_alice("private:b")
                ),
                (401, Some(101)),
            ),
            (
                format!(
                    "channel=private:b&token={bob}&sub_token={}",
                    for_bob("private:c")
                ),
                (403, Some(103)),
            ),
        ];
        for (query, expected) in tries {
            let r = get(&server, &format!("{open}{query}")).await;
            assert_eq!(status_and_code(r).await, expected, "{open}{query}");
        }
        for query in [
            format!("channel=private:a&token={alice}"),
            format!("channel=user:42&token={alice}"),
            format!(
                "channel=private:b&token={bob}&sub_token={}",
                for_bob("private:b")
            ),
        ] {
            let r = get(&server, &format!("{open}{query}")).await;
            assert_eq!(r.status(), 200, "{open}{query}");
        }
    }
    let history = |token: &str, channel: &str| {
        let server = &server;
        let body = json!({ "id": 1, "history": { "channel": channel } }).to_string();
        let query = format!("token={token}");
        async move {
            server
                .send_codes_with(&reqwest::Client::new(), &query, body)
                .await
        }
    };
    assert_eq!(history(&bob, "user:42").await, vec![Some(103)]);
    assert_eq!(history(&alice, "user:42").await, vec![None]);

    // What is published reaches those granted it, and nobody else.
    server.publish("private:a", json!("for alice")).await;
    server.publish("user:42", json!("alice's inbox")).await;
    assert_eq!(a.next_pub().await.2, "for alice");
    assert_eq!(a.next_pub().await.2, "alice's inbox");
    assert_no_pub(&mut b).await;
    assert_no_pub(&mut anonymous).await;
    server.stop().await.unwrap();
}

#[tokio::test]
pub(crate) async fn a_token_that_expires_while_connected_ends_the_connection_unless_refreshed() {
    let server = start(auth_config()).await;
    let soon = now() + 2;
    let short = hs256(&claims(
        "42",
        json!({ "exp": soon, "subscribe": ["private:*"] }),
    ));
    let (mut lapsing, reply) = connect(&server, &short).await;
    assert_eq!(reply["connect"]["expires"], soon);
    lapsing.subscribe("private:a", None).await;
    let (mut refreshed, _) = connect(&server, &short).await;
    refreshed.subscribe("private:a", None).await;
    let longer = hs256(&claims("42", json!({ "subscribe": ["private:*"] })));
    let r = refreshed.call("refresh", json!({ "token": longer })).await;
    assert!(r["refresh"]["ttl"].as_u64().unwrap() > 500, "{r}");
    // Refreshing as someone else is refused.
    let r = refreshed
        .call(
            "refresh",
            json!({ "token": hs256(&claims("43", json!({}))) }),
        )
        .await;
    assert_eq!(r["error"]["code"], 101, "{r}");

    // An SSE stream with the short token ends too, with a disconnect push.
    let sse = get(
        &server,
        &format!("/connection/sse?channel=private:a&token={short}"),
    )
    .await;
    assert_eq!(sse.status(), 200);
    let mut sse = Lines::new(sse);

    assert_eq!(lapsing.closed().await.code, 3504);
    let ended = loop {
        let (_, event) = sse.next_event().await.expect("a disconnect push");
        if let Some(d) = event.get("disconnect") {
            break d.clone();
        }
    };
    assert_eq!(ended["code"], 3504);
    assert_eq!(ended["reconnect"], false);
    // Polls check the token on every request.
    let poll = get(
        &server,
        &format!("/connection/poll?channel=private:a&token={short}"),
    )
    .await;
    assert_eq!(status_and_code(poll).await, (401, Some(109)));

    server.publish("private:a", json!("after expiry")).await;
    assert_eq!(refreshed.next_pub().await.2, "after expiry");
    server.stop().await.unwrap();
}

#[tokio::test]
pub(crate) async fn an_expired_subscription_token_ends_only_its_subscription() {
    let server = start(auth_config()).await;
    let (mut c, _) = connect(&server, &hs256(&claims("42", json!({})))).await;
    let grant = hs256(&claims(
        "42",
        json!({ "channel": "private:x", "exp": now() + 1 }),
    ));
    let r = c
        .call(
            "subscribe",
            json!({ "channel": "private:x", "token": grant }),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let ended = loop {
        let line = c.next_line().await;
        if let Some(u) = line.get("unsubscribe") {
            break u.clone();
        }
    };
    assert_eq!(ended["channel"], "private:x");
    assert_eq!(ended["code"], 109);
    server.publish("private:x", json!("too late")).await;
    assert_no_pub(&mut c).await;
    let r = c.call("history", json!({ "channel": "private:x" })).await;
    assert_eq!(
        r["error"]["code"], 103,
        "the grant went with the token: {r}"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
pub(crate) async fn a_tokens_channels_are_subscribed_at_connect() {
    let server = start(auth_config()).await;
    let token = hs256(&claims("42", json!({ "channels": ["private:news"] })));
    let (mut ws, reply) = connect(&server, &token).await;
    assert!(reply.get("error").is_none(), "{reply}");
    let opened = ws.next_line().await;
    assert_eq!(opened["subscribe"]["channel"], "private:news", "{opened}");
    let stream = get(&server, &format!("/connection/stream?token={token}")).await;
    assert_eq!(stream.status(), 200);
    let mut stream = Lines::new(stream);
    let mut pushes = Vec::new();
    while pushes.len() < 2 {
        pushes.push(serde_json::from_str::<Value>(&stream.next().await.unwrap()).unwrap());
    }
    assert_eq!(
        pushes[1]["subscribe"]["channel"], "private:news",
        "{pushes:?}"
    );
    server.publish("private:news", json!(1)).await;
    assert_eq!(ws.next_pub().await.0, "private:news");
    let line: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(line["pub"]["channel"], "private:news");
    server.stop().await.unwrap();
}
