use super::*;
use crate::Epoch;
use crate::Publication;
use crate::{results, Codec, Outcome, Push, Reply};

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
    let c =
        one(r#"{"id":1,"subscribe":{"channel":"a:b","since":{"offset":3,"epoch":"e"}}}"#).unwrap();
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
            data: Bytes::from(r#"{"k":[1,2]}"#),
            idempotency_key: None,
            conflation_key: None,
        }
    );
    let c = one(r#"{"id":3,"publish":{"channel":"x","data":1,"idempotency_key":"k-1","conflation_key":"BTC"}}"#).unwrap();
    let Method::Publish {
        idempotency_key,
        conflation_key,
        ..
    } = c.method
    else {
        panic!("{c:?}")
    };
    assert_eq!(idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(conflation_key.as_deref(), Some("BTC"));
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
    let c = one("{\"publish\":{\"channel\":\"x\",\"data\":{\"a\":\n[1,\r\n2],\"s\":\"l1\\nl2\"}}}")
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
    let c = one(
        "{\"publish\":{\"channel\":\"x\",\"data\":{\"b\":1,\r\n\"a\":12345678901234567890123}}}",
    )
    .unwrap();
    let Method::Publish { data, .. } = c.method else {
        panic!()
    };
    assert_eq!(&data[..], b"{\"b\":1,\"a\":12345678901234567890123}");
}

#[test]
fn frames_hold_several_commands() {
    let frame = b"{\"id\":1,\"ping\":{}}\n\n{\"id\":2,\"ping\":{}}\n";
    let ids: Vec<_> = decode_frame(frame)
        .into_iter()
        .map(|c| c.unwrap().id)
        .collect();
    assert_eq!(ids, vec![Some(1), Some(2)]);
}

#[test]
fn pub_encoding_is_valid_json_with_raw_data() {
    let ch = ChannelName::new("news").unwrap();
    let p = Publication {
        offset: 42,
        record: Bytes::from(r#"{"t":"</script>"}"#),
    };
    let v: serde_json::Value = serde_json::from_slice(&Json.push(&Push::Pub {
        channel: &ch,
        publication: &p,
    }))
    .unwrap();
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
    let v: serde_json::Value = serde_json::from_slice(&Json.push(&Push::Pub {
        channel: &ch,
        publication: &p,
    }))
    .unwrap();
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

/// A record's conflation key comes before its sender; the payload, the sender and pushes
/// read as without it, and the key is checked when read back from a shared store.
#[test]
fn records_carry_a_conflation_key_before_their_sender() {
    let ch = ChannelName::new("prices").unwrap();
    let from = br#"{"user":"42"}"#;
    for sender in [None, Some(&from[..])] {
        let p = Publication {
            offset: 3,
            record: Publication::keyed_record(Bytes::from("{\"p\":1}"), sender, Some("BTC")),
        };
        assert_eq!(p.conflation_key(), Some(&b"BTC"[..]));
        assert_eq!((p.data(), p.from()), (&b"{\"p\":1}"[..], sender));
        let v: serde_json::Value = serde_json::from_slice(&Json.push(&Push::Pub {
            channel: &ch,
            publication: &p,
        }))
        .unwrap();
        assert_eq!(v["pub"]["data"], serde_json::json!({"p": 1}));
        assert_eq!(stored_record(&p.record).unwrap(), p.record);
    }
    let unkeyed = Publication::keyed_record(Bytes::from("1"), None, None);
    assert_eq!(&unkeyed[..], b"1");
    assert!(stored_record(b"\x02BT\x01C\x00[1]").is_err());
    assert!(stored_record(b"\x02\x00[1]").is_err());
    assert!(stored_record(b"\x02BTC\x00[1").is_err());
    let v: serde_json::Value = serde_json::from_slice(&Json.push(&Push::Conflated {
        channel: &ch,
        offset: 9,
    }))
    .unwrap();
    assert_eq!(
        v,
        serde_json::json!({"conflated": {"channel": "prices", "offset": 9}})
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
        delta: None,
    };
    let reply = Json.reply(&Reply::Done {
        id: 3,
        outcome: Outcome::Subscribe(r),
    });
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(v["id"], 3);
    assert_eq!(v["subscribe"]["publications"][0]["data"][0], 1);
    assert_eq!(v["subscribe"]["recovered"], true);
    let e: serde_json::Value = serde_json::from_slice(&Json.reply(&Reply::error(
        Some(4),
        ErrorCode::PermissionDenied,
        "no",
    )))
    .unwrap();
    assert_eq!(e["error"]["code"], 103);
    let d: serde_json::Value = serde_json::from_slice(&Json.push(&Push::Disconnect {
        code: crate::DisconnectCode::Slow.code(),
        reason: "slow",
    }))
    .unwrap();
    assert_eq!(d["disconnect"]["reconnect"], true);
}

#[test]
fn poll_answers_write_strings_as_serde_does() {
    for text in [
        "plain;e1;7",
        "q\"uote",
        "back\\slash",
        "tab\tnew\nline",
        "\u{7f}é✓",
        "",
    ] {
        let answer = encode_poll_answer(text, text, Some(text), b"");
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["cursor"], text);
        assert_eq!(v["session_key"], text);
        let expected = format!(
            r#"{{"cursor":{0},"client":{0},"session_key":{0},"messages":[]}}"#,
            serde_json::to_string(text).unwrap()
        );
        assert_eq!(String::from_utf8(answer).unwrap(), expected);
    }
}
