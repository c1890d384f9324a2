//! The HTTP API for backends and operators, one file per area: publishing
//! ([`publish`]), history ([`history`]), presence ([`presence`]), acting on connections
//! ([`admin`]), and the node's state ([`status`]: `/metrics`, info, nodes, the dashboard's
//! ticket). Every route needs an API key (`Authorization: apikey KEY`); with no key
//! configured the API is closed and says how to open it. A key may be limited to publishing
//! (POST and DELETE routes) or to reading (GET routes).

mod admin;
mod history;
mod presence;
pub mod publish;
mod status;

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use herald_protocol::{ChannelName, ErrorCode};
use serde::{de::DeserializeOwned, Deserialize};

use crate::{error::Failure, node::Node, policy};

pub use status::metrics;

/// The API's routes, behind the key check.
pub fn routes(node: Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/api/publish", post(publish::publish))
        .route("/api/broadcast", post(publish::broadcast))
        .route("/api/history", get(history::read).delete(history::remove))
        .route("/api/info", get(status::info))
        .route("/api/nodes", get(status::nodes))
        .route("/api/presence", get(presence::members))
        .route("/api/presence_stats", get(presence::stats))
        .route("/api/disconnect", post(admin::disconnect))
        .route("/api/unsubscribe", post(admin::unsubscribe))
        .route("/api/connections", get(admin::connections))
        .route("/api/channels", get(admin::channels))
        .route("/api/dashboard/ticket", get(status::dashboard_ticket))
        .route("/metrics", get(status::metrics))
        .layer(middleware::from_fn_with_state(node, require_key))
}

async fn require_key(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let checked = policy::api_key::check(
        &node.settings,
        request.method(),
        request.uri().path(),
        request.headers(),
    );
    match checked {
        Ok(()) => next.run(request).await,
        Err(f) => f.into_response(),
    }
}

pub(super) fn body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, Failure> {
    let body = body.map_err(|e| {
        Failure::new(
            ErrorCode::MessageTooLarge,
            format!("cannot read request body: {e}"),
        )
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("invalid JSON body: {e}")))
}

pub(crate) fn channel(name: &str) -> Result<ChannelName, Failure> {
    ChannelName::new(name).map_err(|e| Failure::new(ErrorCode::InvalidChannel, e.to_string()))
}

/// A query naming one channel.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChannelParam {
    channel: String,
}
