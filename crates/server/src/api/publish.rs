//! `POST /api/publish` and `POST /api/broadcast`.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, State},
    response::{IntoResponse, Response},
    Json,
};
use herald_protocol::{json, Epoch, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{body, channel};
use crate::{error::Failure, node::Node};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PublishRequest {
    channel: String,
    data: Box<RawValue>,
    /// Publish once per key and channel within `idempotency_window`.
    #[serde(default)]
    idempotency_key: Option<String>,
    /// A later publication with the same key replaces this one for subscriptions that
    /// conflate and have not been sent it yet.
    #[serde(default)]
    conflation_key: Option<String>,
}

#[derive(Serialize)]
pub(super) struct Position {
    offset: u64,
    epoch: Epoch,
    /// An earlier publish with the same idempotency key stored it; this one stored nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    repeat: bool,
}

impl From<crate::publish::Published> for Position {
    fn from(p: crate::publish::Published) -> Self {
        Self {
            offset: p.position.offset,
            epoch: p.position.epoch,
            repeat: p.repeat,
        }
    }
}

/// An API caller's idempotency key: the backend's (see [`crate::publish::Publisher`]).
fn backend(key: &str) -> (&str, crate::publish::Publisher<'static>) {
    (key, crate::publish::Publisher::Backend)
}

/// A request's `data` as a stored payload, or 400 saying why it cannot be one.
fn data(raw: &RawValue) -> Result<Bytes, Failure> {
    json::payload(raw).map_err(|m| Failure::new(ErrorCode::BadRequest, m))
}

/// `POST /api/publish {"channel": "...", "data": ...}` → `{"offset": N, "epoch": "..."}`.
pub(super) async fn publish(
    State(node): State<Arc<Node>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Position>, Failure> {
    let req: PublishRequest = body(raw)?;
    let channel = channel(&req.channel)?;
    let key = req.idempotency_key.as_deref().map(backend);
    let conflation = req.conflation_key.as_deref();
    let content = (data(&req.data)?, None);
    let p = crate::publish::publish_keyed(&node, &channel, content, conflation, key).await?;
    Ok(Json(p.into()))
}

/// Whether a `POST /api/publish` whose head is `head` may go on, as the lean HTTP loop asks
/// it (`transport::http1`) before it reads the body: what the router's layers ask before its
/// handler reads one (the host, then the API key).
pub fn may_publish(node: &Node, head: &axum::http::request::Parts) -> Result<(), Failure> {
    let headers = &head.headers;
    crate::policy::origin::check_host(&node.settings, headers)?;
    crate::policy::api_key::check(&node.settings, &head.method, head.uri.path(), headers)
}

/// The answer to a `POST /api/publish` that [`may_publish`], its `body` read by the lean
/// HTTP loop: what the router's handler answers.
pub async fn publish_body(node: &Arc<Node>, body: Bytes) -> Response {
    publish(State(node.clone()), Ok(body)).await.into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BroadcastRequest {
    channels: Vec<String>,
    data: Box<RawValue>,
    /// Publish once per key and channel (each channel keeps the key on its own).
    #[serde(default)]
    idempotency_key: Option<String>,
    /// The conflation key of every channel's publication.
    #[serde(default)]
    conflation_key: Option<String>,
}

#[derive(Serialize)]
pub(super) struct BroadcastResult {
    channel: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    position: Option<Position>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorJson>,
}

#[derive(Serialize)]
pub(super) struct ErrorJson {
    code: ErrorCode,
    message: String,
}

/// `POST /api/broadcast {"channels": [...], "data": ...}` → one result per channel, in order.
pub(super) async fn broadcast(
    State(node): State<Arc<Node>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let req: BroadcastRequest = body(raw)?;
    if req.channels.is_empty() {
        return Err(Failure::new(ErrorCode::BadRequest, "channels is empty"));
    }
    let data = data(&req.data)?;
    let mut results = Vec::with_capacity(req.channels.len());
    for name in req.channels {
        let published = match channel(&name) {
            Ok(c) => {
                let key = req.idempotency_key.as_deref().map(backend);
                let conflation = req.conflation_key.as_deref();
                crate::publish::publish_keyed(&node, &c, (data.clone(), None), conflation, key)
                    .await
            }
            Err(f) => Err(f),
        };
        results.push(match published {
            Ok(p) => BroadcastResult {
                channel: name,
                position: Some(p.into()),
                error: None,
            },
            Err(f) => BroadcastResult {
                channel: name,
                position: None,
                error: Some(ErrorJson {
                    code: f.code,
                    message: f.message,
                }),
            },
        });
    }
    Ok(Json(serde_json::json!({ "results": results })).into_response())
}
