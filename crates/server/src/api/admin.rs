//! Acting on connections anywhere in the cluster: `POST /api/disconnect`,
//! `POST /api/unsubscribe`, `GET /api/connections`, `GET /api/channels` (carried out by
//! [`crate::admin`]).

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, Query, State},
    Json,
};
use herald_protocol::ErrorCode;
use serde::Deserialize;

use super::body;
use crate::{admin, error::Failure, node::Node, registry::Who};

/// Whose connections an action is for: exactly one of `user` and `client`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WhoParams {
    user: Option<String>,
    client: Option<String>,
}

impl WhoParams {
    fn who(self) -> Result<Who, Failure> {
        who(self.user, self.client)
    }
}

fn who(user: Option<String>, client: Option<String>) -> Result<Who, Failure> {
    match (user, client) {
        (Some(user), None) if !user.is_empty() => Ok(Who::User(user)),
        (None, Some(client)) if !client.is_empty() => Ok(Who::Client(client)),
        _ => Err(Failure::new(
            ErrorCode::BadRequest,
            "give exactly one of user and client",
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DisconnectRequest {
    user: Option<String>,
    client: Option<String>,
    code: Option<u16>,
    reason: Option<String>,
}

/// `POST /api/disconnect {"user": U | "client": C, "code"?: N, "reason"?: "…"}` →
/// `{"disconnected": N}`: closes the connections on every node (default code 3007, which
/// tells clients to reconnect; 3500–3999 and 4500–4999 tell them not to).
pub(super) async fn disconnect(
    State(node): State<Arc<Node>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let req: DisconnectRequest = body(raw)?;
    let action = admin::checked(admin::Action::Disconnect {
        who: who(req.user, req.client)?,
        code: req
            .code
            .unwrap_or(herald_protocol::DisconnectCode::ForceReconnect.code()),
        reason: req
            .reason
            .unwrap_or_else(|| "disconnected by the server's operator".into()),
    })?;
    Ok(Json(admin::everywhere(&node, action).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UnsubscribeRequest {
    user: Option<String>,
    client: Option<String>,
    channel: String,
}

/// `POST /api/unsubscribe {"user": U | "client": C, "channel": "…"}` →
/// `{"unsubscribed": N}`: ends those subscriptions on every node; each client gets an
/// `unsubscribe` push with code 120 and does not subscribe again by itself.
pub(super) async fn unsubscribe(
    State(node): State<Arc<Node>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let req: UnsubscribeRequest = body(raw)?;
    let action = admin::checked(admin::Action::Unsubscribe {
        who: who(req.user, req.client)?,
        channel: req.channel,
    })?;
    Ok(Json(admin::everywhere(&node, action).await?))
}

/// `GET /api/connections?user=U` (or `client=C`) → `{"connections": [{client, user,
/// transport, node, since, channels}]}`, from every node, oldest first.
pub(super) async fn connections(
    State(node): State<Arc<Node>>,
    params: Result<Query<WhoParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let action = admin::Action::Connections { who: p.who()? };
    Ok(Json(admin::everywhere(&node, action).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChannelsParams {
    limit: Option<usize>,
    cursor: Option<String>,
    prefix: Option<String>,
}

/// `GET /api/channels[?limit=N][&cursor=C][&prefix=P]` → `{"channels": [{channel,
/// subscribers}], "cursor"?}`: channels with subscribers on any node, by name, with their
/// subscribers summed over the nodes; pass `cursor` back for the next page.
pub(super) async fn channels(
    State(node): State<Arc<Node>>,
    params: Result<Query<ChannelsParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let action = admin::checked(admin::Action::Channels {
        after: p.cursor.unwrap_or_default(),
        prefix: p.prefix.unwrap_or_default(),
        limit: p.limit.unwrap_or(100),
    })?;
    Ok(Json(admin::everywhere(&node, action).await?))
}
