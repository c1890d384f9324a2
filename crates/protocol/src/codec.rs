//! The seam between Herald's sessions and an encoding of its protocol.
//!
//! A session speaks in typed values: it decodes [`Command`]s from what a client sent and
//! answers with [`Reply`]s and [`Push`]es. A [`Codec`] turns those into bytes and back; a
//! transport's framing then carries the bytes (a WebSocket message, an SSE event, an NDJSON
//! line, a poll's answer). Nothing else in the server writes or reads protocol frames, so a
//! second encoding (a binary one) is a second implementation of this trait, chosen per
//! connection through [`Encoding`](crate::Encoding).
//!
//! Publications go through the same trait once per publication, not once per connection:
//! the hub encodes a [`Push::Pub`] for each encoding in use and every subscriber shares it.

use crate::{results, ChannelName, Command, ErrorCode, Publication};

/// Why part of a frame is not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Nothing in it can be trusted, not even an id (for JSON: not a JSON object).
    #[error("malformed command: {0}")]
    Malformed(String),
    /// A JSON object that is not a valid command; the error can be answered with its id.
    #[error("{message}")]
    Invalid {
        /// The command's id, when it could be read.
        id: Option<u64>,
        /// The error code for the reply.
        code: ErrorCode,
        /// What is wrong, for people.
        message: String,
    },
}

/// What a command achieved, by method: the body of a successful [`Reply`].
#[derive(Debug)]
pub enum Outcome<'a> {
    /// `connect`.
    Connect(results::Connect<'a>),
    /// `subscribe`.
    Subscribe(results::Stream<'a>),
    /// `unsubscribe`.
    Unsubscribe,
    /// `publish`.
    Publish(results::Published<'a>),
    /// `history`.
    History(results::Stream<'a>),
    /// `refresh`.
    Refresh(results::Refreshed),
    /// `rpc`.
    Rpc(results::Rpc<'a>),
    /// `presence`.
    Presence(results::Presence<'a>),
    /// `presence_stats`.
    PresenceStats(results::PresenceStats),
    /// `ping`.
    Ping,
}

impl Outcome<'_> {
    /// The method this answers, as the wire names it.
    pub fn method(&self) -> &'static str {
        match self {
            Outcome::Connect(_) => "connect",
            Outcome::Subscribe(_) => "subscribe",
            Outcome::Unsubscribe => "unsubscribe",
            Outcome::Publish(_) => "publish",
            Outcome::History(_) => "history",
            Outcome::Refresh(_) => "refresh",
            Outcome::Rpc(_) => "rpc",
            Outcome::Presence(_) => "presence",
            Outcome::PresenceStats(_) => "presence_stats",
            Outcome::Ping => "ping",
        }
    }
}

/// The answer to one command that carried an id, or an error that answers none.
#[derive(Debug)]
pub enum Reply<'a> {
    /// The command with this id succeeded.
    Done {
        /// The command's id.
        id: u64,
        /// What it achieved.
        outcome: Outcome<'a>,
    },
    /// A command failed (`id` when it had one and it could be read), or an HTTP transport
    /// refused one of the channels its request named (`channel`).
    Refused {
        /// The failed command's id.
        id: Option<u64>,
        /// One of [`ErrorCode`], or an application's own.
        code: u16,
        /// What went wrong, for people.
        message: &'a str,
        /// The channel refused, when a request named several.
        channel: Option<&'a ChannelName>,
    },
}

impl<'a> Reply<'a> {
    /// A command's failure.
    pub fn error(id: Option<u64>, code: impl Into<u16>, message: &'a str) -> Self {
        Reply::Refused {
            id,
            code: code.into(),
            message,
            channel: None,
        }
    }
}

/// What the server says unasked.
#[derive(Debug)]
pub enum Push<'a> {
    /// A publication on a subscribed channel.
    Pub {
        /// The channel.
        channel: &'a ChannelName,
        /// The publication.
        publication: &'a Publication,
    },
    /// A publication on a channel subscribed with deltas (see [`crate::delta`]): its data
    /// as text (`delta: None`), which the client keeps to apply the next delta to, or the
    /// delta from the previous publication's data.
    PubDelta {
        /// The channel.
        channel: &'a ChannelName,
        /// The publication.
        publication: &'a Publication,
        /// The delta from the previous publication's data, or none for the whole text.
        delta: Option<&'a [u8]>,
    },
    /// The connection ends (on transports without a close code of their own).
    Disconnect {
        /// One of [`crate::DisconnectCode`].
        code: u16,
        /// Why, for people.
        reason: &'a str,
    },
    /// One subscription ends while the connection stays (its token expired, an operator
    /// unsubscribed it).
    Unsubscribe {
        /// The channel.
        channel: &'a ChannelName,
        /// Why, as a code.
        code: ErrorCode,
        /// Why, for people.
        reason: &'a str,
    },
    /// A stream opened without a `connect` command: what its reply would have said.
    Connect(&'a results::Connect<'a>),
    /// The server subscribed the connection to a channel its token names.
    Subscribe(&'a results::Subscribed<'a>),
    /// Members joined or left a channel; `missed` says changes were lost on the way.
    Presence {
        /// The channel.
        channel: &'a ChannelName,
        /// Who joined.
        join: &'a [results::Member<'a>],
        /// Who left.
        leave: &'a [results::Member<'a>],
        /// Whether changes were lost (the client should ask for the members again).
        missed: bool,
        /// How many members the channel has with these changes, as the store counted
        /// them when they were gathered.
        clients: Option<u64>,
    },
    /// A keepalive, for framings without one of their own.
    Ping,
    /// On a subscription that conflates: the publications after the client's position up
    /// to `offset` were replaced by later ones of the same conflation key and will not
    /// come; the subscription's position is `offset` (the next publication is
    /// `offset + 1`).
    Conflated {
        /// The channel.
        channel: &'a ChannelName,
        /// The last offset replaced.
        offset: u64,
    },
}

/// An encoding of Herald's protocol: typed replies and pushes to bytes, bytes to commands.
pub trait Codec: Send + Sync + 'static {
    /// The next command's bytes in `frame`, and what follows them. A frame may carry
    /// several commands.
    fn split<'f>(&self, frame: &'f [u8]) -> (&'f [u8], &'f [u8]);

    /// Decodes what [`Codec::split`] gave: a command, an error that can be answered (with
    /// the command's id when it could be read), `Malformed` when nothing in it can be
    /// trusted, or `None` for filler that is no command (a blank line). Never panics,
    /// whatever the input.
    fn decode(&self, part: &[u8]) -> Option<Result<Command, DecodeError>>;

    /// Encodes a reply.
    fn reply(&self, reply: &Reply<'_>) -> Vec<u8>;

    /// Encodes a push.
    fn push(&self, push: &Push<'_>) -> Vec<u8>;

    /// Appends one encoded reply or push to `out`, a frame that carries several.
    fn join(&self, out: &mut Vec<u8>, encoded: &[u8]);

    /// Whether its frames are binary (a WebSocket binary message), not text.
    fn binary(&self) -> bool {
        false
    }
}
