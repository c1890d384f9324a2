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

fn pusher_app(id: &str, key: &str) -> PusherApp {
    PusherApp {
        id: id.into(),
        key: key.into(),
        secret: "a-secret-of-sixteen-bytes".into(),
        namespace: None,
        client_events: false,
        client_events_per_second: 10,
        activity_timeout: Duration::from_secs(120),
        enabled: true,
        webhook_url: None,
        webhook_events: None,
        webhook_leave_delay: Duration::from_secs(3),
        watchlist_events: false,
        subscription_count: false,
        resume_window: Duration::from_secs(120),
    }
}

#[test]
fn a_pusher_apps_namespace_keeps_presence_and_grants_what_the_front_admits() {
    let mut c = Config::default();
    c.pusher.apps.push(pusher_app("1001", "k1"));
    // The operator's own entry applies over the front's rules.
    c.namespaces.insert(
        "1001".into(),
        NamespaceOverride {
            history_size: Some(5),
            ..Default::default()
        },
    );
    let s = c.validate().unwrap();
    let ns = s.namespace("1001");
    assert_eq!(ns.subscribe, Access::Granted);
    assert_eq!(ns.presence, Presence::On(Access::Granted));
    assert!(ns.join_leave);
    assert_eq!(ns.history_size, 5);
}

#[test]
fn pusher_apps_need_their_own_id_key_namespace_and_a_real_secret() {
    let mut c = Config::default();
    c.pusher.apps.push(pusher_app("1001", "k1"));
    c.pusher.apps[0].secret = "short".into();
    assert_eq!(c.validate().unwrap_err().key, "pusher.apps[0].secret");
    let mut c = Config::default();
    c.pusher.apps.push(pusher_app("1001", "k1"));
    c.pusher.apps.push(pusher_app("1002", "k1"));
    assert_eq!(c.validate().unwrap_err().key, "pusher.apps[1].key");
    let mut c = Config::default();
    c.pusher.apps.push(pusher_app("1001", "k1"));
    c.pusher.apps.push(pusher_app("1002", "k2"));
    c.pusher.apps[1].namespace = Some("1001".into());
    assert_eq!(c.validate().unwrap_err().key, "pusher.apps[1].namespace");
    let mut c = Config::default();
    c.pusher.apps.push(pusher_app("herald", "k1"));
    assert_eq!(c.validate().unwrap_err().key, "pusher.apps[0].namespace");
}

#[test]
fn a_pusher_webhook_is_an_http_address_and_names_only_events_it_will_get() {
    let with = |url: &str, events: Option<Vec<&str>>| {
        let mut c = Config::default();
        let mut app = pusher_app("1001", "k1");
        app.webhook_url = Some(url.into());
        app.webhook_events = events.map(|e| e.into_iter().map(String::from).collect());
        c.pusher.apps.push(app);
        c.validate().err().map(|e| (e.key, e.problem))
    };
    assert_eq!(
        with("https://app.example/pusher", Some(vec!["client_event"])),
        None
    );
    assert_eq!(
        with("ftp://x", None).unwrap().0,
        "pusher.apps[0].webhook_url"
    );
    assert_eq!(
        with("http://x", Some(vec!["member_added", "channel_vacated"])),
        None
    );
    let (key, problem) = with("http://x", Some(vec!["subscription_counts"])).unwrap();
    assert_eq!(key, "pusher.apps[0].webhook_events");
    assert!(problem.contains("is none of"), "{problem}");
}

/// The Centrifugo front's two paths are its own: apart from each other and from Herald's
/// routes, so neither hides a route of Herald's.
#[test]
fn the_centrifugo_fronts_paths_are_its_own() {
    let with = |path: &str, api_path: &str| {
        let mut c = Config::default();
        c.centrifugo.path = path.into();
        c.centrifugo.api_path = api_path.into();
        c.validate().map(drop).map_err(|e| e.key)
    };
    assert_eq!(
        with("/centrifugo/connection/websocket", "/centrifugo/api"),
        Ok(())
    );
    assert_eq!(with("/cf/ws", "/cf/ws"), Err("centrifugo.api_path".into()));
    assert_eq!(
        with("/cf/ws", "/api/centrifugo"),
        Err("centrifugo.api_path".into())
    );
    assert_eq!(
        with("/connection/cf", "/cf/api"),
        Err("centrifugo.path".into())
    );
}
