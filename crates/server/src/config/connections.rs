//! Settings of client connections: each connection's limits and timers (`[client]`),
//! WebSocket compression (`[websocket]`), the HTTP transports (`[http]`), the limits per client address (`[limits]`), and presence
//! (`[presence]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits and timers of each client connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// How often the server pings an idle connection. Default `25s`.
    #[serde(with = "humantime_serde")]
    pub ping_interval: Duration,
    /// A connection that sends nothing (not even a pong) for this long is closed with
    /// code 3005. Must exceed `ping_interval`. Default `60s`.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A write to a client that takes longer than this closes it as slow (3003).
    /// Default `10s`.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Bytes of publications waiting for one client before it is closed as slow (3003).
    /// Default 1 MiB.
    pub queue_max_bytes: usize,
    /// Largest message (WebSocket: inflated, if compressed) or request body a client may
    /// send, in bytes; a larger one closes a WebSocket with 3503 (a compressed one that
    /// inflates past it: 1009). Default 65536.
    pub max_frame_size: usize,
    /// Most channels one connection may subscribe to. Default 512.
    pub max_subscriptions: usize,
    /// Most publications returned by one history read or one resume. A resume that
    /// would need more answers `recovered: false`. Default 1000.
    pub max_history_limit: usize,
    /// Most bytes of publication data in one history answer or one resume: a history
    /// answer stops before the publication that would pass it (ask again from the last
    /// offset for the rest), and a resume that would need more answers `recovered: false`.
    /// Bounds the memory one command can make the server hold. Default 1 MiB.
    pub max_history_bytes: usize,
    /// Commands one connection may send per second, on average; bursts of twice this pass.
    /// Commands over the rate get error 111 and are not executed. 0 = no limit. Default 200.
    pub max_commands_per_second: u32,
}

/// Settings of WebSocket connections (`[websocket]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebsocketConfig {
    /// permessage-deflate (RFC 7692), which browsers offer on every WebSocket: `on` takes
    /// it when offered (each publication is compressed once for every connection that took
    /// it; no context is kept between messages, so a connection holds no compression
    /// state), `off` declines it. Default `on`.
    pub compression: Compression,
    /// Messages shorter than this many bytes go uncompressed: on tiny messages deflate
    /// gains little and costs CPU. Default 128.
    pub compression_min_size: usize,
}

/// Whether WebSocket connections may compress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Take permessage-deflate when the client offers it.
    #[default]
    On,
    /// Decline it.
    Off,
}

impl Default for WebsocketConfig {
    fn default() -> Self {
        Self {
            compression: Compression::On,
            compression_min_size: 128,
        }
    }
}

/// Limits per client address: the TCP peer's, or behind a trusted proxy the address it
/// forwards (`X-Forwarded-For`). Over a limit a client gets 503 with error 106 (too many
/// held) or 429 with error 111 (too fast); other addresses are unaffected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Connections (and, for peers that are not proxies, open TCP sockets) one address may
    /// hold at once. 0 = no limit. Default 1000.
    pub connections_per_address: usize,
    /// New connections (and polls) one address may open per second, on average; bursts of
    /// twice this pass. 0 = no limit. Default 200.
    pub connection_rate_per_address: u32,
    /// Commands one address may send per second through stateless `POST /connection/send`
    /// (without a session), on average; bursts of twice this pass. 0 = no limit.
    /// Default 400.
    pub commands_per_address: u32,
    /// Channels one address may make exist per minute by publishing to a channel that has
    /// no stream yet (on any transport), on average; bursts of twice this pass. Past it, such
    /// publications get error 111; publications to channels that exist are not counted.
    /// API publications are not limited. 0 = no limit. Default 60.
    pub new_channels_per_address: u32,
    /// Calls to the application's backend (connect, subscribe, publish, rpc hooks) that one
    /// address's clients may cause per second, on average; bursts of twice this pass. Past
    /// it, what would ask the backend is refused (111, or 3008 for a WebSocket connect)
    /// without asking it, so that one address cannot make the backend slow (or open its
    /// circuit) for everyone. 0 = no limit. Default 50.
    pub hook_calls_per_address: u32,
    /// Bytes the server may hold for one address's clients beyond their connections' own
    /// queues: replies waiting in Phoenix long-poll sessions, the positions Pusher pages
    /// left to resume from. Past it, a long-poll session that would hold more ends (its
    /// client opens a new one) and a page's positions are not kept. 0 = no limit.
    /// Default 33554432 (32 MiB).
    pub held_bytes_per_address: usize,
    /// Proxies (addresses or networks such as `10.0.0.0/8`) whose `X-Forwarded-For` is
    /// believed. Default none: the TCP peer is the client.
    pub trusted_proxies: Vec<super::Network>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            connections_per_address: 1000,
            connection_rate_per_address: 200,
            commands_per_address: 400,
            new_channels_per_address: 60,
            hook_calls_per_address: 50,
            held_bytes_per_address: 32 << 20,
            trusted_proxies: Vec::new(),
        }
    }
}

/// How presence and join/leave pushes behave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// Joins and leaves are gathered for this long and pushed as one batch per channel.
    /// Default `500ms`.
    #[serde(with = "humantime_serde")]
    pub join_leave_window: Duration,
    /// Above this many members a channel's joins and leaves are not pushed at all: a
    /// client of such a channel asks `presence_stats` instead. Default 1000.
    pub join_leave_max_members: u64,
    /// A client whose connection ends stays a member for this long, so that one that
    /// reconnects in time (sending its earlier client id) causes neither a leave nor a
    /// join. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// A long-poll or poll client stays a member for this long after its last request
    /// ended. Default `15s`.
    #[serde(with = "humantime_serde")]
    pub poll_grace: Duration,
    /// Longest page of members a `presence` command or API call returns (default 100
    /// when the caller gives no limit). Default 1000.
    pub max_page: usize,
    /// Most memberships held through their grace at once on this node; past it, a
    /// membership whose connection or poll ended leaves at once. Bounds what a flood of
    /// polls naming channels (each a membership held for `poll_grace`) can make the server
    /// keep. Default 50000.
    pub max_held: usize,
    /// Most of those held for one client address: one address flooding polls cannot
    /// take every place, so other clients' memberships still outlive their polls.
    /// Default 5000.
    pub max_held_per_address: usize,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            join_leave_window: Duration::from_millis(500),
            join_leave_max_members: 1000,
            grace: Duration::from_secs(5),
            poll_grace: Duration::from_secs(15),
            max_page: 1000,
            max_held: 50_000,
            max_held_per_address: 5_000,
        }
    }
}

/// Settings of the HTTP transports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Longest wait for a request's head, from the connection's opening or the end of the
    /// previous response (so also how long an idle keep-alive connection stays open).
    /// Default `10s`.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest wait for a request's body. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// How long a long-poll request is held when nothing is new. Default `25s`.
    #[serde(with = "humantime_serde")]
    pub longpoll_timeout: Duration,
    /// Longest hold a client may ask for with `timeout=`. Default `120s`.
    #[serde(with = "humantime_serde")]
    pub longpoll_max_timeout: Duration,
    /// How long a long-poll client's session waits for its next request after an answer,
    /// still subscribed, so that the re-poll picks up what queued meanwhile; `0s`: every
    /// request resumes from its cursor. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub longpoll_grace: Duration,
    /// Reconnect delay suggested to EventSource clients (`retry:`). Default `2s`.
    #[serde(with = "humantime_serde")]
    pub sse_retry: Duration,
    /// A forever-frame response ends after this many bytes, so the page reopens it and the
    /// browser frees the old document. Default 1 MiB.
    pub iframe_max_bytes: usize,
    /// A forever-frame response ends after this long. Default `5m`.
    #[serde(with = "humantime_serde")]
    pub iframe_max_lifetime: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            longpoll_timeout: Duration::from_secs(25),
            longpoll_max_timeout: Duration::from_secs(120),
            longpoll_grace: Duration::from_secs(5),
            sse_retry: Duration::from_secs(2),
            iframe_max_bytes: 1 << 20,
            iframe_max_lifetime: Duration::from_secs(300),
        }
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            queue_max_bytes: 1 << 20,
            max_frame_size: 65536,
            max_subscriptions: 512,
            max_history_limit: 1000,
            max_history_bytes: 1 << 20,
            max_commands_per_second: 200,
        }
    }
}
