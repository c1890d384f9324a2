//! WebSocket transport (RFC 6455, with RFC 7692's permessage-deflate): JSON text frames,
//! several commands or pushes per frame, one line each, or (subprotocol `herald.protobuf`)
//! binary frames of length-delimited Protobuf messages. Publications usually skip the
//! connection's task: the hub writes them straight to the socket while the task is idle
//! (see [`crate::queue`]), compressed once per publication for every connection that
//! negotiated deflate. The frames are Herald's own ([`frames`]: tungstenite reads no
//! compressed frame).

pub mod deflate;
pub mod frames;
mod upgrade;
mod wire;

use std::{future::Future, time::Duration};

use herald_protocol::{DisconnectCode, Encoding};
use tokio::{net::TcpStream, time::Instant};

pub use upgrade::{accept, offers, upgrade, Upgraded};
pub use wire::{Framing, HeraldFrames, HeraldProtobufFrames};

use super::driver::{self, Heard, Unwritten, Wire, CLOSE_GRACE};
use crate::{
    error::Disconnect,
    hooks::Transport,
    limits::{Bucket, Rate},
    node::Node,
    queue::Delivery,
    session::{Positions, Session},
};
use frames::{opcode, Incoming, Reader, Violation};
use wire::Io;

/// The subprotocol of the JSON codec. Clients may also offer no subprotocol at all.
pub const JSON_SUBPROTOCOL: &str = "herald.json";

/// The subprotocol of the Protobuf codec (`proto/herald.proto`): binary messages.
pub const PROTOBUF_SUBPROTOCOL: &str = "herald.protobuf";

fn run(up: Upgraded) -> impl Future<Output = ()> + Send {
    serve(up, Transport::Websocket, Encoding::Json, HeraldFrames)
}

fn run_protobuf(up: Upgraded) -> impl Future<Output = ()> + Send {
    let encoding = Encoding::Protobuf;
    serve(up, Transport::Websocket, encoding, HeraldProtobufFrames)
}

/// Runs an upgraded connection's session of Herald's protocol, speaking `encoding` (Herald's
/// JSON, or a front's codec over the same session) framed by `framing`, until it ends.
///
/// Not an async fn: one keeps its arguments in its task for as long as it runs, beside
/// what was made of them. The session and the socket are made here, and the future holds
/// only them (and no wrapper may await it inside an async fn of its own, for the same
/// reason: each idle connection's task is as large as everything it holds).
pub fn serve<F: Framing>(
    up: Upgraded,
    transport: Transport,
    encoding: Encoding,
    framing: F,
) -> impl Future<Output = ()> + Send {
    let Upgraded {
        stream,
        early,
        node,
        address,
        facts,
        deflate,
    } = up;
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(transport, facts)
        .speaking(encoding);
    let mut wire = WebSocket::open(stream, early, deflate, &session, &node, framing);
    async move {
        let told = driver::drive(&node, &mut session, &mut wire, Ok(()), 0).await;
        // Free the session (and its subscriptions) now; the closing handshake is only
        // manners.
        drop(session);
        // Boxed: only a closing connection needs its space.
        Box::pin(wire.farewell(told)).await;
    }
}

/// A WebSocket connection as the driver sees it: pushes are lines of text frames (or a
/// message each, as its [`Framing`] says), and the client's frames are commands.
pub struct WebSocket<F> {
    io: Io<F>,
    /// What the client sent and the reader has not taken yet.
    unread: Vec<u8>,
    reader: Reader,
    /// What inflating its compressed messages may still cost (made at the first one):
    /// bytes, at [`inflate_rate`].
    inflating: Option<Box<Bucket>>,
    /// How long a fragmented message may take to finish (`http.body_timeout`).
    unfinished_within: Duration,
    /// The session's id, for the log line of its close.
    session: u64,
    /// When the client last sent anything (a pong counts).
    last_heard: Instant,
    /// On a compressed connection, what the task has not framed yet: joined pushes, or
    /// (`pieces`) the compressed pieces of publications queued together.
    pending: Vec<u8>,
    pieces: bool,
    /// A push was not UTF-8 (a defect): the next send ends the connection.
    broken: bool,
}

/// Room read at once when the next frame's size is not known yet.
const READ_CHUNK: usize = 512;

impl<F: Framing> WebSocket<F> {
    /// The WebSocket over an upgraded `stream` (`early`: what the client sent after its
    /// upgrade request; `deflate`: whether permessage-deflate was negotiated), for
    /// `session`, whose queue's direct lane writes to it framed by `framing`.
    pub fn open(
        stream: TcpStream,
        early: Vec<u8>,
        deflate: bool,
        session: &Session,
        node: &Node,
        framing: F,
    ) -> Self {
        let config = &node.settings.config;
        let compress_from = deflate.then_some(config.websocket.compression_min_size);
        WebSocket {
            // The session's codec: Herald's JSON, whether the client asked for
            // `herald.json` or for no subprotocol, or a front's (whose pushes are joined
            // the same way).
            io: Io::new(
                stream,
                session.queue().clone(),
                framing,
                session.encoding(),
                compress_from,
            ),
            unread: early,
            reader: Reader::new(config.client.max_frame_size, deflate),
            inflating: None,
            unfinished_within: config.http.body_timeout,
            session: session.id(),
            last_heard: Instant::now(),
            pending: Vec::new(),
            pieces: false,
            broken: false,
        }
    }

    /// Whether its codec's messages are binary (Protobuf), not text.
    fn binary(&self) -> bool {
        self.io.encoding().codec().binary()
    }

    /// Sends `json`, one message, outside the driver: a front's greeting, or its refusal.
    pub async fn say(&mut self, json: &[u8], timeout: Duration) -> Result<(), Unwritten> {
        let mut frames = Vec::new();
        self.seal(json, &mut frames)?;
        self.write(&frames, timeout).await
    }

    /// Frames `text`, joined pushes or a front's one push, as a message at the end of
    /// `out`. Frames are built from validated JSON; a defect that broke that
    /// ends the connection rather than sending a text frame no client could read.
    fn seal(&mut self, text: &[u8], out: &mut Vec<u8>) -> Result<(), Unwritten> {
        if text.is_empty() {
            return Ok(());
        }
        if !self.binary() && std::str::from_utf8(text).is_err() {
            tracing::error!(
                session = self.session,
                "internal error: a frame was not UTF-8"
            );
            return Err(Unwritten::Gone);
        }
        // One message: joined pushes, or one push of a framing that gives each its own
        // (whose pushes are framed as they come: see `Wire::push`).
        self.message(text, out);
        Ok(())
    }

    /// The next message or control frame from the client; `Ok(None)` when it is gone.
    /// Cancel-safe: what was read stays in `unread`. Nothing is read while the connection's
    /// inflate budget is in debt (see [`inflate_rate`]), and a fragmented message must be
    /// finished within `http.body_timeout` of its first frame (the client may otherwise
    /// hold a message's bytes for as long as it answers pings).
    ///
    /// Not an async fn (one keeps `self` twice), and the rare waits are boxed (a timer is
    /// 112 bytes): every idle connection's task holds room for the largest of its waits.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    fn next(&mut self) -> impl Future<Output = Result<Option<Incoming>, Violation>> + Send + '_ {
        async move {
            loop {
                let rate = self.rate();
                let debt = self.inflating.as_mut().and_then(|b| b.debt(rate));
                if let Some(wait) = debt {
                    let paying = Box::pin(tokio::time::sleep(wait));
                    paying.await;
                }
                let read = self.reader.read(&mut self.unread);
                if let Some(bytes) = self.reader.take_inflated() {
                    let rate = self.rate();
                    let budget = self
                        .inflating
                        .get_or_insert_with(|| Box::new(Bucket::full(rate)));
                    budget.charge(rate, bytes.max(LEAST_INFLATE_CHARGE) as f64);
                }
                if let Some(incoming) = read? {
                    return Ok(Some(incoming));
                }
                let wants = self.reader.wants(&self.unread).max(READ_CHUNK);
                let read =
                    if let Some(begun) = self.reader.unfinished_since() {
                        let until = Instant::from_std(begun) + self.unfinished_within;
                        let read = self.io.read(&mut self.unread, wants);
                        let finishing = Box::pin(tokio::time::timeout_at(until, read));
                        match finishing.await {
                            Ok(read) => read,
                            Err(_) => return Err(Violation::Protocol(
                                "a fragmented message was not finished within http.body_timeout",
                            )),
                        }
                    } else {
                        self.io.read(&mut self.unread, wants).await
                    };
                match read {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                }
            }
        }
    }

    /// What inflating may cost this connection, per second (see [`inflate_rate`]).
    fn rate(&self) -> Rate {
        inflate_rate(self.reader.limit())
    }

    /// Appends `text` as one message, compressed if the connection negotiated it and the
    /// message is large enough to gain from it.
    fn message(&self, text: &[u8], out: &mut Vec<u8>) {
        let binary = self.binary() || self.io.framing().binary_message(text);
        match self.io.compress_from() {
            Some(min) if text.len() >= min => {
                frames::write_message(out, &deflate::compress(text), true, binary)
            }
            _ => frames::write_message(out, text, false, binary),
        }
    }

    /// Frames what waits in `pending` at the end of `out`: joined lines (as [`Self::seal`]
    /// does), or publications' compressed pieces as one compressed message.
    fn seal_pending(&mut self, out: &mut Vec<u8>) {
        let pending = std::mem::take(&mut self.pending);
        if std::mem::take(&mut self.pieces) {
            frames::write_message(
                out,
                deflate::finish(pending).as_slice(),
                true,
                self.binary(),
            );
        } else if self.seal(&pending, out).is_err() {
            // Not UTF-8: `send` ends the connection.
            self.broken = true;
        }
    }

    /// Answers a ping with a pong, and a close with a close (RFC 6455 §5.5.1: echoing
    /// its code); what the client did, as [`Wire::heard`] tells it.
    async fn answer(&self, incoming: Incoming) -> Heard {
        match incoming {
            Incoming::Ping(payload) => {
                match self.control(opcode::PONG, &payload, CLOSE_GRACE).await {
                    Ok(()) => Heard::Alive,
                    Err(_) => Heard::Left,
                }
            }
            Incoming::Close(said) => {
                let code = said.map(|(code, _)| code);
                let echo = code.map(u16::to_be_bytes);
                let echo = echo.as_ref().map_or(&[][..], |c| &c[..]);
                let _ = self.control(opcode::CLOSE, echo, CLOSE_GRACE).await;
                match code {
                    Some(code) if comes_back(code) => Heard::Left,
                    _ => Heard::Closed,
                }
            }
            // Nothing to answer (`heard` takes these itself).
            Incoming::Text(_) | Incoming::Binary(_) | Incoming::Pong(_) => Heard::Alive,
        }
    }

    /// Writes `bytes` whole, at most `timeout`: a client that does not read is cut off.
    ///
    /// At once where the socket takes them, as it takes most; only a write that must wait
    /// for the socket gets a timer, boxed. Every idle connection's task holds room for
    /// the largest thing its driver awaits, and a wait with its timer inline is 0.3 KB.
    async fn write(&self, bytes: &[u8], timeout: Duration) -> Result<(), Unwritten> {
        match self.io.write_now(bytes) {
            Ok(true) => Ok(()),
            Ok(false) => self.flush(timeout).await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let waiting = Box::pin(within(timeout, self.io.write(bytes)));
                waiting.await
            }
            Err(_) => Err(Unwritten::Gone),
        }
    }

    /// Sends what the socket did not take of earlier writes, at most `timeout` (boxed, as
    /// in [`Self::write`]).
    async fn flush(&self, timeout: Duration) -> Result<(), Unwritten> {
        let waiting = Box::pin(within(timeout, self.io.flush()));
        waiting.await
    }

    /// Sends a control frame.
    async fn control(&self, op: u8, payload: &[u8], timeout: Duration) -> Result<(), Unwritten> {
        let mut frame = Vec::with_capacity(payload.len() + 2);
        frames::write_frame(&mut frame, true, false, op, payload);
        self.write(&frame, timeout).await
    }
}

impl<F: Framing> Wire for WebSocket<F> {
    /// A plain connection joins every push (lines of one message, or a message each) and
    /// frames them when sending. A compressed one writes a publication from the frame made
    /// once for every connection that negotiated deflate (the hub's direct lane writes the
    /// same), so a publication is compressed once whichever path it takes; the rest is
    /// joined in `pending` and compressed on the connection.
    fn push(
        &mut self,
        json: &[u8],
        delivery: Option<&Delivery>,
        _at: Positions<'_>,
        out: &mut Vec<u8>,
    ) {
        if F::MESSAGE_PER_PUSH {
            // A message each, framed now: what the driver counts as written is then what
            // goes out (a front that confirms writes pings after them), and a message that
            // carries bytes (a binary broadcast) is never taken apart at a line break.
            match delivery.and_then(|d| self.io.shared_frame(d, json)) {
                Some(frame) => out.extend_from_slice(frame),
                None if self.io.framing().binary_message(json)
                    || std::str::from_utf8(json).is_ok() =>
                {
                    self.message(json, out)
                }
                None => self.broken = true,
            }
            return;
        }
        if self.io.compress_from().is_none() {
            return self.io.encoding().codec().join(out, json);
        }
        let shared = delivery.and_then(|d| self.io.shared_frame(d, json));
        if let Some(frame) = shared {
            if frame[0] & 0x40 != 0 {
                // Publications queued together still go as one message: their compressed
                // pieces joined (see `deflate::join`), no compression on the connection.
                if !self.pieces {
                    self.seal_pending(out);
                    self.pieces = true;
                }
                deflate::join(&mut self.pending, frames::payload(frame));
            } else {
                self.seal_pending(out);
                out.extend_from_slice(frame);
            }
            return;
        }
        if self.pieces {
            self.seal_pending(out);
        }
        self.io.encoding().codec().join(&mut self.pending, json);
    }

    async fn send(&mut self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Unwritten> {
        if bytes.is_empty() && self.pending.is_empty() {
            // Nothing new: still send the tail of a direct write the socket did not take.
            if self.io.queue().has_unsent() {
                return self.flush(timeout).await;
            }
            return Ok(());
        }
        if F::MESSAGE_PER_PUSH || self.io.compress_from().is_some() {
            // Frames already, and what waits in `pending` after them.
            let mut frames = bytes;
            self.seal_pending(&mut frames);
            if std::mem::take(&mut self.broken) {
                return Err(Unwritten::Gone);
            }
            return self.write(&frames, timeout).await;
        }
        let mut frames = Vec::with_capacity(bytes.len() + 16);
        self.seal(&bytes, &mut frames)?;
        self.write(&frames, timeout).await
    }

    /// Not an async fn (one keeps `self` twice), and the answer to a ping or a close is
    /// boxed with its frame: every waiting connection's task holds this future.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    fn heard(&mut self) -> impl Future<Output = Heard> + Send {
        async move {
            let incoming = match self.next().await {
                Ok(Some(incoming)) => incoming,
                Ok(None) => return Heard::Left,
                Err(v) => return Heard::Refused(refusal(v)),
            };
            self.last_heard = Instant::now();
            match incoming {
                Incoming::Text(frame) | Incoming::Binary(frame) => Heard::Frame(frame),
                Incoming::Pong(payload) if !payload.is_empty() => Heard::Pong(payload),
                Incoming::Pong(_) => Heard::Alive,
                to_answer => {
                    let answering = Box::pin(self.answer(to_answer));
                    answering.await
                }
            }
        }
    }

    async fn keepalive(&mut self, timeout: Duration) -> Result<(), Unwritten> {
        match self.io.framing().app_ping() {
            Some(ping) => self.say(&ping, timeout).await,
            None => self.control(opcode::PING, &[], timeout).await,
        }
    }

    fn pings_regularly(&self) -> bool {
        let framing = self.io.framing();
        framing.app_ping_regularly() && framing.app_ping().is_some()
    }

    async fn ping(&mut self, payload: [u8; 8], timeout: Duration) -> Result<(), Unwritten> {
        self.control(opcode::PING, &payload, timeout).await
    }

    fn silent_for(&self) -> Option<Duration> {
        Some(self.last_heard.elapsed())
    }

    /// Says why and waits briefly for the peer's Close.
    async fn farewell(mut self, ended: Option<Disconnect>) -> bool {
        let Some(d) = ended else {
            return false;
        };
        let (code, reason) = F::close(&d);
        tracing::debug!(session = self.session, code, reason = %d.reason, "websocket closed by server");
        let mut payload = code.to_be_bytes().to_vec();
        payload.extend_from_slice(reason.as_bytes());
        if self
            .control(opcode::CLOSE, &payload, CLOSE_GRACE)
            .await
            .is_err()
        {
            return false;
        }
        // RFC 6455 §7.1.1: wait (briefly) for the peer's Close before dropping TCP, so the
        // peer reads our code instead of a reset.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Ok(Some(m)) = self.next().await {
                if let Incoming::Close(_) = m {
                    break;
                }
            }
        })
        .await;
        true
    }
}

/// Waits for a write, at most `timeout`: a broken one is `Gone`, a late one `Slow`.
async fn within(
    timeout: Duration,
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), Unwritten> {
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Unwritten::Gone),
        Err(_) => Err(Unwritten::Slow),
    }
}

/// Whether a client that closed with `code` says it is coming back: a code in a range that
/// reconnects (3000-3499, 4000-4499: the SDK closes with its own code when it drops a
/// connection to open another, after a missed pong say). Its memberships are then held for the grace, as a dropped
/// connection's; any other close (1000, 1001 a page going away, none) is a client leaving.
fn comes_back(code: u16) -> bool {
    matches!(code, 3000..=3499 | 4000..=4499)
}

/// How a connection whose client broke the rules is closed: oversized messages get 3503
/// (a compressed one that inflates past the limit 1009, RFC 6455's "message too big":
/// its size shows only while inflating), the rest 3501.
fn refusal(v: Violation) -> Disconnect {
    match v {
        Violation::TooLarge { .. } => {
            Disconnect::because(DisconnectCode::MessageTooLarge, v.to_string())
        }
        Violation::InflatesTooLarge { .. } => Disconnect {
            chosen: Some(MESSAGE_TOO_BIG),
            ..Disconnect::because(DisconnectCode::MessageTooLarge, v.to_string())
        },
        Violation::Protocol(_) | Violation::NotUtf8 => {
            Disconnect::because(DisconnectCode::BadRequest, v.to_string())
        }
    }
}

/// What inflating a client's compressed messages may cost one connection, in inflated
/// bytes a second: 8 message limits (512 KiB at the default 64 KiB), bursts of twice that.
/// A compressed message costs the server the bytes it inflates to, not the bytes sent (100
/// bytes can inflate to the whole limit), so a client sending such messages flat out held
/// a core, though each was refused once inflated. Past the budget the connection reads
/// nothing more until it has refilled, and TCP makes the client wait. At the default, past
/// what a browser sends (Pusher's client events: 10 a second of at most 10 KB), at a few
/// thousandths of a core in a release build.
fn inflate_rate(limit: usize) -> Rate {
    Rate::per_second(u32::try_from(limit.saturating_mul(8)).unwrap_or(u32::MAX))
}

/// What every compressed message costs at least, however small it inflates: a flood of
/// tiny ones is paced too.
const LEAST_INFLATE_CHARGE: usize = 1024;

/// RFC 6455's close code for a message too big to process.
pub const MESSAGE_TOO_BIG: u16 = 1009;

#[cfg(test)]
mod tests;
