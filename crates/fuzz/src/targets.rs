//! The decoders, each as a function of one input, with a corpus of valid examples.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use herald_broker::{Broker, DurableBroker, StreamPolicy, SyncPolicy};
use herald_protocol::{
    json::{self, DecodeError, Json},
    ChannelName, Codec, Cursor, Reply,
};
use herald_server::transport::request::OpenRequest;

use crate::access;

/// A decoder under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Client frames: one or more JSON commands, as every transport reads them.
    Command,
    /// `cursor=` values (poll, long-poll, streams).
    Cursor,
    /// Query strings of the HTTP transports.
    Query,
    /// EventSource's `Last-Event-ID` header.
    LastEventId,
    /// Messages on a channel's Redis pub/sub channel (`EPOCH\nOFFSET\nDATA`).
    RedisMessage,
    /// What the NATS broker reads back from NATS: presence keys and values, idempotency
    /// records, a message's offset and epoch headers and its data.
    NatsStored,
    /// Raw RESP bytes of a history script reply, parsed by redis-rs and decoded by Herald.
    RedisReply,
    /// The durable store's file with damaged bytes: opened, then every stream read.
    StoredFile,
    /// A Pusher client's message, and a stored payload turned into a Pusher event.
    Pusher,
    /// A Phoenix client's message (both serializers), and a stored payload turned into a
    /// Phoenix broadcast.
    Phoenix,
    /// A token, checked as a connection token and as a subscription token against an HMAC
    /// secret, an RSA key and a previous secret.
    Token,
    /// A JWKS document, as fetched from `auth.jwks_url`.
    Jwks,
    /// A backend's answer to each hook.
    HookAnswer,
    /// A configuration file (`herald serve --config`).
    Config,
    /// What a node reads from another through Redis, publications aside: a message on
    /// its own channel, a request it answers, a presence batch.
    NodeMessage,
    /// A browser's `Origin` and `Host`, through the origin, host and CORS checks.
    Origin,
    /// What a WebSocket client sends after its handshake (frames, fragments, compressed
    /// messages), through Herald's frame reader; and a permessage-deflate offer.
    Websocket,
    /// A segment of the durable store's write-ahead log, as replay reads it.
    Wal,
    /// A packed file of the durable store, read without its index (the rebuild).
    Pack,
    /// A Centrifugo client's frame (the Centrifugo front's codec), an error answered to
    /// it, and a stored payload as a Centrifugo publication, whole and as a delta's base.
    Centrifugo,
    /// Two publications' data, and the Fossil delta between them (`delta: "fossil"`).
    Delta,
    /// A frame of Herald's Protobuf codec (`herald.protobuf`): commands as the session
    /// reads them, each valid one written again and read back the same; and the same bytes
    /// as a server message, as `herald sub` and the bench read it (`protobuf::to_json`).
    Protobuf,
}

pub use crate::decoder::Decoder;

impl Target {
    pub const ALL: [Target; 22] = [
        Target::Command,
        Target::Cursor,
        Target::Query,
        Target::LastEventId,
        Target::RedisMessage,
        Target::RedisReply,
        Target::NatsStored,
        Target::StoredFile,
        Target::Pusher,
        Target::Phoenix,
        Target::Token,
        Target::Jwks,
        Target::HookAnswer,
        Target::Config,
        Target::NodeMessage,
        Target::Origin,
        Target::Websocket,
        Target::Wal,
        Target::Pack,
        Target::Centrifugo,
        Target::Delta,
        Target::Protobuf,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Command => "command",
            Target::Cursor => "cursor",
            Target::Query => "query",
            Target::LastEventId => "last-event-id",
            Target::RedisMessage => "redis-message",
            Target::RedisReply => "redis-reply",
            Target::NatsStored => "nats-stored",
            Target::StoredFile => "stored-file",
            Target::Pusher => "pusher",
            Target::Phoenix => "phoenix",
            Target::Token => "token",
            Target::Jwks => "jwks",
            Target::HookAnswer => "hook-answer",
            Target::Config => "config",
            Target::NodeMessage => "node-message",
            Target::Origin => "origin",
            Target::Websocket => "websocket",
            Target::Wal => "wal",
            Target::Pack => "pack",
            Target::Centrifugo => "centrifugo",
            Target::Delta => "delta",
            Target::Protobuf => "protobuf",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Longest input generated: past every limit Herald applies before decoding, so that
    /// inputs reach the decoder whole.
    pub fn max_len(self) -> usize {
        match self {
            Target::StoredFile => usize::MAX,
            _ => 64 * 1024,
        }
    }

    pub fn corpus(self) -> Vec<Vec<u8>> {
        let texts: &[&str] = match self {
            Target::Command => &[
                r#"{"id":1,"connect":{"token":"x"}}"#,
                r#"{"id":2,"subscribe":{"channel":"chat:lobby","since":{"offset":3,"epoch":"abc"}}}"#,
                r#"{"id":3,"publish":{"channel":"chat:lobby","data":{"text":"hi","n":[1,2.5,-3e10,null,true]}}}"#,
                r#"{"id":4,"history":{"channel":"chat:lobby","limit":10,"since":{"offset":0}}}"#,
                r#"{"id":5,"unsubscribe":{"channel":"chat:lobby"}}"#,
                r#"{"id":6,"ping":{}}"#,
                "{\"id\":7,\"ping\":{}}\n{\"id\":8,\"publish\":{\"channel\":\"a\",\"data\":\"\\u00e9\\n\"}}",
                r#"{"publish":{"channel":"x","data":[1e400,1]}}"#,
            ],
            Target::Cursor => &[
                "chat:lobby;abc123;7",
                "a;*;0|b;e1;18446744073709551615",
                "chat:lobby;abc;1|chat:other;abc;2|x;y;3",
                "",
            ],
            Target::Query => &[
                "channel=chat:lobby",
                "channel=a&channel=b&cursor=a%3Babc%3B3",
                "cursor=chat:lobby;*;0&callback=parent.cb&timeout=10s",
                "channel=x&timeout=25&_=12345&t=1",
            ],
            Target::LastEventId => &["chat:lobby;abc123;7", "a;*;0|b;e;2", ""],
            Target::RedisMessage => &[
                "abc123\n7\n{\"text\":\"hi\"}",
                "e\n1\n1",
                "e\n18446744073709551615\n[1,2,{\"a\":null}]",
            ],
            Target::RedisReply => &[
                "*4\r\n$6\r\nabc123\r\n:7\r\n:5\r\n*4\r\n:5\r\n$1\r\n1\r\n:6\r\n$9\r\n{\"a\":[1]}\r\n",
                "*4\r\n$1\r\ne\r\n:0\r\n:1\r\n*0\r\n",
            ],
            Target::NatsStored => &[
                "636861743a6c6f626279.0000000000000007.node1\nabc123\n{\"text\":\"hi\"}",
                "u\u{0}\u{3}ann{\"user\":\"ann\"}",
                "-{}",
                "d 1795772975656 7 abc123",
                "c 1795772975656",
                "18446744073709551615\ne\n[1,2,{\"a\":null}]",
            ],
            Target::Pusher => &[
                r#"{"event":"pusher:subscribe","data":{"channel":"presence-room","auth":"k:00ff","channel_data":"{\"user_id\":7,\"user_info\":{\"name\":\"a\"}}"}}"#,
                r#"{"event":"pusher:subscribe","data":"{\"channel\":\"private-a\",\"auth\":\"k:s\"}"}"#,
                r#"{"event":"client-typing","channel":"private-a","data":{"x":[1,2.5,null]}}"#,
                r#"{"event":"pusher:ping","data":{}}"#,
                r##"{"event":"pusher:subscribe","data":{"channel":"#server-to-user-u.1","auth":""}}"##,
                r#"{"event":"pusher:signin","data":{"auth":"k:s","user_data":"{\"id\":\"1\"}"}}"#,
                r#"{"event":"created","data":"{\"id\":1}","user_id":"7","socket_id":"1.2"}"#,
            ],
            Target::Phoenix => &[
                r#"["1","1","chat:lobby","phx_join",{"token":"t","since":{"offset":3}}]"#,
                r#"[null,"2","phoenix","heartbeat",{}]"#,
                r#"{"topic":"chat","event":"speak","payload":{"body":"hi"},"ref":"3"}"#,
                r#"{"topic":"chat","event":"phx_join","payload":{},"ref":1,"join_ref":"1"}"#,
                r#"{"event":"publish","data":{"body":"x"}}"#,
                r#"{"event":"new_msg","data":{"body":"x"},"socket_id":"phx.00000000000000ff"}"#,
                // A binary push: kind 0, the four sizes, join_ref, ref, topic, event, data.
                "\u{0}\u{1}\u{1}\u{4}\u{6}12chatupload\u{1}\u{2}",
                // A stored binary push, its bytes in base64, and one whose base64 is not.
                r#"{"event":"upload","data":"AAr/Ww==","encoding":"base64"}"#,
                r#"{"event":"upload","data":"!!","encoding":"base64","socket_id":"phx.1"}"#,
            ],
            Target::StoredFile => return vec![seed_file()],
            Target::Token => return access::tokens(),
            Target::Jwks => return access::jwks_documents(),
            Target::HookAnswer => return access::hook_answers(),
            Target::Config => return access::config_files(),
            Target::NodeMessage => return crate::node::corpus(),
            Target::Origin => return access::origins(),
            Target::Websocket => return crate::websocket::corpus(),
            Target::Wal => return crate::wal::corpus(),
            Target::Pack => return crate::pack::corpus(),
            Target::Protobuf => return protobuf_corpus(),
            Target::Centrifugo => &[
                r#"{"id":1,"connect":{"token":"t","name":"js","version":"5.8.0","flag":1,"subs":{}}}"#,
                r#"{"id":2,"subscribe":{"channel":"chat:lobby","recover":true,"offset":3,"epoch":"abc","delta":"fossil"}}"#,
                "{\"id\":3,\"publish\":{\"channel\":\"a\",\"data\":{\"x\":1}}}\n{}\n{\"id\":4,\"ping\":{}}",
                r#"{"id":5,"history":{"channel":"a","limit":-1,"since":{"offset":1,"epoch":"e"}}}"#,
                r#"{"id":6,"sub_refresh":{"channel":"a","token":"t"}}"#,
                r#"{"id":7,"rpc":{"method":"m","data":[1,2]}}"#,
                // Protobuf: connect {id 1}, an empty command (a pong), subscribe to "a".
                "\u{4}\u{8}\u{1}\"\u{0}\u{0}\u{7}\u{8}\u{2}*\u{3}\n\u{1}a",
            ],
            Target::Delta => &[
                "{\"a\":1,\"text\":\"the same text\"}\u{0}{\"a\":2,\"text\":\"the same text\"}",
                "\u{0}",
                "ééé 東京\u{0}éé 東京 é",
            ],
        };
        texts.iter().map(|t| t.as_bytes().to_vec()).collect()
    }

    pub fn decoder(self) -> Decoder {
        match self {
            // As a session reads a frame (split by the codec, each part decoded), and an
            // answerable error written back (its message holds what the client sent).
            Target::Command => Box::new(|input| {
                for decoded in json::decode_frame(input) {
                    if let Err(DecodeError::Invalid { id, code, message }) = decoded {
                        let _ = Json.reply(&Reply::error(id, code, &message));
                    }
                }
            }),
            Target::Cursor => Box::new(|input| {
                let _ = Cursor::parse(&String::from_utf8_lossy(input));
            }),
            Target::Query => Box::new(|input| {
                let _ =
                    OpenRequest::parse(Some(&String::from_utf8_lossy(input)), &HeaderMap::new());
            }),
            Target::LastEventId => Box::new(|input| {
                let Ok(value) = HeaderValue::from_bytes(input) else {
                    return; // hyper refuses such a header before Herald sees it
                };
                let mut headers = HeaderMap::new();
                headers.insert("last-event-id", value);
                let _ = OpenRequest::parse(Some("channel=chat:lobby"), &headers);
            }),
            Target::RedisMessage => Box::new(|input| {
                let _ = herald_broker_redis::decode_message(input);
            }),
            Target::RedisReply => {
                let channel = ChannelName::new("chat:lobby").expect("valid");
                Box::new(move |input| {
                    if let Ok(value) = redis::parse_redis_value(input) {
                        let _ = herald_broker_redis::decode_history_reply(&channel, value);
                    }
                })
            }
            Target::NatsStored => Box::new(herald_broker_nats::decode_stored),
            Target::StoredFile => stored_file(),
            Target::Token => access::token(),
            Target::Jwks => access::jwks(),
            Target::HookAnswer => access::hook_answer(),
            Target::Config => access::config(),
            Target::NodeMessage => crate::node::decoder(),
            Target::Origin => access::origin(),
            Target::Websocket => crate::websocket::decoder(),
            Target::Wal => crate::wal::decoder(),
            Target::Pack => crate::pack::decoder(),
            // A message as the front reads it; the same bytes as a stored payload, as the
            // hub turns one into a Pusher event.
            Target::Pusher => Box::new(|input| {
                use herald_protocol::pusher;
                if let Ok(pusher::ClientMessage::Subscribe(s)) = pusher::decode(input) {
                    // As the front names a channel inside Herald (user channels too), and
                    // back again for the frames it writes.
                    if let Ok(inside) = pusher::inside_name(&s.channel) {
                        assert_eq!(pusher::outside_name(&inside), s.channel);
                    }
                    let _ = pusher::Kind::of(&s.channel);
                    let _ = pusher::user_of_channel(&s.channel);
                }
                let _ = pusher::event("presence-room", input);
            }),
            // As the front's session reads a frame, and answers what it refuses.
            // Both of its codecs: JSON lines, and Protobuf's length-delimited messages.
            Target::Centrifugo => Box::new(|input| {
                use herald_protocol::centrifugo::{Centrifugo, CentrifugoProtobuf};
                for codec in [&Centrifugo as &dyn Codec, &CentrifugoProtobuf] {
                    let mut rest = input;
                    while !rest.is_empty() {
                        let (part, after) = codec.split(rest);
                        assert!(after.len() < rest.len(), "a split always moves on");
                        rest = after;
                        if let Some(Err(DecodeError::Invalid { id, code, message })) =
                            codec.decode(part)
                        {
                            let _ = codec.reply(&Reply::error(id, code, &message));
                        }
                    }
                }
                let publication = herald_protocol::Publication {
                    offset: 1,
                    record: Bytes::copy_from_slice(input),
                };
                let channel = ChannelName::new("chat").expect("a valid name");
                for delta in [None, Some(None), Some(Some(&b"1\n;"[..]))] {
                    let push = match delta {
                        None => herald_protocol::Push::Pub {
                            channel: &channel,
                            publication: &publication,
                        },
                        Some(delta) => herald_protocol::Push::PubDelta {
                            channel: &channel,
                            publication: &publication,
                            delta,
                        },
                    };
                    if std::str::from_utf8(input).is_ok() {
                        let _ = Centrifugo.push(&push);
                    }
                }
                let _ = json::presence_in(&Centrifugo, input);
            }),
            Target::Protobuf => Box::new(|input| {
                use herald_protocol::protobuf::{self, Protobuf};
                let mut rest = input;
                while !rest.is_empty() {
                    let (part, after) = Protobuf.split(rest);
                    assert!(after.len() < rest.len(), "a split always moves on");
                    rest = after;
                    match Protobuf.decode(part) {
                        Some(Ok(command)) => {
                            let again = protobuf::encode_command(&command);
                            let read = Protobuf.decode(&again).expect("a command");
                            assert_eq!(read, Ok(command), "written again, read the same");
                        }
                        Some(Err(DecodeError::Invalid { id, code, message })) => {
                            let _ = Protobuf.reply(&Reply::error(id, code, &message));
                        }
                        _ => {}
                    }
                    if let Some(json) = protobuf::to_json(part) {
                        let _ = String::from_utf8_lossy(&json);
                    }
                }
            }),
            // A delta of any two texts is made without a panic and gives the target back.
            Target::Delta => Box::new(|input| {
                let (source, target) = match input.iter().position(|b| *b == 0) {
                    Some(at) => (&input[..at], &input[at + 1..]),
                    None => (input, &b""[..]),
                };
                if let Some(delta) = herald_protocol::delta::fossil(source, target) {
                    let made = fossil_delta::apply(source, &delta).expect("a delta applies");
                    assert_eq!(made, target, "a delta gives its target back");
                }
            }),
            Target::Phoenix => Box::new(|input| {
                use herald_protocol::phoenix::{self, Vsn};
                for vsn in [Vsn::V1, Vsn::V2] {
                    if let Ok(m) = phoenix::decode(vsn, input) {
                        let _ = phoenix::reply(vsn, &m, false, &phoenix::reason(&m.payload, None));
                    }
                    let _ = phoenix::broadcast(vsn, "chat", input);
                }
                if let Some((m, data)) = phoenix::decode_binary_push(input) {
                    assert!(data.len() < input.len(), "the header is not the payload");
                    let _ = phoenix::reply(Vsn::V2, &m, false, phoenix::empty());
                    // Stored, then broadcast: the same bytes, whole, in a binary message
                    // when the names fit its sizes, and JSON text beside it.
                    let stored = phoenix::stored_binary(&m.event, data, None);
                    let b = phoenix::broadcast(Vsn::V2, &m.topic, &stored);
                    if phoenix::is_binary(&b.frame) {
                        assert!(
                            b.frame.ends_with(data),
                            "a binary broadcast carries the push's bytes"
                        );
                        assert!(b.text.is_some_and(|t| !phoenix::is_binary(&t)));
                    }
                }
            }),
        }
    }
}

/// Channels in the seed file.
const STORED_CHANNELS: [&str; 3] = ["chat:lobby", "chat:other", "news"];

use crate::decoder::runtime;

/// A small store with a few streams, closed cleanly: its files by name.
fn seed_store() -> Vec<(String, Vec<u8>)> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    runtime().block_on(async {
        let broker = DurableBroker::open(
            dir.path(),
            SyncPolicy::Always,
            Arc::new(herald_broker::conformance::Recorder::default()),
        )
        .expect("a fresh store opens");
        for (i, name) in STORED_CHANNELS.iter().enumerate() {
            let channel = ChannelName::new(name).expect("valid");
            for n in 0..=i * 3 {
                broker
                    .publish(
                        &channel,
                        Bytes::from(format!("{{\"n\":{n},\"text\":\"hello\"}}")),
                        StreamPolicy::default(),
                    )
                    .await
                    .expect("publishes");
            }
        }
        drop(broker);
    });
    // Dropping the broker joined its threads, which wrote the last checkpoint.
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
        .expect("the store's directory")
        .map(|e| {
            let e = e.expect("an entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("readable"))
        })
        .collect();
    files.sort();
    files
}

/// The seed store's newest checkpoint file, what the fuzzer mutates: a delta after an empty
/// base, holding every change the seed made (whole streams, publications appended), read
/// by the same decoder as a base.
fn is_checkpoint(name: &str) -> bool {
    name.strip_prefix("herald.index.")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn newest_checkpoint(seed: &[(String, Vec<u8>)]) -> String {
    (seed
        .iter()
        .map(|(name, _)| name)
        .filter(|n| is_checkpoint(n)))
    .max()
    .expect("a delta")
    .clone()
}

fn seed_file() -> Vec<u8> {
    let seed = seed_store();
    let name = newest_checkpoint(&seed);
    seed.into_iter()
        .find(|(n, _)| *n == name)
        .expect("a checkpoint")
        .1
}

/// Writes each input as the checkpoint of the seed store (its log as it was), opens it,
/// and reads every stream it knows: a checkpoint can point anywhere in the files.
fn stored_file() -> Decoder {
    let rt = runtime();
    let seed = seed_store();
    let checkpoint = newest_checkpoint(&seed);
    let channels: Vec<ChannelName> = STORED_CHANNELS
        .iter()
        .map(|c| ChannelName::new(c).expect("valid"))
        .collect();
    let open = move |input: &[u8]| {
        let Ok(dir) = tempfile::tempdir() else {
            return;
        };
        for (name, bytes) in &seed {
            let bytes = if *name == checkpoint {
                input
            } else {
                &bytes[..]
            };
            if std::fs::write(dir.path().join(name), bytes).is_err() {
                return;
            }
        }
        rt.block_on(async {
            let sink = Arc::new(herald_broker::conformance::Recorder::default());
            let Ok(broker) = DurableBroker::open(dir.path(), SyncPolicy::None, sink) else {
                return; // a clear error naming the file: what a damaged checkpoint should get
            };
            crate::decoder::read_every(&broker, &channels).await;
            drop(broker);
        });
    };
    Box::new(move |input| {
        open(input);
        // Under a valid checksum too (its last four bytes), so that the decoder and the
        // reads it leads to see arbitrary values: a checksum stops nearly all of them.
        if let Some(body) = input.len().checked_sub(4).map(|n| &input[..n]) {
            let mut fixed = body.to_vec();
            fixed.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
            open(&fixed);
        }
    })
}

/// Herald Protobuf frames of every command, and of two commands in one frame.
fn protobuf_corpus() -> Vec<Vec<u8>> {
    let commands: Vec<Vec<u8>> = Target::Command
        .corpus()
        .iter()
        .flat_map(|frame| json::decode_frame(frame))
        .filter_map(Result::ok)
        .map(|c| herald_protocol::protobuf::encode_command(&c))
        .collect();
    let mut corpus = commands.clone();
    corpus.push(commands.concat());
    corpus
}
