//! `POST /connection/send`: commands from clients of the HTTP transports.
//!
//! With `?session=ID` (the `client` from a stream's `connect` push) the commands go to
//! that stream's session and their replies travel in the stream, in order with
//! publications; the response is `{}` once they are handled. Without a session, stateless
//! commands (publish, history, ping) are answered in the response body, one line each.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, RawQuery, State},
    http::{header, HeaderMap},
    response::{IntoResponse, Response},
};
use herald_protocol::ErrorCode;
use tokio::sync::oneshot;

use super::origin;
use crate::{
    error::Failure,
    node::{Inbound, Node},
    session::Session,
};

/// `POST /connection/send[?session=ID]`, body: commands, one JSON object per line.
pub async fn send(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(node, headers, query, body).await {
        Ok(r) => r,
        Err(f) => f.into_response(),
    }
}

async fn handle(
    node: Arc<Node>,
    headers: HeaderMap,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    origin::check(&node.settings, &headers)?;
    let limit = node.settings.config.client.max_frame_size;
    let frame = body.map_err(|e| {
        Failure::new(
            ErrorCode::MessageTooLarge,
            format!("cannot read body (limit {limit} bytes): {e}"),
        )
    })?;
    let mut session_id = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*k {
            "session" => session_id = Some(v.into_owned()),
            other => {
                return Err(Failure::new(
                    ErrorCode::BadRequest,
                    format!("unknown query parameter {other:?}"),
                ))
            }
        }
    }
    let Some(id) = session_id else {
        let mut session = Session::new(&node).stateless();
        let mut out = Vec::new();
        session
            .handle_frame(&frame, &mut out)
            .await
            .map_err(|d| Failure::new(ErrorCode::BadRequest, d.reason))?;
        out.push(b'\n');
        return Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], out).into_response());
    };
    let inbox = node.inboxes.lock().get(id.as_str()).cloned();
    let Some(inbox) = inbox else {
        return Err(Failure::new(
            ErrorCode::BadConnectState,
            "no open stream has this session id; reopen the stream",
        ));
    };
    let (done, handled) = oneshot::channel();
    let timeout = node.settings.config.client.write_timeout;
    let gone = || Failure::new(ErrorCode::BadConnectState, "the stream closed; reopen it");
    tokio::time::timeout(timeout, inbox.send(Inbound { frame, done }))
        .await
        .map_err(|_| Failure::new(ErrorCode::TooManyRequests, "the session is busy; retry"))?
        .map_err(|_| gone())?;
    match handled.await.map_err(|_| gone())? {
        Ok(()) => Ok(([(header::CONTENT_TYPE, "application/json")], "{}").into_response()),
        Err(d) => Err(Failure::new(ErrorCode::BadRequest, d.reason)),
    }
}
