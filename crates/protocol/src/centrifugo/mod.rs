//! Centrifugo's client protocol, JSON codec (protocol v2, as `centrifuge-js` 5 and
//! Centrifugo 6 speak it), as a [`Codec`](crate::Codec) of Herald's commands and replies:
//! the Centrifugo front (`herald_server::fronts::centrifugo`) is this codec over Herald's
//! session.
//!
//! Commands are JSON objects, one per line, `{"id": N, "METHOD": {PARAMS}}`; replies carry
//! the id, pushes come as `{"push": {"channel": C, "pub" | "join" | "leave" | …: {…}}}`,
//! and an empty object both ways is the application-level ping and its pong. Unlike
//! Herald's own codec, fields this one does not know are ignored, as Centrifugo ignores
//! them: its clients send newer ones (`flag`, `positioned`, …) to servers that predate them.
//!
//! The models match: a channel, its stream offsets and epoch, recovery (`recover` with
//! `offset` and `epoch`, answered `recovered` and `was_recovering`), history, presence,
//! JWT, rpc, Fossil deltas; Herald's error codes 100-112 are Centrifugo's numbers.

mod encode;
mod proto;
mod protobuf;

use serde::Deserialize;
use serde_json::value::RawValue;

pub use encode::{api_result, close_code, Centrifugo};
pub use protobuf::CentrifugoProtobuf;

use crate::{
    codec::DecodeError,
    command::{
        ConnectRequest, HistoryRequest, PresenceRequest, RefreshRequest, RpcRequest,
        SubscribeRequest,
    },
    ChannelName, Command, Epoch, ErrorCode, Method, Since,
};

/// A command as Centrifugo's clients send it; every method optional, unknown fields
/// ignored.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    id: u64,
    #[serde(borrow, default)]
    connect: Option<Connect<'a>>,
    #[serde(borrow, default)]
    subscribe: Option<Subscribe<'a>>,
    #[serde(borrow, default)]
    unsubscribe: Option<Channel<'a>>,
    #[serde(borrow, default)]
    publish: Option<Publish<'a>>,
    #[serde(borrow, default)]
    presence: Option<Channel<'a>>,
    #[serde(borrow, default)]
    presence_stats: Option<Channel<'a>>,
    #[serde(borrow, default)]
    history: Option<History<'a>>,
    #[serde(borrow, default)]
    ping: Option<&'a RawValue>,
    #[serde(borrow, default)]
    send: Option<&'a RawValue>,
    #[serde(borrow, default)]
    rpc: Option<Rpc<'a>>,
    #[serde(borrow, default)]
    refresh: Option<Refresh<'a>>,
    #[serde(borrow, default)]
    sub_refresh: Option<SubRefresh<'a>>,
}

#[derive(Deserialize)]
struct Connect<'a> {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(borrow, default)]
    #[allow(dead_code)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Subscribe<'a> {
    channel: &'a str,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    recover: bool,
    #[serde(default)]
    epoch: Option<String>,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    delta: Option<&'a str>,
}

#[derive(Deserialize)]
struct Channel<'a> {
    channel: &'a str,
}

#[derive(Deserialize)]
struct Publish<'a> {
    channel: &'a str,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// A stream position in Centrifugo's JSON (`{"offset", "epoch"}`, each optional), as its
/// clients' `history` and its server API's `since` give one.
#[derive(Debug, Deserialize)]
pub struct Position {
    /// The last offset seen.
    #[serde(default)]
    pub offset: u64,
    /// The stream's epoch then; empty or absent: not known.
    #[serde(default)]
    pub epoch: Option<String>,
}

impl Position {
    /// Herald's words for "what follows this position".
    pub fn since(&self) -> Since {
        since(self.offset, self.epoch.as_deref().unwrap_or_default())
    }
}

/// What follows `offset` of the stream of `epoch` (empty: not known), in Herald's words.
fn since(offset: u64, epoch: &str) -> Since {
    Since {
        offset,
        epoch: (!epoch.is_empty()).then(|| Epoch::new(epoch)),
    }
}

#[derive(Deserialize)]
struct History<'a> {
    channel: &'a str,
    #[serde(default)]
    limit: i64,
    #[serde(default)]
    since: Option<Position>,
    #[serde(default)]
    reverse: bool,
}

#[derive(Deserialize)]
struct Rpc<'a> {
    #[serde(default)]
    method: String,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Refresh<'a> {
    #[serde(borrow)]
    token: &'a str,
}

#[derive(Deserialize)]
struct SubRefresh<'a> {
    channel: &'a str,
    #[serde(borrow)]
    token: &'a str,
}

fn invalid(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> DecodeError {
    DecodeError::Invalid {
        id,
        code,
        message: message.into(),
    }
}

/// Decodes one Centrifugo command (one line of JSON); `None` for an empty object, a
/// client's pong.
pub fn decode_command(line: &[u8]) -> Option<Result<Command, DecodeError>> {
    let wire: Wire<'_> = match serde_json::from_slice(line) {
        Ok(w) => w,
        Err(e) => return Some(Err(DecodeError::Malformed(e.to_string()))),
    };
    let raw = |v: Option<&RawValue>| v.map_or_else(Vec::new, |v| v.get().as_bytes().to_vec());
    let channel = |c: Channel<'_>| proto::ChannelRequest {
        channel: c.channel.to_owned(),
    };
    let command = proto::Command {
        id: u32::try_from(wire.id).unwrap_or(u32::MAX),
        connect: wire.connect.map(|c| proto::ConnectRequest {
            token: c.token.unwrap_or_default(),
            name: c.name.unwrap_or_default(),
            version: c.version.unwrap_or_default(),
        }),
        subscribe: wire.subscribe.map(|s| proto::SubscribeRequest {
            channel: s.channel.to_owned(),
            token: s.token.unwrap_or_default(),
            recover: s.recover,
            epoch: s.epoch.unwrap_or_default(),
            offset: s.offset,
            delta: s.delta.unwrap_or_default().to_owned(),
        }),
        unsubscribe: wire.unsubscribe.map(channel),
        publish: wire.publish.map(|p| proto::PublishRequest {
            channel: p.channel.to_owned(),
            data: raw(Some(p.data)),
        }),
        presence: wire.presence.map(channel),
        presence_stats: wire.presence_stats.map(channel),
        history: wire.history.map(|h| proto::HistoryRequest {
            channel: h.channel.to_owned(),
            limit: i32::try_from(h.limit).unwrap_or(-1),
            since: h.since.map(|p| proto::StreamPosition {
                offset: p.offset,
                epoch: p.epoch.unwrap_or_default(),
            }),
            reverse: h.reverse,
        }),
        ping: wire.ping.map(|_| proto::Empty {}),
        send: wire.send.map(|_| proto::Empty {}),
        rpc: wire.rpc.map(|r| proto::RpcRequest {
            data: raw(r.data),
            method: r.method,
        }),
        refresh: wire.refresh.map(|r| proto::RefreshRequest {
            token: r.token.to_owned(),
        }),
        sub_refresh: wire.sub_refresh.map(|r| proto::SubRefreshRequest {
            channel: r.channel.to_owned(),
            token: r.token.to_owned(),
        }),
    };
    command_of(command, true)
}

/// A command of either codec as Herald's; `None` for an empty one, a client's pong.
/// `json`: the command came as JSON, so its data is JSON text already; Protobuf's bytes
/// must be JSON text too (Herald keeps JSON), or the command is refused.
fn command_of(wire: proto::Command, json: bool) -> Option<Result<Command, DecodeError>> {
    let id = (wire.id != 0).then_some(u64::from(wire.id));
    let channel = |name: &str| {
        ChannelName::new(name).map_err(|e| invalid(id, ErrorCode::InvalidChannel, e.to_string()))
    };
    let data = |bytes: Vec<u8>, default: &str| -> Result<bytes::Bytes, DecodeError> {
        if bytes.is_empty() {
            return Ok(bytes::Bytes::copy_from_slice(default.as_bytes()));
        }
        if !json && serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_err() {
            return Err(invalid(
                id,
                ErrorCode::BadRequest,
                "data must be JSON text: Herald keeps publications as JSON",
            ));
        }
        Ok(bytes::Bytes::from(bytes))
    };
    let non_empty = |s: String| (!s.is_empty()).then_some(s);
    let method = (|| {
        Ok(Some(if let Some(c) = wire.connect {
            Method::Connect(ConnectRequest {
                token: non_empty(c.token),
                name: non_empty(c.name),
                version: non_empty(c.version),
                client: None,
            })
        } else if let Some(s) = wire.subscribe {
            let delta =
                crate::delta::asked(&s.delta).map_err(|m| invalid(id, ErrorCode::BadRequest, m))?;
            Method::Subscribe(SubscribeRequest {
                channel: channel(&s.channel)?,
                since: s.recover.then(|| since(s.offset, &s.epoch)),
                token: non_empty(s.token),
                delta,
                conflate: false,
            })
        } else if let Some(u) = wire.unsubscribe {
            Method::Unsubscribe {
                channel: channel(&u.channel)?,
            }
        } else if let Some(p) = wire.publish {
            Method::Publish {
                channel: channel(&p.channel)?,
                data: data(p.data, "null")?,
                idempotency_key: None,
                conflation_key: None,
            }
        } else if let Some(p) = wire.presence {
            Method::Presence(PresenceRequest {
                channel: channel(&p.channel)?,
                // Centrifugo answers with every member: the largest page there is.
                limit: Some(u32::MAX),
                cursor: None,
            })
        } else if let Some(p) = wire.presence_stats {
            Method::PresenceStats {
                channel: channel(&p.channel)?,
            }
        } else if let Some(h) = wire.history {
            if h.reverse {
                return Err(invalid(
                    id,
                    ErrorCode::BadRequest,
                    "history in reverse order is not supported",
                ));
            }
            Method::History(HistoryRequest {
                channel: channel(&h.channel)?,
                since: h.since.map(|p| since(p.offset, &p.epoch)),
                // Centrifugo: 0 asks for the stream's position only, -1 for all.
                limit: u32::try_from(h.limit).ok().or(Some(u32::MAX)),
            })
        } else if let Some(r) = wire.rpc {
            Method::Rpc(RpcRequest {
                method: r.method,
                data: data(r.data, "null")?,
            })
        } else if let Some(r) = wire.refresh {
            Method::Refresh(RefreshRequest {
                channel: None,
                token: r.token,
            })
        } else if let Some(r) = wire.sub_refresh {
            Method::Refresh(RefreshRequest {
                channel: Some(channel(&r.channel)?),
                token: r.token,
            })
        } else if wire.ping.is_some() {
            Method::Ping
        } else if wire.send.is_some() {
            return Err(invalid(
                id,
                ErrorCode::MethodNotFound,
                "send (asynchronous messages) is not supported: use rpc",
            ));
        } else if id.is_none() {
            // Empty: the client's pong.
            return Ok(None);
        } else {
            return Err(invalid(id, ErrorCode::BadRequest, "command has no method"));
        }))
    })();
    match method {
        Ok(None) => None,
        Ok(Some(method)) => Some(Ok(Command { id, method })),
        Err(e) => Some(Err(e)),
    }
}

#[cfg(test)]
mod tests;
