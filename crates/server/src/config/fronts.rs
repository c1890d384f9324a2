//! The protocol fronts' configuration: Pusher apps (`[[pusher.apps]]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, Access, ConfigError, NamespaceOverride, Presence};

/// `[pusher]`: the Pusher protocol front.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PusherConfig {
    /// The apps clients and backends may use, each with its own key and secret. Default
    /// none: the front answers nothing.
    pub apps: Vec<PusherApp>,
}

/// One Pusher app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PusherApp {
    /// The app id (`/apps/{id}/…` in the HTTP API).
    pub id: String,
    /// The app key: public, in the client's WebSocket address (`/app/{key}`).
    pub key: String,
    /// The secret that signs subscriptions and API calls; at least 16 bytes.
    pub secret: String,
    /// The namespace of the app's channels in Herald: its channel `NAME` is Herald's
    /// `NAMESPACE:NAME`. Default: the app id.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Whether clients may send events (`client-…`) on private and presence channels.
    /// Default false.
    #[serde(default)]
    pub client_events: bool,
    /// Client events per connection per second (Pusher's own limit: 10); more get error
    /// 4301 and are not sent. Default 10.
    #[serde(default = "default_client_event_rate")]
    pub client_events_per_second: u32,
    /// How long a quiet client waits before it pings (told in `connection_established`).
    /// Default `120s`, Pusher's.
    #[serde(default = "default_activity_timeout", with = "humantime_serde")]
    pub activity_timeout: Duration,
    /// Whether the app is served; a disabled app's clients are refused with 4003.
    /// Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Where the app's webhooks are posted (`http://` or `https://`). Default none.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Which events are posted there, of [`WEBHOOK_EVENTS`]. Default all of them.
    #[serde(default)]
    pub webhook_events: Option<Vec<String>>,
    /// How long `channel_vacated` waits: none is posted when the channel's first
    /// subscriber is back by then, as when a page reloads. Default `3s`. (`member_removed`
    /// keeps presence's own clock, `presence.grace`, with the channel's clients and the
    /// HTTP API.)
    #[serde(default = "default_leave_delay", with = "humantime_serde")]
    pub webhook_leave_delay: Duration,
    /// How long a page that opted in (`wsPath: "/resume/ID"`) may be away and still be
    /// sent what it missed when it subscribes again; `0s` turns resuming off. Default `2m`.
    #[serde(default = "default_resume_window", with = "humantime_serde")]
    pub resume_window: Duration,
    /// Whether signed-in users are told when the users of their signin's `watchlist` come
    /// online and go offline (`pusher.user.watchlist`), as Pusher's app setting "Watchlist
    /// events". Each signed-in connection then holds its user's online membership, and
    /// follows one channel per watched user. Default false, as Pusher's.
    #[serde(default)]
    pub watchlist_events: bool,
    /// Whether the subscribers of its channels (not presence ones, which count members)
    /// are told how many they are (`pusher:subscription_count`), and the webhook
    /// `subscription_count` is posted, as Pusher's app setting "Subscription counting".
    /// Each subscription then holds a membership of a count of the server's own. Default
    /// false, as Pusher's.
    #[serde(default)]
    pub subscription_count: bool,
}

/// The webhook events this server posts.
pub const WEBHOOK_EVENTS: [&str; 7] = [
    "channel_occupied",
    "channel_vacated",
    "member_added",
    "member_removed",
    "client_event",
    "cache_miss",
    "subscription_count",
];

fn default_resume_window() -> Duration {
    Duration::from_secs(120)
}

fn default_leave_delay() -> Duration {
    Duration::from_secs(3)
}

fn default_client_event_rate() -> u32 {
    10
}

fn default_activity_timeout() -> Duration {
    Duration::from_secs(120)
}

fn yes() -> bool {
    true
}

/// `[phoenix]`: the Phoenix Channels front (`/socket/websocket`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PhoenixConfig {
    /// Whether `/socket/websocket` answers. Its clients are Herald's clients: topics are
    /// channels, under the same namespace rules, tokens and hooks. Default true.
    pub enabled: bool,
    /// The event each client event is published as, when it is not its own name: the seed
    /// study's chat sends `speak` and hears `publish` (`{ speak = "publish" }`). Default
    /// none.
    pub events: std::collections::BTreeMap<String, String>,
    /// Namespaces whose client events do not reach their sender, as Phoenix's
    /// `broadcast_from!` (`""`: the default namespace, of topics without a `:`). Elsewhere
    /// they reach every member, the sender included, as `broadcast!`. Default none.
    pub broadcast_from: Vec<String>,
    /// Events a client pushes to be answered, not broadcast: each goes to the rpc hook
    /// (`hooks.rpc_url`, with the topic as `channel`) and its `data` is the push's reply,
    /// as a Phoenix channel's `handle_in` answers `{:reply, {:ok, data}, socket}`.
    /// Default none.
    pub rpc_events: Vec<String>,
}

impl Default for PhoenixConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            events: Default::default(),
            broadcast_from: Vec::new(),
            rpc_events: Vec::new(),
        }
    }
}

impl PhoenixConfig {
    /// Whether a client event on `channel` leaves its sender out.
    pub fn broadcast_from(&self, channel: &herald_protocol::ChannelName) -> bool {
        let namespace = channel.namespace();
        self.broadcast_from.iter().any(|n| n == namespace)
    }
}

/// `[centrifugo]`: the Centrifugo client protocol front.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CentrifugoConfig {
    /// Whether its WebSocket answers. Its clients are Herald's clients: channels under the
    /// same namespace rules, tokens and hooks. Default true.
    pub enabled: bool,
    /// Where Centrifugo's clients connect (Herald's own protocol has
    /// `/connection/websocket`). Default `/centrifugo/connection/websocket`.
    pub path: String,
    /// Where Centrifugo's server API answers (`POST {api_path}/publish`, …, with
    /// `X-API-Key`), for backends written against Centrifugo's (Herald's own `/api/` takes
    /// other bodies). Default `/centrifugo/api`.
    pub api_path: String,
}

impl CentrifugoConfig {
    /// Paths of its own: under `/centrifugo/` or outside every prefix Herald serves.
    pub(crate) fn check(&self) -> Result<(), super::ConfigError> {
        if self.path == self.api_path {
            return Err(super::bad(
                "centrifugo.api_path",
                "must differ from centrifugo.path",
            ));
        }
        Self::check_path("centrifugo.path", &self.path)?;
        Self::check_path("centrifugo.api_path", &self.api_path)
    }

    fn check_path(name: &str, path: &str) -> Result<(), super::ConfigError> {
        let ours = [
            "/connection/",
            "/api/",
            "/apps/",
            "/app/",
            "/socket/",
            "/resume/",
            "/dashboard",
            "/metrics",
            "/health",
            "/ready",
            "/chat",
            "/herald.js",
            "/favicon.ico",
        ];
        let fine = path.len() > 1
            && path.starts_with('/')
            && !path.ends_with('/')
            && path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b))
            && !ours.iter().any(|p| path.starts_with(p))
            && !path.contains("//");
        if fine {
            Ok(())
        } else {
            Err(super::bad(
                name,
                "must be a path of its own such as /centrifugo/connection/websocket (letters, digits, - _ . /), outside Herald's routes",
            ))
        }
    }
}

impl Default for CentrifugoConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: "/centrifugo/connection/websocket".into(),
            api_path: "/centrifugo/api".into(),
        }
    }
}

/// Shortest app secret accepted.
pub const MIN_PUSHER_SECRET: usize = 16;

impl PusherApp {
    /// Whether webhook event `name` is posted (the app has a webhook, and wants it).
    pub fn posts(&self, name: &str) -> bool {
        (name != "subscription_count" || self.subscription_count)
            && self.webhook_url.is_some()
            && self
                .webhook_events
                .as_ref()
                .is_none_or(|wanted| wanted.iter().any(|w| w == name))
    }

    /// The namespace of its channels.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(&self.id)
    }

    /// The rules its namespace starts from, before the configuration's own
    /// `[namespaces.NS]`: the front grants each channel it admits (public ones to anyone,
    /// private and presence ones to a valid signature), so `granted` lets exactly those
    /// in, and Herald's own clients need a token that grants the channel. Presence is
    /// kept (for `presence-` channels) and its changes pushed.
    pub fn namespace_rules() -> NamespaceOverride {
        NamespaceOverride {
            subscribe: Some(Access::Granted),
            history: Some(Access::Granted),
            publish: Some(Access::Granted),
            presence: Some(Presence::On(Access::Granted)),
            join_leave: Some(true),
            ..Default::default()
        }
    }
}

impl PusherConfig {
    /// Checks the apps: each complete, and no two sharing an id, a key or a namespace.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, app) in self.apps.iter().enumerate() {
            let key = |field: &str| format!("pusher.apps[{i}].{field}");
            let ids_ok = |s: &str| {
                !s.is_empty()
                    && s.len() <= 64
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            };
            if !ids_ok(&app.id) {
                return Err(bad(key("id"), "1 to 64 of A-Z a-z 0-9 - _"));
            }
            if !ids_ok(&app.key) {
                return Err(bad(key("key"), "1 to 64 of A-Z a-z 0-9 - _"));
            }
            if app.secret.len() < MIN_PUSHER_SECRET {
                return Err(bad(
                    key("secret"),
                    format!(
                        "must be at least {MIN_PUSHER_SECRET} bytes, and your own: make one with `openssl rand -hex 16`"
                    ),
                ));
            }
            let ns = app.namespace();
            if ns.is_empty() || herald_protocol::ChannelName::new(ns).is_err() || ns.contains(':') {
                return Err(bad(
                    key("namespace"),
                    "a namespace name uses the channel-name characters and no `:`",
                ));
            }
            if ns == super::OPERATOR_NAMESPACE {
                return Err(bad(
                    key("namespace"),
                    "the `herald` namespace is Herald's own",
                ));
            }
            for (what, value) in [
                ("id", &app.id),
                ("key", &app.key),
                ("namespace", &ns.to_owned()),
            ] {
                if !seen.insert((what, value.clone())) {
                    return Err(bad(
                        key(what),
                        format!("another app has the {what} {value:?}"),
                    ));
                }
            }
            if app.client_events_per_second == 0 {
                return Err(bad(key("client_events_per_second"), "must be at least 1"));
            }
            if app.activity_timeout < Duration::from_secs(1) {
                return Err(bad(key("activity_timeout"), "must be at least 1s"));
            }
            if let Some(url) = &app.webhook_url {
                let parsed = reqwest::Url::parse(url).ok();
                if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https")) {
                    return Err(bad(
                        key("webhook_url"),
                        "must be an http:// or https:// address",
                    ));
                }
            }
            if app.resume_window > Duration::from_secs(3600) {
                return Err(bad(key("resume_window"), "must be at most 1h"));
            }
            if app.webhook_leave_delay > Duration::from_secs(3600) {
                return Err(bad(key("webhook_leave_delay"), "must be at most 1h"));
            }
            for event in app.webhook_events.iter().flatten() {
                if !WEBHOOK_EVENTS.contains(&event.as_str()) {
                    return Err(bad(
                        key("webhook_events"),
                        format!("{event:?} is none of {WEBHOOK_EVENTS:?}"),
                    ));
                }
            }
        }
        Ok(())
    }
}
