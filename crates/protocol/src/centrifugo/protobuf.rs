//! Centrifugo's Protobuf codec (`centrifuge-protobuf`, the mobile SDKs' default and
//! `centrifuge/build/protobuf`): each command and reply a length-delimited message
//! (`client.proto`, see [`super::proto`]), several to a WebSocket binary message. Data is
//! bytes on this wire; Herald keeps JSON, so what a client publishes must be JSON text.

use prost::Message;

use super::{close_code, proto};
use crate::{
    codec::{Codec, DecodeError, Outcome, Push, Reply},
    results::{self, Member},
    ChannelName, Command, Publication,
};

/// The Centrifugo Protobuf codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct CentrifugoProtobuf;

impl Codec for CentrifugoProtobuf {
    fn split<'f>(&self, frame: &'f [u8]) -> (&'f [u8], &'f [u8]) {
        crate::protobuf::split_delimited(frame)
    }

    fn decode(&self, part: &[u8]) -> Option<Result<Command, DecodeError>> {
        let body = match crate::protobuf::delimited_body(part) {
            Ok(body) => body,
            Err(e) => return Some(Err(e)),
        };
        match proto::Command::decode(body) {
            Ok(command) => super::command_of(command, false),
            Err(e) => Some(Err(DecodeError::Malformed(e.to_string()))),
        }
    }

    fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        let message = match reply {
            Reply::Done { id, outcome } => done(u32::try_from(*id).unwrap_or(0), outcome),
            Reply::Refused {
                id, code, message, ..
            } => proto::Reply {
                id: id.and_then(|id| u32::try_from(id).ok()).unwrap_or(0),
                error: Some(proto::Error {
                    code: u32::from(*code),
                    message: (*message).to_owned(),
                    temporary: crate::codes::temporary(*code),
                }),
                ..Default::default()
            },
        };
        message.encode_length_delimited_to_vec()
    }

    fn push(&self, push: &Push<'_>) -> Vec<u8> {
        let on = |channel: &ChannelName, push: proto::Push| proto::Push {
            channel: channel.as_str().to_owned(),
            ..push
        };
        let pushes: Vec<proto::Push> = match push {
            Push::Pub {
                channel,
                publication,
            } => vec![on(
                channel,
                proto::Push {
                    r#pub: Some(publication_of(publication, None)),
                    ..Default::default()
                },
            )],
            Push::PubDelta {
                channel,
                publication,
                delta,
            } => vec![on(
                channel,
                proto::Push {
                    r#pub: Some(publication_of(publication, Some(*delta))),
                    ..Default::default()
                },
            )],
            Push::Disconnect { code, reason } => {
                let (code, reconnect) = close_code(*code);
                vec![proto::Push {
                    disconnect: Some(proto::Disconnect {
                        code: code.into(),
                        reason: (*reason).to_owned(),
                        reconnect,
                    }),
                    ..Default::default()
                }]
            }
            Push::Unsubscribe {
                channel,
                code,
                reason,
            } => vec![on(
                channel,
                proto::Push {
                    unsubscribe: Some(proto::Unsubscribe {
                        code: super::encode::unsubscribe_code(*code).into(),
                        reason: (*reason).to_owned(),
                    }),
                    ..Default::default()
                },
            )],
            Push::Connect(c) => vec![proto::Push {
                connect: Some(connect_of(c)),
                ..Default::default()
            }],
            Push::Subscribe(s) => vec![on(
                s.channel,
                proto::Push {
                    subscribe: Some(proto::Subscribe {
                        recoverable: true,
                        positioned: true,
                        epoch: s.epoch.as_str().to_owned(),
                        offset: s.offset,
                        data: s
                            .data
                            .map(|d| d.get().as_bytes().to_vec())
                            .unwrap_or_default(),
                    }),
                    ..Default::default()
                },
            )],
            Push::Presence {
                channel,
                join,
                leave,
                ..
            } => {
                let member = |m: &Member<'_>| proto::Member {
                    info: Some(client_info(m)),
                };
                let joins = join.iter().map(|m| proto::Push {
                    join: Some(member(m)),
                    ..Default::default()
                });
                let leaves = leave.iter().map(|m| proto::Push {
                    leave: Some(member(m)),
                    ..Default::default()
                });
                joins.chain(leaves).map(|p| on(channel, p)).collect()
            }
            // An empty reply: the server's ping.
            Push::Ping => return proto::Reply::default().encode_length_delimited_to_vec(),
            // Centrifugo's subscriptions never conflate.
            Push::Conflated { .. } => Vec::new(),
        };
        let mut out = Vec::new();
        for push in pushes {
            let reply = proto::Reply {
                push: Some(push),
                ..Default::default()
            };
            out.extend(reply.encode_length_delimited_to_vec());
        }
        out
    }

    fn join(&self, out: &mut Vec<u8>, encoded: &[u8]) {
        // Each message carries its length: they follow one another.
        out.extend_from_slice(encoded);
    }

    fn binary(&self) -> bool {
        true
    }
}

/// A publication: its data's bytes; on a subscription that takes deltas, the whole data
/// (`Some(None)`) or the delta with `delta` set.
fn publication_of(p: &Publication, delta: Option<Option<&[u8]>>) -> proto::Publication {
    let (data, is_delta) = match delta {
        Some(Some(d)) => (d.to_vec(), true),
        _ => (p.data().to_vec(), false),
    };
    proto::Publication {
        data,
        delta: is_delta,
        offset: p.offset,
        info: p.from().map(|from| {
            let from: serde_json::Value = serde_json::from_slice(from).unwrap_or_default();
            let bytes = |key: &str| from.get(key).map(|v| v.to_string().into_bytes());
            proto::ClientInfo {
                user: from["user"].as_str().unwrap_or_default().to_owned(),
                client: String::new(),
                conn_info: bytes("info").unwrap_or_default(),
                chan_info: bytes("channel_info").unwrap_or_default(),
            }
        }),
    }
}

fn client_info(m: &Member<'_>) -> proto::ClientInfo {
    let herald: serde_json::Value = serde_json::from_slice(m.info).unwrap_or_default();
    let bytes = |key: &str| herald.get(key).map(|v| v.to_string().into_bytes());
    proto::ClientInfo {
        user: herald["user"].as_str().unwrap_or_default().to_owned(),
        client: format!("{:016x}", m.id),
        conn_info: bytes("info").unwrap_or_default(),
        chan_info: bytes("channel_info").unwrap_or_default(),
    }
}

fn connect_of(c: &results::Connect<'_>) -> proto::ConnectResult {
    proto::ConnectResult {
        client: c.client.to_owned(),
        version: c.version.to_owned(),
        expires: c.expiry.is_some(),
        ttl: c
            .expiry
            .map_or(0, |e| u32::try_from(e.ttl).unwrap_or(u32::MAX)),
        ping: u32::try_from(c.ping).unwrap_or(u32::MAX),
        pong: true,
    }
}

fn done(id: u32, outcome: &Outcome<'_>) -> proto::Reply {
    let reply = proto::Reply {
        id,
        ..Default::default()
    };
    let ttl =
        |e: Option<results::Expiry>| e.map_or(0, |e| u32::try_from(e.ttl).unwrap_or(u32::MAX));
    match outcome {
        Outcome::Connect(c) => proto::Reply {
            connect: Some(connect_of(c)),
            ..reply
        },
        Outcome::Subscribe(s) => proto::Reply {
            subscribe: Some(proto::SubscribeResult {
                recoverable: true,
                positioned: true,
                epoch: s.epoch.as_str().to_owned(),
                offset: s.offset,
                recovered: s.recovered == Some(true),
                was_recovering: s.recovered.is_some(),
                publications: s
                    .publications
                    .iter()
                    .map(|p| publication_of(p, None))
                    .collect(),
                data: s
                    .data
                    .map(|d| d.get().as_bytes().to_vec())
                    .unwrap_or_default(),
                delta: s.delta.is_some(),
            }),
            ..reply
        },
        Outcome::History(s) => proto::Reply {
            history: Some(proto::HistoryResult {
                publications: s
                    .publications
                    .iter()
                    .map(|p| publication_of(p, None))
                    .collect(),
                epoch: s.epoch.as_str().to_owned(),
                offset: s.offset,
            }),
            ..reply
        },
        Outcome::Unsubscribe => proto::Reply {
            unsubscribe: Some(proto::Empty {}),
            ..reply
        },
        Outcome::Publish(_) => proto::Reply {
            publish: Some(proto::Empty {}),
            ..reply
        },
        Outcome::Refresh(r) if r.subscription => proto::Reply {
            sub_refresh: Some(proto::SubRefreshResult {
                expires: r.expiry.is_some(),
                ttl: ttl(r.expiry),
            }),
            ..reply
        },
        Outcome::Refresh(r) => proto::Reply {
            refresh: Some(proto::RefreshResult {
                expires: r.expiry.is_some(),
                ttl: ttl(r.expiry),
            }),
            ..reply
        },
        Outcome::Rpc(r) => proto::Reply {
            rpc: Some(proto::RpcResult {
                data: r.data.get().as_bytes().to_vec(),
            }),
            ..reply
        },
        Outcome::Presence(page) => proto::Reply {
            presence: Some(proto::PresenceResult {
                presence: page
                    .members
                    .iter()
                    .map(|m| (format!("{:016x}", m.id), client_info(m)))
                    .collect(),
            }),
            ..reply
        },
        Outcome::PresenceStats(s) => proto::Reply {
            presence_stats: Some(proto::PresenceStatsResult {
                num_clients: u32::try_from(s.clients).unwrap_or(u32::MAX),
                num_users: u32::try_from(s.users).unwrap_or(u32::MAX),
            }),
            ..reply
        },
        Outcome::Ping => proto::Reply {
            ping: Some(proto::Empty {}),
            ..reply
        },
    }
}
