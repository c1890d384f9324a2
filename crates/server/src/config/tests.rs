use super::*;

#[test]
fn defaults_are_valid_and_chat_allows_publishing() {
    let s = Config::default().validate().unwrap();
    assert_eq!(s.namespace("chat").publish, Access::Anyone);
    assert_eq!(s.namespace("").publish, Access::Nobody);
    assert_eq!(s.namespace("unknown").publish, Access::Nobody);
    assert_eq!(s.namespace("unknown").subscribe, Access::Anyone);
    assert_eq!(
        s.namespace("chat").max_message_size,
        65536,
        "inherited from [channels]"
    );
}

/// Issue #18, item 2: a channel of any namespace is still replayable hours later.
#[test]
fn ordinary_channels_keep_a_thousand_publications_for_a_week() {
    let s = Config::default().validate().unwrap();
    for namespace in ["", "news", "chat"] {
        let rules = s.namespace(namespace);
        assert_eq!(rules.history_size, 1000, "{namespace:?}");
        assert_eq!(
            rules.history_ttl,
            Duration::from_secs(7 * 24 * 3600),
            "{namespace:?}"
        );
        assert!(rules.history_meta_ttl >= rules.history_ttl, "{namespace:?}");
    }
}

#[test]
fn errors_name_the_key() {
    let mut c = Config::default();
    c.client.idle_timeout = Duration::from_secs(1);
    assert_eq!(c.validate().unwrap_err().key, "client.idle_timeout");
    let mut c = Config::default();
    c.namespaces
        .insert("a:b".into(), NamespaceOverride::default());
    assert_eq!(c.validate().unwrap_err().key, "namespaces.a:b");
    let mut c = Config::default();
    c.allowed_origins = vec!["example.com".into()];
    assert_eq!(c.validate().unwrap_err().key, "allowed_origins");
    let mut c = Config::default();
    c.api_key = Some(" ".into());
    assert_eq!(c.validate().unwrap_err().key, "api_key");
    let mut c = Config::default();
    c.auth.hmac_secret = Some("short".into());
    assert_eq!(c.validate().unwrap_err().key, "auth.hmac_secret");
}

#[test]
fn a_token_key_closes_the_default_namespace_to_anonymous_readers() {
    let mut c = Config::default();
    c.auth.hmac_secret = Some("k".repeat(32));
    let s = c.validate().unwrap();
    assert_eq!(s.namespace("").subscribe, Access::Authenticated);
    assert_eq!(s.namespace("x").history, Access::Authenticated);
    assert_eq!(
        s.namespace("chat").subscribe,
        Access::Anyone,
        "the demo stays open"
    );
    assert_eq!(
        s.open_to_anyone(),
        vec![("chat", vec!["subscribe", "read history", "publish"])]
    );
    let open = Config::default().validate().unwrap();
    assert_eq!(
        open.open_to_anyone()[0],
        ("", vec!["subscribe", "read history"])
    );
}

#[test]
fn the_old_client_switches_are_refused_with_their_replacement() {
    let c: Config = toml::from_str("[namespaces.news]\nclient_publish = true\n").unwrap();
    let e = c.validate().unwrap_err();
    assert_eq!(e.key, "namespaces.news.client_publish");
    assert!(e.problem.contains("publish = \"anyone\""), "{e}");
}

#[test]
fn api_keys_may_be_scoped() {
    let c: Config = toml::from_str(
        "api_keys = [\"all-0123456789abcdef\", { key = \"pub-0123456789abcdef\", scope = \"publish\" }]\n",
    )
    .unwrap();
    let s = c.validate().unwrap();
    let keys: Vec<_> = s.api_keys().collect();
    assert_eq!(
        keys,
        vec![
            ("all-0123456789abcdef", ApiScope::All),
            ("pub-0123456789abcdef", ApiScope::Publish)
        ]
    );
    // Too short to resist guessing, scoped or not.
    let c: Config = toml::from_str("api_keys = [{ key = \"p\", scope = \"publish\" }]\n").unwrap();
    assert_eq!(c.validate().unwrap_err().key, "api_keys");
}
