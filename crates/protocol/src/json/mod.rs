//! The JSON codec: one JSON object per line, several lines per frame.
//!
//! Decoding is strict and total: every input gives either commands or an error that says
//! what is wrong, never a panic (the decoder is fuzzed). Encoding of publications writes
//! bytes directly, because it runs once per publication on the fan-out path.

use std::collections::HashMap;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::value::RawValue;

use crate::{
    command::{
        ConnectRequest, HistoryRequest, PresenceRequest, RefreshRequest, RpcRequest,
        SubscribeRequest,
    },
    ChannelName, Command, ErrorCode, Method, Since,
};

pub use crate::codec::DecodeError;

/// Every command of a frame, read as a session reads it through [`Json`] (split into
/// lines, blank ones skipped), for tools and tests that want them all at once.
pub fn decode_frame(frame: &[u8]) -> Vec<Result<Command, DecodeError>> {
    use crate::Codec;
    let mut commands = Vec::new();
    let mut rest = frame;
    while !rest.is_empty() {
        let (part, after) = Json.split(rest);
        rest = after;
        commands.extend(Json.decode(part));
    }
    commands
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
            let p: SubscribeParams = parse(id, params)?;
            Method::Subscribe(SubscribeRequest {
                channel: channel(id, &p.channel)?,
                since: p.since,
                token: p.token,
                delta: crate::delta::asked(p.delta.as_deref().unwrap_or_default())
                    .map_err(|m| invalid(id, ErrorCode::BadRequest, m))?,
                conflate: p.conflate,
            })
        }
        "unsubscribe" => {
            let p: ChannelParams = parse(id, params)?;
            Method::Unsubscribe { channel: channel(id, &p.channel)? }
        }
        "publish" => {
            let p: PublishParams = parse(id, params)?;
            let data = payload(&p.data).map_err(|m| invalid(id, ErrorCode::BadRequest, m))?;
            Method::Publish {
                channel: channel(id, &p.channel)?,
                data,
                idempotency_key: p.idempotency_key,
                conflation_key: p.conflation_key,
            }
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
struct SubscribeParams {
    channel: String,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    conflate: bool,
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
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    conflation_key: Option<String>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    channel: String,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    limit: Option<u32>,
}

mod encode;
mod payload;

pub use encode::*;
pub use payload::*;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

/// A `presence` push as Herald's JSON codec wrote it, in another codec's words: the hub
/// encodes joins and leaves once, in Herald's JSON, and a connection of another codec
/// has them said again. `None` when `json` is no presence push.
pub fn presence_in(codec: &dyn crate::Codec, json: &[u8]) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct Wire<'a> {
        #[serde(borrow)]
        presence: Body<'a>,
    }
    #[derive(Deserialize)]
    struct Body<'a> {
        channel: &'a str,
        #[serde(default)]
        join: Vec<serde_json::Map<String, serde_json::Value>>,
        #[serde(default)]
        leave: Vec<serde_json::Map<String, serde_json::Value>>,
        #[serde(default)]
        missed: bool,
        #[serde(default)]
        clients: Option<u64>,
    }
    let wire: Wire<'_> = serde_json::from_slice(json).ok()?;
    let channel = ChannelName::new(wire.presence.channel).ok()?;
    // A member is `{"client": ID, …}`: the id, and the rest as its info object.
    let members = |list: Vec<serde_json::Map<String, serde_json::Value>>| -> Vec<(u64, Vec<u8>)> {
        list.into_iter()
            .filter_map(|mut m| {
                let id = encode::decode_member_id(m.remove("client")?.as_str()?)?;
                let info = if m.is_empty() {
                    Vec::new()
                } else {
                    serde_json::to_vec(&m).ok()?
                };
                Some((id, info))
            })
            .collect()
    };
    let (join, leave) = (members(wire.presence.join), members(wire.presence.leave));
    fn as_members(list: &[(u64, Vec<u8>)]) -> Vec<crate::results::Member<'_>> {
        list.iter()
            .map(|(id, info)| crate::results::Member { id: *id, info })
            .collect()
    }
    let (join, leave) = (as_members(&join), as_members(&leave));
    Some(codec.push(&crate::codec::Push::Presence {
        channel: &channel,
        join: &join,
        leave: &leave,
        missed: wire.presence.missed,
        clients: wire.presence.clients,
    }))
}
