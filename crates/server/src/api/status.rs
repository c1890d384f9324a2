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

/// `GET /api/nodes`: every live node's figures (this one's fresh), by node id. A node
/// that stops reporting leaves the list within the broker's time to live (10 s on Redis).
pub(super) async fn nodes(
    State(node): State<Arc<Node>>,
) -> Result<Json<serde_json::Value>, Failure> {
    let mut all = vec![node.figures()];
    let own = all[0]["node"].clone();
    if let Some(link) = &node.link {
        let reported = link.nodes().await;
        // Shared storage: anyone who can write there could put anything, so only objects
        // with a node id are listed.
        all.extend(
            reported?
                .iter()
                .filter_map(|f| serde_json::from_slice::<serde_json::Value>(f).ok())
                .filter(|f| f["node"].is_string() && f["node"] != own),
        );
    }
    all.sort_by(|a, b| a["node"].as_str().cmp(&b["node"].as_str()));
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
