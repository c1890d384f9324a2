//! Phoenix Channels' messages, as Herald's Phoenix front speaks them to `phoenix.js` (and
//! Tsung's Phoenix sessions). No I/O; fuzzed (`crates/fuzz`, target `phoenix`).
//!
//! Two serializers, chosen by the socket's `vsn=`:
//!
//! ```text
//! 2.0.0  ["1","1","chat:lobby","phx_join",{"token":"…"}]                  [join_ref, ref, topic, event, payload]
//! 1.0.0  {"topic":"chat","event":"phx_join","payload":{},"ref":"1"}
//! ```
//!
//! A topic is Herald's channel of the same name. A publication stored as a Pusher-style
//! event (`{"event": E, "data": D}`, see [`crate::pusher`]) arrives as event `E` with
//! payload `D`; any other payload arrives whole as the event [`PLAIN_EVENT`].

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The event a publication that is not an event envelope arrives as.
pub const PLAIN_EVENT: &str = crate::pusher::PLAIN_EVENT;

/// The topic of the socket's own messages (heartbeats).
pub const SOCKET_TOPIC: &str = "phoenix";

/// Which serializer a socket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vsn {
    /// `1.0.0`: one JSON object per message.
    V1,
    /// `2.0.0`: one JSON array per message.
    V2,
}

impl Vsn {
    /// The serializer `vsn=` names (none: 1.0.0, as Phoenix assumes); `None` for a version
    /// this server does not speak.
    pub fn parse(vsn: Option<&str>) -> Option<Vsn> {
        match vsn {
            None => Some(Vsn::V1),
            Some(v) if v.starts_with("1.") => Some(Vsn::V1),
            Some(v) if v.starts_with("2.") => Some(Vsn::V2),
            Some(_) => None,
        }
    }
}

/// One message from a client.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The join this message belongs to (the `ref` of its `phx_join`).
    pub join_ref: Option<String>,
    /// The message's own ref, echoed in the reply.
    pub reference: Option<String>,
    /// The topic.
    pub topic: String,
    /// The event (`phx_join`, `phx_leave`, `heartbeat`, or the app's own).
    pub event: String,
    /// The payload, as JSON text.
    pub payload: String,
}

/// Why a message was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

/// A ref as clients write it: a string, a number, or null.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ref {
    Text(String),
    Number(serde_json::Number),
}

fn text(r: Option<Ref>) -> Option<String> {
    r.map(|r| match r {
        Ref::Text(s) => s,
        Ref::Number(n) => n.to_string(),
    })
}

/// Decodes one message. Never panics.
pub fn decode(vsn: Vsn, message: &[u8]) -> Result<Message, Malformed> {
    let bad = |e: serde_json::Error| Malformed(format!("not a Phoenix message: {e}"));
    match vsn {
        Vsn::V2 => {
            let (join_ref, reference, topic, event, payload): (
                Option<Ref>,
                Option<Ref>,
                String,
                String,
                &RawValue,
            ) = serde_json::from_slice(message).map_err(bad)?;
            Ok(Message {
                join_ref: text(join_ref),
                reference: text(reference),
                topic,
                event,
                payload: payload.get().to_owned(),
            })
        }
        Vsn::V1 => {
            #[derive(Deserialize)]
            struct Object<'a> {
                topic: String,
                event: String,
                #[serde(borrow, default)]
                payload: Option<&'a RawValue>,
                #[serde(default, rename = "ref")]
                reference: Option<Ref>,
                #[serde(default)]
                join_ref: Option<Ref>,
            }
            let o: Object = serde_json::from_slice(message).map_err(bad)?;
            Ok(Message {
                join_ref: text(o.join_ref),
                reference: text(o.reference),
                topic: o.topic,
                event: o.event,
                payload: o.payload.map_or("{}", |p| p.get()).to_owned(),
            })
        }
    }
}

/// The kind byte of a client's binary push (serializer 2.0.0, a binary WebSocket message:
/// `[0, join_ref len, ref len, topic len, event len, join_ref, ref, topic, event, data]`).
const BINARY_PUSH: u8 = 0;

/// A client's binary push (phoenix.js sends one when a push's payload is an
/// `ArrayBuffer`): the message with a `null` payload, and the payload's bytes. `None` if
/// `message` is not one. Never panics.
pub fn decode_binary_push(message: &[u8]) -> Option<(Message, &[u8])> {
    let (&kind, rest) = message.split_first()?;
    if kind != BINARY_PUSH {
        return None;
    }
    let (sizes, mut rest) = rest.split_first_chunk::<4>()?;
    let mut texts: [String; 4] = Default::default();
    for (text, size) in texts.iter_mut().zip(sizes) {
        let (bytes, after) = rest.split_at_checked(usize::from(*size))?;
        *text = std::str::from_utf8(bytes).ok()?.to_owned();
        rest = after;
    }
    let [join_ref, reference, topic, event] = texts;
    let message = Message {
        join_ref: Some(join_ref).filter(|r| !r.is_empty()),
        reference: Some(reference).filter(|r| !r.is_empty()),
        topic,
        event,
        payload: "null".to_owned(),
    };
    Some((message, rest))
}

/// Encodes a message from the server.
pub fn encode(
    vsn: Vsn,
    join_ref: Option<&str>,
    reference: Option<&str>,
    topic: &str,
    event: &str,
    payload: &RawValue,
) -> Vec<u8> {
    match vsn {
        Vsn::V2 => serde_json::to_vec(&(join_ref, reference, topic, event, payload)),
        Vsn::V1 => {
            #[derive(Serialize)]
            struct Object<'a> {
                topic: &'a str,
                event: &'a str,
                payload: &'a RawValue,
                #[serde(rename = "ref")]
                reference: Option<&'a str>,
                #[serde(skip_serializing_if = "Option::is_none")]
                join_ref: Option<&'a str>,
            }
            serde_json::to_vec(&Object {
                topic,
                event,
                payload,
                reference,
                join_ref,
            })
        }
    }
    .expect("messages serialise")
}

/// `phx_reply` to `message`: `{"status": "ok"|"error", "response": …}`.
pub fn reply(vsn: Vsn, message: &Message, ok: bool, response: &RawValue) -> Vec<u8> {
    #[derive(Serialize)]
    struct Reply<'a> {
        status: &'a str,
        response: &'a RawValue,
    }
    let payload = serde_json::to_string(&Reply {
        status: if ok { "ok" } else { "error" },
        response,
    })
    .expect("replies serialise");
    let payload: &RawValue = serde_json::from_str(&payload).expect("just written");
    encode(
        vsn,
        message.join_ref.as_deref(),
        message.reference.as_deref(),
        &message.topic,
        "phx_reply",
        payload,
    )
}

/// An error reply's response: `{"reason": …}`, with Herald's error code when there is one.
pub fn reason(reason: &str, code: Option<u16>) -> Box<RawValue> {
    #[derive(Serialize)]
    struct Reason<'a> {
        reason: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<u16>,
    }
    let text = serde_json::to_string(&Reason { reason, code }).expect("reasons serialise");
    RawValue::from_string(text).expect("just written")
}

/// The empty object.
pub fn empty() -> &'static RawValue {
    serde_json::from_str("{}").expect("{} is JSON")
}

#[derive(Deserialize)]
struct Envelope<'a> {
    event: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    /// The connection that sent it and is not to hear it (Pusher's `socket_id`, a Phoenix
    /// connection's for `broadcast_from`).
    #[serde(default, borrow)]
    socket_id: Option<std::borrow::Cow<'a, str>>,
    /// [`BASE64`] when `data` is a binary payload's bytes, as a base64 string.
    #[serde(default, borrow)]
    encoding: Option<std::borrow::Cow<'a, str>>,
}

/// The `encoding` of a stored event whose `data` is the base64 of a binary payload (a
/// binary push): JSON where the payload goes as text (Herald's own protocol, the HTTP API,
/// serializer 1.0.0, the long-poll), bytes where it can (2.0.0 on a WebSocket).
pub const BASE64: &str = "base64";

impl Envelope<'_> {
    /// The binary payload's base64 text, if the event carries one.
    fn base64(&self) -> Option<String> {
        if self.encoding.as_deref() != Some(BASE64) {
            return None;
        }
        serde_json::from_str(self.data?.get()).ok()
    }
}

/// A publication as a Phoenix broadcast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broadcast {
    /// The message: JSON text, or a binary message (serializer 2.0.0's broadcast kind) for
    /// a binary payload.
    pub frame: Vec<u8>,
    /// The broadcast as JSON text when `frame` is binary, for a transport that carries
    /// only text (the long-poll): the payload `{"binary": BASE64}`.
    pub text: Option<Vec<u8>>,
    /// The connection it is not for, if its sender asked so (the envelope's `socket_id`).
    pub except: Option<String>,
}

/// The kind byte of the server's binary broadcast (serializer 2.0.0:
/// `[2, topic len, event len, topic, event, data]`).
const BINARY_BROADCAST: u8 = 2;

/// Whether `message` is one of serializer 2.0.0's binary messages (kinds 0 to 2, push,
/// reply, broadcast), not JSON text: JSON text never begins with those bytes.
pub fn is_binary(message: &[u8]) -> bool {
    matches!(message.first(), Some(0..=2))
}

/// `data` as a binary broadcast of `event` on `topic`; `None` when a name is longer than
/// the kind's one-byte sizes allow.
fn binary_broadcast(topic: &str, event: &str, data: &[u8]) -> Option<Vec<u8>> {
    let (topic_len, event_len) = (
        u8::try_from(topic.len()).ok()?,
        u8::try_from(event.len()).ok()?,
    );
    let mut out = Vec::with_capacity(3 + topic.len() + event.len() + data.len());
    out.extend_from_slice(&[BINARY_BROADCAST, topic_len, event_len]);
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(data);
    Some(out)
}

/// How a client's binary push of `event` is stored: `{"event", "data": BASE64 text,
/// "encoding": "base64"[, "socket_id"]}` (see [`BASE64`]).
pub fn stored_binary(event: &str, data: &[u8], socket_id: Option<&str>) -> Vec<u8> {
    use base64::Engine;
    #[derive(Serialize)]
    struct Stored<'a> {
        event: &'a str,
        data: String,
        encoding: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        socket_id: Option<&'a str>,
    }
    serde_json::to_vec(&Stored {
        event,
        data: base64::engine::general_purpose::STANDARD.encode(data),
        encoding: BASE64,
        socket_id,
    })
    .expect("payloads serialise")
}

/// A binary payload as JSON text carries it: `{"binary": BASE64}`.
fn binary_as_json(base64: &str) -> Box<RawValue> {
    #[derive(Serialize)]
    struct Binary<'a> {
        binary: &'a str,
    }
    serde_json::value::to_raw_value(&Binary { binary: base64 }).expect("objects serialise")
}

/// A publication's payload (`data`, one JSON value) as a broadcast on `topic`: no join
/// ref, so every member of the topic takes it, and one encoding serves them all.
pub fn broadcast(vsn: Vsn, topic: &str, data: &[u8]) -> Broadcast {
    let null: &RawValue = serde_json::from_str("null").expect("null is JSON");
    let envelope = (data.first() == Some(&b'{'))
        .then(|| serde_json::from_slice::<Envelope>(data).ok())
        .flatten();
    match envelope {
        Some(e) => {
            let except = e.socket_id.as_ref().map(|s| s.clone().into_owned());
            if let Some(base64) = e.base64() {
                return binary_broadcast_of(vsn, topic, &e.event, &base64, except);
            }
            Broadcast {
                frame: encode(vsn, None, None, topic, &e.event, e.data.unwrap_or(null)),
                text: None,
                except,
            }
        }
        None => {
            let whole: &RawValue = serde_json::from_slice(data).unwrap_or(null);
            Broadcast {
                frame: encode(vsn, None, None, topic, PLAIN_EVENT, whole),
                text: None,
                except: None,
            }
        }
    }
}

/// A binary payload's broadcast: its bytes in a binary message for serializer 2.0.0 (the
/// JSON text beside it for a long-poll), JSON text alone for 1.0.0, which has no binary.
fn binary_broadcast_of(
    vsn: Vsn,
    topic: &str,
    event: &str,
    base64: &str,
    except: Option<String>,
) -> Broadcast {
    use base64::Engine;
    let text = encode(vsn, None, None, topic, event, &binary_as_json(base64));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64)
        .ok();
    let binary = bytes
        .filter(|_| vsn == Vsn::V2)
        .and_then(|bytes| binary_broadcast(topic, event, &bytes));
    match binary {
        Some(frame) => Broadcast {
            frame,
            text: Some(text),
            except,
        },
        None => Broadcast {
            frame: text,
            text: None,
            except,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_serializers() {
        let m = decode(
            Vsn::V2,
            br#"["1","2","chat:lobby","phx_join",{"token":"t"}]"#,
        )
        .unwrap();
        assert_eq!(m.join_ref.as_deref(), Some("1"));
        assert_eq!(m.reference.as_deref(), Some("2"));
        assert_eq!(m.payload, r#"{"token":"t"}"#);
        let m = decode(
            Vsn::V1,
            br#"{"topic":"chat","event":"speak","payload":{"body":"hi"}}"#,
        )
        .unwrap();
        assert_eq!((m.topic.as_str(), m.event.as_str()), ("chat", "speak"));
        assert_eq!(m.reference, None);
        let m = decode(Vsn::V2, br#"[null,7,"phoenix","heartbeat",{}]"#).unwrap();
        assert_eq!(m.reference.as_deref(), Some("7"));
        for bad in [&b"[]"[..], b"{}", br#"[1,2,3]"#, b"nope"] {
            assert!(decode(Vsn::V2, bad).is_err());
            assert!(decode(Vsn::V1, bad).is_err());
        }
        assert_eq!(Vsn::parse(Some("2.0.0")), Some(Vsn::V2));
        assert_eq!(Vsn::parse(None), Some(Vsn::V1));
        assert_eq!(Vsn::parse(Some("3.0.0")), None);
    }

    #[test]
    fn reads_a_binary_push_as_phoenix_js_writes_it() {
        let mut push = vec![0, 1, 2, 10, 6];
        push.extend_from_slice(b"312chat:lobbyupload");
        push.extend_from_slice(&[0xff, 0, 1]);
        let (m, data) = decode_binary_push(&push).unwrap();
        assert_eq!(m.join_ref.as_deref(), Some("3"));
        assert_eq!(m.reference.as_deref(), Some("12"));
        assert_eq!(
            (m.topic.as_str(), m.event.as_str()),
            ("chat:lobby", "upload")
        );
        assert_eq!(data, [0xff, 0, 1]);
        assert!(decode_binary_push(&push[..8]).is_none(), "cut short");
        assert!(decode_binary_push(b"[\"1\"]").is_none(), "text");
        assert!(decode_binary_push(&[0, 1, 0, 0]).is_none());
        assert!(
            decode_binary_push(&[0, 1, 0, 0, 0, 0xff]).is_none(),
            "not UTF-8"
        );
    }

    #[test]
    fn a_stored_binary_push_is_bytes_for_2_0_0_and_base64_json_elsewhere() {
        let bytes = [0u8, b'\n', 0xff, b'['];
        let stored = stored_binary("upload", &bytes, None);
        assert_eq!(
            std::str::from_utf8(&stored).unwrap(),
            r#"{"event":"upload","data":"AAr/Ww==","encoding":"base64"}"#
        );
        let b = broadcast(Vsn::V2, "room", &stored);
        let mut frame = vec![2, 4, 6];
        frame.extend_from_slice(b"roomupload");
        frame.extend_from_slice(&bytes);
        assert_eq!(b.frame, frame);
        assert!(is_binary(&b.frame));
        let text = b.text.unwrap();
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            r#"[null,null,"room","upload",{"binary":"AAr/Ww=="}]"#
        );
        assert!(!is_binary(&text));
        let v1 = broadcast(Vsn::V1, "room", &stored);
        assert!(v1.text.is_none());
        assert!(std::str::from_utf8(&v1.frame)
            .unwrap()
            .contains(r#""payload":{"binary":"AAr/Ww=="}"#));
        // A name too long for the kind's one-byte sizes goes as text.
        let long = "e".repeat(300);
        let stored = stored_binary(&long, &bytes, None);
        assert!(!is_binary(&broadcast(Vsn::V2, "room", &stored).frame));
    }

    #[test]
    fn writes_replies_and_broadcasts() {
        let m = decode(Vsn::V2, br#"["1","2","room","phx_join",{}]"#).unwrap();
        assert_eq!(
            String::from_utf8(reply(Vsn::V2, &m, true, empty())).unwrap(),
            r#"["1","2","room","phx_reply",{"status":"ok","response":{}}]"#
        );
        let b = broadcast(
            Vsn::V1,
            "chat",
            br#"{"event":"publish","data":{"body":"x"}}"#,
        );
        assert_eq!(
            String::from_utf8(b.frame).unwrap(),
            r#"{"topic":"chat","event":"publish","payload":{"body":"x"},"ref":null}"#
        );
        assert_eq!(b.except, None);
        let b = broadcast(Vsn::V2, "chat", br#"[1]"#);
        assert_eq!(
            String::from_utf8(b.frame).unwrap(),
            r#"[null,null,"chat","message",[1]]"#
        );
        let b = broadcast(
            Vsn::V2,
            "chat",
            br#"{"event":"e","data":1,"socket_id":"phx.1f"}"#,
        );
        assert_eq!(b.frame, br#"[null,null,"chat","e",1]"#);
        assert_eq!(b.except.as_deref(), Some("phx.1f"));
    }
}
