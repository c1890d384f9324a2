//! The connection driver: one loop for every transport that holds a connection open
//! (WebSocket, SSE, HTTP streaming, the forever frame). It owns what they share: waiting on
//! shutdown, the delivery queue, token expiry, keepalives and idleness, the client's
//! commands, the write deadline and the code it ends with, the last word to the client, and
//! the call that ends the session. A transport only says how its bytes are framed and
//! written, and what its client sends on the connection itself ([`Wire`]).
//!
//! So the same thing ends the same way everywhere: a client that stops reading is cut as
//! slow (3003), a broken write is 3004, shutdown is 3001, an expired token 3504, a client
//! that answers no keepalive 3005 (WebSocket only: streams carry nothing from the client),
//! and each is counted and told to the backend once (`tests/it/behaviour.rs` checks it
//! transport by transport).

use std::{future::Future, time::Duration};

use herald_protocol::DisconnectCode;
use tokio::time::Instant;

use super::MAX_BATCH_BYTES;
use crate::{
    error::Disconnect,
    node::Node,
    queue::{Command, Delivery},
    session::{ExpiryTimer, Positions, Session},
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

/// Why the driver stops: the end, and whether the client can still be told it.
#[derive(Debug, Clone)]
struct Stop {
    why: Disconnect,
    writable: bool,
}

impl From<Disconnect> for Stop {
    fn from(why: Disconnect) -> Self {
        Stop {
            why,
            writable: true,
        }
    }
}

impl From<Unwritten> for Stop {
    fn from(u: Unwritten) -> Self {
        Stop {
            why: u.disconnect(),
            writable: false,
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

    /// Tells the client why the connection ends (`None`: it left, or cannot be written to)
    /// and closes it: true when the connection is left clean for another request.
    fn farewell(self, ended: Option<Disconnect>) -> impl Future<Output = bool> + Send;
}

/// How long the last word to a client may take to go out.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The protocol a connection speaks over its session: Herald's own (the [`Session`]
/// itself), or a front's (Pusher's), which reads the client's frames its own way and
/// writes publications in its own words, over the same session, hub and queue.
pub trait Speaker: Send {
    /// The session under it.
    fn session(&self) -> &Session;

    /// The session under it, to change.
    fn session_mut(&mut self) -> &mut Session;

    /// Handles what a client sent (see [`Session::handle_frame_until`]): answers go to
    /// `out`, one per line; returns the part of the frame not handled yet.
    fn handle<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> impl Future<Output = Result<&'f [u8], Disconnect>> + Send;

    /// Takes queued publications, as [`Session::drain`] does, in this protocol's words:
    /// each with the delivery it carries, when its words are the ones the connection's
    /// [`Framing`](super::websocket::Framing) gives that delivery (so the same frame serves).
    fn drain(
        &mut self,
        max_bytes: usize,
        emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect>;

    /// Ends what the client's tokens no longer grant, for every transport alike (the
    /// driver's connections and the polls): `Err` when the connection's own token expired
    /// (3504, unless the refresh hook extends it); otherwise what to tell the client of the
    /// subscriptions that ended, in this protocol's words, one message each.
    fn expire(&mut self) -> impl Future<Output = Result<Vec<Vec<u8>>, Disconnect>> + Send;

    /// Something was written: the payload of a ping to send now, when the speaker wants
    /// the client to confirm it read everything so far (see [`Speaker::confirmed`]).
    fn confirm_writes(&mut self) -> Option<[u8; 8]> {
        None
    }

    /// The client answered the ping that carried `payload`.
    fn confirmed(&mut self, payload: &[u8]) {
        let _ = payload;
    }
}

impl Speaker for Session {
    fn session(&self) -> &Session {
        self
    }

    fn session_mut(&mut self) -> &mut Session {
        self
    }

    fn handle<'f>(
        &mut self,
        frame: &'f [u8],
        out: &mut Vec<u8>,
        flush_at: usize,
    ) -> impl Future<Output = Result<&'f [u8], Disconnect>> + Send {
        self.handle_frame_until(frame, out, flush_at)
    }

    fn drain(
        &mut self,
        max_bytes: usize,
        emit: impl FnMut(&[u8], Option<&Delivery>, Positions<'_>),
    ) -> Result<(), Disconnect> {
        Session::drain(self, max_bytes, emit)
    }

    fn expire(&mut self) -> impl Future<Output = Result<Vec<Vec<u8>>, Disconnect>> + Send {
        Session::expire(self)
    }
}

/// Runs a connection whose session is open until it ends, and ends the session (the queue
/// detached, the end counted and told to the backend); `opened` is how opening its channels
/// went (a stream opens them first). Returns what the client is to be told, `None` when it
/// left or cannot be written to: the caller drops the session (and its subscriptions),
/// then says it with [`Wire::farewell`].
///
/// The session and the wire are borrowed, not moved in: a future keeps its arguments in
/// its own state, so the caller's and the driver's would both hold a whole session for
/// every idle connection (0.8 KB more per connection when they were moved).
pub async fn drive<S: Speaker, W: Wire>(
    node: &Node,
    speaker: &mut S,
    wire: &mut W,
    mut opened: Result<(), Disconnect>,
    mut written: usize,
) -> Option<Disconnect> {
    let client = &node.settings.config.client;
    let (max_bytes, deadline) = wire.bounds();
    // One timer, in place, for the next keepalive or the deadline, whichever comes first
    // (an `Interval` boxes a timer of its own): every idle connection carries one.
    let wake_at = |ping: Instant| deadline.map_or(ping, |d| d.min(ping));
    let ping_every = wire.ping_interval().unwrap_or(client.ping_interval);
    let timer = tokio::time::sleep_until(wake_at(Instant::now() + ping_every));
    tokio::pin!(timer);
    let mut expiry = ExpiryTimer::default();

    // Why the connection ends; None: the client left.
    let ended: Option<Stop> = loop {
        let written_before = written;
        if let Err(d) = std::mem::replace(&mut opened, Ok(())) {
            break Some(d.into());
        }
        expiry.follow(speaker.session());
        // Everything is written: the hub may write publications itself until something
        // wakes the connection (unless something arrived meanwhile; then `ready` is at once).
        wire.idle(speaker.session());
        speaker.session().queue().release();
        let mut bytes = Vec::new();
        // In a block of its own, so that what woke the connection takes no room in the
        // task while it writes (nor while it waits: most of its life).
        let step: Result<(), Stop> = {
            let woke = tokio::select! {
                biased;
                _ = node.shutdown.cancelled() => Woke::Shutdown,
                heard = wire.heard() => Woke::Heard(heard),
                _ = expiry.wait() => Woke::Expiry,
                _ = speaker.session().queue().ready() => Woke::Queue,
                () = &mut timer => match deadline {
                    Some(d) if Instant::now() >= d => Woke::Deadline,
                    _ => Woke::Keepalive,
                },
            };
            // From here the connection writes: the hub queues until the next `release`, so
            // that replies and queued publications keep their order.
            speaker.session().queue().hold();
            match woke {
                Woke::Shutdown => Err(Disconnect::new(DisconnectCode::Shutdown).into()),
                Woke::Heard(Heard::Left) => break None,
                Woke::Heard(Heard::Closed) => {
                    speaker.session_mut().left_on_purpose();
                    break None;
                }
                Woke::Heard(Heard::Refused(d)) => Err(d.into()),
                Woke::Heard(Heard::Alive) => Ok(()),
                Woke::Heard(Heard::Pong(payload)) => {
                    speaker.confirmed(&payload);
                    Ok(())
                }
                // Boxed, as every rare step: a waiting connection's task is as large as its
                // largest step, and most of its life is spent waiting. (Each in a statement
                // of its own: a temporary lives to the end of its statement, and one that
                // spans an await takes room in the task.) The frame moves into the box.
                Woke::Heard(Heard::Frame(frame)) => {
                    let obeying = Box::pin(obey(
                        speaker,
                        wire,
                        Command::unanswered(frame),
                        (&mut written, client.write_timeout),
                    ));
                    obeying.await
                }
                Woke::Expiry => {
                    let expiring = Box::pin(speaker.expire());
                    let expired = expiring.await;
                    expired
                        .map(|pushes| {
                            for push in pushes {
                                let at = speaker.session().positions();
                                wire.push(&push, None, at, &mut bytes);
                            }
                        })
                        .map_err(Stop::from)
                }
                Woke::Queue => match speaker.session().queue().take_command() {
                    Some(command) => {
                        let obeying = Box::pin(obey(
                            speaker,
                            wire,
                            command,
                            (&mut written, client.write_timeout),
                        ));
                        obeying.await
                    }
                    None => Ok(()),
                },
                Woke::Keepalive => {
                    timer.as_mut().reset(wake_at(Instant::now() + ping_every));
                    match wire.silent_for() {
                        Some(silent) if silent >= client.idle_timeout => Err(Disconnect::because(
                            DisconnectCode::Stale,
                            format!("nothing received for {:?}", client.idle_timeout),
                        )
                        .into()),
                        // The client spoke within the period (its own pings, commands): it
                        // is alive and the line carried traffic; a ping adds nothing. (The
                        // SDK pings a quiet WebSocket every 9 s, since a page never sees
                        // the server's pings: this keeps that from doubling them.)
                        Some(silent) if silent < ping_every && !wire.pings_regularly() => Ok(()),
                        _ => {
                            let pinging = Box::pin(wire.keepalive(client.write_timeout));
                            pinging.await.map_err(Stop::from)
                        }
                    }
                }
                Woke::Deadline => Err(Disconnect::because(
                    DisconnectCode::ForceReconnect,
                    "stream reached its maximum lifetime; reopen it",
                )
                .into()),
            }
        };
        // Replies first, then whatever publications are queued, in writes of bounded size.
        let step = step.and_then(|()| {
            speaker
                .drain(MAX_BATCH_BYTES, |json, d, at| {
                    wire.push(json, d, at, &mut bytes)
                })
                .map_err(Stop::from)
        });
        written += bytes.len();
        if let Err(u) = wire.send(bytes, client.write_timeout).await {
            break Some(u.into());
        }
        if let Err(stop) = step {
            break Some(stop);
        }
        if written > written_before {
            if let Some(payload) = speaker.confirm_writes() {
                let pinging = Box::pin(wire.ping(payload, client.write_timeout));
                if let Err(u) = pinging.await {
                    break Some(u.into());
                }
            }
        }
        if written >= max_bytes {
            break Some(
                Disconnect::because(
                    DisconnectCode::ForceReconnect,
                    "stream reached its size limit; reopen it",
                )
                .into(),
            );
        }
    };
    // The hub writes no more, whatever the end; commands still waiting are answered
    // "closed" (their `done` dropped).
    let session = speaker.session_mut();
    session.queue().detach();
    while session.queue().take_command().is_some() {}
    session.ending(ended.as_ref().map(|s| &s.why));
    ended.filter(|s| s.writable).map(|s| s.why)
}

/// What woke a waiting connection.
enum Woke {
    Shutdown,
    Heard(Heard),
    Expiry,
    Queue,
    Keepalive,
    Deadline,
}

/// Handles a frame of commands, sending replies in pieces of about [`MAX_BATCH_BYTES`] as
/// they are made, each waiting for the client: a frame full of history reads is never
/// answered (or held) whole. A command posted from elsewhere is told how it went.
async fn obey<S: Speaker, W: Wire>(
    speaker: &mut S,
    wire: &mut W,
    Command { frame, done }: Command,
    (written, write_timeout): (&mut usize, Duration),
) -> Result<(), Stop> {
    let mut rest = &frame[..];
    let obeyed = loop {
        let mut replies = Vec::new();
        let step = speaker.handle(rest, &mut replies, MAX_BATCH_BYTES).await;
        let mut bytes = Vec::new();
        // The replies one by one, as the session's codec joined them (a line each in
        // JSON, each with its length in Protobuf).
        let codec = speaker.session().codec();
        let mut joined = &replies[..];
        while !joined.is_empty() {
            let (reply, after) = codec.split(joined);
            joined = after;
            if !reply.is_empty() {
                wire.push(reply, None, speaker.session().positions(), &mut bytes);
            }
        }
        *written += bytes.len();
        if let Err(u) = wire.send(bytes, write_timeout).await {
            break Err(Stop::from(u));
        }
        match step {
            Ok(more) if !more.is_empty() => rest = more,
            Ok(_) => break Ok(()),
            Err(d) => break Err(Stop::from(d)),
        }
    };
    if let Some(done) = done {
        let _ = done.send(obeyed.clone().map_err(|s| s.why));
    }
    obeyed
}
