//! Encoding replies and pushes. Publications are written as bytes directly, because that
//! runs once per publication on the fan-out path; the rest goes through serde.

use std::io::Write;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::{
    codec::{Codec, Outcome, Push, Reply},
    results::{self, Member},
    ChannelName, Command, ErrorCode, Publication,
};

use super::DecodeError;

/// The JSON codec: one JSON object per line, several lines per frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn split<'f>(&self, frame: &'f [u8]) -> (&'f [u8], &'f [u8]) {
        // Blank lines before a command go with it (JSON allows the whitespace): a frame of
        // nothing but line breaks is one part, not a step of the session per line (a
        // flood of them was most of what a compressed bomb cost).
        let start = frame
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(frame.len());
        match memchr::memchr(b'\n', &frame[start..]) {
            Some(end) => (&frame[..start + end], &frame[start + end + 1..]),
            None => (frame, &frame[frame.len()..]),
        }
    }

    fn decode(&self, part: &[u8]) -> Option<Result<Command, DecodeError>> {
        part.iter()
            .any(|b| !b.is_ascii_whitespace())
            .then(|| super::decode_command(part))
    }

    fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        match reply {
            Reply::Done { id, outcome } => encode_outcome(*id, outcome),
            Reply::Refused {
                id,
                code,
                message,
                channel,
            } => encode_error_body(*id, *code, message, channel.map(ChannelName::as_str)),
        }
    }

    fn push(&self, push: &Push<'_>) -> Vec<u8> {
        match push {
            Push::Pub {
                channel,
                publication,
            } => encode_pub(channel, publication),
            Push::PubDelta {
                channel,
                publication,
                delta,
            } => encode_pub_delta(channel, publication, *delta),
            Push::Disconnect { code, reason } => encode_disconnect(*code, reason),
            Push::Unsubscribe {
                channel,
                code,
                reason,
            } => encode_unsubscribe(channel, *code, reason),
            Push::Connect(result) => encode_push("connect", result),
            Push::Subscribe(opened) => encode_push("subscribe", opened),
            Push::Presence {
                channel,
                join,
                leave,
                missed,
                clients,
            } => encode_presence(channel, join, leave, *missed, *clients),
            Push::Ping => PING_PUSH.to_vec(),
            Push::Conflated { channel, offset } => format!(
                r#"{{"conflated":{{"channel":"{}","offset":{offset}}}}}"#,
                channel.as_str()
            )
            .into_bytes(),
        }
    }

    fn join(&self, out: &mut Vec<u8>, encoded: &[u8]) {
        if !out.is_empty() {
            out.push(b'\n');
        }
        out.extend_from_slice(encoded);
    }
}

/// `{"id":ID,"METHOD":RESULT}`.
fn encode_outcome(id: u64, outcome: &Outcome<'_>) -> Vec<u8> {
    const EMPTY: results::Empty = results::Empty {};
    let method = outcome.method();
    match outcome {
        Outcome::Connect(r) => encode_reply(id, method, r),
        Outcome::Subscribe(r) | Outcome::History(r) => encode_reply(id, method, r),
        Outcome::Unsubscribe | Outcome::Ping => encode_reply(id, method, &EMPTY),
        Outcome::Publish(r) => encode_reply(id, method, r),
        Outcome::Refresh(r) => encode_reply(id, method, r),
        Outcome::Rpc(r) => encode_reply(id, method, r),
        Outcome::Presence(page) => {
            let mut out = Vec::with_capacity(64);
            write!(out, r#"{{"id":{id},"{method}":"#).expect("writing to a Vec cannot fail");
            out.extend_from_slice(&encode_presence_page(page));
            out.push(b'}');
            out
        }
        Outcome::PresenceStats(r) => encode_reply(id, method, r),
    }
}

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
fn encode_reply(id: u64, method: &str, result: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write!(out, r#"{{"id":{id},"{method}":"#).expect("writing to a Vec cannot fail");
    serde_json::to_writer(&mut out, result).expect("reply types always serialise");
    out.push(b'}');
    out
}

/// Encodes an error reply: `{"id":ID,"error":{"code":N,"message":"…"}}` (no id when the
/// command had none or it could not be read), or an HTTP transport's refusal of one of the
/// channels its request named: `{"error":{"code":N,"message":"…","channel":"…"}}`, so that a
/// client can drop that one.
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
fn encode_pub(channel: &ChannelName, publication: &Publication) -> Vec<u8> {
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
    out
}

/// `{"pub":{"channel":…,"offset":N,"full":"DATA AS TEXT"}}`, or `"delta":"FOSSIL DELTA"`
/// in place of `full` (see [`crate::delta`]): strings, so that a client has the data's
/// exact bytes to apply the next delta to.
fn encode_pub_delta(
    channel: &ChannelName,
    publication: &Publication,
    delta: Option<&[u8]>,
) -> Vec<u8> {
    let (key, text) = match delta {
        Some(delta) => (&b"delta"[..], delta),
        None => (&b"full"[..], publication.data()),
    };
    let text = std::str::from_utf8(text).expect("publications and their deltas are UTF-8");
    let mut out = Vec::with_capacity(64 + channel.as_str().len() + text.len() * 5 / 4);
    out.extend_from_slice(b"{\"pub\":{\"channel\":\"");
    out.extend_from_slice(channel.as_str().as_bytes());
    out.extend_from_slice(b"\",\"offset\":");
    write!(out, "{}", publication.offset).expect("writing to a Vec cannot fail");
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key);
    out.extend_from_slice(b"\":");
    serde_json::to_writer(&mut out, text).expect("writing to a Vec cannot fail");
    if let Some(from) = publication.from() {
        out.extend_from_slice(b",\"from\":");
        out.extend_from_slice(from);
    }
    out.extend_from_slice(b"}}");
    out
}

/// Encodes a disconnect push: `{"disconnect":{"code":N,"reason":"…","reconnect":BOOL}}`.
/// Sent before closing on transports that have no close code of their own.
fn encode_disconnect(code: u16, reason: &str) -> Vec<u8> {
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
fn encode_unsubscribe(channel: &ChannelName, code: ErrorCode, reason: &str) -> Vec<u8> {
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

/// Encodes a push that carries a result: `{"connect":RESULT}` opens a stream whose client
/// sent no `connect` command (the result a `connect` reply would carry);
/// `{"subscribe":{"channel":"…","epoch":"…","offset":N,"recovered"?:B,"data"?:…}}` says the
/// server subscribed the connection to a channel its token names.
fn encode_push(name: &str, result: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write!(out, r#"{{"{name}":"#).expect("writing to a Vec cannot fail");
    serde_json::to_writer(&mut out, result).expect("pushes always serialise");
    out.push(b'}');
    out
}

/// Encodes a presence push:
/// `{"presence":{"channel":"…","join":[…],"leave":[…],"missed"?:true,"clients"?:N}}`, where
/// `join` and `leave` are arrays of members (see [`encode_member`]), `missed` says that
/// changes were lost on the way (the client should ask for the members again) and
/// `clients` is how many members the channel has with them.
fn encode_presence(
    channel: &ChannelName,
    join: &[Member],
    leave: &[Member],
    missed: bool,
    clients: Option<u64>,
) -> Vec<u8> {
    let size = |ms: &[Member]| ms.iter().map(|m| 32 + m.info.len()).sum::<usize>();
    let mut push = Vec::with_capacity(48 + channel.as_str().len() + size(join) + size(leave));
    push.extend_from_slice(br#"{"presence":{"channel":""#);
    // Channel names need no escaping (see [`ChannelName`]).
    push.extend_from_slice(channel.as_str().as_bytes());
    push.extend_from_slice(br#"","join":"#);
    encode_members(&mut push, join);
    push.extend_from_slice(br#","leave":"#);
    encode_members(&mut push, leave);
    if missed {
        push.extend_from_slice(br#","missed":true"#);
    }
    if let Some(n) = clients {
        push.extend_from_slice(br#","clients":"#);
        push.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
    push.extend_from_slice(b"}}");
    push
}

/// Encodes a page of members: `{"members":[…],"cursor"?:"…"}` (the `presence` result, and
/// the server API's answer).
pub fn encode_presence_page(page: &results::Presence<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        32 + page
            .members
            .iter()
            .map(|m| 32 + m.info.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(br#"{"members":"#);
    encode_members(&mut out, page.members);
    if let Some(cursor) = &page.cursor {
        out.extend_from_slice(br#","cursor":"#);
        serde_json::to_writer(&mut out, cursor).expect("strings serialise");
    }
    out.push(b'}');
    out
}

/// Appends members as a JSON array.
pub fn encode_members(out: &mut Vec<u8>, members: &[Member]) {
    out.push(b'[');
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        encode_member(out, m.id, m.info);
    }
    out.push(b']');
}

/// The keepalive push of streams whose framing has no comment of its own (NDJSON, the
/// forever frame); SSE sends a comment instead.
const PING_PUSH: &[u8] = br#"{"ping":{}}"#;

/// Appends `text` as a JSON string: as it is when nothing in it needs escaping (a cursor, a
/// client id and a key never do, and this runs for every long-poll), through serde if
/// anything does.
fn string(out: &mut Vec<u8>, text: &str) {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(out, text).expect("strings serialise");
    }
}

/// Encodes a poll's answer (the long-poll framing of the JSON codec): `{"cursor":"…","client":"…","session_key":"…","messages":[PUSH,…]}`,
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
    string(&mut body, cursor);
    body.extend_from_slice(b",\"client\":");
    string(&mut body, client);
    if let Some(key) = session_key {
        body.extend_from_slice(b",\"session_key\":");
        string(&mut body, key);
    }
    body.extend_from_slice(b",\"messages\":[");
    body.extend_from_slice(messages);
    body.extend_from_slice(b"]}");
    body
}
