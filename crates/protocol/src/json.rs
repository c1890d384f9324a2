//! The JSON codec: one JSON object per line, several lines per frame.
//!
//! Decoding is strict and total: every input gives either commands or an error that says
//! what is wrong, never a panic (the decoder is fuzzed). Encoding of publications writes
//! bytes directly, because it runs once per publication on the fan-out path.

use std::{collections::HashMap, io::Write};

use bytes::Bytes;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{
    command::{
        ConnectRequest, HistoryRequest, PresenceRequest, RefreshRequest, RpcRequest,
        SubscribeRequest,
    },
    ChannelName, Command, ErrorCode, Method, Publication, Since,
};

/// Why a line is not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not a JSON object: nothing in it can be trusted, not even an id.
    #[error("malformed command: {0}")]
    Malformed(String),
    /// A JSON object that is not a valid command; the error can be answered with its id.
    #[error("{message}")]
    Invalid {
        /// The command's id, when it could be read.
        id: Option<u64>,
        /// The error code for the reply.
        code: ErrorCode,
        /// What is wrong, for people.
        message: String,
    },
}

/// Splits a frame into its non-empty lines and decodes each.
pub fn decode_frame(frame: &[u8]) -> impl Iterator<Item = Result<Command, DecodeError>> + '_ {
    frame
        .split(|b| *b == b'\n')
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
        .map(decode_command)
}

/// Decodes one command from one JSON object.
pub fn decode_command(line: &[u8]) -> Result<Command, DecodeError> {
    let fields: HashMap<String, Box<RawValue>> =
        serde_json::from_slice(line).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let id = match fields.get("id") {
        None => None,
        Some(raw) => match serde_json::from_str::<Option<u64>>(raw.get()) {
            Ok(id) => id,
            Err(_) => {
                return Err(invalid(
                    None,
                    ErrorCode::BadRequest,
                    "id must be an unsigned integer",
                ))
            }
        },
    };
    let mut methods = fields.iter().filter(|(k, _)| k.as_str() != "id");
    let (name, params) = match (methods.next(), methods.next()) {
        (Some(m), None) => m,
        (None, _) => return Err(invalid(id, ErrorCode::BadRequest, "command has no method")),
        (Some(_), Some(_)) => {
            return Err(invalid(
                id,
                ErrorCode::BadRequest,
                "command has more than one method",
            ))
        }
    };
    let params = params.get();
    let method = match name.as_str() {
        "connect" => Method::Connect(parse::<ConnectRequest>(id, params)?),
        "subscribe" => {
            let p: SinceParams = parse(id, params)?;
            Method::Subscribe(SubscribeRequest {
                channel: channel(id, &p.channel)?,
                since: p.since,
                token: p.token,
            })
        }
        "unsubscribe" => {
            let p: ChannelParams = parse(id, params)?;
            Method::Unsubscribe { channel: channel(id, &p.channel)? }
        }
        "publish" => {
            let p: PublishParams = parse(id, params)?;
            let data = payload(&p.data).map_err(|m| invalid(id, ErrorCode::BadRequest, m))?;
            Method::Publish { channel: channel(id, &p.channel)?, data }
        }
        "history" => {
            let p: HistoryParams = parse(id, params)?;
            Method::History(HistoryRequest {
                channel: channel(id, &p.channel)?,
                since: p.since,
                limit: p.limit,
            })
        }
        "presence" => {
            let p: PresenceParams = parse(id, params)?;
            Method::Presence(PresenceRequest {
                channel: channel(id, &p.channel)?,
                limit: p.limit,
                cursor: p.cursor,
            })
        }
        "presence_stats" => {
            let p: ChannelParams = parse(id, params)?;
            Method::PresenceStats { channel: channel(id, &p.channel)? }
        }
        "refresh" => {
            let p: RefreshParams = parse(id, params)?;
            let channel = match p.channel {
                Some(name) => Some(channel(id, &name)?),
                None => None,
            };
            Method::Refresh(RefreshRequest { channel, token: p.token })
        }
        "ping" => {
            let _: Empty = parse(id, params)?;
            Method::Ping
        }
        "rpc" => {
            let p: RpcParams = parse(id, params)?;
            if p.method.is_empty() || p.method.len() > MAX_RPC_METHOD {
                return Err(invalid(
                    id,
                    ErrorCode::BadRequest,
                    format!("rpc method must be 1 to {MAX_RPC_METHOD} bytes"),
                ));
            }
            let data = match &p.data {
                Some(raw) => payload(raw).map_err(|m| invalid(id, ErrorCode::BadRequest, m))?,
                None => Bytes::from_static(b"null"),
            };
            Method::Rpc(RpcRequest { method: p.method, data })
        }
        other => {
            return Err(invalid(
                id,
                ErrorCode::MethodNotFound,
                format!("unknown method {other:?}; expected one of connect, subscribe, unsubscribe, publish, history, refresh, rpc, ping"),
            ))
        }
    };
    Ok(Command { id, method })
}

fn invalid(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> DecodeError {
    DecodeError::Invalid {
        id,
        code,
        message: message.into(),
    }
}

fn parse<T: DeserializeOwned>(id: Option<u64>, params: &str) -> Result<T, DecodeError> {
    serde_json::from_str(params).map_err(|e| {
        invalid(
            id,
            ErrorCode::BadRequest,
            format!("invalid parameters: {e}"),
        )
    })
}

fn channel(id: Option<u64>, name: &str) -> Result<ChannelName, DecodeError> {
    ChannelName::new(name).map_err(|e| invalid(id, ErrorCode::InvalidChannel, e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelParams {
    channel: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SinceParams {
    channel: String,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    token: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefreshParams {
    #[serde(default)]
    channel: Option<String>,
    token: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishParams {
    channel: String,
    data: Box<RawValue>,
}

/// Longest `rpc` method name, in bytes.
pub const MAX_RPC_METHOD: usize = 256;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RpcParams {
    method: String,
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresenceParams {
    channel: String,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    cursor: Option<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    channel: String,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    limit: Option<u32>,
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

/// Deepest nesting of arrays and objects a payload may have: the depth serde_json (and so
/// Herald's own clients) can read back, far beyond what any message needs.
pub const MAX_PAYLOAD_DEPTH: usize = 128;

/// A validated JSON value as a stored payload. Raw line breaks (legal JSON whitespace) are
/// removed, because every framing puts one push per line. Inside a valid JSON string a
/// line break is always escaped, so every raw CR or LF byte is whitespace between tokens
/// and dropping it changes nothing else: keys keep their order and numbers their digits.
/// Refuses values nested deeper than [`MAX_PAYLOAD_DEPTH`].
pub fn payload(data: &RawValue) -> Result<Bytes, String> {
    let text = data.get().as_bytes();
    // One pass that only stops at bytes that matter (a table says which): between them it
    // is a tight loop, and inside strings only quotes and backslashes matter. Stepping
    // through every byte with a state machine made this check a quarter of the server's
    // CPU for 130 KB answers from a backend.
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(i) = text[at..].iter().position(|b| STRUCTURAL[*b as usize]) {
        at += i;
        match text[at] {
            b'"' => {
                at += 1;
                while let Some(i) = text[at..].iter().position(|b| *b == b'"' || *b == b'\\') {
                    at += i + 1;
                    if text[at - 1] == b'"' {
                        break;
                    }
                    // Skip the escaped byte.
                    at += 1;
                    if at >= text.len() {
                        break;
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_PAYLOAD_DEPTH {
                    return Err(format!(
                        "data is nested deeper than {MAX_PAYLOAD_DEPTH} levels"
                    ));
                }
                at += 1;
            }
            _ => {
                depth = depth.saturating_sub(1);
                at += 1;
            }
        }
        if at >= text.len() {
            break;
        }
    }
    // A raw line break cannot be inside a valid string, so any is whitespace.
    if memchr::memchr2(b'\n', b'\r', text).is_some() {
        let kept: Vec<u8> = text
            .iter()
            .copied()
            .filter(|b| *b != b'\n' && *b != b'\r')
            .collect();
        return Ok(Bytes::from(kept));
    }
    Ok(Bytes::copy_from_slice(text))
}

/// The bytes [`payload`] stops at outside strings.
static STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'[' as usize] = true;
    t[b'{' as usize] = true;
    t[b']' as usize] = true;
    t[b'}' as usize] = true;
    t
};

/// Publication data read back from a store others can write (a shared Redis), checked as
/// a client's would be: valid UTF-8 JSON, nested at most [`MAX_PAYLOAD_DEPTH`] deep,
/// without raw line breaks. Whatever passes is safe in every framing (a line per push, an
/// SSE `data:` line, a forever frame's `<script>`).
pub fn stored_payload(data: &[u8]) -> Result<Bytes, String> {
    let raw: &RawValue =
        serde_json::from_slice(data).map_err(|e| format!("data is not JSON: {e}"))?;
    payload(raw)
}

/// A publication record (see [`Publication::record`]) read back from a store others can
/// write, checked as [`stored_payload`] checks data; its sender must be a JSON object.
pub fn stored_record(record: &[u8]) -> Result<Bytes, String> {
    match crate::position::split_record(record) {
        (None, data) => stored_payload(data),
        (Some(from), data) => {
            let from = stored_payload(from)?;
            if from.first() != Some(&b'{') {
                return Err("a publication's sender is not a JSON object".into());
            }
            Ok(Publication::record(stored_payload(data)?, Some(&from)))
        }
    }
}

/// Results of commands, serialised into replies.
pub mod results {
    use serde::Serialize;
    use serde_json::value::RawValue;

    use crate::{Epoch, Publication};

    /// Result of `connect`.
    #[derive(Debug, Serialize)]
    pub struct Connect<'a> {
        /// This session's id.
        pub client: &'a str,
        /// Server version.
        pub version: &'a str,
        /// Seconds between server pings; the client may consider the connection dead after
        /// about twice this long without hearing anything.
        pub ping: u64,
        /// The user the token names; absent for anonymous connections.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub user: Option<&'a str>,
        /// When the token stops being accepted, and so when the connection needs a
        /// `refresh` (Unix seconds, with `ttl` the same as seconds from now, for clients
        /// whose clock is off); absent when it does not expire.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        pub expiry: Option<Expiry>,
    }

    /// `presence`: a page of members (a JSON array made by
    /// [`encode_member`](super::encode_member)) and, when more may follow, the cursor of
    /// the next page.
    #[derive(Serialize)]
    pub struct Presence<'a> {
        /// The members, in id order.
        pub members: super::RawJson<'a>,
        /// Pass it back for the next page; absent on the last page.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cursor: Option<String>,
    }

    /// `presence_stats`.
    #[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
    pub struct PresenceStats {
        /// Members (clients).
        pub clients: u64,
        /// Distinct users among them.
        pub users: u64,
    }

    /// When a token stops being accepted.
    #[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
    pub struct Expiry {
        /// Unix seconds.
        pub expires: u64,
        /// Seconds from now.
        pub ttl: u64,
    }

    /// Result of `refresh`: the new expiry (empty when the new token does not expire).
    #[derive(Debug, Serialize)]
    pub struct Refreshed {
        /// As in [`Connect`].
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        pub expiry: Option<Expiry>,
    }

    /// Result of `subscribe` and `history`.
    #[derive(Debug, Serialize)]
    pub struct Stream<'a> {
        /// Stream epoch.
        pub epoch: &'a Epoch,
        /// Offset of the newest publication in the stream (or of the last one replayed).
        pub offset: u64,
        /// For subscribe with `since`: whether every missed publication is in `publications`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub recovered: Option<bool>,
        /// Replayed or requested publications, oldest first.
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        pub publications: &'a [Publication],
        /// For subscribe: the channel's state as the application's backend gave it (its
        /// subscribe hook's `data`), before any live publication.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub data: Option<&'a RawValue>,
    }

    /// Result of `rpc`: what the application's backend answered.
    #[derive(Debug, Serialize)]
    pub struct Rpc<'a> {
        /// The backend's `data` (JSON; `null` when it gave none).
        pub data: &'a RawValue,
    }

    /// Result of `publish`.
    #[derive(Debug, Serialize)]
    pub struct Published<'a> {
        /// The publication's offset.
        pub offset: u64,
        /// The stream's epoch.
        pub epoch: &'a Epoch,
    }

    /// A result with no fields (`unsubscribe`, `ping`).
    #[derive(Debug, Serialize)]
    pub struct Empty {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Epoch;

    fn one(line: &str) -> Result<Command, DecodeError> {
        decode_command(line.as_bytes())
    }

    #[test]
    fn rpc_carries_a_method_and_any_json_value() {
        let c = one(r#"{"id":2,"rpc":{"method":"get","data":{"a":[1]}}}"#).unwrap();
        assert_eq!(
            c.method,
            Method::Rpc(RpcRequest {
                method: "get".into(),
                data: Bytes::from(r#"{"a":[1]}"#)
            })
        );
        let Method::Rpc(r) = one(r#"{"rpc":{"method":"m"}}"#).unwrap().method else {
            panic!()
        };
        assert_eq!(&r.data[..], b"null");
        for bad in [
            r#"{"id":3,"rpc":{"method":""}}"#.to_string(),
            format!(r#"{{"id":3,"rpc":{{"method":"{}"}}}}"#, "m".repeat(257)),
            r#"{"id":3,"rpc":{"data":1}}"#.to_string(),
        ] {
            let Err(DecodeError::Invalid { id, code, .. }) = one(&bad) else {
                panic!("{bad}")
            };
            assert_eq!((id, code), (Some(3), ErrorCode::BadRequest), "{bad}");
        }
    }

    #[test]
    fn decodes_every_method() {
        let c = one(r#"{"id":1,"subscribe":{"channel":"a:b","since":{"offset":3,"epoch":"e"}}}"#)
            .unwrap();
        assert_eq!(c.id, Some(1));
        let Method::Subscribe(s) = c.method else {
            panic!("{c:?}")
        };
        assert_eq!(s.channel.as_str(), "a:b");
        assert_eq!(
            s.since,
            Some(Since {
                offset: 3,
                epoch: Some(Epoch::new("e"))
            })
        );

        let c = one(r#"{"id":2,"publish":{"channel":"x","data":{"k":[1,2]}}}"#).unwrap();
        assert_eq!(
            c.method,
            Method::Publish {
                channel: ChannelName::new("x").unwrap(),
                data: Bytes::from(r#"{"k":[1,2]}"#)
            }
        );
        assert_eq!(
            one(r#"{"ping":{}}"#).unwrap(),
            Command {
                id: None,
                method: Method::Ping
            }
        );
        assert!(matches!(
            one(r#"{"id":3,"connect":{"token":"t"}}"#).unwrap().method,
            Method::Connect(_)
        ));
        assert!(matches!(
            one(r#"{"id":4,"unsubscribe":{"channel":"x"}}"#)
                .unwrap()
                .method,
            Method::Unsubscribe { .. }
        ));
        let c = one(r#"{"id":5,"history":{"channel":"x","limit":10}}"#).unwrap();
        assert!(matches!(
            c.method,
            Method::History(HistoryRequest {
                limit: Some(10),
                ..
            })
        ));
    }

    #[test]
    fn errors_name_the_problem_and_keep_the_id() {
        assert!(matches!(one("{nope"), Err(DecodeError::Malformed(_))));
        assert!(matches!(one("[1,2]"), Err(DecodeError::Malformed(_))));
        let err = |l: &str| match one(l) {
            Err(DecodeError::Invalid { id, code, message }) => (id, code, message),
            other => panic!("{other:?}"),
        };
        let (id, code, msg) = err(r#"{"id":7,"fly":{}}"#);
        assert_eq!((id, code), (Some(7), ErrorCode::MethodNotFound));
        assert!(msg.contains("fly"));
        assert_eq!(err(r#"{"id":8}"#).1, ErrorCode::BadRequest);
        assert_eq!(
            err(r#"{"id":9,"ping":{},"connect":{}}"#).1,
            ErrorCode::BadRequest
        );
        let (id, code, _) = err(r#"{"id":10,"subscribe":{"channel":"a b"}}"#);
        assert_eq!((id, code), (Some(10), ErrorCode::InvalidChannel));
        let (_, code, msg) = err(r#"{"id":11,"subscribe":{"chanel":"a"}}"#);
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(msg.contains("chanel"), "{msg}");
        assert_eq!(err(r#"{"id":-1,"ping":{}}"#).1, ErrorCode::BadRequest);
    }

    #[test]
    fn payloads_never_hold_line_breaks() {
        let c =
            one("{\"publish\":{\"channel\":\"x\",\"data\":{\"a\":\n[1,\r\n2],\"s\":\"l1\\nl2\"}}}")
                .unwrap();
        let Method::Publish { data, .. } = c.method else {
            panic!()
        };
        assert!(!data.contains(&b'\n') && !data.contains(&b'\r'));
        let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(v["s"], "l1\nl2");
    }

    /// What `RawValue` accepts but `serde_json::Value` refuses (numbers out of range, lone
    /// surrogates, deep nesting), with a raw line break that once forced a re-parse: an
    /// answer for each, never a panic.
    #[test]
    fn payloads_value_refuses_get_an_answer_not_a_panic() {
        let deep = format!("{}\r{}", "[".repeat(200), "]".repeat(200));
        for data in ["[1e400,\r1]", "[\"\\ud800\",\r1]", deep.as_str()] {
            let line = format!("{{\"id\":1,\"publish\":{{\"channel\":\"x\",\"data\":{data}}}}}");
            match one(&line) {
                Ok(Command {
                    method: Method::Publish { data, .. },
                    ..
                }) => {
                    assert!(!data.contains(&b'\n') && !data.contains(&b'\r'));
                }
                Ok(other) => panic!("{other:?}"),
                Err(DecodeError::Invalid { code, .. }) => assert_eq!(code, ErrorCode::BadRequest),
                Err(e) => panic!("{e:?}"),
            }
        }
        // Only line breaks go: keys keep their order and numbers their digits.
        let c = one("{\"publish\":{\"channel\":\"x\",\"data\":{\"b\":1,\r\n\"a\":12345678901234567890123}}}").unwrap();
        let Method::Publish { data, .. } = c.method else {
            panic!()
        };
        assert_eq!(&data[..], b"{\"b\":1,\"a\":12345678901234567890123}");
    }

    #[test]
    fn frames_hold_several_commands() {
        let frame = b"{\"id\":1,\"ping\":{}}\n\n{\"id\":2,\"ping\":{}}\n";
        let ids: Vec<_> = decode_frame(frame).map(|c| c.unwrap().id).collect();
        assert_eq!(ids, vec![Some(1), Some(2)]);
    }

    #[test]
    fn pub_encoding_is_valid_json_with_raw_data() {
        let ch = ChannelName::new("news").unwrap();
        let p = Publication {
            offset: 42,
            record: Bytes::from(r#"{"t":"</script>"}"#),
        };
        let v: serde_json::Value = serde_json::from_slice(&encode_pub(&ch, &p)).unwrap();
        assert_eq!(v["pub"]["channel"], "news");
        assert_eq!(v["pub"]["offset"], 42);
        assert_eq!(v["pub"]["data"]["t"], "</script>");
        assert!(v["pub"].get("from").is_none());
    }

    /// A record with its sender gives the payload and the sender back, in pushes and in
    /// replies; a record without one reads as before.
    #[test]
    fn records_carry_their_sender() {
        let ch = ChannelName::new("news").unwrap();
        let from = br#"{"user":"42","info":{"name":"Ann"}}"#;
        let p = Publication {
            offset: 7,
            record: Publication::record(Bytes::from("[1,2]"), Some(from)),
        };
        assert_eq!(p.data(), b"[1,2]");
        assert_eq!(p.from(), Some(&from[..]));
        let v: serde_json::Value = serde_json::from_slice(&encode_pub(&ch, &p)).unwrap();
        assert_eq!(v["pub"]["data"], serde_json::json!([1, 2]));
        assert_eq!(v["pub"]["from"]["info"]["name"], "Ann");
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"offset": 7, "data": [1, 2], "from": {"user": "42", "info": {"name": "Ann"}}})
        );
        // Checked like data when read back from a shared store.
        assert_eq!(stored_record(&p.record).unwrap(), p.record);
        assert!(stored_record(b"\x01[1]\x00[2]").is_err());
        assert!(stored_record(b"\x01{\"user\":1}").is_err());
        let plain = Publication::record(Bytes::from("3"), None);
        assert_eq!(
            (&plain[..], stored_record(&plain).unwrap()),
            (&b"3"[..], plain.clone())
        );
    }

    #[test]
    fn replies_serialise_publications_as_raw_json() {
        let pubs = [Publication {
            offset: 1,
            record: Bytes::from("[1]"),
        }];
        let epoch = Epoch::new("e");
        let r = results::Stream {
            epoch: &epoch,
            offset: 1,
            recovered: Some(true),
            publications: &pubs,
            data: None,
        };
        let v: serde_json::Value =
            serde_json::from_slice(&encode_reply(3, "subscribe", &r)).unwrap();
        assert_eq!(v["id"], 3);
        assert_eq!(v["subscribe"]["publications"][0]["data"][0], 1);
        assert_eq!(v["subscribe"]["recovered"], true);
        let e: serde_json::Value =
            serde_json::from_slice(&encode_error(Some(4), ErrorCode::PermissionDenied, "no"))
                .unwrap();
        assert_eq!(e["error"]["code"], 103);
        let d: serde_json::Value = serde_json::from_slice(&encode_disconnect(
            crate::DisconnectCode::Slow.code(),
            "slow",
        ))
        .unwrap();
        assert_eq!(d["disconnect"]["reconnect"], true);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::Cursor;

    fn commandish() -> impl Strategy<Value = String> {
        let method = prop_oneof![
            Just("connect"),
            Just("subscribe"),
            Just("unsubscribe"),
            Just("publish"),
            Just("history"),
            Just("ping"),
            Just("x")
        ];
        let value = prop_oneof![
            Just("{}".to_string()),
            Just("null".to_string()),
            Just("[1,{\"a\":2}]".to_string()),
            "[ -~]{0,20}".prop_map(|s| format!("{s:?}")),
            any::<i64>().prop_map(|n| n.to_string()),
        ];
        (
            any::<Option<i64>>(),
            method,
            "[a-z]{0,8}",
            value.clone(),
            value,
        )
            .prop_map(|(id, m, k, v1, v2)| match id {
                Some(id) => format!("{{\"id\":{id},\"{m}\":{{\"channel\":{v1},\"{k}\":{v2}}}}}"),
                None => format!("{{\"{m}\":{{\"{k}\":{v1},\"data\":{v2}}}}}"),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The decoders are total: any bytes give commands or errors, never a panic.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            for _ in decode_frame(&bytes) {}
            let _ = Cursor::parse(&String::from_utf8_lossy(&bytes));
        }

        /// Brackets, quotes and backslashes inside strings never count as nesting, however
        /// they are escaped: only the real depth decides, and only line breaks are dropped.
        #[test]
        fn payload_depth_counts_only_real_nesting(
            depth in 120usize..136,
            leaf in proptest::collection::vec(prop_oneof![
                Just("["), Just("]"), Just("{"), Just("\\"), Just("\""), Just("a"), Just("\n")
            ], 0..12),
            breaks in any::<bool>(),
        ) {
            let leaf = serde_json::to_string(&leaf.concat()).unwrap();
            let gap = if breaks { "\r\n" } else { "" };
            let text = format!("{}{leaf}{gap}{}", "[".repeat(depth), "]".repeat(depth));
            let raw: Box<RawValue> = serde_json::from_str(&text).unwrap();
            match payload(&raw) {
                Ok(kept) => {
                    prop_assert!(depth <= MAX_PAYLOAD_DEPTH);
                    let expected = text.replace("\r\n", "");
                    prop_assert_eq!(&kept[..], expected.as_bytes());
                }
                Err(_) => prop_assert!(depth > MAX_PAYLOAD_DEPTH),
            }
        }

        /// Near-valid commands exercise the paths past JSON parsing.
        #[test]
        fn decoding_near_valid_commands_never_panics(lines in proptest::collection::vec(commandish(), 1..4)) {
            let frame = lines.join("\n");
            for decoded in decode_frame(frame.as_bytes()) {
                if let Ok(Command { method: Method::Publish { data, .. }, .. }) = decoded {
                    prop_assert!(serde_json::from_slice::<serde_json::Value>(&data).is_ok());
                }
            }
        }
    }
}
