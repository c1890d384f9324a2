//! Delta compression (`delta: "fossil"`): a subscription that asks for it gets its first
//! live publication whole, as text, and every next one as the Fossil delta from the one
//! before, on every transport; others on the channel still get plain publications.

use serde_json::{json, Value};

use crate::{
    http::{urlencode, Lines},
    support::*,
};

/// A document of about 2 KB of which one field changes per publication.
pub(crate) fn document(version: u64) -> Value {
    let fields: serde_json::Map<String, Value> = (0..40)
        .map(|i| {
            (
                format!("field{i:02}"),
                json!(format!("value {i} of a dashboard that rarely changes")),
            )
        })
        .collect();
    json!({ "version": version, "fields": fields })
}

/// What a client keeps to apply deltas: the last publication's data, as text.
#[derive(Default)]
pub(crate) struct Applier {
    last: Option<Vec<u8>>,
    pub(crate) wholes: usize,
    pub(crate) deltas: usize,
    plain: usize,
}

impl Applier {
    /// The data a `pub` push of a delta subscription carries, checked against the text the
    /// client keeps.
    pub(crate) fn take(&mut self, publication: &Value) -> Value {
        if let Some(data) = publication.get("data") {
            // A replay (history is sent plain): the next live one goes whole.
            self.last = None;
            self.plain += 1;
            return data.clone();
        }
        let text = if let Some(full) = publication["full"].as_str() {
            self.wholes += 1;
            full.as_bytes().to_vec()
        } else {
            let delta = publication["delta"]
                .as_str()
                .expect("full or delta: {publication}");
            self.deltas += 1;
            let base = self
                .last
                .as_ref()
                .expect("a delta comes after a whole publication");
            fossil_delta::apply(base, delta.as_bytes()).expect("the delta applies")
        };
        self.last = Some(text.clone());
        serde_json::from_slice(&text).expect("the data is JSON")
    }
}

#[tokio::test]
async fn a_websocket_subscription_gets_one_whole_publication_then_small_deltas() {
    let server = start(config()).await;
    let mut delta = server.client().await;
    let mut plain = server.client().await;
    let reply = delta
        .call("subscribe", json!({"channel": "dash", "delta": "fossil"}))
        .await;
    assert_eq!(reply["subscribe"]["delta"], "fossil", "{reply}");
    assert!(plain.subscribe("dash", None).await.get("delta").is_none());

    let mut applier = Applier::default();
    let (mut whole_bytes, mut delta_bytes) = (0, 0);
    for version in 1..=20 {
        server.publish("dash", document(version)).await;
        let line = delta.next_line().await;
        let size = line.to_string().len();
        assert_eq!(applier.take(&line["pub"]), document(version));
        if version == 1 {
            whole_bytes = size;
        } else {
            delta_bytes += size;
        }
        let (_, offset, data) = plain.next_pub().await;
        assert_eq!((offset, data), (version, document(version)));
    }
    assert_eq!((applier.plain, applier.wholes, applier.deltas), (0, 1, 19));
    assert!(
        delta_bytes * 10 < whole_bytes * 19,
        "19 deltas take {delta_bytes} bytes, against {whole_bytes} for one whole publication"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_resumed_subscription_starts_again_from_a_whole_publication() {
    let server = start(config()).await;
    let mut c = server.client().await;
    let reply = c
        .call("subscribe", json!({"channel": "dash", "delta": "fossil"}))
        .await;
    let epoch = reply["subscribe"]["epoch"].as_str().unwrap().to_string();
    let mut applier = Applier::default();
    for version in 1..=3 {
        server.publish("dash", document(version)).await;
        assert_eq!(applier.take(&c.next_line().await["pub"]), document(version));
    }
    drop(c);
    server.publish("dash", document(4)).await;
    let mut c = server.client().await;
    let reply = c
        .call(
            "subscribe",
            json!({"channel": "dash", "delta": "fossil", "since": {"offset": 3, "epoch": epoch}}),
        )
        .await;
    assert_eq!(reply["subscribe"]["recovered"], true, "{reply}");
    assert_eq!(reply["subscribe"]["publications"][0]["data"], document(4));
    // The client's kept text is that of 3: the next live one goes whole.
    let mut applier = Applier::default();
    for version in 5..=6 {
        server.publish("dash", document(version)).await;
        assert_eq!(applier.take(&c.next_line().await["pub"]), document(version));
    }
    assert_eq!((applier.wholes, applier.deltas), (1, 1));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_unknown_delta_format_is_refused() {
    let server = start(config()).await;
    let mut c = server.client().await;
    let reply = c
        .call("subscribe", json!({"channel": "dash", "delta": "xdelta3"}))
        .await;
    assert_eq!(reply["error"]["code"], 107, "{reply}");
    let status = reqwest::get(server.url("/connection/longpoll?channel=dash&delta=xdelta3"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 400);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn sse_and_http_streaming_carry_deltas() {
    let server = start(config()).await;
    for path in ["/connection/sse", "/connection/stream"] {
        let channel = format!("dash{}", path.len());
        let r = reqwest::get(server.url(&format!("{path}?channel={channel}&delta=fossil")))
            .await
            .unwrap();
        let mut lines = Lines::new(r);
        let mut applier = Applier::default();
        let mut version = 0;
        while applier.wholes + applier.deltas < 5 {
            let event = if path.ends_with("sse") {
                lines.next_event().await.unwrap().1
            } else {
                serde_json::from_str(&lines.next().await.unwrap()).unwrap()
            };
            if event.get("subscribe").is_some() {
                // Subscribed: publish one at a time, each after the last arrived.
                version += 1;
                server.publish(&channel, document(version)).await;
            } else if let Some(p) = event.get("pub") {
                assert_eq!(applier.take(p), document(version), "{path}");
                version += 1;
                server.publish(&channel, document(version)).await;
            }
        }
        assert_eq!((applier.wholes, applier.deltas), (1, 4), "{path}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_long_poll_that_continues_its_session_gets_deltas() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let (_, epoch) = server.publish("lp", document(0)).await;
    let mut cursor = format!("lp;{epoch};1");
    let mut key = String::new();
    let mut applier = Applier::default();
    for version in 1..=4 {
        let url = server.url(&format!(
            "/connection/longpoll?channel=lp&delta=fossil&timeout=10&cursor={}&session_key={key}",
            urlencode(&cursor)
        ));
        // The poll holds until the publication, or finds it when it comes after it.
        let held = tokio::spawn(http.get(url).send());
        server.publish("lp", document(version)).await;
        let (status, answer) = response(held.await.unwrap().unwrap()).await;
        assert_eq!(status, 200, "{answer}");
        let messages = answer["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1, "{answer}");
        assert_eq!(applier.take(&messages[0]["pub"]), document(version));
        cursor = answer["cursor"].as_str().unwrap().to_string();
        key = answer["session_key"].as_str().unwrap().to_string();
    }
    assert_eq!(
        applier.wholes, 1,
        "the session is continued, and its deltas with it"
    );
    server.stop().await.unwrap();
}
