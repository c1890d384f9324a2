//! Golden frames: every reply and push the JSON codec makes, byte for byte, against
//! `fixtures/frames.txt`; and every example in `docs/protocol.md` against them, so that the
//! documentation cannot show a field, or an order of fields, that the server does not send.
//!
//! A change to a frame changes the fixture in the same commit (and every client that reads
//! it: the SDK, `herald sub`, the bench). The fixture is one frame a line: `NAME FRAME`.

use std::collections::BTreeMap;

use bytes::Bytes;
use herald_protocol::{
    json::{self, Json},
    protobuf::{self, Protobuf},
    results::{self, Member},
    ChannelName, Codec, Epoch, ErrorCode, Outcome, Publication, Push, Reply,
};
use serde_json::{value::RawValue, Value};

fn channel(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

fn publication(offset: u64, data: &str, from: Option<&str>) -> Publication {
    Publication {
        offset,
        record: Publication::record(
            Bytes::copy_from_slice(data.as_bytes()),
            from.map(str::as_bytes),
        ),
    }
}

/// Every frame, by name, as the JSON codec makes it.
fn frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut frames = frames_in(&Json);
    frames.extend(poll_answers());
    frames
}

/// Every reply and push, by name, as `codec` makes it.
fn frames_in(codec: &dyn Codec) -> Vec<(&'static str, Vec<u8>)> {
    let done = |id: u64, outcome: Outcome<'_>| codec.reply(&Reply::Done { id, outcome });
    let epoch = Epoch::new("k3x9q1");
    let lobby = channel("chat:lobby");
    let state = RawValue::from_string(r#"{"topic":"hi"}"#.into()).unwrap();
    let answer = RawValue::from_string(r#"{"ok":true}"#.into()).unwrap();
    let replayed = [
        publication(5, r#"{"text":"a"}"#, None),
        publication(6, r#"{"text":"b"}"#, Some(r#"{"user":"42"}"#)),
    ];
    let expiry = Some(results::Expiry {
        expires: 1_900_000_000,
        ttl: 600,
    });
    let members = [
        Member {
            id: 0xabc,
            info: br#"{"user":"42","info":{"name":"Ada"}}"#,
        },
        Member {
            id: 0xdef,
            info: b"{}",
        },
    ];
    let connect = results::Connect {
        client: "n1-8f2c",
        version: "0.1.0",
        ping: 25,
        user: Some("42"),
        expiry,
    };
    let anonymous = results::Connect {
        user: None,
        expiry: None,
        ..connect
    };
    let stream = |recovered, data| results::Stream {
        epoch: &epoch,
        offset: 6,
        recovered,
        publications: &replayed,
        data,
        delta: None,
    };
    let push = |push: Push<'_>| codec.push(&push);
    let hi = publication(7, r#"{"text":"hi"}"#, None);
    let hello = publication(
        8,
        r#"{"text":"hello"}"#,
        Some(r#"{"user":"42","info":{"name":"Ada"}}"#),
    );
    vec![
        ("reply.connect", done(1, Outcome::Connect(connect))),
        (
            "reply.connect.anonymous",
            done(1, Outcome::Connect(anonymous)),
        ),
        (
            "reply.subscribe",
            done(2, Outcome::Subscribe(stream(Some(true), Some(&state)))),
        ),
        (
            "reply.history",
            done(3, Outcome::History(stream(None, None))),
        ),
        (
            "reply.publish",
            done(
                4,
                Outcome::Publish(results::Published {
                    offset: 7,
                    epoch: &epoch,
                    repeat: false,
                }),
            ),
        ),
        (
            "reply.publish.repeat",
            done(
                4,
                Outcome::Publish(results::Published {
                    offset: 7,
                    epoch: &epoch,
                    repeat: true,
                }),
            ),
        ),
        (
            "reply.refresh",
            done(
                5,
                Outcome::Refresh(results::Refreshed {
                    expiry,
                    subscription: false,
                }),
            ),
        ),
        (
            "reply.rpc",
            done(6, Outcome::Rpc(results::Rpc { data: &answer })),
        ),
        (
            "reply.presence",
            done(
                7,
                Outcome::Presence(results::Presence {
                    members: &members,
                    cursor: Some("0000000000000def".into()),
                }),
            ),
        ),
        (
            "reply.presence_stats",
            done(
                8,
                Outcome::PresenceStats(results::PresenceStats {
                    clients: 2,
                    users: 1,
                }),
            ),
        ),
        ("reply.unsubscribe", done(9, Outcome::Unsubscribe)),
        ("reply.ping", done(10, Outcome::Ping)),
        (
            "reply.error",
            codec.reply(&Reply::error(
                Some(11),
                ErrorCode::PermissionDenied,
                "not allowed",
            )),
        ),
        (
            "error.unnumbered",
            codec.reply(&Reply::error(None, ErrorCode::BadRequest, "not JSON")),
        ),
        (
            "error.channel",
            codec.reply(&Reply::Refused {
                id: None,
                code: 1003,
                message: "staff only",
                channel: Some(&channel("room:staff")),
            }),
        ),
        (
            "push.pub",
            push(Push::Pub {
                channel: &lobby,
                publication: &hi,
            }),
        ),
        (
            "push.pub.from",
            push(Push::Pub {
                channel: &lobby,
                publication: &hello,
            }),
        ),
        (
            "push.pub.full",
            push(Push::PubDelta {
                channel: &lobby,
                publication: &hi,
                delta: None,
            }),
        ),
        (
            "push.pub.delta",
            push(Push::PubDelta {
                channel: &lobby,
                publication: &hi,
                delta: Some(b"E\n7@0,3:\"hi\"3NB;"),
            }),
        ),
        ("push.connect", push(Push::Connect(&connect))),
        (
            "push.subscribe",
            push(Push::Subscribe(&results::Subscribed {
                channel: &channel("news"),
                epoch: &epoch,
                offset: 7,
                recovered: Some(false),
                data: Some(&state),
            })),
        ),
        (
            "push.unsubscribe",
            push(Push::Unsubscribe {
                channel: &channel("doc:7f3e"),
                code: ErrorCode::TokenExpired,
                reason: "subscription token expired",
            }),
        ),
        (
            "push.disconnect",
            push(Push::Disconnect {
                code: 3001,
                reason: "shutdown",
            }),
        ),
        (
            "push.disconnect.final",
            push(Push::Disconnect {
                code: 3504,
                reason: "token expired",
            }),
        ),
        (
            "push.presence",
            push(Push::Presence {
                channel: &lobby,
                join: &members,
                leave: &[],
                missed: false,
                clients: Some(3),
            }),
        ),
        (
            "push.presence.missed",
            push(Push::Presence {
                channel: &lobby,
                join: &[],
                leave: &[],
                missed: true,
                clients: None,
            }),
        ),
        ("push.ping", push(Push::Ping)),
        (
            "push.conflated",
            push(Push::Conflated {
                channel: &lobby,
                offset: 7,
            }),
        ),
    ]
}

/// The long-poll's answers (the JSON codec's framing of a poll).
fn poll_answers() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "answer.poll",
            json::encode_poll_answer(
                "chat:lobby;k3x9q1;7",
                "n1-8f2c",
                Some("5f0c9a7e1b2d4c6f8a0b1c2d3e4f5a6b"),
                br#"{"pub":{"channel":"chat:lobby","offset":7,"data":{"text":"hi"}}}"#,
            ),
        ),
        (
            "answer.poll.empty",
            json::encode_poll_answer("chat:lobby;k3x9q1;7", "n1-8f2c", None, b""),
        ),
    ]
}

fn fixture() -> BTreeMap<String, String> {
    lines(include_str!("../fixtures/frames.txt"))
}

fn lines(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, frame) = l.split_once(' ').expect("NAME FRAME");
            (name.to_string(), frame.to_string())
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Protobuf codec's frames (`fixtures/frames.protobuf.txt`, `NAME HEX`) are golden too,
/// and each says what its JSON namesake says: read back as JSON
/// ([`protobuf::to_json`]), it is the JSON codec's frame byte for byte. The SDK's tests
/// read the same fixture with `proto/herald.proto`.
#[test]
fn every_protobuf_frame_is_golden_and_means_its_json_namesake() {
    let golden = lines(include_str!("../fixtures/frames.protobuf.txt"));
    let json: BTreeMap<&str, Vec<u8>> = frames_in(&Json).into_iter().collect();
    let made = frames_in(&Protobuf);
    let mut wrong = Vec::new();
    for (name, bytes) in &made {
        let (part, rest) = Protobuf.split(bytes);
        assert!(rest.is_empty(), "{name}: one message");
        let read = protobuf::to_json(part).expect("a server message");
        assert_eq!(
            String::from_utf8(read).unwrap(),
            String::from_utf8(json[name].clone()).unwrap(),
            "{name}: the Protobuf frame means what the JSON one says"
        );
        match golden.get(*name) {
            Some(g) if *g == hex(bytes) => {}
            other => wrong.push(format!("{name} {}\n  (golden: {other:?})", hex(bytes))),
        }
    }
    assert!(wrong.is_empty(), "frames differ:\n{}", wrong.join("\n"));
    assert_eq!(golden.len(), made.len(), "one golden frame per frame made");
}

#[test]
fn every_frame_is_the_golden_one_byte_for_byte() {
    let golden = fixture();
    let made = frames();
    let mut wrong = Vec::new();
    for (name, bytes) in &made {
        let text = String::from_utf8(bytes.clone()).expect("frames are UTF-8");
        serde_json::from_str::<Value>(&text).expect("frames are JSON");
        assert!(!text.contains('\n'), "{name}: one line per frame");
        match golden.get(*name) {
            Some(g) if *g == text => {}
            other => wrong.push(format!("{name} {text}\n  (golden: {other:?})")),
        }
    }
    for name in golden.keys() {
        assert!(
            made.iter().any(|(n, _)| n == name),
            "{name} is in the fixture but the test makes no such frame"
        );
    }
    assert!(wrong.is_empty(), "frames differ:\n{}", wrong.join("\n"));
}

/// A JSON value with its objects' keys in the order written (`serde_json::Value` sorts
/// them); only the top two levels matter here.
enum Ordered {
    Object(Vec<(String, Ordered)>),
    Other,
}

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Ordered>()? {
                    entries.push((k, v));
                }
                Ok(Ordered::Object(entries))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Ordered, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Ordered::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A frame's kind (`reply.subscribe`, `push.pub`, `error`) and its body's keys in the order
/// written; `None` for what is not a frame (not JSON, or no object body).
fn shape(frame: &str) -> Option<(String, Vec<String>)> {
    let Ordered::Object(entries) = serde_json::from_str::<Ordered>(frame).ok()? else {
        return None;
    };
    // A poll's answer is an envelope, not a frame with a body.
    if entries.iter().any(|(k, _)| k == "messages") {
        return Some((
            "answer.poll".into(),
            entries.iter().map(|(k, _)| k.clone()).collect(),
        ));
    }
    let has_id = entries.iter().any(|(k, _)| k == "id");
    let (kind, body) = entries.iter().find(|(k, _)| k != "id")?;
    let Ordered::Object(body) = body else {
        return None;
    };
    let kind = match (kind.as_str(), has_id) {
        ("error", _) => "error".to_string(),
        (k, true) => format!("reply.{k}"),
        (k, false) => format!("push.{k}"),
    };
    Some((kind, body.iter().map(|(k, _)| k.clone()).collect()))
}

/// The JSON frames `docs/protocol.md` shows: lines of its `json` blocks, and code spans,
/// that parse as JSON objects (templates with placeholders do not, and are passed over).
fn documented() -> Vec<String> {
    let doc = include_str!("../../../docs/protocol.md");
    let mut found = Vec::new();
    let mut in_json = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_json = line == "```json";
            continue;
        }
        if in_json {
            found.push(line.trim().to_string());
        } else {
            found.extend(
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|span| span.starts_with("{\""))
                    .map(str::to_string),
            );
        }
    }
    found.into_iter().filter(|f| shape(f).is_some()).collect()
}

#[test]
fn the_protocol_docs_show_frames_as_the_codec_makes_them() {
    // Each kind's keys, in the order the codec writes them (the union over its frames).
    let mut golden: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, bytes) in frames() {
        let (kind, keys) = shape(std::str::from_utf8(&bytes).unwrap()).unwrap();
        let known = golden.entry(kind).or_default();
        for k in keys {
            if !known.contains(&k) {
                known.push(k);
            }
        }
    }
    let examples = documented();
    assert!(
        examples.len() >= 8,
        "docs/protocol.md's examples were not found: {examples:?}"
    );
    for example in examples {
        let (kind, keys) = shape(&example).unwrap();
        let known = golden.get(&kind).unwrap_or_else(|| {
            panic!("docs/protocol.md shows a {kind} the codec never makes: {example}")
        });
        let at: Vec<usize> = keys
            .iter()
            .map(|k| {
                known.iter().position(|g| g == k).unwrap_or_else(|| {
                    panic!("docs/protocol.md shows {kind} with `{k}`, which the codec never writes ({known:?}): {example}")
                })
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "docs/protocol.md shows {kind}'s fields in another order than the codec's {known:?}: {example}"
        );
    }
}
