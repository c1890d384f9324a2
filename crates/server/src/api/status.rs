//! What operators read: `GET /metrics`, `GET /api/info`, `GET /api/nodes`, and the
//! dashboard's ticket (`GET /api/dashboard/ticket`).

use std::sync::Arc;

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use herald_protocol::ErrorCode;

use crate::{error::Failure, node::Node};

/// `GET /metrics`: Prometheus text (docs/observability.md).
pub async fn metrics(State(node): State<Arc<Node>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics_text(),
    )
        .into_response()
}

/// `GET /api/info`.
pub(super) async fn info(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    let mut figures = node.figures();
    if let Some(lead) = &node.lead {
        let mut posted = Vec::new();
        for log in &node.hook_logs {
            if lead.of(log).held().await {
                posted.push(log.as_str());
            }
        }
        figures["delivers_hooks"] = posted.into();
    }
    Json(figures)
}

/// `GET /api/nodes`: every live node's figures (this one's fresh), by node id.
pub(super) async fn nodes(
    State(node): State<Arc<Node>>,
) -> Result<Json<serde_json::Value>, Failure> {
    let all = node.figures_everywhere().await?;
    Ok(Json(serde_json::json!({ "nodes": all })))
}

/// `GET /api/dashboard/ticket` → `{"token": "…", "expires": UNIX}`: what the dashboard
/// connects with to read Herald's own channels (see [`crate::policy::operator`]).
pub(super) async fn dashboard_ticket(
    State(node): State<Arc<Node>>,
) -> Result<Json<serde_json::Value>, Failure> {
    let (token, expires) = crate::policy::operator::ticket(&node.settings)
        .ok_or_else(|| Failure::new(ErrorCode::NotAvailable, "no API key is configured"))?;
    Ok(Json(serde_json::json!({
        "token": token,
        "expires": expires,
        "channel": crate::web::dashboard::STATS_CHANNEL,
    })))
}
