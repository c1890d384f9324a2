//! Issue #56: what one hostile client of the Pusher front can make the server do: client
//! events past Pusher's rate or on encrypted channels, webhooks by the thousand, and API
//! calls whose signature does not bind what they ask.

use futures_util::{SinkExt, StreamExt};
use herald_server::config::{Config, PusherApp};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::{tungstenite::Message, MaybeTlsStream, WebSocketStream};

use crate::support::*;

const APP_KEY: &str = "hostile-app-key";
const SECRET: &str = "hostile-app-secret-0123456789";

/// A server with one Pusher app (client events on), as `webhooks` says.
fn pusher_config(webhooks: bool) -> Config {
    let mut c = config();
    let webhook = if webhooks {
        // Nobody listens there: what is posted is only counted.
        "webhook_url = \"http://127.0.0.1:9/\"\n"
    } else {
        ""
    };
    let app: PusherApp = toml::from_str(&format!(
        "id = \"7\"\nkey = \"{APP_KEY}\"\nsecret = \"{SECRET}\"\nclient_events = true\n{webhook}"
    ))
    .unwrap();
    c.pusher.apps.push(app);
    c
}

fn hmac(text: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// A pusher-js client, spoken by hand.
struct PusherClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    socket_id: String,
}

impl PusherClient {
    async fn connect(server: &TestServer) -> Self {
        let url = format!("ws://{}/app/{APP_KEY}?protocol=7", server.addr);
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut client = Self {
            ws,
            socket_id: String::new(),
        };
        let hello = client.next().await;
        assert_eq!(hello["event"], "pusher:connection_established", "{hello}");
        let data: Value = serde_json::from_str(hello["data"].as_str().unwrap()).unwrap();
        client.socket_id = data["socket_id"].as_str().unwrap().to_string();
        client
    }

    async fn send(&mut self, message: Value) {
        self.ws
            .send(Message::text(message.to_string()))
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Value {
        loop {
            let m = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a message in time")
                .expect("the connection is open")
                .unwrap();
            if let Message::Text(text) = m {
                return serde_json::from_str(&text).unwrap();
            }
        }
    }

    /// Subscribes to `channel` (signed when it is private); the answer's event.
    async fn subscribe(&mut self, channel: &str) -> Value {
        let mut data = json!({ "channel": channel });
        if channel.starts_with("private-") {
            let signature = hmac(&format!("{}:{channel}", self.socket_id));
            data["auth"] = format!("{APP_KEY}:{signature}").into();
        }
        self.send(json!({ "event": "pusher:subscribe", "data": data }))
            .await;
        self.next().await
    }

    /// Everything the server sends until the pong of a ping sent now.
    async fn until_pong(&mut self) -> Vec<Value> {
        self.send(json!({ "event": "pusher:ping", "data": {} }))
            .await;
        let mut got = Vec::new();
        loop {
            let m = self.next().await;
            if m["event"] == "pusher:pong" {
                return got;
            }
            got.push(m);
        }
    }
}

fn error_codes(messages: &[Value]) -> Vec<u64> {
    messages
        .iter()
        .filter(|m| m["event"] == "pusher:error")
        .map(|m| m["data"]["code"].as_u64().unwrap_or(0))
        .collect()
}

/// Item 2 (client events): Pusher allows 10 client events a second; bursts of 20 passed.
#[tokio::test]
async fn client_events_are_ten_a_second_in_a_burst_too() {
    let server = start(pusher_config(false)).await;
    let mut client = PusherClient::connect(&server).await;
    let ok = client.subscribe("private-room").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    for i in 0..20 {
        let event =
            json!({ "event": "client-typing", "channel": "private-room", "data": { "i": i } });
        client.send(event).await;
    }
    let codes = error_codes(&client.until_pong().await);
    // 10 pass, and at most one more refilled while they were sent.
    assert!(
        (9..=10).contains(&codes.len()) && codes.iter().all(|c| *c == 4301),
        "{codes:?}"
    );
    server.stop().await.unwrap();
}

/// Item 7: a plaintext client event on an encrypted channel was relayed to its
/// subscribers (pusher-js refuses to send one; a raw client can). Pusher refuses them.
#[tokio::test]
async fn client_events_on_encrypted_channels_are_refused() {
    let server = start(pusher_config(false)).await;
    let mut sender = PusherClient::connect(&server).await;
    let mut reader = PusherClient::connect(&server).await;
    for c in [&mut sender, &mut reader] {
        let ok = c.subscribe("private-encrypted-vault").await;
        assert_eq!(
            ok["event"], "pusher_internal:subscription_succeeded",
            "{ok}"
        );
    }
    let event =
        json!({ "event": "client-x", "channel": "private-encrypted-vault", "data": "plain" });
    sender.send(event).await;
    let said = sender.until_pong().await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["event"], "pusher:error", "{said:?}");
    assert!(reader.until_pong().await.is_empty(), "nothing was relayed");
    server.stop().await.unwrap();
}

/// Item 1 (webhooks): a subscribe that makes a channel occupied posts a webhook (and its
/// vacating another); one address made 30,000 in 5 s. Now each is charged to the
/// address's `limits.hook_calls_per_address`, as every call to the backend its clients
/// cause.
#[tokio::test]
async fn webhooks_one_address_causes_are_charged_to_its_backend_budget() {
    let mut c = pusher_config(true);
    c.limits.hook_calls_per_address = 5;
    let server = start(c).await;
    let mut client = PusherClient::connect(&server).await;
    let mut refused = 0;
    for i in 0..30 {
        let answer = client.subscribe(&format!("new-{i}")).await;
        if answer["event"] == "pusher:subscription_error" {
            assert_eq!(answer["data"]["status"], 429, "{answer}");
            refused += 1;
        }
    }
    // The burst (10) and what refills meanwhile pass; the rest are refused.
    assert!(refused >= 15, "{refused} of 30 refused");
    // Channels others occupy already post nothing, and are not charged.
    let mut other = PusherClient::connect(&server).await;
    let ok = other.subscribe("new-0").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    server.stop().await.unwrap();
}

/// A signed call of the HTTP API: `GET path` with `params` (decoded, as Pusher's
/// libraries sign them) and the query as sent, `query`.
async fn api_get(
    server: &TestServer,
    path: &str,
    signed: &[(&str, &str)],
    query: &str,
) -> (u16, String) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let mut params: Vec<(String, String)> = vec![
        ("auth_key".into(), APP_KEY.into()),
        ("auth_timestamp".into(), now.clone()),
        ("auth_version".into(), "1.0".into()),
    ];
    params.extend(signed.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    params.sort();
    let text = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let signature = hmac(&format!("GET\n{path}\n{text}"));
    let url = server.url(&format!(
        "{path}?auth_key={APP_KEY}&auth_timestamp={now}&auth_version=1.0&{query}&auth_signature={signature}"
    ));
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Item 7 (API): the signature binds the parameters as the server reads them. Two
/// parameters re-sent as one `%26`-encoded value kept their signature; and an unknown
/// app id answered 404 where a known one answered 401, telling which ids exist.
#[tokio::test]
async fn api_signatures_bind_what_is_asked_and_app_ids_stay_unknown() {
    let server = start(pusher_config(false)).await;
    let path = "/apps/7/channels";
    let two = [("filter_by_prefix", "presence-"), ("info", "user_count")];
    let (status, body) = api_get(
        &server,
        path,
        &two,
        "filter_by_prefix=presence-&info=user_count",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The same signature over one parameter whose value holds the other.
    let (status, body) = api_get(
        &server,
        path,
        &two,
        "filter_by_prefix=presence-%26info%3Duser_count",
    )
    .await;
    assert_eq!(status, 401, "{body}");
    // An unknown app id is told what a wrong signature is told.
    let (unknown, unknown_body) = api_get(&server, "/apps/8/channels", &[], "").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let forged = "0".repeat(64);
    let wrong_secret = server.url(&format!(
        "/apps/7/channels?auth_key={APP_KEY}&auth_timestamp={now}&auth_version=1.0&auth_signature={forged}"
    ));
    let r = reqwest::get(wrong_secret).await.unwrap();
    let known = (r.status().as_u16(), r.text().await.unwrap());
    assert_eq!(known.0, 401, "{known:?}");
    assert_eq!((unknown, unknown_body), known);
    let (status, body) = api_get(&server, path, &[], "").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await.unwrap();
}

/// Item 6: a page's resume needs the proof only that page was given (`herald:page`,
/// sent back as `herald:resume`), not its id, which is in the path (so in access logs).
/// Whoever knew the id closed the page's connection (4200), took what it missed, and left
/// the page's own reconnect with nothing; now such a connection is a new page: nothing is
/// closed, nothing replayed, nothing told.
#[tokio::test]
async fn a_page_resumes_only_with_its_proof() {
    let server = start(pusher_config(false)).await;
    let path = format!("/resume/page-0123456789abcdef/app/{APP_KEY}?protocol=7");
    let open = |server: &TestServer| {
        let url = format!("ws://{}{path}", server.addr);
        async move {
            let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            let mut client = PusherClient {
                ws,
                socket_id: String::new(),
            };
            assert_eq!(
                client.next().await["event"],
                "pusher:connection_established"
            );
            let page = client.next().await;
            assert_eq!(page["event"], "herald:page", "{page}");
            let data: Value = serde_json::from_str(page["data"].as_str().unwrap()).unwrap();
            (client, data["proof"].as_str().unwrap().to_string())
        }
    };
    let (mut page, proof) = open(&server).await;
    let ok = page.subscribe("news").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    server
        .publish("7:news", json!({"event": "n", "data": 1}))
        .await;
    assert_eq!(page.next().await["data"], 1);
    page.until_pong().await;

    // Someone who knows the page id, with a wrong proof (or none): a page of its own.
    let (mut intruder, other) = open(&server).await;
    assert_ne!(other, proof);
    intruder
        .send(json!({ "event": "herald:resume", "data": { "proof": "0".repeat(32) } }))
        .await;
    let ok = intruder.subscribe("news").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert!(
        intruder.until_pong().await.is_empty(),
        "told or sent nothing"
    );
    // The page's connection was not closed.
    assert!(page.until_pong().await.is_empty());

    // The page drops, misses a publication, and proves itself: it is sent what it missed.
    page.ws.close(None).await.unwrap();
    drop(page);
    let (mut back, _) = open(&server).await;
    eventually("the page's positions are kept", || async {
        // A publication the page misses, once its connection is gone from the channel.
        server.node.hub.subscriber_count(&"7:news".parse().unwrap()) == 1
    })
    .await;
    server
        .publish("7:news", json!({"event": "n", "data": 2}))
        .await;
    back.send(json!({ "event": "herald:resume", "data": { "proof": proof } }))
        .await;
    let ok = back.subscribe("news").await;
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    let missed = back.next().await;
    assert_eq!(
        (&missed["event"], &missed["data"]),
        (&json!("n"), &json!(2))
    );
    server.stop().await.unwrap();
}

/// Issue #59, item 9: a quiet Pusher connection hears `pusher:ping`, as from Pusher's own
/// servers (a page cannot see WebSocket pings); one that answers `pusher:pong` stays past
/// `client.idle_timeout`, one that stops answering is closed with 4201 (pusher-js
/// reconnects). Herald sent WebSocket pings only.
#[tokio::test]
async fn a_quiet_pusher_connection_hears_pusher_ping_and_is_kept_by_its_pongs() {
    let mut c = pusher_config(false);
    c.client.ping_interval = std::time::Duration::from_millis(200);
    c.client.idle_timeout = std::time::Duration::from_secs(1);
    let server = start(c).await;
    let mut client = PusherClient::connect(&server).await;
    let started = tokio::time::Instant::now();
    // Answered for twice the idle timeout: every ping is Pusher's, and the connection stays.
    // (Bounded as a whole: `next` waits past WebSocket pings, which would come forever.)
    let answering = async {
        while started.elapsed() < std::time::Duration::from_secs(2) {
            let ping = client.next().await;
            assert_eq!(ping["event"], "pusher:ping", "{ping}");
            client
                .send(json!({ "event": "pusher:pong", "data": {} }))
                .await;
        }
    };
    tokio::time::timeout(PATIENCE, answering)
        .await
        .expect("pusher:ping, and the connection kept by the pongs");
    // Unanswered: closed as a client that stopped answering.
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            match client.ws.next().await {
                Some(Ok(Message::Close(close))) => return close,
                Some(Ok(_)) => {}
                other => panic!("not a close: {other:?}"),
            }
        }
    })
    .await
    .expect("closed in time");
    assert_eq!(closed.map(|c| u16::from(c.code)), Some(4201));
    server.stop().await.unwrap();
}
