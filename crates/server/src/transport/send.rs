//! `POST /connection/send`: commands from clients of the HTTP transports.
//!
//! With `?session=ID` (the `client` from a stream's `connect` push) the commands go to
//! that stream's session and their replies travel in the stream, in order with
//! publications; the response is `{}` once they are handled. A session that lives on
//! another node (its id starts with that node's id) is reached through the broker, so a
//! load balancer needs no affinity. Without a session, stateless commands (publish,
//! history, ping) are answered in the response body, one line each.

use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    extract::{rejection::BytesRejection, RawQuery, State},
    http::{header, HeaderMap},
    response::{IntoResponse, Response},
    Extension,
};
use herald_broker::NodeRequests;
use herald_protocol::{json::Json, Codec, ErrorCode, Reply};
use tokio::sync::oneshot;

use futures_util::StreamExt;

use super::{request, MAX_BATCH_BYTES};
use crate::policy::origin;
use crate::{
    error::Failure,
    hooks::Transport,
    limits::{AddressGuard, Peer},
    node::Node,
    queue::Command,
    session::{self, Session},
};

/// `POST /connection/send[?session=ID]`, body: commands, one JSON object per line.
pub async fn send(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(node, peer, headers, query, body).await {
        Ok(r) => r,
        Err(f) => f.into_response(),
    }
}

async fn handle(
    node: Arc<Node>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    origin::check(&node.settings, &headers)?;
    if node.shutdown.is_cancelled() {
        return Err(Failure::new(
            ErrorCode::ShuttingDown,
            "server is shutting down",
        ));
    }
    let limit = node.settings.config.client.max_frame_size;
    let frame = body.map_err(|e| {
        Failure::new(
            ErrorCode::MessageTooLarge,
            format!("cannot read body (limit {limit} bytes): {e}"),
        )
    })?;
    let mut session_id = None;
    let mut token = request::bearer(&headers)?;
    let mut sub_tokens = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*k {
            "session" => session_id = Some(v.into_owned()),
            "token" => token = Some(v.into_owned()),
            "sub_token" => sub_tokens.push(v.into_owned()),
            other => {
                return Err(Failure::new(
                    ErrorCode::BadRequest,
                    format!("unknown query parameter {other:?}"),
                ))
            }
        }
    }
    let Some(id) = session_id else {
        // A stateless send is a request of its own, as a poll is: it counts against its
        // address's connections and their rate before anything (a hook) is asked for it.
        let admitted = request::admit(&node, &headers, peer)?;
        let mut session = Session::new(&node).stateless();
        if let Some(guard) = &admitted {
            session = session.charged_to(guard.ip());
        }
        let facts = node.settings.hooks.facts(&headers);
        let session = session.came_by(Transport::Send, facts);
        let session = request::authenticate(&node, session, token.as_deref(), &sub_tokens).await?;
        return answer(session, frame, admitted).await;
    };
    if token.is_some() || !sub_tokens.is_empty() {
        // The stream's session has its own identity; changing it is `refresh`'s job, so a
        // token here would be ignored, which would hide a client's mistake.
        return Err(Failure::new(
            ErrorCode::BadRequest,
            "with session=ID, the stream's own token applies: send a new one as a refresh command",
        ));
    }
    if let Some(owner) = session::node_of(&id).filter(|owner| *owner != &*node.id) {
        let mut request = Vec::with_capacity(id.len() + 1 + frame.len());
        request.extend_from_slice(id.as_bytes());
        request.push(b'\n');
        request.extend_from_slice(&frame);
        if let Some(link) = &node.link {
            let answer = link.ask_node(owner, request.into()).await.map_err(|e| {
                Failure::new(
                    ErrorCode::BadConnectState,
                    format!("the stream's node cannot be reached ({e}); reopen the stream"),
                )
            })?;
            return decode_answer(&answer).map(|()| sent());
        }
    }
    deliver(&node, &id, frame).await.map(|()| sent())
}

/// Answers a stateless session's commands, one line each. The first piece is handled
/// before the response starts, so a body that is malformed from its first line gets an
/// HTTP error; the rest is handled as the client reads (in pieces of about
/// [`MAX_BATCH_BYTES`]), so one request of many history reads is never answered whole.
/// A malformed line later on ends the answer with an error line.
async fn answer(
    mut session: Session,
    frame: Bytes,
    admitted: Option<AddressGuard>,
) -> Result<Response, Failure> {
    let mut out = Vec::new();
    let rest = session
        .handle_frame_until(&frame, &mut out, MAX_BATCH_BYTES)
        .await
        .map_err(|d| Failure::new(ErrorCode::BadRequest, d.reason))?
        .len();
    out.push(b'\n');
    let ndjson = [(header::CONTENT_TYPE, "application/x-ndjson")];
    if rest == 0 {
        return Ok((ndjson, out).into_response());
    }
    let first = Bytes::from(out);
    let rest = frame.slice(frame.len() - rest..);
    // The address's count holds until the last piece is answered.
    let pieces =
        futures_util::stream::unfold(Some((session, rest, admitted)), |state| async move {
            let (mut session, frame, admitted) = state?;
            let mut out = Vec::new();
            let next = match session
                .handle_frame_until(&frame, &mut out, MAX_BATCH_BYTES)
                .await
            {
                Ok([]) => None,
                Ok(rest) => {
                    let rest = frame.slice_ref(rest);
                    Some((session, rest, admitted))
                }
                Err(d) => {
                    let refusal = session.codec().reply(&Reply::error(
                        None,
                        ErrorCode::BadRequest,
                        &d.reason,
                    ));
                    session.append(&mut out, &refusal);
                    None
                }
            };
            if !out.is_empty() {
                out.push(b'\n');
            }
            Some((Ok::<_, std::io::Error>(Bytes::from(out)), next))
        });
    let body = futures_util::stream::once(async { Ok(first) }).chain(pieces);
    Ok((ndjson, Body::from_stream(body)).into_response())
}

fn sent() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
}

/// Hands a frame to a stream session of this node and waits until it is handled.
async fn deliver(node: &Node, id: &str, frame: Bytes) -> Result<(), Failure> {
    let Some(queue) = node.sessions.stream_queue(id) else {
        return Err(Failure::new(
            ErrorCode::BadConnectState,
            "no open stream has this session id; reopen the stream",
        ));
    };
    let (done, handled) = oneshot::channel();
    if queue
        .command(Command {
            frame,
            done: Some(done),
        })
        .is_err()
    {
        return Err(Failure::new(
            ErrorCode::TooManyRequests,
            "the session is busy; wait for the answers to earlier sends",
        ));
    }
    // The queue is the session's: a stream that closes drops it, and `done` with it.
    drop(queue);
    match handled.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(d)) => Err(Failure::new(ErrorCode::BadRequest, d.reason)),
        Err(_) => Err(Failure::new(
            ErrorCode::BadConnectState,
            "the stream closed; reopen it",
        )),
    }
}

/// Another node's send for a session of this one: `SESSION\nFRAME` in, and out `{}` or the
/// failure as the API's error body. (Or an operator's action: see [`crate::admin`].)
#[async_trait::async_trait]
impl NodeRequests for Node {
    async fn answer(&self, request: Bytes) -> Bytes {
        if let Some(action) = request.strip_prefix(crate::admin::NODE_REQUEST) {
            return crate::admin::answer(self, action).to_string().into();
        }
        let mut parts = request.splitn(2, |b| *b == b'\n');
        let (Some(id), Some(frame)) = (parts.next(), parts.next()) else {
            return Json
                .reply(&Reply::error(
                    None,
                    ErrorCode::BadRequest,
                    "malformed node request",
                ))
                .into();
        };
        let id = String::from_utf8_lossy(id);
        let frame = request.slice_ref(frame);
        match deliver(self, &id, frame).await {
            Ok(()) => Bytes::from_static(b"{}"),
            Err(f) => Json
                .reply(&Reply::error(None, f.wire_code(), &f.message))
                .into(),
        }
    }
}

/// The owning node's answer, as this node's response.
fn decode_answer(answer: &[u8]) -> Result<(), Failure> {
    let v: serde_json::Value = serde_json::from_slice(answer).unwrap_or_default();
    let Some(error) = v.get("error") else {
        return Ok(());
    };
    let code = error["code"]
        .as_u64()
        .and_then(|c| ErrorCode::from_code(c as u16))
        .unwrap_or(ErrorCode::Internal);
    Err(Failure::new(
        code,
        error["message"]
            .as_str()
            .unwrap_or("the stream's node failed"),
    ))
}
