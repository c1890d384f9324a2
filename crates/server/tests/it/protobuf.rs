//! Herald's Protobuf codec (`herald.protobuf`): a Protobuf client and a JSON client on the
//! same channel are told the same things, message for message (read back as JSON, see
//! `protobuf::to_json`), and what is no Protobuf command gets an error, not a crash.

use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::{
    delta::{document, Applier},
    presence::{presence_config, token},
    support::*,
};

/// The same message on both clients, ids aside.
async fn same_next(json_client: &mut Client, protobuf: &mut Client) -> Value {
    let (a, b) = (json_client.next_line().await, protobuf.next_line().await);
    assert_eq!(a, b, "the JSON and the Protobuf client were told the same");
    a
}

fn without_id(mut reply: Value) -> Value {
    reply.as_object_mut().unwrap().remove("id");
    reply
}

#[tokio::test]
async fn a_protobuf_client_is_told_what_a_json_client_is_told() {
    let server = start(presence_config()).await;
    let (mut j, mut p) = (server.client().await, server.protobuf_client().await);
    for (c, user) in [(&mut j, "ada"), (&mut p, "bob")] {
        let reply = c
            .call(
                "connect",
                json!({ "token": token(user, json!({ "name": user })) }),
            )
            .await;
        assert_eq!(reply["connect"]["user"], user, "{reply}");
    }
    server.publish("room:1", json!({ "before": true })).await;
    let subscribed = |c: Value| without_id(c);
    let since = json!({ "channel": "room:1", "since": { "offset": 0 } });
    assert_eq!(
        subscribed(j.call("subscribe", since.clone()).await),
        subscribed(p.call("subscribe", since).await),
        "the subscribe replies, the replayed publication with them"
    );
    server.node.presence.end_window().await;
    let joined = same_next(&mut j, &mut p).await;
    assert_eq!(
        joined["presence"]["join"].as_array().unwrap().len(),
        2,
        "{joined}"
    );

    // A publication by the Protobuf client, with who sent it; one by the backend.
    let published = p
        .call(
            "publish",
            json!({ "channel": "room:1", "data": { "text": "hi" } }),
        )
        .await;
    assert_eq!(published["publish"]["offset"], 2, "{published}");
    let hi = same_next(&mut j, &mut p).await;
    assert_eq!(hi["pub"]["data"], json!({ "text": "hi" }));
    assert_eq!(hi["pub"]["from"]["user"], "bob", "{hi}");
    server.publish("room:1", json!([1, 2, 3])).await;
    assert_eq!(same_next(&mut j, &mut p).await["pub"]["offset"], 3);

    for (method, params) in [
        ("history", json!({ "channel": "room:1", "limit": 10 })),
        ("presence", json!({ "channel": "room:1" })),
        ("presence_stats", json!({ "channel": "room:1" })),
        ("ping", json!({})),
        ("publish", json!({ "channel": "quiet:1", "data": 1 })),
    ] {
        let (a, b) = (
            j.call(method, params.clone()).await,
            p.call(method, params).await,
        );
        assert_eq!(without_id(a), without_id(b), "{method}");
    }

    // The connection ends in the same words.
    let mut unsubscribed = Vec::new();
    for c in [&mut j, &mut p] {
        unsubscribed.push(without_id(
            c.call("unsubscribe", json!({ "channel": "room:1" })).await,
        ));
    }
    assert_eq!(unsubscribed[0], unsubscribed[1]);
}

#[tokio::test]
async fn protobuf_subscriptions_take_deltas() {
    let server = start(config()).await;
    let mut p = server.protobuf_client().await;
    let reply = p
        .call("subscribe", json!({ "channel": "dash", "delta": "fossil" }))
        .await;
    assert_eq!(reply["subscribe"]["delta"], "fossil", "{reply}");
    let mut applier = Applier::default();
    for version in 1..=10 {
        server.publish("dash", document(version)).await;
        let line = p.next_line().await;
        assert_eq!(applier.take(&line["pub"]), document(version));
    }
    assert_eq!((applier.wholes, applier.deltas), (1, 9));
}

#[tokio::test]
async fn what_is_no_protobuf_command_closes_with_a_reason_and_bad_data_is_refused() {
    let server = start(config()).await;
    // A length prefix that says more than follows; a message that is no command: nothing
    // in them can be trusted, not even an id (as with a JSON frame that is no JSON), so
    // the connection closes with 3501 and says why.
    for junk in [&b"\x05\x01\x02"[..], &b"\x03\xff\xff\xff"[..]] {
        let mut p = server.protobuf_client().await;
        p.ws.send(Message::Binary(junk.to_vec().into()))
            .await
            .unwrap();
        let closed = p.closed().await;
        assert_eq!(closed.code, 3501, "{closed:?}");
        assert!(closed.reason.contains("malformed"), "{closed:?}");
    }
    // Data that is not JSON text: refused with the command's id; the connection stays.
    let mut p = server.protobuf_client().await;
    let refused = p
        .call("publish", json!({ "channel": "open:x", "data": "fine" }))
        .await;
    assert!(refused.get("publish").is_some(), "{refused}");
    let binary_data = herald_protocol_publish_of_bytes(b"\x00\x9f not JSON");
    p.ws.send(Message::Binary(binary_data.into()))
        .await
        .unwrap();
    let error = p.next_line().await;
    assert_eq!(error["id"], 99, "{error}");
    assert_eq!(error["error"]["code"], 107, "{error}");
    assert!(p.call("ping", json!({})).await.get("ping").is_some());
}

/// A Protobuf `publish` with id 99 whose data is `data`, raw.
fn herald_protocol_publish_of_bytes(data: &[u8]) -> Vec<u8> {
    // Command { id: 99, publish: Publish { channel: "open:x", data } }, by hand: the
    // codec's own writer takes only JSON.
    let mut publish = vec![0x0a, 6];
    publish.extend_from_slice(b"open:x");
    publish.push(0x12);
    publish.push(data.len() as u8);
    publish.extend_from_slice(data);
    let mut command = vec![0x08, 99, 0x2a, publish.len() as u8];
    command.extend_from_slice(&publish);
    let mut framed = vec![command.len() as u8];
    framed.extend_from_slice(&command);
    framed
}

/// Length-delimited Protobuf messages read off an HTTP response as they come (a message
/// may span chunks), each read back as JSON.
struct DelimitedStream {
    response: reqwest::Response,
    buffered: Vec<u8>,
}

impl DelimitedStream {
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = whole_message(&self.buffered) {
                let part: Vec<u8> = self.buffered.drain(..end).collect();
                let json = herald_protocol::protobuf::to_json(&part).expect("a server message");
                return serde_json::from_slice(&json).unwrap();
            }
            let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                .await
                .expect("a message in time")
                .unwrap()
                .expect("the stream goes on");
            self.buffered.extend_from_slice(&chunk);
        }
    }
}

/// Where the first length-delimited message in `buf` ends, once it is whole.
fn whole_message(buf: &[u8]) -> Option<usize> {
    let mut len = 0usize;
    for (i, b) in buf.iter().enumerate().take(10) {
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let end = i + 1 + len;
            return (buf.len() >= end).then_some(end);
        }
    }
    None
}

/// `/connection/stream?protocol=protobuf` carries Herald's Protobuf messages, each with its
/// length, one after another; the stream's session takes Protobuf commands by
/// `POST /connection/send?session=ID` and answers them in the stream. The transports that
/// carry text only refuse the codec with a reason.
#[tokio::test]
async fn an_http_stream_carries_protobuf_messages_and_takes_protobuf_commands() {
    let server = start(config()).await;
    let http = reqwest::Client::new();
    let opened = http
        .get(server.url("/connection/stream?protocol=protobuf&channel=open:pb"))
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), 200);
    assert_eq!(opened.headers()["content-type"], "application/x-protobuf");
    let mut stream = DelimitedStream {
        response: opened,
        buffered: Vec::new(),
    };
    let connect = stream.next().await;
    let session = connect["connect"]["client"].as_str().unwrap().to_owned();
    assert_eq!(stream.next().await["subscribe"]["channel"], "open:pb");
    server.publish("open:pb", json!({ "n": 1 })).await;
    let first = stream.next().await;
    assert_eq!(
        (&first["pub"]["offset"], &first["pub"]["data"]),
        (&json!(1), &json!({ "n": 1 })),
        "{first}"
    );

    let command = json!({ "id": 7, "publish": { "channel": "open:pb", "data": { "n": 2 } } });
    let frame = herald_protocol::protobuf::frame_of_json(command.to_string().as_bytes());
    let sent = http
        .post(server.url(&format!("/connection/send?session={session}")))
        .body(frame)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let (mut reply, mut second) = (None, None);
    while reply.is_none() || second.is_none() {
        let message = stream.next().await;
        if message["id"] == 7 {
            reply = Some(message);
        } else if message.get("pub").is_some() {
            second = Some(message);
        }
    }
    assert_eq!(reply.unwrap()["publish"]["offset"], 2);
    assert_eq!(second.unwrap()["pub"]["data"], json!({ "n": 2 }));

    for path in [
        "/connection/sse?protocol=protobuf&channel=open:pb",
        "/connection/iframe?callback=f&protocol=protobuf&channel=open:pb",
        "/connection/longpoll?protocol=protobuf&channel=open:pb",
        "/connection/poll?protocol=protobuf&channel=open:pb",
    ] {
        let r = http.get(server.url(path)).send().await.unwrap();
        let (status, body) = response(r).await;
        assert_eq!(status, 400, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("bytes") && message.contains("herald.protobuf"),
            "{path}: {body}"
        );
    }
}
