//! What the driver needs of a transport: how its pushes are framed and written, and what
//! its client sends on the connection ([`Wire`]).

use std::{future::Future, time::Duration};

use herald_protocol::DisconnectCode;
use tokio::time::Instant;

use crate::{
    error::Disconnect,
    queue::Delivery,
    session::{Positions, Session},
};

/// Why a write did not go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwritten {
    /// The connection broke, or the client left.
    Gone,
    /// The client read nothing for the write timeout.
    Slow,
}

impl Unwritten {
    /// How a connection that could not be written to ends: a slow consumer (3003) or a
    /// write error (3004). Neither can be told to the client.
    pub fn disconnect(self) -> Disconnect {
        match self {
            Unwritten::Gone => Disconnect::new(DisconnectCode::WriteError),
            Unwritten::Slow => Disconnect::because(
                DisconnectCode::Slow,
                "write timed out; reconnect and resume",
            ),
        }
    }
}

/// What the client did on the connection itself.
#[derive(Debug)]
pub enum Heard {
    /// A frame of commands (WebSocket).
    Frame(bytes::Bytes),
    /// Something that only says it is alive (a pong, a ping).
    Alive,
    /// A pong to a ping that carried a payload (WebSocket): the client has read everything
    /// written before that ping.
    Pong(bytes::Bytes),
    /// The connection ended without a word: the client dropped, or its network did.
    Left,
    /// It closed the connection, saying so (a WebSocket close frame): it left on purpose,
    /// and its presence leaves at once (the grace is for drops).
    Closed,
    /// It sent what ends the connection (a malformed or oversized frame).
    Refused(Disconnect),
}

/// A transport as the driver sees it: how pushes are framed and written, and what its
/// client sends on the connection.
pub trait Wire: Send {
    /// Appends one push (a JSON object) in this transport's framing; `delivery`: the
    /// publication it carries, if it is one (a compressed WebSocket then writes the frame
    /// made once for every connection); `at` is the session's positions right after it
    /// (SSE carries them as the event id).
    fn push(
        &mut self,
        json: &[u8],
        delivery: Option<&Delivery>,
        at: Positions<'_>,
        out: &mut Vec<u8>,
    );

    /// Writes `bytes` (pushes as [`Wire::push`] framed them) whole, waiting at most
    /// `timeout` for the client to take them. Empty bytes still send what a direct write of
    /// the hub left unsent.
    fn send(
        &mut self,
        bytes: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send;

    /// Resolves with what the client does next on the connection. A stream's client only
    /// ever leaves (its commands come through the session's queue).
    fn heard(&mut self) -> impl Future<Output = Heard> + Send;

    /// Sends a keepalive: a WebSocket ping, or a stream's comment or `ping` push.
    fn keepalive(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send;

    /// Sends a ping carrying `payload`, whose pong comes back as [`Heard::Pong`]; nothing
    /// where the client cannot answer one (a stream).
    fn ping(
        &mut self,
        payload: [u8; 8],
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send {
        let _ = (payload, timeout);
        std::future::ready(Ok(()))
    }

    /// How often this connection's client asked to hear a keepalive (a stream's `ping=`),
    /// if it did; otherwise `client.ping_interval`.
    fn ping_interval(&self) -> Option<Duration> {
        None
    }

    /// Whether the client counts on a keepalive every period even while it talks (its
    /// protocol's own ping, which it answers); otherwise one goes only on a quiet connection.
    fn pings_regularly(&self) -> bool {
        false
    }

    /// How long the client has been silent, for a transport whose client answers
    /// keepalives (WebSocket: pongs): past `client.idle_timeout` it is taken for gone (3005).
    /// `None` where silence means nothing (a stream's client sends nothing on it).
    fn silent_for(&self) -> Option<Duration> {
        None
    }

    /// The connection is about to wait with everything written: the hub may write to the
    /// socket directly until it wakes, if the socket allows it for `session`.
    fn idle(&self, _session: &Session) {}

    /// Most bytes the connection may carry, and when it must end, before the client is
    /// asked to reopen it (the forever frame: a document grows for as long as it is open).
    fn bounds(&self) -> (usize, Option<Instant>) {
        (usize::MAX, None)
    }

    /// Whether this is one request of a client that polls, held by [`super::hold`]: it
    /// goes back as soon as it has an answer ([`Wire::answered`]), or when its hold (the
    /// deadline of [`Wire::bounds`]) is over, and its session lives on.
    fn is_request(&self) -> bool {
        false
    }

    /// A request's wire: whether it holds something to answer.
    fn answered(&self) -> bool {
        false
    }

    /// Tells the client why the connection ends (`None`: it left, or cannot be written to)
    /// and closes it: true when the connection is left clean for another request.
    fn farewell(self, ended: Option<Disconnect>) -> impl Future<Output = bool> + Send;
}

/// How long the last word to a client may take to go out.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);
