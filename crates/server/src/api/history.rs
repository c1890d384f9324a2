//! `GET /api/history` and `DELETE /api/history`.

use std::sync::Arc;

use axum::{
    extract::{Query, State},
    Json,
};
use herald_protocol::{Epoch, ErrorCode, Publication, Since};
use serde::{Deserialize, Serialize};

use super::{channel, ChannelParam};
use crate::{error::Failure, history, node::Node};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryParams {
    channel: String,
    since: Option<u64>,
    epoch: Option<String>,
    limit: Option<usize>,
}

#[derive(Serialize)]
pub(super) struct HistoryResponse {
    offset: u64,
    epoch: Epoch,
    publications: Vec<Publication>,
}

/// `GET /api/history?channel=C[&since=OFFSET[&epoch=E]][&limit=N]`.
pub(super) async fn read(
    State(node): State<Arc<Node>>,
    params: Result<Query<HistoryParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HistoryResponse>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let channel = channel(&p.channel)?;
    if p.epoch.is_some() && p.since.is_none() {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            "epoch is given without since",
        ));
    }
    let since = p.since.map(|offset| Since {
        offset,
        epoch: p.epoch.as_deref().map(Epoch::new),
    });
    let h = history::read(&node, &channel, since, p.limit).await?;
    Ok(Json(HistoryResponse {
        offset: h.position.offset,
        epoch: h.position.epoch,
        publications: h.publications,
    }))
}

/// `DELETE /api/history?channel=C`: forgets the history; the channel gets a new epoch.
pub(super) async fn remove(
    State(node): State<Arc<Node>>,
    params: Result<Query<ChannelParam>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    node.broker.remove_history(&channel(&p.channel)?).await?;
    Ok(Json(serde_json::json!({})))
}
