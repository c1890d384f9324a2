//! Runs an accepted stream: its replays, then publications, command replies and keepalives,
//! until it ends, written through an [`Out`] (the socket itself, or hyper's body).

use std::{future::Future, time::Duration};

use bytes::Bytes;
use herald_protocol::{json, DisconnectCode};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{Accepted, Framing};
use crate::{
    error::Disconnect,
    queue::Command,
    session::{ExpiryTimer, Session},
    transport::MAX_BATCH_BYTES,
};

/// Where a stream's bytes go: straight to its socket ([`super::http1`]), or into hyper's
/// response body.
pub trait Out: Send {
    /// Writes `bytes` whole, waiting at most `timeout` for the client to take them; why
    /// not, once the stream is over.
    fn send(
        &mut self,
        bytes: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Unwritten>> + Send;
    /// Resolves when the client has left.
    fn gone(&mut self) -> impl Future<Output = ()> + Send;
    /// The stream is about to wait with everything written: the hub may write to the
    /// socket directly until it wakes, if the socket allows it for `session`.
    fn idle(&self, _session: &Session) {}
}

/// Why a stream's write did not go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwritten {
    /// The client left, or its connection broke.
    Gone,
    /// The client read nothing for the write timeout: it is cut as a slow consumer (3003),
    /// as on every transport.
    Slow,
}

impl Unwritten {
    /// How the stream's end is recorded: a client that left says nothing; one that stopped
    /// reading is a slow consumer.
    fn ending(self) -> Option<Disconnect> {
        match self {
            Unwritten::Gone => None,
            Unwritten::Slow => Some(crate::transport::write_timed_out()),
        }
    }
}

/// hyper's response body, fed through a channel of one chunk.
pub(super) struct ToBody {
    pub(super) tx: mpsc::Sender<Bytes>,
    pub(super) abort: CancellationToken,
}

impl Out for ToBody {
    async fn send(&mut self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Unwritten> {
        if bytes.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout(timeout, self.tx.send(Bytes::from(bytes))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Unwritten::Gone),
            Err(_) => {
                // Fails the body, so that hyper drops the connection.
                self.abort.cancel();
                Err(Unwritten::Slow)
            }
        }
    }

    async fn gone(&mut self) {
        self.tx.closed().await;
    }
}

/// Runs an accepted stream until it ends: the replays of the channels it opens, then
/// publications, replies to the commands its client sends with `POST /connection/send`,
/// keepalives, and the push that says why it ended (unless the client left). True when it
/// ended with that push written, false when the client left or stopped reading.
pub async fn run(accepted: Box<Accepted>, out: &mut impl Out) -> bool {
    let Accepted {
        admitted: _admitted,
        node,
        mut session,
        channels,
        framing,
        first,
    } = *accepted;
    let client = &node.settings.config.client;
    let http = &node.settings.config.http;
    // Only forever frames have limits (a document's size and age).
    let (max_bytes, deadline) = match framing {
        Framing::Iframe { .. } => (
            http.iframe_max_bytes,
            Some(Instant::now() + http.iframe_max_lifetime),
        ),
        _ => (usize::MAX, None),
    };
    // One timer, in place, for the next keepalive or the deadline, whichever comes first
    // (an `Interval` boxes a timer of its own): every idle stream carries one.
    let wake_at = |ping: Instant| deadline.map_or(ping, |d| d.min(ping));
    let timer = tokio::time::sleep_until(wake_at(Instant::now() + client.ping_interval));
    tokio::pin!(timer);
    let mut expiry = ExpiryTimer::default();
    let mut written = first.len();
    session.announce();
    if let Err(u) = out.send(first, client.write_timeout).await {
        session.ending(u.ending().as_ref());
        return false;
    }

    // Each channel's replay goes out before the next is read: what is held at once is one
    // replay (at most `max_history_bytes`).
    let mut opened = Ok(());
    for (channel, since) in channels {
        let mut bytes = Vec::new();
        // Boxed, as every rare step: a waiting stream's task is as large as its largest
        // step, and most of its life is spent waiting. (Each in a statement of its own: a
        // temporary lives to the end of its statement, and one that spans an await takes
        // room in the task.)
        let opening = Box::pin(session.open_channel(channel.clone(), since, |json, at| {
            framing.push_at(json, at, &mut bytes)
        }));
        let replayed = opening.await;
        written += bytes.len();
        if let Err(u) = out.send(bytes, client.write_timeout).await {
            session.ending(u.ending().as_ref());
            return false;
        }
        if let Err(f) = replayed {
            let ending = f.disconnect();
            opened = Err(Disconnect::because(
                ending.code,
                format!("could not open {channel}: {}", ending.reason),
            ));
            break;
        }
    }
    // Ok: why the server ends it, told to the client; Err: the client left (`None`) or
    // stopped reading, which cannot be told.
    let ended: Result<Disconnect, Option<Disconnect>> = loop {
        if let Err(d) = std::mem::replace(&mut opened, Ok(())) {
            break Ok(d);
        }
        let mut bytes = Vec::new();
        expiry.follow(&session);
        // Everything is written: the hub may write publications itself until something
        // wakes the stream (unless something arrived meanwhile; then `ready` is at once).
        out.idle(&session);
        session.queue().release();
        let woke = tokio::select! {
            biased;
            _ = node.shutdown.cancelled() => Woke::Shutdown,
            () = out.gone() => Woke::Gone,
            _ = expiry.wait() => Woke::Expiry,
            _ = session.queue().ready() => Woke::Queue,
            () = &mut timer => match deadline {
                Some(d) if Instant::now() >= d => Woke::Deadline,
                _ => Woke::Ping,
            },
        };
        // From here the stream writes: the hub queues until the next `release`, so that
        // replies and queued publications keep their order.
        session.queue().hold();
        let step: Result<(), Disconnect> = match woke {
            Woke::Shutdown => Err(Disconnect::new(DisconnectCode::Shutdown)),
            Woke::Gone => break Err(None),
            Woke::Expiry => {
                let expiring = Box::pin(session.expire());
                let expired = expiring.await;
                expired.map(|pushes| {
                    for push in pushes {
                        framing.push_at(&push, session.positions(), &mut bytes);
                    }
                })
            }
            Woke::Queue => match session.queue().take_command() {
                Some(command) => {
                    let obeying = Box::pin(obey(
                        &mut session,
                        &framing,
                        command,
                        out,
                        (&mut written, client.write_timeout),
                    ));
                    obeying.await
                }
                None => Ok(()),
            },
            Woke::Ping => {
                timer
                    .as_mut()
                    .reset(wake_at(Instant::now() + client.ping_interval));
                framing.keepalive(&mut bytes);
                Ok(())
            }
            Woke::Deadline => Err(Disconnect::because(
                DisconnectCode::ForceReconnect,
                "stream reached its maximum lifetime; reopen it",
            )),
        };
        let step = step.and_then(|()| {
            session.drain(MAX_BATCH_BYTES, |json, at| {
                framing.push_at(json, at, &mut bytes)
            })
        });
        written += bytes.len();
        if let Err(u) = out.send(bytes, client.write_timeout).await {
            break Err(u.ending());
        }
        if let Err(d) = step {
            break Ok(d);
        }
        if written >= max_bytes {
            break Ok(Disconnect::because(
                DisconnectCode::ForceReconnect,
                "stream reached its size limit; reopen it",
            ));
        }
    };
    // The hub writes no more, whatever the stream's end; sends still waiting are answered
    // "closed" (their `done` dropped).
    session.queue().detach();
    while session.queue().take_command().is_some() {}
    let d = match ended {
        Ok(d) => d,
        Err(unwritten) => {
            session.ending(unwritten.as_ref());
            return false;
        }
    };
    session.ending(Some(&d));
    let mut bytes = Vec::new();
    framing.push(
        &json::encode_disconnect(d.wire_code(), d.short_reason()),
        None,
        &mut bytes,
    );
    framing.epilogue(&mut bytes);
    out.send(bytes, CLOSE_GRACE).await.is_ok()
}

/// What woke a waiting stream.
enum Woke {
    Shutdown,
    Gone,
    Expiry,
    Queue,
    Ping,
    Deadline,
}

/// How long the push that ends a stream may take to go out.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Handles a frame of commands sent with `POST /connection/send`: replies go out in
/// pieces as they are made, each waiting for the client; the last piece stays for the
/// caller to send with what the queue holds.
async fn obey(
    session: &mut Session,
    framing: &Framing,
    Command { frame, done }: Command,
    out: &mut impl Out,
    (written, write_timeout): (&mut usize, Duration),
) -> Result<(), Disconnect> {
    let mut rest = &frame[..];
    let mut bytes = Vec::new();
    let handled = loop {
        let mut replies = Vec::new();
        let step = session
            .handle_frame_until(rest, &mut replies, MAX_BATCH_BYTES)
            .await;
        for reply in replies.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            framing.push_at(reply, session.positions(), &mut bytes);
        }
        *written += bytes.len();
        if let Err(u) = out.send(std::mem::take(&mut bytes), write_timeout).await {
            break Err(u
                .ending()
                .unwrap_or(Disconnect::new(DisconnectCode::WriteError)));
        }
        match step {
            Ok(more) if !more.is_empty() => rest = more,
            Ok(_) => break Ok(()),
            Err(d) => break Err(d),
        }
    };
    let _ = done.send(handled.clone());
    handled
}
