//! Streaming HTTP transports: Server-Sent Events, newline-delimited JSON over one chunked
//! response, and the forever frame (an HTML document fed `<script>` chunks). All three carry
//! the same pushes as WebSocket; clients send commands with `POST /connection/send`.

use std::{future::Future, io, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{RawQuery, State},
    http::{header, HeaderMap, HeaderValue},
    response::{IntoResponse, Response},
    Extension,
};
use bytes::Bytes;
use herald_protocol::{json, ChannelName, DisconnectCode, ErrorCode, Since};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    http1::{Handover, Held, Lean},
    request::{self, OpenRequest},
    MAX_BATCH_BYTES,
};
use crate::{
    error::{Disconnect, Failure},
    hooks::Transport,
    limits::{AddressGuard, Peer},
    node::Node,
    queue::{Command, Lane},
    session::{ExpiryTimer, Positions, Session},
};

/// Longest SSE event id: the cursor it carries comes back as the `Last-Event-ID` header,
/// which must pass proxies (nginx reads 8 KiB header lines by default) and the server's own
/// cursor limit. Subscriptions beyond it are refused (error 106).
const MAX_SSE_ID: usize = 8 * 1024;

/// How pushes are wrapped on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`: `id: CURSOR` and `data: PUSH` per event.
    Sse,
    /// `application/x-ndjson`: one push per line.
    Ndjson,
    /// `text/html`: `<script>parent.CALLBACK(PUSH);</script>` per push.
    Iframe {
        /// The page's function, a plain JavaScript identifier.
        callback: String,
    },
}

/// Bytes before the first push of a forever frame: old browsers render nothing (and run no
/// script) until they have seen this much of a document.
pub const IFRAME_PADDING: usize = 2048;

impl Framing {
    fn content_type(&self) -> &'static str {
        match self {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
            Framing::Iframe { .. } => "text/html; charset=utf-8",
        }
    }

    /// What a response starts with.
    pub fn prelude(&self, sse_retry: Duration, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => {
                out.extend_from_slice(format!("retry: {}\n\n", sse_retry.as_millis()).as_bytes())
            }
            Framing::Ndjson => {}
            Framing::Iframe { .. } => {
                out.extend_from_slice(b"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>herald</title></head><body>\n<!--");
                out.resize(out.len() + IFRAME_PADDING, b' ');
                out.extend_from_slice(b"-->\n");
            }
        }
    }

    /// One push (a JSON object without line breaks); `cursor` becomes the SSE event id.
    pub fn push(&self, json: &[u8], cursor: Option<&str>, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => {
                if let Some(cursor) = cursor {
                    out.extend_from_slice(b"id: ");
                    out.extend_from_slice(cursor.as_bytes());
                    out.push(b'\n');
                }
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(json);
                out.extend_from_slice(b"\n\n");
            }
            Framing::Ndjson => {
                out.extend_from_slice(json);
                out.push(b'\n');
            }
            Framing::Iframe { callback } => {
                out.extend_from_slice(b"<script>parent.");
                out.extend_from_slice(callback.as_bytes());
                out.push(b'(');
                script_safe(json, out);
                out.extend_from_slice(b");</script>\n");
            }
        }
    }

    /// One push with the session's positions right after it. Only SSE carries them (as the
    /// event id), so the cursor string is built only there: this runs once per delivery.
    pub fn push_at(&self, json: &[u8], at: Positions<'_>, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => self.push(json, Some(&at.cursor()), out),
            _ => self.push(json, None, out),
        }
    }

    /// Keeps proxies and the client's liveness check from giving up on a quiet stream.
    pub fn keepalive(&self, out: &mut Vec<u8>) {
        match self {
            Framing::Sse => out.extend_from_slice(b": ping\n\n"),
            _ => self.push(b"{\"ping\":{}}", None, out),
        }
    }

    /// What a response ends with.
    pub fn epilogue(&self, out: &mut Vec<u8>) {
        if let Framing::Iframe { .. } = self {
            out.extend_from_slice(b"</body></html>\n");
        }
    }
}

/// Copies JSON so that it can stand inside a `<script>` element: `<`, `>` and `&` only
/// occur inside JSON strings, where `\u003c`-style escapes mean the same characters, so no
/// payload can close the script (`</script>`) or open a comment (`<!--`). U+2028 and U+2029
/// are escaped too, for engines older than ES2019.
pub fn script_safe(json: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            0xE2 if json.get(i + 1) == Some(&0x80)
                && matches!(json.get(i + 2), Some(0xA8 | 0xA9)) =>
            {
                out.extend_from_slice(if json[i + 2] == 0xA8 {
                    b"\\u2028"
                } else {
                    b"\\u2029"
                });
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
}

/// A JavaScript identifier (no dots, no brackets): the only thing a callback may be.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && name.len() <= 64
}

/// `GET /connection/sse`.
pub async fn sse(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, lean, headers, query, |_| Ok(Framing::Sse)).await
}

/// `GET /connection/stream`.
pub async fn ndjson(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, lean, headers, query, |_| Ok(Framing::Ndjson)).await
}

/// `GET /connection/iframe?callback=NAME`.
pub async fn iframe(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, lean, headers, query, |req| {
        match req.callback.clone() {
            Some(callback) if is_identifier(&callback) => Ok(Framing::Iframe { callback }),
            Some(_) => Err(Failure::new(
                ErrorCode::BadRequest,
                "callback must be a plain JavaScript identifier",
            )),
            None => Err(Failure::new(
                ErrorCode::BadRequest,
                "callback=NAME is required: the page's function to call",
            )),
        }
    })
    .await
}

/// A stream that has been accepted and not started: its session, the channels still to
/// open, and what it starts with.
#[derive(Debug)]
pub struct Accepted {
    // Counts the connection against its address while the stream lives.
    admitted: Option<AddressGuard>,
    node: Arc<Node>,
    session: Session,
    channels: Vec<(ChannelName, Option<Since>)>,
    framing: Framing,
    first: Vec<u8>,
}

impl Accepted {
    /// The session's queue, for a socket's direct lane.
    pub fn queue(&self) -> &Arc<crate::queue::Queue> {
        self.session.queue()
    }

    /// The direct lane its framing can use (the forever frame's pushes name the page's
    /// callback, so they are not the same for every connection: it has none).
    pub fn lane(&self) -> Option<Lane> {
        match self.framing {
            Framing::Sse => Some(Lane::Sse),
            Framing::Ndjson => Some(Lane::Ndjson),
            Framing::Iframe { .. } => None,
        }
    }
}

async fn open(
    node: Arc<Node>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    query: Option<String>,
    framing: impl FnOnce(&OpenRequest) -> Result<Framing, Failure>,
) -> Response {
    match accept(node, peer, headers, query, framing).await {
        Ok(accepted) => respond(accepted, lean.is_some()),
        Err(f) => f.into_response(),
    }
}

async fn accept(
    node: Arc<Node>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    framing: impl FnOnce(&OpenRequest) -> Result<Framing, Failure>,
) -> Result<Box<Accepted>, Failure> {
    let admitted = request::admit(&node, &headers, peer)?;
    let request = OpenRequest::parse(query.as_deref(), &headers)?;
    let framing = framing(&request)?;
    let address = admitted.as_ref().map(|a| a.ip());
    let transport = match framing {
        Framing::Sse => Transport::Sse,
        Framing::Ndjson => Transport::Stream,
        Framing::Iframe { .. } => Transport::Iframe,
    };
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(transport, node.settings.hooks.facts(&headers));
    if framing == Framing::Sse {
        session = session.cursor_bound(MAX_SSE_ID);
    }
    let mut session = request.authenticate(&node, session).await?;
    let request = request.with_token_channels(&session);
    // What can refuse the request (the rules, the subscribe hook) is checked now, so the
    // answer can still be an HTTP error; the channels are opened by the pump, one replay
    // at a time as the client reads.
    session.admit(&request.channels).await?;
    let mut first = Vec::new();
    framing.prelude(node.settings.config.http.sse_retry, &mut first);
    framing.push(&session.connect_push(), None, &mut first);
    Ok(Box::new(Accepted {
        admitted,
        node,
        session,
        channels: request.channels,
        framing,
        first,
    }))
}

/// The stream's response: handed over to the lean path to run on its socket, or (served by
/// hyper) a body fed by a task of its own.
fn respond(accepted: Box<Accepted>, lean: bool) -> Response {
    let content_type = accepted.framing.content_type();
    let mut response = if lean {
        Handover::new(Held::Stream(accepted)).into_response()
    } else {
        let (tx, rx) = mpsc::channel::<Bytes>(1);
        let abort = CancellationToken::new();
        let node = accepted.node.clone();
        node.tasks.spawn({
            let abort = abort.clone();
            async move { run(accepted, &mut ToBody { tx, abort }).await }
        });
        let body = futures_util::stream::unfold((rx, abort), |(mut rx, abort)| async move {
            tokio::select! {
                biased;
                // A client that stopped reading: fail the body so the connection is dropped.
                _ = abort.cancelled() => Some((Err(io::Error::other("slow consumer")), (rx, CancellationToken::new()))),
                chunk = rx.recv() => chunk.map(|b| (Ok::<_, io::Error>(b), (rx, abort))),
            }
        });
        Body::from_stream(body).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, no-transform"),
    );
    // nginx and similar proxies buffer responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

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
            Unwritten::Slow => Some(super::write_timed_out()),
        }
    }
}

/// hyper's response body, fed through a channel of one chunk.
struct ToBody {
    tx: mpsc::Sender<Bytes>,
    abort: CancellationToken,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_carry_the_cursor_as_id() {
        let mut out = Vec::new();
        Framing::Sse.push(b"{\"pub\":{}}", Some("a;e;1"), &mut out);
        assert_eq!(out, b"id: a;e;1\ndata: {\"pub\":{}}\n\n");
        out.clear();
        Framing::Sse.keepalive(&mut out);
        assert_eq!(out, b": ping\n\n");
    }

    #[test]
    fn script_safe_output_cannot_leave_the_script_element() {
        let hostile = "{\"t\":\"</script><script>alert(1)</script><!-- & \u{2028}\"}";
        let mut out = Vec::new();
        script_safe(hostile.as_bytes(), &mut out);
        let text = String::from_utf8(out).unwrap();
        for bad in ["</script", "<!--", "<", ">", "&", "\u{2028}"] {
            assert!(!text.contains(bad), "{bad:?} in {text}");
        }
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back["t"],
            "</script><script>alert(1)</script><!-- & \u{2028}"
        );
    }

    #[test]
    fn callbacks_are_plain_identifiers() {
        for ok in ["cb", "_x", "$h1", "onHerald"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "1x", "a.b", "alert(1)", "x;y", "a-b", "é"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn the_forever_frame_starts_with_padding() {
        let mut out = Vec::new();
        Framing::Iframe {
            callback: "cb".into(),
        }
        .prelude(Duration::ZERO, &mut out);
        assert!(out.len() > IFRAME_PADDING);
        assert!(out.starts_with(b"<!DOCTYPE html>"));
    }
}
