//! The connection driver: one loop for every transport, whether it holds a connection
//! open (WebSocket, SSE, HTTP streaming, the forever frame: [`drive`]) or answers requests
//! (the long-polls, Herald's and the Phoenix front's: [`hold`], one request at a time). It
//! owns what they share: waiting on shutdown, the delivery queue, token expiry, keepalives
//! and idleness, the client's commands, the write deadline and the code it ends with, the
//! last word to the client, and the call that ends the session. A transport only says how
//! its bytes are framed and written, and what its client sends on the connection itself
//! ([`Wire`]); a protocol, how it reads and writes over the session ([`Speaker`]).
//!
//! So the same thing ends the same way everywhere: a client that stops reading is cut as
//! slow (3003), a broken write is 3004, shutdown is 3001, an expired token 3504, a client
//! that answers no keepalive 3005 (WebSocket only: streams carry nothing from the client),
//! and each is counted and told to the backend once (`tests/it/behaviour.rs` checks it
//! transport by transport).

mod speaker;
mod wire;

use std::{future::Future, time::Duration};

use futures_util::FutureExt;
use herald_protocol::DisconnectCode;
use tokio::time::Instant;

use super::MAX_BATCH_BYTES;
use crate::{
    error::Disconnect,
    node::Node,
    queue::Command,
    session::{ExpiryTimer, Session},
};
pub use speaker::Speaker;
pub use wire::{Heard, Unwritten, Wire, CLOSE_GRACE};

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

/// Runs a connection whose session is open until it ends, and ends the session (the queue
/// detached, the end counted and told to the backend); `opened` is how opening its channels
/// went (a stream opens them first). Returns what the client is to be told, `None` when it
/// left or cannot be written to: the caller drops the session (and its subscriptions),
/// then says it with [`Wire::farewell`].
///
/// The session and the wire are borrowed, not moved in: a future keeps its arguments in
/// its own state, so the caller's and the driver's would both hold a whole session for
/// every idle connection (0.8 KB more per connection when they were moved).
///
/// A plain function over the loop's future, not an `async fn` around it: that would keep
/// its arguments a second time in every connection's task.
pub fn drive<'a, S: Speaker, W: Wire>(
    node: &'a Node,
    speaker: &'a mut S,
    wire: &'a mut W,
    opened: Result<(), Disconnect>,
    written: usize,
) -> impl Future<Output = Option<Disconnect>> + Send + 'a {
    run(node, speaker, wire, opened, written).map(|held| match held {
        Held::Ended(told) => told,
        // Only a request is answered (see `Wire::is_request`).
        Held::Answered => None,
    })
}

/// How a request that waits for something to say ([`hold`]) ended.
#[derive(Debug)]
pub enum Held {
    /// It has its answer (what its wire took), or its hold is over with nothing: the
    /// session lives on for the client's next request.
    Answered,
    /// The session ended: its client is to be told why in the answer (`None`: it left).
    Ended(Option<Disconnect>),
}

/// Holds one request of a client that polls (Herald's long-poll, the Phoenix front's)
/// until it has something to answer, under the same loop as every connection: the same
/// shutdown, queue, token expiry and commands, written through `wire` (a
/// [`Wire::is_request`], whose deadline is the end of the hold). A session that ends
/// here is ended as a connection's is.
pub async fn hold<S: Speaker, W: Wire>(node: &Node, speaker: &mut S, wire: &mut W) -> Held {
    debug_assert!(wire.is_request(), "only a request is held");
    run(node, speaker, wire, Ok(()), 0).await
}

/// Ends the session whatever ended it: the hub writes no more, commands still waiting are
/// answered "closed" (their `done` dropped), and the end is counted and told to the
/// backend. Returns what the client is to be told, if it can be.
fn end(session: &mut Session, ended: Option<Stop>) -> Option<Disconnect> {
    session.queue().detach();
    while session.queue().take_command().is_some() {}
    session.ending(ended.as_ref().map(|s| &s.why));
    ended.filter(|s| s.writable).map(|s| s.why)
}

/// The loop under [`drive`] and [`hold`].
///
/// A plain function over an `async move` block, not an `async fn`: an async fn moves its
/// arguments into locals of its own beside the ones it was called with, 64 bytes twice
/// in every connection's task.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn run<'a, S: Speaker, W: Wire>(
    node: &'a Node,
    speaker: &'a mut S,
    wire: &'a mut W,
    mut opened: Result<(), Disconnect>,
    mut written: usize,
) -> impl Future<Output = Held> + 'a {
    async move {
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
                let woke = if expiry.due() {
                    Woke::Expiry
                } else {
                    tokio::select! {
                    biased;
                    _ = node.shutdown.cancelled() => Woke::Shutdown,
                    heard = wire.heard() => Woke::Heard(heard),
                    _ = expiry.wait() => Woke::Expiry,
                    _ = speaker.session().queue().ready() => Woke::Queue,
                    () = &mut timer => match deadline {
                        // A request's hold is over: it is answered with what it has.
                        Some(d) if Instant::now() >= d && wire.is_request() => return Held::Answered,
                        Some(d) if Instant::now() >= d => Woke::Deadline,
                        _ => Woke::Keepalive,
                    },
                    }
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
                            Some(silent) if silent >= client.idle_timeout => {
                                Err(Disconnect::because(
                                    DisconnectCode::Stale,
                                    format!("nothing received for {:?}", client.idle_timeout),
                                )
                                .into())
                            }
                            // The client spoke within the period (its own pings, commands): it
                            // is alive and the line carried traffic; a ping adds nothing. (The
                            // SDK pings a quiet WebSocket every 9 s, since a page never sees
                            // the server's pings: this keeps that from doubling them.)
                            Some(silent) if silent < ping_every && !wire.pings_regularly() => {
                                Ok(())
                            }
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
            // A request goes back with its answer as soon as it has one.
            if wire.answered() {
                return Held::Answered;
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
        Held::Ended(end(speaker.session_mut(), ended))
    }
}

/// Obeys the commands waiting for a request's session while no request holds it (a
/// Phoenix long-poll's `POST` while no `GET` waits): their replies go through `wire`, as
/// a held request's would. A command that ends the session ends it here, as on a
/// connection, and its reason is returned.
pub async fn obey_waiting<S: Speaker, W: Wire>(
    speaker: &mut S,
    wire: &mut W,
) -> Result<(), Disconnect> {
    let mut written = 0;
    while let Some(command) = speaker.session().queue().take_command() {
        if let Err(stop) = obey(speaker, wire, command, (&mut written, CLOSE_GRACE)).await {
            let why = stop.why.clone();
            end(speaker.session_mut(), Some(stop));
            return Err(why);
        }
    }
    Ok(())
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
