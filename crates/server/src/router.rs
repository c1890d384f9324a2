//! Every HTTP route in one table.

use std::sync::Arc;

use axum::{routing::get, Router};
use herald_protocol::ErrorCode;

use crate::{error::Failure, node::Node, publish::http_api, transport::websocket};

/// The whole HTTP surface of a node.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/connection/websocket", get(websocket::upgrade))
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(http_api::routes(node.clone()))
        .fallback(|| async {
            Failure::new(
                ErrorCode::MethodNotFound,
                "no such route; see docs/protocol.md",
            )
        })
        .with_state(node)
}
