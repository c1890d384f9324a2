//! Encoding replies and pushes. Publications are written as bytes directly, because that
//! runs once per publication on the fan-out path; the rest goes through serde.

use std::{collections::HashMap, io::Write};

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::{ChannelName, ErrorCode, Publication};

/// Appends a presence member as JSON: `{"client": ID, …}` with the fields of `info` (the
/// member's `{"user", "info", "channel_info"}` object, or empty for an anonymous client).
/// The id is the member's public id, 16 hex digits.
pub fn encode_member(out: &mut Vec<u8>, id: u64, info: &[u8]) {
    use std::io::Write;
    write!(out, r#"{{"client":"{id:016x}""#).expect("writing to a Vec cannot fail");
    match info.strip_prefix(b"{") {
        Some(rest) if rest.len() > 1 => {
            out.push(b',');
            out.extend_from_slice(rest);
        }
        _ => out.push(b'}'),
    }
}

/// A member id written by [`encode_member`] (a page cursor), read back.
pub fn decode_member_id(text: &str) -> Option<u64> {
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// Serialises a publication's stored JSON text as raw JSON (never as a string).
pub struct RawJson<'a>(pub &'a [u8]);

impl Serialize for RawJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = std::str::from_utf8(self.0).map_err(serde::ser::Error::custom)?;
        let raw: &RawValue = serde_json::from_str(text).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl Serialize for Publication {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let from = self.from();
        let mut st = s.serialize_struct("Publication", 2 + usize::from(from.is_some()))?;
        st.serialize_field("offset", &self.offset)?;
        st.serialize_field("data", &RawJson(self.data()))?;
        if let Some(from) = from {
            st.serialize_field("from", &RawJson(from))?;
        }
        st.end()
    }
}

/// Encodes a successful reply: `{"id":ID,"METHOD":RESULT}`.
pub fn encode_reply(id: u64, method: &str, result: &impl Serialize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Reply<'a, T> {
        id: u64,
        #[serde(flatten)]
        body: HashMap<&'a str, &'a T>,
    }
    let body = HashMap::from([(method, result)]);
    serde_json::to_vec(&Reply { id, body }).expect("reply types always serialise")
}

/// Encodes an error reply: `{"id":ID,"error":{"code":N,"message":"…"}}` (no id when the
/// command had none or it could not be read).
pub fn encode_error(id: Option<u64>, code: impl Into<u16>, message: &str) -> Vec<u8> {
    encode_error_body(id, code.into(), message, None)
}

/// Encodes an HTTP transport's refusal of one of the channels its request named:
/// `{"error":{"code":N,"message":"…","channel":"…"}}`, so that a client can drop that one.
pub fn encode_channel_error(code: impl Into<u16>, message: &str, channel: &ChannelName) -> Vec<u8> {
    encode_error_body(None, code.into(), message, Some(channel.as_str()))
}

fn encode_error_body(id: Option<u64>, code: u16, message: &str, channel: Option<&str>) -> Vec<u8> {
    #[derive(Serialize)]
    struct ErrorReply<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        error: ErrorBody<'a>,
    }
    serde_json::to_vec(&ErrorReply {
        id,
        error: ErrorBody {
            code,
            message,
            channel,
        },
    })
    .expect("error replies always serialise")
}

/// The `error` object of error replies and HTTP error bodies.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// One of [`ErrorCode`], or an application's own (see
    /// [`crate::codes::APPLICATION_ERROR_CODES`]).
    pub code: u16,
    /// What went wrong, for people.
    pub message: &'a str,
    /// The channel refused, when a request named several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<&'a str>,
}

/// Encodes a publication push: `{"pub":{"channel":"…","offset":N,"data":…,"from"?:{…}}}`.
///
/// Written by hand: it runs once per publication and its output is shared by every
/// subscriber. Channel names need no escaping (see [`ChannelName`]); `data` and `from` are
/// stored as validated JSON text.
pub fn encode_pub(channel: &ChannelName, publication: &Publication) -> Bytes {
    let mut out = Vec::with_capacity(56 + channel.as_str().len() + publication.record.len());
    out.extend_from_slice(b"{\"pub\":{\"channel\":\"");
    out.extend_from_slice(channel.as_str().as_bytes());
    out.extend_from_slice(b"\",\"offset\":");
    write!(out, "{}", publication.offset).expect("writing to a Vec cannot fail");
    out.extend_from_slice(b",\"data\":");
    out.extend_from_slice(publication.data());
    if let Some(from) = publication.from() {
        out.extend_from_slice(b",\"from\":");
        out.extend_from_slice(from);
    }
    out.extend_from_slice(b"}}");
    Bytes::from(out)
}

/// Encodes a disconnect push: `{"disconnect":{"code":N,"reason":"…","reconnect":BOOL}}`.
/// Sent before closing on transports that have no close code of their own.
pub fn encode_disconnect(code: u16, reason: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Push<'a> {
        disconnect: Body<'a>,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        code: u16,
        reason: &'a str,
        reconnect: bool,
    }
    let body = Body {
        code,
        reason,
        reconnect: crate::reconnect_allowed(code),
    };
    serde_json::to_vec(&Push { disconnect: body }).expect("disconnect pushes always serialise")
}

/// Encodes the push that ends one subscription while the connection stays:
/// `{"unsubscribe":{"channel":"…","code":N,"reason":"…"}}` (a subscription token expired).
pub fn encode_unsubscribe(channel: &ChannelName, code: ErrorCode, reason: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Push<'a> {
        unsubscribe: Body<'a>,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        channel: &'a ChannelName,
        code: ErrorCode,
        reason: &'a str,
    }
    serde_json::to_vec(&Push {
        unsubscribe: Body {
            channel,
            code,
            reason,
        },
    })
    .expect("unsubscribe pushes always serialise")
}

/// Encodes the push that opens a stream whose client sent no `connect` command:
/// `{"connect":RESULT}`, the result a `connect` reply would carry.
pub fn encode_connect_push(result: &crate::json::results::Connect<'_>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Push<'a, 'r> {
        connect: &'r crate::json::results::Connect<'a>,
    }
    serde_json::to_vec(&Push { connect: result }).expect("connect pushes always serialise")
}

/// Encodes the push that says the server subscribed the connection to a channel (one its
/// token names): `{"subscribe":{"channel":"…","epoch":"…","offset":N,"recovered"?:B,"data"?:…}}`.
pub fn encode_subscribe_push(opened: &crate::json::results::Subscribed<'_>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Push<'a, 'r> {
        subscribe: &'r crate::json::results::Subscribed<'a>,
    }
    serde_json::to_vec(&Push { subscribe: opened }).expect("subscribe pushes always serialise")
}

/// Encodes a presence push: `{"presence":{"channel":"…","join":[…],"leave":[…],"missed"?:true}}`,
/// where `join` and `leave` are JSON arrays of members (see [`encode_member`]) and `missed`
/// says that changes were lost on the way (the client should ask for the members again).
pub fn encode_presence(channel: &ChannelName, join: &[u8], leave: &[u8], missed: bool) -> Vec<u8> {
    let mut push = Vec::with_capacity(48 + channel.as_str().len() + join.len() + leave.len());
    push.extend_from_slice(br#"{"presence":{"channel":""#);
    // Channel names need no escaping (see [`ChannelName`]).
    push.extend_from_slice(channel.as_str().as_bytes());
    push.extend_from_slice(br#"","join":"#);
    push.extend_from_slice(join);
    push.extend_from_slice(br#","leave":"#);
    push.extend_from_slice(leave);
    if missed {
        push.extend_from_slice(br#","missed":true"#);
    }
    push.extend_from_slice(b"}}");
    push
}

/// The keepalive push of streams whose framing has no comment of its own (NDJSON, the
/// forever frame); SSE sends a comment instead.
pub const PING_PUSH: &[u8] = br#"{"ping":{}}"#;

/// Encodes a poll's answer: `{"cursor":"…","client":"…","session_key":"…","messages":[PUSH,…]}`,
/// where `messages` is the pushes already encoded and separated by commas, `cursor` the
/// position to poll from next, `client` what the next poll sends as `client=`, and
/// `session_key` (when the session was parked) what it sends as `session_key=`.
pub fn encode_poll_answer(
    cursor: &str,
    client: &str,
    session_key: Option<&str>,
    messages: &[u8],
) -> Vec<u8> {
    let mut body = Vec::with_capacity(messages.len() + cursor.len() + client.len() + 80);
    body.extend_from_slice(b"{\"cursor\":");
    body.extend_from_slice(&serde_json::to_vec(cursor).expect("strings serialise"));
    body.extend_from_slice(b",\"client\":");
    body.extend_from_slice(&serde_json::to_vec(client).expect("strings serialise"));
    if let Some(key) = session_key {
        body.extend_from_slice(b",\"session_key\":");
        body.extend_from_slice(&serde_json::to_vec(key).expect("strings serialise"));
    }
    body.extend_from_slice(b",\"messages\":[");
    body.extend_from_slice(messages);
    body.extend_from_slice(b"]}");
    body
}
