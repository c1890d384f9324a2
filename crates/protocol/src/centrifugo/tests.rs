use super::*;
use crate::{codec::Codec, results, Outcome, Publication, Push, Reply};

fn decode(line: &str) -> Option<Result<Command, DecodeError>> {
    Centrifugo.decode(line.as_bytes())
}

fn text(bytes: Vec<u8>) -> serde_json::Value {
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn commands_read_as_centrifuge_js_sends_them_ignoring_fields_it_does_not_know() {
    let c = decode(
        r#"{"id":1,"connect":{"token":"t","name":"js","version":"5.8.0","flag":3,"subs":{}}}"#,
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.id, Some(1));
    let Method::Connect(req) = c.method else {
        panic!("{c:?}")
    };
    assert_eq!(
        (req.token.as_deref(), req.name.as_deref()),
        (Some("t"), Some("js"))
    );

    let c = decode(r#"{"id":2,"subscribe":{"channel":"news","recover":true,"offset":7,"epoch":"e1","delta":"fossil","flag":1,"positioned":true}}"#)
        .unwrap()
        .unwrap();
    let Method::Subscribe(req) = c.method else {
        panic!("{c:?}")
    };
    assert_eq!(
        req.since,
        Some(Since {
            offset: 7,
            epoch: Some(Epoch::new("e1"))
        })
    );
    assert!(req.delta);

    let c = decode(r#"{"id":3,"subscribe":{"channel":"news"}}"#)
        .unwrap()
        .unwrap();
    let Method::Subscribe(req) = c.method else {
        panic!("{c:?}")
    };
    assert_eq!((req.since, req.delta), (None, false));

    let c = decode(r#"{"id":4,"publish":{"channel":"news","data":{"a":[1,2]}}}"#)
        .unwrap()
        .unwrap();
    let Method::Publish { data, .. } = c.method else {
        panic!("{c:?}")
    };
    assert_eq!(&data[..], br#"{"a":[1,2]}"#);

    let c = decode(
        r#"{"id":5,"history":{"channel":"news","limit":-1,"since":{"offset":2,"epoch":"e"}}}"#,
    )
    .unwrap()
    .unwrap();
    let Method::History(h) = c.method else {
        panic!("{c:?}")
    };
    assert_eq!(h.limit, Some(u32::MAX));
    assert_eq!(h.since.unwrap().offset, 2);

    let c = decode(r#"{"id":6,"sub_refresh":{"channel":"news","token":"t2"}}"#)
        .unwrap()
        .unwrap();
    let Method::Refresh(r) = c.method else {
        panic!("{c:?}")
    };
    assert_eq!(r.channel.unwrap().as_str(), "news");
}

#[test]
fn an_empty_object_is_a_pong_and_nothing_else_is_trusted_that_is_not_json() {
    assert!(decode("{}").is_none());
    assert!(decode("  ").is_none());
    assert!(matches!(
        decode("{nope"),
        Some(Err(DecodeError::Malformed(_)))
    ));
    assert!(matches!(
        decode(r#"{"id":9}"#),
        Some(Err(DecodeError::Invalid { id: Some(9), .. }))
    ));
    assert!(matches!(
        decode(r#"{"id":9,"subscribe":{"channel":"x","delta":"xdelta"}}"#),
        Some(Err(DecodeError::Invalid { id: Some(9), .. }))
    ));
    assert!(matches!(
        decode(r#"{"id":9,"subscribe":{"channel":"bad name"}}"#),
        Some(Err(DecodeError::Invalid {
            code: crate::ErrorCode::InvalidChannel,
            ..
        }))
    ));
}

#[test]
fn replies_and_pushes_are_in_centrifugos_words() {
    let epoch = Epoch::new("e1");
    let publications = [Publication {
        offset: 3,
        record: bytes::Bytes::from_static(br#"{"x":1}"#),
    }];
    let reply = Centrifugo.reply(&Reply::Done {
        id: 2,
        outcome: Outcome::Subscribe(results::Stream {
            epoch: &epoch,
            offset: 3,
            recovered: Some(true),
            publications: &publications,
            data: None,
            delta: None,
        }),
    });
    assert_eq!(
        text(reply),
        serde_json::json!({"id":2,"subscribe":{"recoverable":true,"positioned":true,"recovered":true,
            "was_recovering":true,"epoch":"e1","offset":3,"publications":[{"data":{"x":1},"offset":3}]}})
    );
    let refused = Centrifugo.reply(&Reply::error(Some(4), 103u16, "permission denied"));
    assert_eq!(
        text(refused),
        serde_json::json!({"id":4,"error":{"code":103,"message":"permission denied"}})
    );
    let channel = ChannelName::new("news").unwrap();
    let push = Centrifugo.push(&Push::Pub {
        channel: &channel,
        publication: &publications[0],
    });
    assert_eq!(
        text(push),
        serde_json::json!({"push":{"channel":"news","pub":{"data":{"x":1},"offset":3}}})
    );
    let delta = Centrifugo.push(&Push::PubDelta {
        channel: &channel,
        publication: &publications[0],
        delta: Some(b"7\n3:abc1;"),
    });
    assert_eq!(
        text(delta),
        serde_json::json!({"push":{"channel":"news","pub":{"data":"7\n3:abc1;","delta":true,"offset":3}}})
    );
    assert_eq!(Centrifugo.push(&Push::Ping), b"{}");
    assert_eq!(
        close_code(3504),
        (3005, true),
        "an expired token: get one and reconnect"
    );
    assert_eq!(close_code(3500), (3500, false));
    assert_eq!(close_code(4100), (4100, true));
}

/// The connect reply asks for Centrifugo's ping every `ping` seconds and a pong to each:
/// its clients then reconnect when one is late, and the server hears them.
#[test]
fn the_connect_reply_asks_for_pings_and_pongs_in_both_codecs() {
    let connect = results::Connect {
        client: "c1",
        version: "1.0",
        ping: 25,
        user: None,
        expiry: None,
    };
    let reply = Reply::Done {
        id: 1,
        outcome: Outcome::Connect(connect),
    };
    let json = text(Centrifugo.reply(&reply));
    assert_eq!(
        (&json["connect"]["ping"], &json["connect"]["pong"]),
        (&serde_json::json!(25), &serde_json::json!(true))
    );
    use prost::Message;
    let bytes = super::CentrifugoProtobuf.reply(&reply);
    let decoded = proto::Reply::decode_length_delimited(&bytes[..]).unwrap();
    let result = decoded.connect.unwrap();
    assert_eq!((result.ping, result.pong), (25, true));
}

mod protobuf {
    use prost::Message;

    use super::super::{proto, CentrifugoProtobuf};
    use crate::{
        codec::Codec, results, ChannelName, Epoch, Method, Outcome, Publication, Push, Reply,
    };

    fn frame(commands: &[proto::Command]) -> Vec<u8> {
        commands
            .iter()
            .flat_map(|c| c.encode_length_delimited_to_vec())
            .collect()
    }

    #[test]
    fn length_delimited_commands_read_as_herald_commands_several_to_a_frame() {
        let frame = frame(&[
            proto::Command {
                id: 1,
                connect: Some(proto::ConnectRequest {
                    token: "t".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            // The client's pong: an empty command.
            proto::Command::default(),
            proto::Command {
                id: 2,
                subscribe: Some(proto::SubscribeRequest {
                    channel: "news".into(),
                    recover: true,
                    offset: 4,
                    epoch: "e".into(),
                    delta: "fossil".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            proto::Command {
                id: 3,
                publish: Some(proto::PublishRequest {
                    channel: "news".into(),
                    data: b"\x00not json".to_vec(),
                }),
                ..Default::default()
            },
        ]);
        let mut rest = &frame[..];
        let mut read = Vec::new();
        while !rest.is_empty() {
            let (part, after) = CentrifugoProtobuf.split(rest);
            rest = after;
            read.push(CentrifugoProtobuf.decode(part));
        }
        assert_eq!(read.len(), 4);
        assert!(
            matches!(&read[0], Some(Ok(c)) if matches!(&c.method, Method::Connect(r) if r.token.as_deref() == Some("t")))
        );
        assert!(read[1].is_none(), "an empty command is a pong");
        let Some(Ok(c)) = &read[2] else {
            panic!("{:?}", read[2])
        };
        let Method::Subscribe(s) = &c.method else {
            panic!("{c:?}")
        };
        assert_eq!((s.since.as_ref().unwrap().offset, s.delta), (4, true));
        assert!(
            matches!(
                read[3],
                Some(Err(crate::codec::DecodeError::Invalid { id: Some(3), .. }))
            ),
            "data that is not JSON is refused: {:?}",
            read[3]
        );
        // Cut short: refused as malformed, never a panic.
        let (part, _) = CentrifugoProtobuf.split(&frame[..frame.len() - 1]);
        let _ = CentrifugoProtobuf.decode(part);
        let (part, rest) = CentrifugoProtobuf.split(&[0x85]);
        assert!(rest.is_empty());
        assert!(matches!(CentrifugoProtobuf.decode(part), Some(Err(_))));
    }

    #[test]
    fn replies_and_pushes_read_back_as_centrifugos_messages() {
        let epoch = Epoch::new("e1");
        let publications = [Publication {
            offset: 3,
            record: bytes::Bytes::from_static(br#"{"x":1}"#),
        }];
        let bytes = CentrifugoProtobuf.reply(&Reply::Done {
            id: 2,
            outcome: Outcome::Subscribe(results::Stream {
                epoch: &epoch,
                offset: 3,
                recovered: Some(true),
                publications: &publications,
                data: None,
                delta: Some("fossil"),
            }),
        });
        let reply = proto::Reply::decode_length_delimited(&bytes[..]).unwrap();
        let s = reply.subscribe.unwrap();
        assert_eq!(
            (reply.id, s.recovered, s.was_recovering, s.delta),
            (2, true, true, true)
        );
        assert_eq!(s.publications[0].data, br#"{"x":1}"#);
        let channel = ChannelName::new("news").unwrap();
        let mut pushes = CentrifugoProtobuf.push(&Push::PubDelta {
            channel: &channel,
            publication: &publications[0],
            delta: Some(b"7\n3:abc1;"),
        });
        CentrifugoProtobuf.join(&mut pushes, &CentrifugoProtobuf.push(&Push::Ping));
        let mut rest = &pushes[..];
        let first = proto::Reply::decode_length_delimited(&mut rest).unwrap();
        let p = first.push.unwrap();
        assert_eq!(p.channel, "news");
        let publication = p.r#pub.unwrap();
        assert_eq!(
            (publication.delta, &publication.data[..]),
            (true, &b"7\n3:abc1;"[..])
        );
        assert_eq!(
            proto::Reply::decode_length_delimited(&mut rest).unwrap(),
            proto::Reply::default()
        );
        assert!(rest.is_empty());
    }
}
