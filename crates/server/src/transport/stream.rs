//! Streaming HTTP transports: Server-Sent Events, newline-delimited JSON over one chunked
//! response, and the forever frame (an HTML document fed `<script>` chunks). All three carry
//! the same pushes as WebSocket; clients send commands with `POST /connection/send`.

use std::{io, sync::Arc, time::Duration};

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
    request::{self, OpenRequest},
    MAX_BATCH_BYTES,
};
use crate::{
    error::{Disconnect, Failure},
    hooks::Transport,
    limits::{AddressGuard, Peer},
    node::{Inbound, Node},
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
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, headers, query, |_| Ok(Framing::Sse)).await
}

/// `GET /connection/stream`.
pub async fn ndjson(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, headers, query, |_| Ok(Framing::Ndjson)).await
}

/// `GET /connection/iframe?callback=NAME`.
pub async fn iframe(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, headers, query, |req| {
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

async fn open(
    node: Arc<Node>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    framing: impl FnOnce(&OpenRequest) -> Result<Framing, Failure>,
) -> Response {
    match start(node, peer, headers, query, framing).await {
        Ok(response) => response,
        Err(f) => f.into_response(),
    }
}

async fn start(
    node: Arc<Node>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    framing: impl FnOnce(&OpenRequest) -> Result<Framing, Failure>,
) -> Result<Response, Failure> {
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
    let session = request.authenticate(&node, session).await?;
    let request = request.with_token_channels(&session);
    // What can refuse the request is checked now, so the answer can still be an HTTP error;
    // the channels are opened by the pump, one replay at a time as the client reads.
    session.may_open(&request.channels)?;
    let mut first = Vec::new();
    framing.prelude(node.settings.config.http.sse_retry, &mut first);
    framing.push(&session.connect_push(), None, &mut first);

    let (tx, rx) = mpsc::channel::<Bytes>(1);
    tx.try_send(Bytes::from(first))
        .expect("a new channel has room");
    let (inbox_tx, inbox_rx) = mpsc::channel(4);
    node.inboxes
        .lock()
        .insert(session.client().into(), inbox_tx);
    let abort = CancellationToken::new();
    let content_type = framing.content_type();
    node.tasks.spawn(pump(
        admitted,
        node.clone(),
        (session, request.channels),
        framing,
        tx,
        inbox_rx,
        abort.clone(),
    ));

    let body = futures_util::stream::unfold((rx, abort), |(mut rx, abort)| async move {
        tokio::select! {
            biased;
            // A client that stopped reading: fail the body so the connection is dropped.
            _ = abort.cancelled() => Some((Err(io::Error::other("slow consumer")), (rx, CancellationToken::new()))),
            chunk = rx.recv() => chunk.map(|b| (Ok::<_, io::Error>(b), (rx, abort))),
        }
    });
    let mut response = Body::from_stream(body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, no-transform"),
    );
    // nginx and similar proxies buffer responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

async fn pump(
    // Counts the connection against its address while the stream lives.
    _admitted: Option<AddressGuard>,
    node: Arc<Node>,
    // The session, and the channels it is still to open.
    (mut session, channels): (Session, Vec<(ChannelName, Option<Since>)>),
    framing: Framing,
    tx: mpsc::Sender<Bytes>,
    mut inbox: mpsc::Receiver<Inbound>,
    abort: CancellationToken,
) {
    let client = &node.settings.config.client;
    let http = &node.settings.config.http;
    let mut ping =
        tokio::time::interval_at(Instant::now() + client.ping_interval, client.ping_interval);
    let (max_bytes, lifetime) = match framing {
        Framing::Iframe { .. } => (http.iframe_max_bytes, http.iframe_max_lifetime),
        // About a century: no limit.
        _ => (usize::MAX, Duration::from_secs(3_000_000_000)),
    };
    let deadline = tokio::time::sleep(lifetime);
    tokio::pin!(deadline);
    let mut expiry = ExpiryTimer::default();
    let mut written = 0usize;
    session.announce();
    // Leaves `inboxes` however the pump ends, a defect's panic included.
    let _registered = Registered {
        node: &node,
        client: session.client().into(),
    };

    // Each channel's replay goes out before the next is read: what is held at once is one
    // replay (at most `max_history_bytes`) and the one chunk the body has room for.
    let mut opened = Ok(());
    for (channel, since) in channels {
        let mut out = Vec::new();
        // Boxed, as every rare step of the pump: a waiting stream's task is as large as its
        // largest step, and most of its life is spent waiting.
        let replayed = Box::pin(session.open_channel(channel.clone(), since, |json, at| {
            framing.push_at(json, at, &mut out)
        }))
        .await;
        written += out.len();
        if !send(&tx, out, client.write_timeout, &abort).await {
            return;
        }
        if let Err(f) = replayed {
            opened = Err(Disconnect::because(
                DisconnectCode::ServerError,
                format!("could not open {channel}: {}", f.message),
            ));
            break;
        }
    }
    let ended: Option<Disconnect> = loop {
        if let Err(d) = std::mem::replace(&mut opened, Ok(())) {
            break Some(d);
        }
        let mut out = Vec::new();
        expiry.follow(&session);
        let step: Result<(), Disconnect> = tokio::select! {
            biased;
            _ = node.shutdown.cancelled() => Err(Disconnect::new(DisconnectCode::Shutdown)),
            _ = tx.closed() => break None,
            _ = expiry.wait() => Box::pin(session.expire()).await.map(|pushes| {
                for push in pushes {
                    framing.push_at(&push, session.positions(), &mut out);
                }
            }),
            Some(Inbound { frame, done }) = inbox.recv() => {
                // Replies go out in pieces as they are made, each waiting for the client.
                let mut rest = &frame[..];
                let handled = loop {
                    let mut replies = Vec::new();
                    let step = Box::pin(session.handle_frame_until(rest, &mut replies, MAX_BATCH_BYTES)).await;
                    for reply in replies.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        framing.push_at(reply, session.positions(), &mut out);
                    }
                    match step {
                        Ok(more) if !more.is_empty() => {
                            rest = more;
                            written += out.len();
                            if !send(&tx, std::mem::take(&mut out), client.write_timeout, &abort).await {
                                break Err(Disconnect::new(DisconnectCode::WriteError));
                            }
                        }
                        Ok(_) => break Ok(()),
                        Err(d) => break Err(d),
                    }
                };
                let _ = done.send(handled.clone());
                handled
            }
            _ = session.queue().ready() => Ok(()),
            _ = ping.tick() => {
                framing.keepalive(&mut out);
                Ok(())
            }
            _ = &mut deadline => Err(Disconnect::because(DisconnectCode::ForceReconnect, "stream reached its maximum lifetime; reopen it")),
        };
        let step = step.and_then(|()| {
            session.drain(MAX_BATCH_BYTES, |json, at| {
                framing.push_at(json, at, &mut out)
            })
        });
        written += out.len();
        if !send(&tx, out, client.write_timeout, &abort).await {
            break None;
        }
        if let Err(d) = step {
            break Some(d);
        }
        if written >= max_bytes {
            break Some(Disconnect::because(
                DisconnectCode::ForceReconnect,
                "stream reached its size limit; reopen it",
            ));
        }
    };
    session.ending(ended.as_ref());
    if let Some(d) = ended {
        let mut out = Vec::new();
        framing.push(
            &json::encode_disconnect(d.wire_code(), d.short_reason()),
            None,
            &mut out,
        );
        framing.epilogue(&mut out);
        let _ = tx.try_send(Bytes::from(out));
    }
}

/// Hands a chunk to the response body, waiting while the client reads the previous one; false
/// once the stream is over: the client left, or read nothing for `timeout` (then the body
/// fails, so the connection is dropped).
async fn send(
    tx: &mpsc::Sender<Bytes>,
    out: Vec<u8>,
    timeout: Duration,
    abort: &CancellationToken,
) -> bool {
    if out.is_empty() {
        return true;
    }
    match tokio::time::timeout(timeout, tx.send(Bytes::from(out))).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            abort.cancel();
            false
        }
    }
}

/// A stream session's entry in [`Node::inboxes`], removed when dropped.
struct Registered<'a> {
    node: &'a Node,
    client: Box<str>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.node.inboxes.lock().remove(&self.client);
    }
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
