//! Client → server commands.

use bytes::Bytes;

use crate::{ChannelName, Since};

/// One command from a client. With an `id` it gets exactly one reply carrying that id;
/// without one it is fire-and-forget (its errors are still reported, without an id).
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// Chosen by the client; echoed in the reply.
    pub id: Option<u64>,
    /// What the client asks for.
    pub method: Method,
}

/// The command's method and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// Opens the session; the token (if any) says who the client is.
    Connect(ConnectRequest),
    /// Starts delivery of a channel's publications, optionally resuming after a position.
    Subscribe(SubscribeRequest),
    /// Stops delivery of a channel's publications.
    Unsubscribe {
        /// The channel.
        channel: ChannelName,
    },
    /// Publishes data to a channel (where the namespace allows client publishing).
    Publish {
        /// The channel.
        channel: ChannelName,
        /// One JSON value, as text.
        data: Bytes,
        /// Publish once per key and channel within the server's `idempotency_window`: a
        /// retry with the same key stores nothing and answers with the first one's position.
        idempotency_key: Option<String>,
        /// Subscribers that conflate skip it once a later publication of the same key
        /// waits behind it (see [`crate::Push::Conflated`]).
        conflation_key: Option<String>,
    },
    /// Reads a channel's history.
    History(HistoryRequest),
    /// Replaces the connection's token (no `channel`) or a subscription's token (with
    /// `channel`) before it expires.
    Refresh(RefreshRequest),
    /// A call to the application's backend (its `rpc` hook), answered on this connection.
    Rpc(RpcRequest),
    /// A page of a channel's members (presence).
    Presence(PresenceRequest),
    /// How many clients and distinct users a channel has.
    PresenceStats {
        /// The channel.
        channel: ChannelName,
    },
    /// Asks for an empty reply; keeps the connection alive and measures round trips.
    Ping,
}

impl Method {
    /// The method's name as it appears on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Method::Connect(_) => "connect",
            Method::Subscribe(_) => "subscribe",
            Method::Unsubscribe { .. } => "unsubscribe",
            Method::Publish { .. } => "publish",
            Method::History(_) => "history",
            Method::Refresh(_) => "refresh",
            Method::Rpc(_) => "rpc",
            Method::Presence(_) => "presence",
            Method::PresenceStats { .. } => "presence_stats",
            Method::Ping => "ping",
        }
    }
}

/// Parameters of `connect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectRequest {
    /// Connection token: a JWT that says who the client is and what it may do. Without
    /// one the connection is anonymous.
    #[serde(default)]
    pub token: Option<String>,
    /// Client library name, for logs.
    #[serde(default)]
    pub name: Option<String>,
    /// Client library version, for logs.
    #[serde(default)]
    pub version: Option<String>,
    /// The `client` id this client was given by its first connection, sent again when it
    /// reconnects: presence then sees the same member come back (no leave, no join). It is
    /// a secret (only its own client knows it) and is never shown to others.
    #[serde(default)]
    pub client: Option<String>,
}

/// Parameters of `presence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceRequest {
    /// The channel.
    pub channel: ChannelName,
    /// At most this many members (the server caps it).
    pub limit: Option<u32>,
    /// Members after this one: the previous page's `cursor`.
    pub cursor: Option<String>,
}

/// Parameters of `subscribe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    /// The channel.
    pub channel: ChannelName,
    /// Resume after this position: the reply replays what was missed, or says
    /// `recovered: false` when history cannot cover the gap.
    pub since: Option<Since>,
    /// Subscription token: a JWT granting this connection's user this channel.
    pub token: Option<String>,
    /// Live publications as deltas from the previous one (`delta: "fossil"`).
    pub delta: bool,
    /// Publications replaced by later ones of the same conflation key while they wait
    /// for the connection are skipped (`conflate: true`; see [`crate::Push::Conflated`]).
    pub conflate: bool,
}

/// Parameters of `refresh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshRequest {
    /// The subscription whose token is replaced; none for the connection's own token.
    pub channel: Option<ChannelName>,
    /// The new token.
    pub token: String,
}

/// Parameters of `rpc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcRequest {
    /// What the client calls, for the backend (1 to 256 bytes).
    pub method: String,
    /// One JSON value, as text (`null` when the client sent none).
    pub data: Bytes,
}

/// Parameters of `history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRequest {
    /// The channel.
    pub channel: ChannelName,
    /// Only publications after this position; without it, the newest ones.
    pub since: Option<Since>,
    /// At most this many publications (0 = only the stream position).
    pub limit: Option<u32>,
}
