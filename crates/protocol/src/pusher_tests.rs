//! The Pusher protocol's messages, decoded and encoded.

use super::*;

#[test]
fn decodes_what_pusher_js_sends() {
    let m = decode(br#"{"event":"pusher:subscribe","data":{"auth":"k:s","channel":"private-a"}}"#)
        .unwrap();
    assert_eq!(
        m,
        ClientMessage::Subscribe(Subscribe {
            channel: "private-a".into(),
            auth: Some("k:s".into()),
            channel_data: None
        })
    );
    // Some clients send the data as a JSON string.
    let m = decode(br#"{"event":"pusher:unsubscribe","data":"{\"channel\":\"a\"}"}"#).unwrap();
    assert_eq!(
        m,
        ClientMessage::Unsubscribe {
            channel: "a".into()
        }
    );
    let m = decode(br#"{"event":"client-typing","channel":"private-a","data":{"x":1}}"#).unwrap();
    assert_eq!(
        m,
        ClientMessage::ClientEvent {
            event: "client-typing".into(),
            channel: "private-a".into(),
            data: r#"{"x":1}"#.into()
        }
    );
    assert_eq!(
        decode(br#"{"event":"pusher:ping","data":{}}"#).unwrap(),
        ClientMessage::Ping
    );
    for bad in [
        &b"[]"[..],
        b"{",
        br#"{"event":"pusher:subscribe"}"#,
        br#"{"event":"nope"}"#,
        br#"{"event":"client-x","data":1}"#,
    ] {
        assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn an_event_round_trips_through_its_stored_payload() {
    let data: &RawValue = serde_json::from_str(r#""{\"id\":1}""#).unwrap();
    let payload = stored("order", data, Some("7"), Some("1.2"));
    let e = event("private-a", &payload);
    assert_eq!(
        String::from_utf8(e.frame).unwrap(),
        r#"{"event":"order","channel":"private-a","data":"{\"id\":1}","user_id":"7"}"#
    );
    assert_eq!(e.except.as_deref(), Some("1.2"));
    // Anything else arrives as `message`, whole.
    let e = event("a", br#"{"text":"hi"}"#);
    assert_eq!(
        String::from_utf8(e.frame).unwrap(),
        r#"{"event":"message","channel":"a","data":{"text":"hi"}}"#
    );
}

#[test]
fn channel_names_follow_pushers_alphabet() {
    assert!(check_channel("presence-room.1=a@b,c_d-e").is_ok());
    assert!(check_channel("a;b").is_err());
    assert!(check_channel("a:b").is_err());
    assert!(check_channel("").is_err());
    assert!(check_channel(&"a".repeat(165)).is_err());
    assert_eq!(Kind::of("private-encrypted-x"), Kind::Encrypted);
    assert_eq!(Kind::of("presence-x"), Kind::Presence);
    assert_eq!(Kind::of("x"), Kind::Public);
    assert_eq!(Kind::of("#server-to-user-ann"), Kind::User);
}

#[test]
fn a_user_channel_has_a_name_inside_that_no_pusher_client_can_give() {
    let inside = inside_name("#server-to-user-ann.1").unwrap();
    assert_eq!(inside, "!server-to-user-ann.1");
    assert!(check_channel(&inside).is_err());
    assert_eq!(outside_name(&inside), "#server-to-user-ann.1");
    assert_eq!(inside_name("news").unwrap(), "news");
    assert_eq!(outside_name("news"), "news");
    assert_eq!(user_of_channel("#server-to-user-ann"), Some("ann"));
    for bad in [
        "#server-to-user-",
        "#server-to-user-a b",
        "#other",
        "!server-to-user-ann",
    ] {
        assert!(inside_name(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_users_online_channel_is_hidden_and_no_pusher_client_can_name_it() {
    let online = format!("{ONLINE_CHANNEL_INSIDE}ann");
    assert!(hidden(&online));
    assert!(inside_name(&online).is_err());
    assert!(!hidden("!server-to-user-ann"));
    assert!(!hidden("presence-room"));
}

#[test]
fn watchlist_events_name_who_came_online_and_who_went_offline() {
    let frame: serde_json::Value =
        serde_json::from_slice(&watchlist_events(&["a", "b"], &["c"])).unwrap();
    assert_eq!(frame["event"], "pusher_internal:watchlist_events");
    let data: serde_json::Value = serde_json::from_str(frame["data"].as_str().unwrap()).unwrap();
    assert_eq!(
        data,
        serde_json::json!({"events": [
            {"name": "online", "user_ids": ["a", "b"]},
            {"name": "offline", "user_ids": ["c"]},
        ]})
    );
    let only_offline: serde_json::Value =
        serde_json::from_slice(&watchlist_events(&[], &["c"])).unwrap();
    assert!(!only_offline["data"].as_str().unwrap().contains("online\""));
}

#[test]
fn a_subscription_count_is_told_as_pusher_js_reads_it() {
    let frame: serde_json::Value =
        serde_json::from_slice(&subscription_count("orders", 3)).unwrap();
    assert_eq!(frame["event"], "pusher_internal:subscription_count");
    assert_eq!(frame["channel"], "orders");
    assert_eq!(frame["data"], r#"{"subscription_count":3}"#);
    assert!(hidden(&format!("{SUBSCRIPTIONS_CHANNEL_INSIDE}orders")));
}

#[test]
fn a_page_is_given_its_proof_and_sends_it_back() {
    let page: serde_json::Value = serde_json::from_slice(&page("0a1b")).unwrap();
    assert_eq!(page["event"], "herald:page");
    assert_eq!(page["data"], r#"{"proof":"0a1b"}"#);
    for sent in [
        r#"{"event":"herald:resume","data":{"proof":"0a1b"}}"#,
        r#"{"event":"herald:resume","data":"{\"proof\":\"0a1b\"}"}"#,
    ] {
        match decode(sent.as_bytes()) {
            Ok(ClientMessage::Resume { proof }) => assert_eq!(proof, "0a1b"),
            other => panic!("{sent}: {other:?}"),
        }
    }
    assert!(decode(br#"{"event":"herald:resume","data":{}}"#).is_err());
}
