//! Herald's replies and pushes in Centrifugo's JSON words.

use std::io::Write;

use serde::Serialize;
use serde_json::{value::RawValue, Map, Value};

use crate::{
    codec::{Codec, Outcome, Push, Reply},
    results::{self, Member},
    ChannelName, Command, DisconnectCode, Publication,
};

use super::DecodeError;

/// The Centrifugo codec: one JSON object per line, several lines per frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Centrifugo;

impl Codec for Centrifugo {
    fn split<'f>(&self, frame: &'f [u8]) -> (&'f [u8], &'f [u8]) {
        crate::json::Json.split(frame)
    }

    fn decode(&self, part: &[u8]) -> Option<Result<Command, DecodeError>> {
        if part.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        super::decode_command(part)
    }

    fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        match reply {
            Reply::Done { id, outcome } => {
                let (method, result) = outcome_of(outcome);
                let mut out = Vec::with_capacity(32 + result.len());
                write!(out, r#"{{"id":{id},"{method}":"#).expect("writing to a Vec cannot fail");
                out.extend_from_slice(&result);
                out.push(b'}');
                out
            }
            Reply::Refused {
                id, code, message, ..
            } => {
                #[derive(Serialize)]
                struct Error<'a> {
                    code: u16,
                    message: &'a str,
                    #[serde(skip_serializing_if = "std::ops::Not::not")]
                    temporary: bool,
                }
                #[derive(Serialize)]
                struct Refusal<'a> {
                    #[serde(skip_serializing_if = "Option::is_none")]
                    id: Option<u64>,
                    error: Error<'a>,
                }
                let refusal = Refusal {
                    id: *id,
                    error: Error {
                        code: *code,
                        message,
                        temporary: crate::codes::temporary(*code),
                    },
                };
                serde_json::to_vec(&refusal).expect("errors serialise")
            }
        }
    }

    fn push(&self, push: &Push<'_>) -> Vec<u8> {
        match push {
            Push::Pub {
                channel,
                publication,
            } => in_push(channel, "pub", &publication_of(publication, None)),
            Push::PubDelta {
                channel,
                publication,
                delta,
            } => in_push(channel, "pub", &publication_of(publication, Some(*delta))),
            Push::Disconnect { code, reason } => {
                let (code, reconnect) = close_code(*code);
                let body =
                    serde_json::json!({"code": code, "reason": reason, "reconnect": reconnect});
                wrap(&serde_json::json!({ "disconnect": body }))
            }
            Push::Unsubscribe {
                channel,
                code,
                reason,
            } => {
                let code = unsubscribe_code(*code);
                in_push(
                    channel,
                    "unsubscribe",
                    &serde_json::json!({"code": code, "reason": reason}),
                )
            }
            Push::Connect(connect) => wrap(&serde_json::json!({ "connect": connect_of(connect) })),
            Push::Subscribe(s) => {
                let mut body = Map::new();
                body.insert("recoverable".into(), true.into());
                body.insert("positioned".into(), true.into());
                body.insert("epoch".into(), s.epoch.as_str().into());
                body.insert("offset".into(), s.offset.into());
                if let Some(data) = s.data {
                    body.insert("data".into(), raw(data));
                }
                in_push(s.channel, "subscribe", &Value::Object(body))
            }
            Push::Presence {
                channel,
                join,
                leave,
                ..
            } => {
                let mut out = Vec::new();
                for (kind, members) in [("join", join), ("leave", leave)] {
                    for m in members.iter() {
                        let body = serde_json::json!({ "info": client_info(m) });
                        crate::json::Json.join(&mut out, &in_push(channel, kind, &body));
                    }
                }
                out
            }
            Push::Ping => b"{}".to_vec(),
            // Centrifugo's subscriptions never conflate.
            Push::Conflated { .. } => Vec::new(),
        }
    }

    fn join(&self, out: &mut Vec<u8>, encoded: &[u8]) {
        crate::json::Json.join(out, encoded)
    }
}

/// Centrifugo's unsubscribe code for why Herald ended a subscription.
pub(super) fn unsubscribe_code(code: crate::ErrorCode) -> u16 {
    match code as u16 {
        // An operator ended it: Centrifugo's "server unsubscribe", for good.
        120 => 2000,
        // The subscription token expired: resubscribe with a new one.
        109 => 2501,
        _ => 2500,
    }
}

/// The close code and whether to reconnect, in Centrifugo's numbers, for one of Herald's
/// close codes (an application's own, 4000-4999, stays as it is).
pub fn close_code(code: u16) -> (u16, bool) {
    let centrifugo = match DisconnectCode::from_code(code) {
        Some(DisconnectCode::Shutdown) => 3001,
        Some(DisconnectCode::InsufficientState) => 3010,
        Some(DisconnectCode::Slow) => 3008,
        Some(DisconnectCode::WriteError) => 3009,
        Some(DisconnectCode::Stale) => 3012,
        Some(
            DisconnectCode::ServerError
            | DisconnectCode::BackendUnavailable
            | DisconnectCode::BrokerUnreachable,
        ) => 3004,
        Some(DisconnectCode::ForceReconnect) => 3011,
        Some(DisconnectCode::InvalidToken) => 3500,
        Some(DisconnectCode::BadRequest | DisconnectCode::MessageTooLarge) => 3501,
        Some(DisconnectCode::Forbidden) => 3507,
        // The token expired: Centrifugo's "connection expired", after which its clients
        // get a new token and reconnect.
        Some(DisconnectCode::Expired) => 3005,
        Some(DisconnectCode::ConnectionLimit) => 3504,
        None => code,
    };
    // Centrifugo: 3000-3499 reconnect, 3500-3999 do not; 4000-4499 reconnect, 4500-4999 not.
    let reconnect = matches!(centrifugo, 3000..=3499 | 4000..=4499);
    (centrifugo, reconnect)
}

fn wrap(push: &Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "push": push })).expect("pushes serialise")
}

fn in_push(channel: &ChannelName, kind: &str, body: &Value) -> Vec<u8> {
    let mut push = Map::new();
    push.insert("channel".into(), channel.as_str().into());
    push.insert(kind.into(), body.clone());
    wrap(&Value::Object(push))
}

fn raw(value: &RawValue) -> Value {
    serde_json::from_str(value.get()).unwrap_or(Value::Null)
}

/// A publication: `data` as it was published; on a subscription that takes deltas, its
/// text as a string (`delta: Some(None)`) or the delta, with `"delta": true`.
fn publication_of(p: &Publication, delta: Option<Option<&[u8]>>) -> Value {
    let mut body = Map::new();
    let text = |bytes: &[u8]| Value::String(String::from_utf8_lossy(bytes).into_owned());
    match delta {
        None => {
            body.insert(
                "data".into(),
                serde_json::from_slice(p.data()).unwrap_or(Value::Null),
            );
        }
        Some(None) => {
            body.insert("data".into(), text(p.data()));
        }
        Some(Some(d)) => {
            body.insert("data".into(), text(d));
            body.insert("delta".into(), true.into());
        }
    }
    body.insert("offset".into(), p.offset.into());
    if let Some(from) = p.from() {
        // Herald's sender `{"user", "info"?, "channel_info"?}` as Centrifugo's ClientInfo.
        let from: Value = serde_json::from_slice(from).unwrap_or(Value::Null);
        let mut info = Map::new();
        info.insert("user".into(), from["user"].clone());
        info.insert("client".into(), "".into());
        for (herald, centrifugo) in [("info", "conn_info"), ("channel_info", "chan_info")] {
            if let Some(v) = from.get(herald) {
                info.insert(centrifugo.into(), v.clone());
            }
        }
        body.insert("info".into(), Value::Object(info));
    }
    Value::Object(body)
}

/// A member as Centrifugo's ClientInfo: `{"user", "client", "conn_info"?, "chan_info"?}`.
fn client_info(m: &Member<'_>) -> Value {
    let herald: Value = if m.info.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(m.info).unwrap_or(Value::Null)
    };
    let mut info = Map::new();
    info.insert(
        "user".into(),
        herald.get("user").cloned().unwrap_or_else(|| "".into()),
    );
    info.insert("client".into(), format!("{:016x}", m.id).into());
    for (key, centrifugo) in [("info", "conn_info"), ("channel_info", "chan_info")] {
        if let Some(v) = herald.get(key) {
            info.insert(centrifugo.into(), v.clone());
        }
    }
    Value::Object(info)
}

fn connect_of(c: &results::Connect<'_>) -> Value {
    let mut body = Map::new();
    body.insert("client".into(), c.client.into());
    body.insert("version".into(), c.version.into());
    // The server pings every `ping` seconds (an empty reply) and the client answers each.
    body.insert("ping".into(), c.ping.into());
    body.insert("pong".into(), true.into());
    if let Some(e) = c.expiry {
        body.insert("expires".into(), true.into());
        body.insert("ttl".into(), e.ttl.into());
    }
    Value::Object(body)
}

fn stream_of(s: &results::Stream<'_>, subscribe: bool) -> Value {
    let mut body = Map::new();
    if subscribe {
        body.insert("recoverable".into(), true.into());
        body.insert("positioned".into(), true.into());
        if let Some(recovered) = s.recovered {
            body.insert("recovered".into(), recovered.into());
            body.insert("was_recovering".into(), true.into());
        }
        if let Some(data) = s.data {
            body.insert("data".into(), raw(data));
        }
        if s.delta.is_some() {
            body.insert("delta".into(), true.into());
        }
    }
    body.insert("epoch".into(), s.epoch.as_str().into());
    body.insert("offset".into(), s.offset.into());
    if !s.publications.is_empty() {
        let publications = s.publications.iter().map(|p| publication_of(p, None));
        body.insert("publications".into(), publications.collect());
    }
    Value::Object(body)
}

/// `outcome` as Centrifugo's server API answers it: `{"result": …}`, the client
/// protocol's result of the same method, except that a publish says where it was stored.
pub fn api_result(outcome: &Outcome<'_>) -> Vec<u8> {
    let result = match outcome {
        Outcome::Publish(p) => serde_json::to_vec(&serde_json::json!({
            "offset": p.offset,
            "epoch": p.epoch,
        }))
        .expect("results serialise"),
        _ => outcome_of(outcome).1,
    };
    let mut out = Vec::with_capacity(result.len() + 11);
    out.extend_from_slice(br#"{"result":"#);
    out.extend_from_slice(&result);
    out.push(b'}');
    out
}

/// The reply's method name and its result, in Centrifugo's words.
fn outcome_of(outcome: &Outcome<'_>) -> (&'static str, Vec<u8>) {
    let empty = || b"{}".to_vec();
    let json = |v: Value| serde_json::to_vec(&v).expect("results serialise");
    match outcome {
        Outcome::Connect(c) => ("connect", json(connect_of(c))),
        Outcome::Subscribe(s) => ("subscribe", json(stream_of(s, true))),
        Outcome::History(s) => ("history", json(stream_of(s, false))),
        Outcome::Unsubscribe => ("unsubscribe", empty()),
        Outcome::Publish(_) => ("publish", empty()),
        Outcome::Refresh(r) => {
            let mut body = Map::new();
            if let Some(e) = r.expiry {
                body.insert("expires".into(), true.into());
                body.insert("ttl".into(), e.ttl.into());
            }
            let method = if r.subscription {
                "sub_refresh"
            } else {
                "refresh"
            };
            (method, json(Value::Object(body)))
        }
        Outcome::Rpc(r) => ("rpc", json(serde_json::json!({ "data": raw(r.data) }))),
        Outcome::Presence(page) => {
            let presence: Map<String, Value> = page
                .members
                .iter()
                .map(|m| (format!("{:016x}", m.id), client_info(m)))
                .collect();
            (
                "presence",
                json(serde_json::json!({ "presence": presence })),
            )
        }
        Outcome::PresenceStats(s) => (
            "presence_stats",
            json(serde_json::json!({"num_clients": s.clients, "num_users": s.users})),
        ),
        Outcome::Ping => ("ping", empty()),
    }
}
