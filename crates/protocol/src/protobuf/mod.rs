//! Herald's protocol in Protobuf (`proto/herald.proto`, the `herald.protobuf` WebSocket
//! subprotocol): the JSON codec's commands, replies and pushes field for field, each a
//! length-delimited message, several to a binary WebSocket message.
//!
//! Values that are JSON in the JSON codec are JSON text in bytes here (Herald stores
//! publications as JSON): what a client publishes is checked as the JSON codec checks it.
//! A publication push is written by hand (it runs once per publication, for every
//! subscriber of this codec); the rest goes through prost.

mod wire;

use bytes::Bytes;
use prost::{
    encoding::{encode_key, encode_varint, encoded_len_varint, WireType},
    Message,
};
use serde_json::value::RawValue;

use crate::{
    codec::{Codec, DecodeError, Outcome, Push, Reply},
    command::{
        ConnectRequest, HistoryRequest, PresenceRequest, RefreshRequest, RpcRequest,
        SubscribeRequest,
    },
    json::MAX_RPC_METHOD,
    results::{self, Member},
    ChannelName, Command, Epoch, ErrorCode, Method, Publication, Since,
};

/// The Protobuf codec of Herald's protocol.
#[derive(Debug, Clone, Copy, Default)]
pub struct Protobuf;

/// The length prefix of the message at the start of `frame`: its size and the message's
/// length; `None` when the prefix is cut short or malformed.
pub(crate) fn prefix(frame: &[u8]) -> Option<(usize, usize)> {
    let mut buf = frame;
    let len = prost::encoding::decode_varint(&mut buf).ok()?;
    let len = usize::try_from(len).ok()?;
    Some((frame.len() - buf.len(), len))
}

/// The first length-delimited message of `frame` (with its prefix) and what follows; all
/// of it when its prefix is cut short or says more than is there (which
/// [`delimited_body`] then refuses).
pub(crate) fn split_delimited(frame: &[u8]) -> (&[u8], &[u8]) {
    match prefix(frame) {
        Some((head, len)) if len <= frame.len() - head => frame.split_at(head + len),
        _ => (frame, &frame[frame.len()..]),
    }
}

/// The message inside what [`split_delimited`] gave, or why there is none.
pub(crate) fn delimited_body(part: &[u8]) -> Result<&[u8], DecodeError> {
    match prefix(part) {
        Some((head, len)) if head + len == part.len() => Ok(&part[head..]),
        _ => Err(DecodeError::Malformed(
            "a message's length prefix does not match its bytes".into(),
        )),
    }
}

impl Codec for Protobuf {
    fn split<'f>(&self, frame: &'f [u8]) -> (&'f [u8], &'f [u8]) {
        split_delimited(frame)
    }

    fn decode(&self, part: &[u8]) -> Option<Result<Command, DecodeError>> {
        let body = match delimited_body(part) {
            Ok(body) => body,
            Err(e) => return Some(Err(e)),
        };
        Some(match wire::Command::decode(body) {
            Ok(command) => command_of(command),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        })
    }

    fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        let message = match reply {
            Reply::Done { id, outcome } => wire::ServerMessage {
                id: Some(*id),
                body: Some(body_of(outcome)),
            },
            Reply::Refused {
                id,
                code,
                message,
                channel,
            } => wire::ServerMessage {
                id: *id,
                body: Some(wire::Body::Error(wire::Error {
                    code: u32::from(*code),
                    message: (*message).to_owned(),
                    channel: channel.map(|c| c.as_str().to_owned()),
                })),
            },
        };
        message.encode_length_delimited_to_vec()
    }

    fn push(&self, push: &Push<'_>) -> Vec<u8> {
        let body = match push {
            Push::Pub {
                channel,
                publication,
            } => return encode_pub(channel, publication, Payload::Data),
            Push::PubDelta {
                channel,
                publication,
                delta,
            } => {
                let payload = match delta {
                    Some(delta) => Payload::Delta(delta),
                    None => Payload::Full,
                };
                return encode_pub(channel, publication, payload);
            }
            Push::Disconnect { code, reason } => wire::Body::Disconnect(wire::Disconnect {
                code: u32::from(*code),
                reason: (*reason).to_owned(),
                reconnect: crate::reconnect_allowed(*code),
            }),
            Push::Unsubscribe {
                channel,
                code,
                reason,
            } => wire::Body::Unsubscribe(wire::Unsubscribe {
                channel: Some(channel.as_str().to_owned()),
                code: Some(u32::from(u16::from(*code))),
                reason: Some((*reason).to_owned()),
            }),
            Push::Connect(c) => wire::Body::Connect(connect_of(c)),
            Push::Subscribe(s) => wire::Body::Subscribe(wire::Stream {
                channel: Some(s.channel.as_str().to_owned()),
                epoch: s.epoch.as_str().to_owned(),
                offset: s.offset,
                recovered: s.recovered,
                publications: Vec::new(),
                data: s.data.map(|d| d.get().as_bytes().to_vec()),
                delta: None,
            }),
            Push::Presence {
                channel,
                join,
                leave,
                missed,
                clients,
            } => wire::Body::Presence(wire::Presence {
                channel: Some(channel.as_str().to_owned()),
                join: join.iter().map(member_of).collect(),
                leave: leave.iter().map(member_of).collect(),
                missed: missed.then_some(true),
                clients: *clients,
                ..Default::default()
            }),
            Push::Ping => wire::Body::Ping(wire::Empty {}),
            Push::Conflated { channel, offset } => wire::Body::Conflated(wire::Conflated {
                channel: channel.as_str().to_owned(),
                offset: *offset,
            }),
        };
        wire::ServerMessage {
            id: None,
            body: Some(body),
        }
        .encode_length_delimited_to_vec()
    }

    fn join(&self, out: &mut Vec<u8>, encoded: &[u8]) {
        // Each message carries its length: they follow one another.
        out.extend_from_slice(encoded);
    }

    fn binary(&self) -> bool {
        true
    }
}

/// What a publication push carries: its data, or on a subscription with deltas its data
/// as text to keep (`full`) or the delta from the previous one.
enum Payload<'a> {
    Data,
    Full,
    Delta(&'a [u8]),
}

/// `ServerMessage { pub: Pub {channel, offset, data | full | delta, from?} }`, length
/// prefixed, written in one buffer of the right size.
fn encode_pub(channel: &ChannelName, publication: &Publication, payload: Payload<'_>) -> Vec<u8> {
    let (tag, payload) = match payload {
        Payload::Data => (3, publication.data()),
        Payload::Full => (5, publication.data()),
        Payload::Delta(delta) => (6, delta),
    };
    let from = publication.from();
    let field = |len: usize| 1 + encoded_len_varint(len as u64) + len;
    let inner = field(channel.as_str().len())
        + 1
        + encoded_len_varint(publication.offset)
        + field(payload.len())
        + from.map_or(0, |f| field(f.len()));
    let message = field(inner);
    let mut out = Vec::with_capacity(encoded_len_varint(message as u64) + message);
    encode_varint(message as u64, &mut out);
    encode_key(13, WireType::LengthDelimited, &mut out);
    encode_varint(inner as u64, &mut out);
    let bytes_field = |out: &mut Vec<u8>, tag: u32, value: &[u8]| {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value);
    };
    bytes_field(&mut out, 1, channel.as_str().as_bytes());
    encode_key(2, WireType::Varint, &mut out);
    encode_varint(publication.offset, &mut out);
    bytes_field(&mut out, tag, payload);
    if let Some(from) = from {
        bytes_field(&mut out, 4, from);
    }
    out
}

fn publication_of(p: &Publication) -> wire::Publication {
    wire::Publication {
        offset: p.offset,
        data: p.data().to_vec(),
        from: p.from().map(<[u8]>::to_vec),
    }
}

/// A member: its id, and its other fields (the `{"user", "info", "channel_info"}` object)
/// when it has any, as the JSON codec writes them beside `client`.
fn member_of(m: &Member<'_>) -> wire::Member {
    wire::Member {
        client: format!("{:016x}", m.id),
        fields: (m.info.len() > 2).then(|| m.info.to_vec()),
    }
}

fn connect_of(c: &results::Connect<'_>) -> wire::ConnectResult {
    wire::ConnectResult {
        client: c.client.to_owned(),
        version: c.version.to_owned(),
        ping: c.ping,
        user: c.user.map(str::to_owned),
        expires: c.expiry.map(|e| e.expires),
        ttl: c.expiry.map(|e| e.ttl),
    }
}

fn stream_of(s: &results::Stream<'_>) -> wire::Stream {
    wire::Stream {
        channel: None,
        epoch: s.epoch.as_str().to_owned(),
        offset: s.offset,
        recovered: s.recovered,
        publications: s.publications.iter().map(publication_of).collect(),
        data: s.data.map(|d| d.get().as_bytes().to_vec()),
        delta: s.delta.map(str::to_owned),
    }
}

fn body_of(outcome: &Outcome<'_>) -> wire::Body {
    match outcome {
        Outcome::Connect(c) => wire::Body::Connect(connect_of(c)),
        Outcome::Subscribe(s) => wire::Body::Subscribe(stream_of(s)),
        Outcome::History(s) => wire::Body::History(stream_of(s)),
        Outcome::Unsubscribe => wire::Body::Unsubscribe(wire::Unsubscribe::default()),
        Outcome::Publish(p) => wire::Body::Publish(wire::PublishResult {
            offset: p.offset,
            epoch: p.epoch.as_str().to_owned(),
            repeat: p.repeat.then_some(true),
        }),
        Outcome::Refresh(r) => wire::Body::Refresh(wire::Expiry {
            expires: r.expiry.map(|e| e.expires),
            ttl: r.expiry.map(|e| e.ttl),
        }),
        Outcome::Rpc(r) => wire::Body::Rpc(wire::RpcResult {
            data: r.data.get().as_bytes().to_vec(),
        }),
        Outcome::Presence(page) => wire::Body::Presence(wire::Presence {
            members: page.members.iter().map(member_of).collect(),
            cursor: page.cursor.clone(),
            ..Default::default()
        }),
        Outcome::PresenceStats(s) => wire::Body::PresenceStats(wire::PresenceStats {
            clients: s.clients,
            users: s.users,
        }),
        Outcome::Ping => wire::Body::Ping(wire::Empty {}),
    }
}

fn invalid(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> DecodeError {
    DecodeError::Invalid {
        id,
        code,
        message: message.into(),
    }
}

/// A command in Herald's terms, checked as the JSON codec checks the same fields.
fn command_of(wire: wire::Command) -> Result<Command, DecodeError> {
    let id = wire.id;
    let channel = |name: &str| {
        ChannelName::new(name).map_err(|e| invalid(id, ErrorCode::InvalidChannel, e.to_string()))
    };
    // JSON text, checked and stored as the JSON codec's `data` is.
    let json = |bytes: &[u8]| -> Result<Bytes, DecodeError> {
        let refuse = |why: String| invalid(id, ErrorCode::BadRequest, why);
        let raw: &RawValue = serde_json::from_slice(bytes)
            .map_err(|e| refuse(format!("data must be JSON text: {e}")))?;
        crate::json::payload(raw).map_err(refuse)
    };
    let since = |s: wire::Since| Since {
        offset: s.offset,
        epoch: s.epoch.map(|e| Epoch::new(&e)),
    };
    let method = match wire.method {
        None => return Err(invalid(id, ErrorCode::BadRequest, "command has no method")),
        Some(wire::Method::Connect(c)) => Method::Connect(ConnectRequest {
            token: c.token,
            name: c.name,
            version: c.version,
            client: c.client,
        }),
        Some(wire::Method::Subscribe(s)) => Method::Subscribe(SubscribeRequest {
            channel: channel(&s.channel)?,
            since: s.since.map(since),
            token: s.token,
            delta: crate::delta::asked(&s.delta)
                .map_err(|m| invalid(id, ErrorCode::BadRequest, m))?,
            conflate: s.conflate,
        }),
        Some(wire::Method::Unsubscribe(c)) => Method::Unsubscribe {
            channel: channel(&c.channel)?,
        },
        Some(wire::Method::Publish(p)) => Method::Publish {
            channel: channel(&p.channel)?,
            data: json(&p.data)?,
            idempotency_key: p.idempotency_key,
            conflation_key: p.conflation_key,
        },
        Some(wire::Method::History(h)) => Method::History(HistoryRequest {
            channel: channel(&h.channel)?,
            since: h.since.map(since),
            limit: h.limit,
        }),
        Some(wire::Method::Refresh(r)) => Method::Refresh(RefreshRequest {
            channel: r.channel.as_deref().map(channel).transpose()?,
            token: r.token,
        }),
        Some(wire::Method::Rpc(r)) => {
            if r.method.is_empty() || r.method.len() > MAX_RPC_METHOD {
                return Err(invalid(
                    id,
                    ErrorCode::BadRequest,
                    format!("rpc method must be 1 to {MAX_RPC_METHOD} bytes"),
                ));
            }
            let data = match r.data.is_empty() {
                true => Bytes::from_static(b"null"),
                false => json(&r.data)?,
            };
            Method::Rpc(RpcRequest {
                method: r.method,
                data,
            })
        }
        Some(wire::Method::Presence(p)) => Method::Presence(PresenceRequest {
            channel: channel(&p.channel)?,
            limit: p.limit,
            cursor: p.cursor,
        }),
        Some(wire::Method::PresenceStats(c)) => Method::PresenceStats {
            channel: channel(&c.channel)?,
        },
        Some(wire::Method::Ping(_)) => Method::Ping,
    };
    Ok(Command { id, method })
}

/// A command as the SDK writes it, length prefixed: for tests, tools and the bench's
/// clients.
pub fn encode_command(command: &Command) -> Vec<u8> {
    let since = |s: &Since| wire::Since {
        offset: s.offset,
        epoch: s.epoch.as_ref().map(|e| e.as_str().to_owned()),
    };
    let text = |b: &Bytes| b.to_vec();
    let method = match &command.method {
        Method::Connect(c) => wire::Method::Connect(wire::Connect {
            token: c.token.clone(),
            name: c.name.clone(),
            version: c.version.clone(),
            client: c.client.clone(),
        }),
        Method::Subscribe(s) => wire::Method::Subscribe(wire::Subscribe {
            channel: s.channel.as_str().to_owned(),
            since: s.since.as_ref().map(since),
            token: s.token.clone(),
            delta: if s.delta { crate::delta::FOSSIL } else { "" }.to_owned(),
            conflate: s.conflate,
        }),
        Method::Unsubscribe { channel } => wire::Method::Unsubscribe(wire::Channel {
            channel: channel.as_str().to_owned(),
        }),
        Method::Publish {
            channel,
            data,
            idempotency_key,
            conflation_key,
        } => wire::Method::Publish(wire::Publish {
            channel: channel.as_str().to_owned(),
            data: text(data),
            idempotency_key: idempotency_key.clone(),
            conflation_key: conflation_key.clone(),
        }),
        Method::History(h) => wire::Method::History(wire::History {
            channel: h.channel.as_str().to_owned(),
            since: h.since.as_ref().map(since),
            limit: h.limit,
        }),
        Method::Refresh(r) => wire::Method::Refresh(wire::Refresh {
            channel: r.channel.as_ref().map(|c| c.as_str().to_owned()),
            token: r.token.clone(),
        }),
        Method::Rpc(r) => wire::Method::Rpc(wire::Rpc {
            method: r.method.clone(),
            data: text(&r.data),
        }),
        Method::Presence(p) => wire::Method::Presence(wire::PresencePage {
            channel: p.channel.as_str().to_owned(),
            limit: p.limit,
            cursor: p.cursor.clone(),
        }),
        Method::PresenceStats { channel } => wire::Method::PresenceStats(wire::Channel {
            channel: channel.as_str().to_owned(),
        }),
        Method::Ping => wire::Method::Ping(wire::Empty {}),
    };
    wire::Command {
        id: command.id,
        method: Some(method),
    }
    .encode_length_delimited_to_vec()
}

/// A server message (one length-delimited message) as the JSON codec would have written
/// it: for `herald sub`, the bench's clients and tests, which read Protobuf by what they
/// already read. `None` when it is not one.
pub fn to_json(part: &[u8]) -> Option<Vec<u8>> {
    let message = wire::ServerMessage::decode(delimited_body(part).ok()?).ok()?;
    Some(json::of(message))
}

/// JSON command lines (as `json::decode_frame` reads them) as one Protobuf frame; the
/// lines that are no command are left out. For tools and tests that write commands as
/// JSON and speak Protobuf.
pub fn frame_of_json(lines: &[u8]) -> Vec<u8> {
    crate::json::decode_frame(lines)
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .flat_map(encode_command)
        .collect()
}

/// A Protobuf frame from the server as the JSON lines of the same messages ([`to_json`]
/// each, joined by line breaks); `None` when a part of it is no server message.
pub fn json_lines(frame: &[u8]) -> Option<Vec<u8>> {
    let mut lines = Vec::with_capacity(frame.len() * 2);
    let mut rest = frame;
    while !rest.is_empty() {
        let (part, after) = split_delimited(rest);
        rest = after;
        crate::json::Json.join(&mut lines, &to_json(part)?);
    }
    Some(lines)
}

mod json;

#[cfg(test)]
mod tests;
