use bytes::Bytes;
use prost::Message;

use super::{encode_command, to_json, wire, Protobuf};
use crate::{
    codec::{Codec, DecodeError, Push},
    command::{RpcRequest, SubscribeRequest},
    ChannelName, Command, Epoch, ErrorCode, Method, Publication, Since,
};

fn channel(name: &str) -> ChannelName {
    ChannelName::new(name).unwrap()
}

fn decode_all(frame: &[u8]) -> Vec<Result<Command, DecodeError>> {
    let mut out = Vec::new();
    let mut rest = frame;
    while !rest.is_empty() {
        let (part, after) = Protobuf.split(rest);
        rest = after;
        out.extend(Protobuf.decode(part));
    }
    out
}

#[test]
fn commands_read_back_as_written_several_to_a_frame() {
    let commands = [
        Command {
            id: Some(1),
            method: Method::Subscribe(SubscribeRequest {
                channel: channel("chat:lobby"),
                since: Some(Since {
                    offset: 4,
                    epoch: Some(Epoch::new("x1")),
                }),
                token: None,
                delta: true,
                conflate: true,
            }),
        },
        Command {
            id: Some(0),
            method: Method::Publish {
                channel: channel("chat:lobby"),
                data: Bytes::from_static(br#"{"text":"hi"}"#),
                idempotency_key: Some("k1".into()),
                conflation_key: Some("BTC".into()),
            },
        },
        Command {
            id: None,
            method: Method::Rpc(RpcRequest {
                method: "sum".into(),
                data: Bytes::from_static(b"[1,2]"),
            }),
        },
        Command {
            id: Some(3),
            method: Method::Ping,
        },
    ];
    let frame: Vec<u8> = commands.iter().flat_map(encode_command).collect();
    let read: Vec<Command> = decode_all(&frame).into_iter().map(Result::unwrap).collect();
    assert_eq!(read, commands);
}

#[test]
fn data_must_be_json_text_and_is_kept_on_one_line() {
    let publish = |data: &[u8]| wire::Command {
        id: Some(7),
        method: Some(wire::Method::Publish(wire::Publish {
            channel: "chat:lobby".into(),
            data: data.to_vec(),
            idempotency_key: None,
            conflation_key: None,
        })),
    };
    let refused = Protobuf
        .decode(&publish(b"\x00\x01binary").encode_length_delimited_to_vec())
        .unwrap()
        .unwrap_err();
    assert!(matches!(
        refused,
        DecodeError::Invalid {
            id: Some(7),
            code: ErrorCode::BadRequest,
            ..
        }
    ));
    let empty = Protobuf
        .decode(&publish(b"").encode_length_delimited_to_vec())
        .unwrap();
    assert!(empty.is_err(), "a publish without data is refused");
    let read = Protobuf
        .decode(&publish(b"{\"a\":\n1}").encode_length_delimited_to_vec())
        .unwrap()
        .unwrap();
    let Method::Publish { data, .. } = read.method else {
        panic!("not a publish")
    };
    assert_eq!(&data[..], br#"{"a":1}"#);
}

#[test]
fn what_is_no_command_is_malformed_never_a_panic() {
    for bad in [
        &b"\x05\x01\x02"[..],                                 // cut short
        &b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..], // a prefix past u64
        &b"\x02\xff\xff"[..],                                 // not a message
    ] {
        for read in decode_all(bad) {
            assert!(matches!(read, Err(DecodeError::Malformed(_))), "{bad:?}");
        }
    }
    let no_method = wire::Command {
        id: Some(2),
        method: None,
    };
    let read = Protobuf
        .decode(&no_method.encode_length_delimited_to_vec())
        .unwrap();
    assert!(matches!(
        read,
        Err(DecodeError::Invalid { id: Some(2), .. })
    ));
}

#[test]
fn the_hand_written_publication_is_what_prost_writes() {
    let publication = Publication {
        offset: 300,
        record: Publication::record(
            Bytes::from_static(br#"{"text":"hi"}"#),
            Some(br#"{"user":"42"}"#),
        ),
    };
    let lobby = channel("chat:lobby");
    let made = Protobuf.push(&Push::Pub {
        channel: &lobby,
        publication: &publication,
    });
    let by_prost = wire::ServerMessage {
        id: None,
        body: Some(wire::Body::Pub(wire::Pub {
            channel: "chat:lobby".into(),
            offset: 300,
            data: Some(br#"{"text":"hi"}"#.to_vec()),
            from: Some(br#"{"user":"42"}"#.to_vec()),
            full: None,
            delta: None,
        })),
    };
    assert_eq!(made, by_prost.encode_length_delimited_to_vec());
    assert_eq!(
        to_json(&made).unwrap(),
        br#"{"pub":{"channel":"chat:lobby","offset":300,"data":{"text":"hi"},"from":{"user":"42"}}}"#
    );
}
