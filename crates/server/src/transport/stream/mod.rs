//! Streaming HTTP transports: Server-Sent Events, newline-delimited JSON over one chunked
//! response, and the forever frame (an HTML document fed `<script>` chunks). All three carry
//! the same pushes as WebSocket; clients send commands with `POST /connection/send`.

mod framing;
mod pump;

use std::{io, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{RawQuery, State},
    http::{header, HeaderMap, HeaderValue},
    response::{IntoResponse, Response},
    Extension,
};
use bytes::Bytes;
use herald_protocol::{ChannelName, ErrorCode, Since};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use framing::{is_identifier, script_safe, Framing, IFRAME_PADDING};
pub use pump::{run, Out};

use super::{
    http1::{Handover, Held, Lean},
    request::{self, OpenRequest},
};
use crate::{
    error::Failure,
    hooks::Transport,
    limits::{AddressGuard, Peer},
    node::Node,
    queue::Lane,
    session::Session,
};
use pump::ToBody;

/// Longest SSE event id: the cursor it carries comes back as the `Last-Event-ID` header,
/// which must pass proxies (nginx reads 8 KiB header lines by default) and the server's own
/// cursor limit. Subscriptions beyond it are refused (error 106).
const MAX_SSE_ID: usize = 8 * 1024;

/// `GET /connection/sse`.
pub async fn sse(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, lean, headers, query, |req| {
        req.text_only().map(|()| Framing::Sse)
    })
    .await
}

/// `GET /connection/stream`: NDJSON, or with `protocol=protobuf` length-delimited
/// Protobuf messages.
pub async fn ndjson(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    lean: Option<Extension<Lean>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    open(node, peer, lean, headers, query, |req| match req.protobuf {
        true => Ok(Framing::Protobuf),
        false => Ok(Framing::Ndjson),
    })
    .await
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
        req.text_only()?;
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
    /// How the channels take their publications (`delta=fossil`, `conflate=true`).
    takes: crate::session::Takes,
    framing: Framing,
    first: Vec<u8>,
    /// How often it sends a keepalive.
    ping: Duration,
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
            Framing::Sse => Some(Lane::SSE),
            Framing::Ndjson => Some(Lane::NDJSON),
            // The forever frame's pushes name the page's callback; a Protobuf stream's go
            // through its task (no lane frames them yet).
            Framing::Iframe { .. } | Framing::Protobuf => None,
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
        Framing::Ndjson | Framing::Protobuf => Transport::Stream,
        Framing::Iframe { .. } => Transport::Iframe,
    };
    let mut session = Session::new(&node)
        .at_address(address)
        .speaking(framing.encoding())
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
    let ping = request.ping_every(node.settings.config.client.ping_interval);
    Ok(Box::new(Accepted {
        admitted,
        node,
        session,
        takes: request.takes(),
        channels: request.channels,
        framing,
        first,
        ping,
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
