//! Server configuration: one typed struct, read from TOML / environment / flags by the
//! binary, checked once at start by [`Config::validate`].
//!
//! Every field's default is stated in its doc comment and in `docs/configuration.md`.

mod auth;
mod connections;
mod fronts;
mod hooks;
mod namespaces;
mod network;

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

/// Shortest API key `serve` accepts.
pub const MIN_API_KEY: usize = 16;

pub use auth::{AuthConfig, PreviousKey, MIN_HMAC_SECRET};
pub use connections::{
    ClientConfig, Compression, HttpConfig, LimitsConfig, PresenceConfig, WebsocketConfig,
};
pub use fronts::{CentrifugoConfig, PhoenixConfig, PusherApp, PusherConfig, MIN_PUSHER_SECRET};
pub use hooks::HooksConfig;
pub use namespaces::{Access, NamespaceConfig, NamespaceOverride, Presence};
pub use network::Network;

/// Everything `herald serve` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on. Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Worker threads; 0 means one per core. Default 0.
    pub workers: usize,
    /// Threads that write large channels' publications to their subscribers' sockets;
    /// 0 = half the cores (at least one), leaving the rest to the workers and the broker.
    pub fanout_threads: usize,
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace`, or a tracing directive such as
    /// `herald_server=debug`. Default `info`.
    pub log_level: String,
    /// `text` or `json`. Default `text`.
    pub log_format: LogFormat,
    /// An API key for the HTTP API (`Authorization: apikey KEY`), allowed every call.
    /// Default none: the API then refuses every request and says how to set a key.
    pub api_key: Option<String>,
    /// More API keys, any of which is accepted: each a string (every call) or
    /// `{ key = "…", scope = "publish" }` (publish and broadcast only) or
    /// `{ key = "…", scope = "read" }` (history and info only). Default none.
    pub api_keys: Vec<ApiKey>,
    /// How client tokens are checked. Default: no keys, every client anonymous.
    pub auth: AuthConfig,
    /// Where the application's backend is asked about connections, subscriptions,
    /// publications and `rpc` calls. Default: nowhere.
    pub hooks: HooksConfig,
    /// Origins browsers may connect from (`https://example.com`), or `*` for any. Requests
    /// without an `Origin` header (non-browser clients) are always allowed; a browser's
    /// same-origin request is always allowed. Default empty: same origin only.
    pub allowed_origins: Vec<String>,
    /// Host names (the `Host` header, without port) the server answers to; other requests get
    /// 403 with error 103. Against DNS rebinding: a hostile page whose name is made to resolve
    /// to this server would otherwise be "same origin" with it. Default empty: when `listen`
    /// is a loopback address, `localhost`, `127.0.0.1` and `::1`; otherwise any host (set it
    /// in production).
    pub allowed_hosts: Vec<String>,
    /// Where durable history is kept (the log `herald.wal.*`, packed history `herald.pack.*`
    /// and the index checkpoint `herald.index` inside). Default `herald-data`, relative to the
    /// working directory.
    pub data_dir: std::path::PathBuf,
    /// Let several processes listen on the same address (`SO_REUSEPORT`): the kernel spreads
    /// new connections among them. For several nodes on one machine sharing channels
    /// through Redis. Default false.
    pub reuse_port: bool,
    /// When durable writes reach the disk: `interval` (default: acknowledged once written,
    /// so `kill -9` loses nothing; synced within `sync_interval_ms`, so a machine crash may
    /// lose that last interval, answered with new epochs), `group` (concurrent publications
    /// share one fsync; an acknowledged publication is on disk, at an fsync's CPU and time
    /// per publish), `always` (one fsync each, before delivery), or `none` (never synced).
    pub sync: SyncMode,
    /// Ignored (a warning says so): the setting of earlier versions for the durable store's
    /// page cache. The store now reads history through the operating system's page cache;
    /// the setting is still accepted so that their configuration files load.
    pub store_cache_bytes: Option<usize>,
    /// With `sync = "interval"`, the longest an acknowledged publication waits to be
    /// synced, in milliseconds. Default 10.
    pub sync_interval_ms: u64,
    /// Size at which the durable store closes a log segment and starts a new one, in bytes
    /// (65536 to 1073741824). Compaction rewrites a segment at a time. Default 16777216.
    pub store_segment_bytes: u64,
    /// Bytes of log between checkpoints of the durable store's index: at most what a start
    /// after a crash reads. Default 16777216.
    pub store_checkpoint_bytes: u64,
    /// Serve the browser SDK at `/herald.js` and the chat demo at `/chat`. Default true.
    pub web: bool,
    /// Also serve `GET /metrics` on this address, without the API key (for a Prometheus
    /// on a private network). On the main address `/metrics` always needs a key. Default:
    /// none.
    pub metrics_listen: Option<SocketAddr>,
    /// Most connections (of every transport, long-polls included) at once; more are refused
    /// with 503 and error 106. 0 = no limit. Default 100000.
    pub max_connections: usize,
    /// Longest wait for connections to close and requests to finish on shutdown.
    /// Default `10s`.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// How long a publish's `idempotency_key` is remembered per channel: a publish with the
    /// same key within it publishes nothing and answers with the first one's position.
    /// Default `5m`.
    #[serde(with = "humantime_serde")]
    pub idempotency_window: Duration,
    /// Per-connection settings.
    pub client: ClientConfig,
    /// Settings of WebSocket connections (compression).
    pub websocket: WebsocketConfig,
    /// Settings of the HTTP transports (SSE, streaming, forever frame, polling).
    pub http: HttpConfig,
    /// Limits per client address.
    pub limits: LimitsConfig,
    /// How presence and join/leave pushes behave (namespaces turn them on).
    pub presence: PresenceConfig,
    /// Rules for channels whose namespace has no entry in `namespaces`; fields left out
    /// take the built-in defaults (see [`NamespaceConfig`]).
    pub channels: NamespaceOverride,
    /// Rules per namespace (the part of a channel name before `:`). Fields left out take
    /// the value from `channels`. Default: a `chat` namespace that anyone may read and
    /// publish to, keeping 1000 messages for 7 days (the demo's).
    pub namespaces: BTreeMap<String, NamespaceOverride>,
    /// The Pusher protocol front: its apps. Default none.
    pub pusher: PusherConfig,
    /// The Phoenix Channels front. Default: on.
    pub phoenix: PhoenixConfig,
    /// The Centrifugo client protocol front. Default: on.
    pub centrifugo: CentrifugoConfig,
}

/// An API key, with what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ApiKey {
    /// A key allowed every call.
    Full(String),
    /// A key limited to some calls.
    Scoped {
        /// The key.
        key: String,
        /// What it may do.
        scope: ApiScope,
    },
}

/// What an API key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiScope {
    /// Every call.
    All,
    /// Publish and broadcast.
    Publish,
    /// Read history and info.
    Read,
}

impl ApiKey {
    /// The key and its scope.
    pub fn parts(&self) -> (&str, ApiScope) {
        match self {
            ApiKey::Full(key) => (key, ApiScope::All),
            ApiKey::Scoped { key, scope } => (key, *scope),
        }
    }
}

/// When durable writes reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Concurrent publications share one fsync.
    Group,
    /// One fsync per publication.
    Always,
    /// Acknowledged once written, synced within `sync_interval_ms`.
    #[default]
    Interval,
    /// No fsync.
    None,
}

impl From<SyncMode> for herald_broker::SyncPolicy {
    fn from(m: SyncMode) -> Self {
        match m {
            SyncMode::Group => Self::Group,
            SyncMode::Always => Self::Always,
            SyncMode::Interval => Self::Interval,
            SyncMode::None => Self::None,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: 0,
            fanout_threads: 0,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            api_key: None,
            api_keys: Vec::new(),
            auth: AuthConfig::default(),
            hooks: HooksConfig::default(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            web: true,
            metrics_listen: None,
            data_dir: "herald-data".into(),
            reuse_port: false,
            sync: SyncMode::Interval,
            store_cache_bytes: None,
            sync_interval_ms: herald_broker::DEFAULT_SYNC_INTERVAL.as_millis() as u64,
            store_segment_bytes: herald_broker::DEFAULT_SEGMENT_BYTES,
            store_checkpoint_bytes: herald_broker::DEFAULT_CHECKPOINT_BYTES,
            max_connections: 100_000,
            shutdown_timeout: Duration::from_secs(10),
            idempotency_window: Duration::from_secs(300),
            client: ClientConfig::default(),
            websocket: WebsocketConfig::default(),
            http: HttpConfig::default(),
            limits: LimitsConfig::default(),
            presence: PresenceConfig::default(),
            channels: NamespaceOverride::default(),
            namespaces: BTreeMap::from([(
                "chat".to_string(),
                NamespaceOverride {
                    history_size: Some(1000),
                    history_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
                    history_meta_ttl: Some(Duration::from_secs(30 * 24 * 3600)),
                    subscribe: Some(Access::Anyone),
                    history: Some(Access::Anyone),
                    presence: Some(Presence::On(Access::Anyone)),
                    join_leave: Some(true),
                    publish: Some(Access::Anyone),
                    ..Default::default()
                },
            )]),
            pusher: PusherConfig::default(),
            phoenix: PhoenixConfig::default(),
            centrifugo: CentrifugoConfig::default(),
        }
    }
}

/// A configuration value that cannot work, named by its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: `{key}`: {problem}")]
pub struct ConfigError {
    /// Dotted key, as in the TOML file.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The error for `key` (dotted, as in the TOML file), saying what is wrong with it.
pub fn bad(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        problem: problem.into(),
    }
}

/// The namespace of Herald's own channels (the dashboard's figures, read with operator
/// tickets: [`crate::policy::operator`]); a configuration may not name it.
pub const OPERATOR_NAMESPACE: &str = "herald";

/// The namespace of the streams that carry connection events to the backend
/// ([`crate::hooks::events`]).
pub const EVENTS_NAMESPACE: &str = "$herald";

impl Config {
    /// Checks every value and resolves namespace rules.
    /// Refuses API keys short enough to guess, or to have been copied from an example
    /// (`change-me`, `secret`): the key publishes and disconnects on every channel.
    fn check_api_keys(&self) -> Result<(), ConfigError> {
        let short = |key: &str| key.len() < MIN_API_KEY;
        let why = format!(
            "must be at least {MIN_API_KEY} bytes, and your own: make one with `openssl rand -hex 16`"
        );
        if self.api_key.as_deref().is_some_and(short) {
            return Err(bad("api_key", why));
        }
        if self.api_keys.iter().any(|k| short(k.parts().0)) {
            return Err(bad("api_keys", why));
        }
        Ok(())
    }

    /// Checks every value (not the key files: [`Config::validate`] loads them).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        self.check_api_keys()?;
        self.centrifugo.check()?;
        let c = &self.client;
        if self.presence.join_leave_window.is_zero() {
            return Err(bad("presence.join_leave_window", "must be greater than 0"));
        }
        if self.presence.max_page == 0 {
            return Err(bad("presence.max_page", "must be at least 1"));
        }
        if c.ping_interval.is_zero() {
            return Err(bad("client.ping_interval", "must be greater than 0"));
        }
        let segments = herald_broker::MIN_SEGMENT_BYTES..=herald_broker::MAX_SEGMENT_BYTES;
        if !segments.contains(&self.store_segment_bytes) {
            return Err(bad(
                "store_segment_bytes",
                format!("must be from {} to {}", segments.start(), segments.end()),
            ));
        }
        if self.store_checkpoint_bytes < herald_broker::MIN_SEGMENT_BYTES {
            return Err(bad(
                "store_checkpoint_bytes",
                format!("must be at least {}", herald_broker::MIN_SEGMENT_BYTES),
            ));
        }
        if c.idle_timeout <= c.ping_interval {
            return Err(bad(
                "client.idle_timeout",
                "must be longer than client.ping_interval",
            ));
        }
        if c.write_timeout.is_zero() {
            return Err(bad("client.write_timeout", "must be greater than 0"));
        }
        if c.max_frame_size < 1024 {
            return Err(bad("client.max_frame_size", "must be at least 1024 bytes"));
        }
        if c.queue_max_bytes < c.max_frame_size {
            return Err(bad(
                "client.queue_max_bytes",
                "must be at least client.max_frame_size",
            ));
        }
        if c.max_subscriptions == 0 {
            return Err(bad("client.max_subscriptions", "must be at least 1"));
        }
        let h = &self.http;
        if h.longpoll_timeout.is_zero() || h.longpoll_timeout > h.longpoll_max_timeout {
            return Err(bad(
                "http.longpoll_timeout",
                "must be greater than 0 and at most http.longpoll_max_timeout",
            ));
        }
        if h.header_timeout.is_zero() || h.body_timeout.is_zero() {
            return Err(bad(
                "http.header_timeout",
                "http.header_timeout and http.body_timeout must be greater than 0",
            ));
        }
        if h.iframe_max_bytes < 4096 {
            return Err(bad("http.iframe_max_bytes", "must be at least 4096"));
        }
        if h.iframe_max_lifetime.is_zero() {
            return Err(bad("http.iframe_max_lifetime", "must be greater than 0"));
        }
        let keys = self.api_keys.iter().map(|k| k.parts().0);
        for (i, key) in keys.chain(self.api_key.as_deref()).enumerate() {
            if key.trim().is_empty() {
                let name = if i < self.api_keys.len() {
                    "api_keys"
                } else {
                    "api_key"
                };
                return Err(bad(name, "an API key must not be empty"));
            }
        }
        for origin in &self.allowed_origins {
            if origin != "*" && !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(bad(
                    "allowed_origins",
                    format!("{origin:?} is not `*` or an origin such as https://example.com"),
                ));
            }
        }
        self.auth.check()?;
        self.pusher.check()?;
        self.hooks.check()
    }

    /// The rules of `[channels]` and of every namespace, resolved and checked (Herald's own
    /// namespace included).
    pub(crate) fn namespace_rules(
        &self,
    ) -> Result<(NamespaceConfig, BTreeMap<String, NamespaceConfig>), ConfigError> {
        self.channels.check_replaced("channels")?;
        let base = NamespaceConfig::built_in(self.auth.keyed()).apply(&self.channels);
        base.check("channels", &self.hooks)?;
        let mut namespaces = BTreeMap::new();
        for (name, o) in &self.namespaces {
            let key = format!("namespaces.{name}");
            if name.is_empty()
                || herald_protocol::ChannelName::new(name).is_err()
                || name.contains(':')
            {
                return Err(bad(
                    key,
                    "a namespace name uses the channel-name characters and no `:`",
                ));
            }
            if name == OPERATOR_NAMESPACE {
                return Err(bad(
                    key,
                    "the `herald` namespace is Herald's own (the dashboard's figures); choose another name",
                ));
            }
            o.check_replaced(&key)?;
            let ns = self.namespace_base(&base, name).apply(o);
            ns.check(&key, &self.hooks)?;
            namespaces.insert(name.clone(), ns);
        }
        // A Pusher app's namespace exists whether or not the configuration names it.
        for app in &self.pusher.apps {
            let name = app.namespace();
            if !namespaces.contains_key(name) {
                let ns = self.namespace_base(&base, name);
                ns.check(&format!("namespaces.{name}"), &self.hooks)?;
                namespaces.insert(name.to_owned(), ns);
            }
        }
        namespaces.insert(OPERATOR_NAMESPACE.to_string(), operator_namespace(&base));
        Ok((base, namespaces))
    }
}

impl Config {
    /// What a namespace's own entry applies over: `[channels]`, and for a Pusher app's
    /// namespace the front's rules over that (see [`PusherApp::namespace_rules`]).
    fn namespace_base(&self, base: &NamespaceConfig, name: &str) -> NamespaceConfig {
        match self.pusher.apps.iter().any(|a| a.namespace() == name) {
            true => base.apply(&PusherApp::namespace_rules()),
            false => base.clone(),
        }
    }
}

/// The rules of Herald's own channels (`herald:stats`, which the dashboard reads): the
/// last ten minutes of figures, in memory, read only by dashboard tickets (see
/// [`crate::policy::operator`]), published only by the node itself.
fn operator_namespace(base: &NamespaceConfig) -> NamespaceConfig {
    let ten_minutes = std::time::Duration::from_secs(600);
    base.apply(&NamespaceOverride {
        history_size: Some(600),
        history_ttl: Some(ten_minutes),
        history_meta_ttl: Some(ten_minutes),
        subscribe: Some(Access::Granted),
        history: Some(Access::Granted),
        presence: Some(Presence::Off),
        join_leave: Some(false),
        publish: Some(Access::Nobody),
        personal: Some(false),
        max_message_size: Some(1 << 20),
        subscribe_hook: Some(false),
        publish_hook: Some(false),
        durable: Some(false),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
