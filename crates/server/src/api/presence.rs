//! `GET /api/presence` and `GET /api/presence_stats`.

use std::sync::Arc;

use axum::{
    extract::{Query, State},
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use herald_protocol::{json, results, ChannelName, ErrorCode};
use serde::Deserialize;

use super::{channel, ChannelParam};
use crate::{error::Failure, node::Node};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PresenceParams {
    channel: String,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// The channel of a presence call, if its namespace keeps presence (the API sees it
/// whoever the namespace shows it to).
fn presence_channel(node: &Node, name: &str) -> Result<ChannelName, Failure> {
    let channel = channel(name)?;
    crate::policy::presence_kept(node, &channel)?;
    Ok(channel)
}

/// `GET /api/presence?channel=C[&limit=N][&cursor=X]` → `{"members": [...], "cursor"?}`.
pub(super) async fn members(
    State(node): State<Arc<Node>>,
    params: Result<Query<PresenceParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let channel = presence_channel(&node, &p.channel)?;
    let (members, cursor) = node
        .presence
        .page(&channel, p.cursor.as_deref(), p.limit)
        .await?;
    let members = crate::hub::presence::listed(&members);
    let body = json::encode_presence_page(&results::Presence {
        members: &members,
        cursor,
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `GET /api/presence_stats?channel=C` → `{"clients": N, "users": N}`.
pub(super) async fn stats(
    State(node): State<Arc<Node>>,
    params: Result<Query<ChannelParam>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<results::PresenceStats>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let channel = presence_channel(&node, &p.channel)?;
    let stats = node.presence.stats(&channel).await?;
    Ok(Json(results::PresenceStats {
        clients: stats.clients,
        users: stats.users,
    }))
}
