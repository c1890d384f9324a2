//! Results of commands, as typed values: what a [`Codec`](crate::Codec) writes into replies.

use serde::Serialize;
use serde_json::value::RawValue;

use crate::{Epoch, Publication};

/// Result of `connect`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Connect<'a> {
    /// This session's id.
    pub client: &'a str,
    /// Server version.
    pub version: &'a str,
    /// Seconds between server pings; the client may consider the connection dead after
    /// about twice this long without hearing anything.
    pub ping: u64,
    /// The user the token names; absent for anonymous connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    /// When the token stops being accepted, and so when the connection needs a
    /// `refresh` (Unix seconds, with `ttl` the same as seconds from now, for clients
    /// whose clock is off); absent when it does not expire.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Expiry>,
}

/// `presence`: a page of members and, when more may follow, the cursor of the next page.
#[derive(Debug)]
pub struct Presence<'a> {
    /// The members, in id order.
    pub members: &'a [Member<'a>],
    /// Pass it back for the next page; absent on the last page.
    pub cursor: Option<String>,
}

/// A member of a channel's presence: a client, and what its token or connect hook said
/// about its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The member's public id (written as 16 hex digits).
    pub id: u64,
    /// The member's `{"user", "info", "channel_info"}` object as JSON text, or empty for an
    /// anonymous client.
    pub info: &'a [u8],
}

/// `presence_stats`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PresenceStats {
    /// Members (clients).
    pub clients: u64,
    /// Distinct users among them.
    pub users: u64,
}

/// When a token stops being accepted.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Expiry {
    /// Unix seconds.
    pub expires: u64,
    /// Seconds from now.
    pub ttl: u64,
}

/// Result of `refresh`: the new expiry (empty when the new token does not expire).
#[derive(Debug, Serialize)]
pub struct Refreshed {
    /// As in [`Connect`].
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Expiry>,
    /// Whether a subscription's token was refreshed (not the connection's): codecs that
    /// name the two apart (Centrifugo's `sub_refresh`) answer in its name.
    #[serde(skip)]
    pub subscription: bool,
}

/// Result of `subscribe` and `history`.
#[derive(Debug, Serialize)]
pub struct Stream<'a> {
    /// Stream epoch.
    pub epoch: &'a Epoch,
    /// Offset of the newest publication in the stream (or of the last one replayed).
    pub offset: u64,
    /// For subscribe with `since`: whether every missed publication is in `publications`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    /// Replayed or requested publications, oldest first.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub publications: &'a [Publication],
    /// For subscribe: the channel's state as the application's backend gave it (its
    /// subscribe hook's `data`), before any live publication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
    /// For subscribe: live publications come as deltas (`"fossil"`), as the client asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<&'static str>,
}

/// Result of `rpc`: what the application's backend answered.
#[derive(Debug, Serialize)]
pub struct Rpc<'a> {
    /// The backend's `data` (JSON; `null` when it gave none).
    pub data: &'a RawValue,
}

/// Result of `publish`.
#[derive(Debug, Serialize)]
pub struct Published<'a> {
    /// The publication's offset.
    pub offset: u64,
    /// The stream's epoch.
    pub epoch: &'a Epoch,
    /// An earlier publish with the same `idempotency_key` stored it; this one stored
    /// nothing. Absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub repeat: bool,
}

/// A result with no fields (`unsubscribe`, `ping`).
#[derive(Debug, Serialize)]
pub struct Empty {}

/// A channel the server subscribed the connection to itself (one its token names), pushed
/// as `subscribe` with the channel's name.
#[derive(Debug, Serialize)]
pub struct Subscribed<'a> {
    /// The channel.
    pub channel: &'a crate::ChannelName,
    /// Stream epoch.
    pub epoch: &'a Epoch,
    /// Offset of the newest publication in the stream (or of the last one replayed).
    pub offset: u64,
    /// With a resume position: whether every missed publication follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    /// The channel's state as the subscribe hook gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a RawValue>,
}
