//! Runs an accepted stream: its replays, then the connection driver (publications, command
//! replies, keepalives, the last push), written through an [`Out`] (the socket itself, or
//! hyper's body) in the stream's [`Framing`].

use std::{future::Future, time::Duration};

use bytes::Bytes;
use herald_protocol::Push;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{Accepted, Framing};
use crate::{
    error::Disconnect,
    session::{Positions, Session},
    transport::driver::{self, Heard, Unwritten, Wire, CLOSE_GRACE},
};

/// Where a stream's bytes go: straight to its socket ([`crate::transport::http1`]), or into hyper's
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

/// Runs an accepted stream until it ends: the replays of the channels it opens, then the
/// driver. True when it ended with its last push written, false when the client left or
/// stopped reading.
pub async fn run(accepted: Box<Accepted>, out: &mut impl Out) -> bool {
    let Accepted {
        admitted: _admitted,
        node,
        mut session,
        channels,
        takes,
        framing,
        first,
        ping,
    } = *accepted;
    let http = &node.settings.config.http;
    // Only forever frames have bounds (a document's size and age).
    let bounds = match framing {
        Framing::Iframe { .. } => (
            http.iframe_max_bytes,
            Some(Instant::now() + http.iframe_max_lifetime),
        ),
        _ => (usize::MAX, None),
    };
    // Made first, in place: a local moved into another keeps its room in the task.
    let mut wire = StreamWire {
        out,
        framing,
        bounds,
        ping,
    };
    let client = &node.settings.config.client;
    let mut written = first.len();
    session.announce();
    if let Err(u) = wire.out.send(first, client.write_timeout).await {
        session.ending(Some(&u.disconnect()));
        return false;
    }

    // Each channel's replay goes out before the next is read: what is held at once is one
    // replay (at most `max_history_bytes`).
    let mut opened = Ok(());
    for (channel, since) in channels {
        let mut bytes = Vec::new();
        // Boxed, as every rare step: a waiting stream's task is as large as its largest
        // step, and most of its life is spent waiting.
        let framing = &wire.framing;
        let opening = Box::pin(
            session.open_channel(channel.clone(), since, takes, |json, at| {
                framing.push_at(json, at, &mut bytes)
            }),
        );
        let replayed = opening.await;
        written += bytes.len();
        if let Err(u) = wire.out.send(bytes, client.write_timeout).await {
            session.ending(Some(&u.disconnect()));
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
    let told = driver::drive(&node, &mut session, &mut wire, opened, written).await;
    drop(session);
    // Boxed: only a closing stream needs its space.
    Box::pin(wire.farewell(told)).await
}

/// A stream as the driver sees it.
struct StreamWire<'o, O> {
    out: &'o mut O,
    framing: Framing,
    bounds: (usize, Option<Instant>),
    ping: Duration,
}

impl<O: Out> Wire for StreamWire<'_, O> {
    fn push(
        &mut self,
        json: &[u8],
        _delivery: Option<&crate::queue::Delivery>,
        at: Positions<'_>,
        out: &mut Vec<u8>,
    ) {
        self.framing.push_at(json, at, out);
    }

    async fn send(&mut self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Unwritten> {
        self.out.send(bytes, timeout).await
    }

    async fn heard(&mut self) -> Heard {
        // Nothing comes on the stream itself: commands are posted (`POST /connection/send`)
        // and reach the driver through the session's queue.
        self.out.gone().await;
        Heard::Left
    }

    fn ping_interval(&self) -> Option<Duration> {
        Some(self.ping)
    }

    async fn keepalive(&mut self, timeout: Duration) -> Result<(), Unwritten> {
        let mut bytes = Vec::new();
        self.framing.keepalive(&mut bytes);
        self.out.send(bytes, timeout).await
    }

    fn idle(&self, session: &Session) {
        self.out.idle(session);
    }

    fn bounds(&self) -> (usize, Option<Instant>) {
        self.bounds
    }

    async fn farewell(self, ended: Option<Disconnect>) -> bool {
        let Some(d) = ended else {
            return false;
        };
        let mut bytes = Vec::new();
        let push = self.framing.encoding().codec().push(&Push::Disconnect {
            code: d.wire_code(),
            reason: d.short_reason(),
        });
        self.framing.push(&push, None, &mut bytes);
        self.framing.epilogue(&mut bytes);
        self.out.send(bytes, CLOSE_GRACE).await.is_ok()
    }
}
