//! The HTTP API for backends: publish, broadcast, history, presence, info. Every route needs an API
//! key (`Authorization: apikey KEY`); with no key configured the API is closed and says
//! how to open it. A key may be limited to publishing (POST and DELETE routes) or to
//! reading (GET routes).

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, Query, Request, State},
    http::header,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use herald_protocol::{json, ChannelName, Epoch, ErrorCode, Publication, Since};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{admin, config::ApiScope, error::Failure, history, node::Node, session::registry::Who};

/// The API's routes, behind the key check.
pub fn routes(node: Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/api/publish", post(publish))
        .route("/api/broadcast", post(broadcast))
        .route("/api/history", get(read_history).delete(remove_history))
        .route("/api/info", get(info))
        .route("/api/nodes", get(nodes))
        .route("/api/presence", get(presence))
        .route("/api/presence_stats", get(presence_stats))
        .route("/api/disconnect", post(disconnect))
        .route("/api/unsubscribe", post(unsubscribe))
        .route("/api/connections", get(connections))
        .route("/api/channels", get(channels))
        .route("/api/dashboard/ticket", get(dashboard_ticket))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(node, require_key))
}

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

async fn require_key(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let mut keys = node.settings.api_keys().peekable();
    if keys.peek().is_none() {
        return Failure::new(
            ErrorCode::NotAvailable,
            "the HTTP API is disabled because no API key is configured; set api_key in the config file, \
             HERALD_API_KEY in the environment, or pass --api-key to herald serve",
        )
        .into_response();
    }
    // Reads are GETs (and HEADs, which the router answers as GETs without the body, so
    // they read as much); acting on connections needs a full key; everything else changes
    // channels.
    let reads = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let needed = if reads {
        ApiScope::Read
    } else if ADMIN_ACTIONS.contains(&request.uri().path()) {
        ApiScope::All
    } else {
        ApiScope::Publish
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("apikey "))
        .map(str::trim);
    match given {
        None => Failure::new(
            ErrorCode::Unauthorized,
            "missing header `Authorization: apikey KEY`",
        )
        .into_response(),
        Some(given) => {
            // Every key is compared (in constant time), so timing tells nothing of which
            // key, or whether any, matched.
            let scope = keys.fold(None, |found, (key, scope)| {
                let equal = constant_time_eq(key.as_bytes(), given.as_bytes());
                found.or(equal.then_some(scope))
            });
            match scope {
                Some(ApiScope::All) => next.run(request).await,
                Some(scope) if scope == needed => next.run(request).await,
                Some(scope) => Failure::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "this API key may only {}",
                        if scope == ApiScope::Read {
                            "read (GET routes)"
                        } else {
                            "publish (POST and DELETE routes other than /api/disconnect and /api/unsubscribe, which need a key without a scope)"
                        }
                    ),
                )
                .into_response(),
                None => Failure::new(ErrorCode::Unauthorized, "wrong API key").into_response(),
            }
        }
    }
}

/// Routes that act on other people's connections: only a key without a scope may.
const ADMIN_ACTIONS: [&str; 2] = ["/api/disconnect", "/api/unsubscribe"];

/// Compares without stopping at the first difference, so timing does not reveal a key.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, Failure> {
    let body = body.map_err(|e| {
        Failure::new(
            ErrorCode::MessageTooLarge,
            format!("cannot read request body: {e}"),
        )
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("invalid JSON body: {e}")))
}

fn channel(name: &str) -> Result<ChannelName, Failure> {
    ChannelName::new(name).map_err(|e| Failure::new(ErrorCode::InvalidChannel, e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishRequest {
    channel: String,
    data: Box<RawValue>,
}

#[derive(Serialize)]
struct Position {
    offset: u64,
    epoch: Epoch,
}

/// A request's `data` as a stored payload, or 400 saying why it cannot be one.
fn data(raw: &RawValue) -> Result<Bytes, Failure> {
    json::payload(raw).map_err(|m| Failure::new(ErrorCode::BadRequest, m))
}

/// `POST /api/publish {"channel": "...", "data": ...}` → `{"offset": N, "epoch": "..."}`.
async fn publish(
    State(node): State<Arc<Node>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Position>, Failure> {
    let req: PublishRequest = body(raw)?;
    let channel = channel(&req.channel)?;
    let p = crate::publish::publish(&node, &channel, data(&req.data)?, None).await?;
    Ok(Json(Position {
        offset: p.offset,
        epoch: p.epoch,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastRequest {
    channels: Vec<String>,
    data: Box<RawValue>,
}

#[derive(Serialize)]
struct BroadcastResult {
    channel: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    position: Option<Position>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorJson>,
}

#[derive(Serialize)]
struct ErrorJson {
    code: ErrorCode,
    message: String,
}

/// `POST /api/broadcast {"channels": [...], "data": ...}` → one result per channel, in order.
async fn broadcast(
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
            Ok(c) => crate::publish::publish(&node, &c, data.clone(), None).await,
            Err(f) => Err(f),
        };
        results.push(match published {
            Ok(p) => BroadcastResult {
                channel: name,
                position: Some(Position {
                    offset: p.offset,
                    epoch: p.epoch,
                }),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    channel: String,
    since: Option<u64>,
    epoch: Option<String>,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct HistoryResponse {
    offset: u64,
    epoch: Epoch,
    publications: Vec<Publication>,
}

/// `GET /api/history?channel=C[&since=OFFSET[&epoch=E]][&limit=N]`.
async fn read_history(
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelParam {
    channel: String,
}

/// `DELETE /api/history?channel=C`: forgets the history; the channel gets a new epoch.
async fn remove_history(
    State(node): State<Arc<Node>>,
    params: Result<Query<ChannelParam>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    node.broker.remove_history(&channel(&p.channel)?).await?;
    Ok(Json(serde_json::json!({})))
}

/// `GET /api/info`.
async fn info(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(node.figures())
}

/// `GET /api/nodes`: every live node's figures (this one's fresh), by node id. A node
/// that stops reporting leaves the list within the broker's time to live (10 s on Redis).
async fn nodes(State(node): State<Arc<Node>>) -> Result<Json<serde_json::Value>, Failure> {
    let mut all = vec![node.figures()];
    let own = all[0]["node"].clone();
    if let Some(reported) = node.broker.nodes().await {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresenceParams {
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
async fn presence(
    State(node): State<Arc<Node>>,
    params: Result<Query<PresenceParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let channel = presence_channel(&node, &p.channel)?;
    let (members, cursor) = node
        .presence
        .page(&channel, p.cursor.as_deref(), p.limit)
        .await?;
    let body = serde_json::to_vec(&json::results::Presence {
        members: json::RawJson(&members),
        cursor,
    })
    .expect("serialises");
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `GET /api/presence_stats?channel=C` → `{"clients": N, "users": N}`.
async fn presence_stats(
    State(node): State<Arc<Node>>,
    params: Result<Query<ChannelParam>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<json::results::PresenceStats>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let channel = presence_channel(&node, &p.channel)?;
    let stats = node.presence.stats(&channel).await?;
    Ok(Json(json::results::PresenceStats {
        clients: stats.clients,
        users: stats.users,
    }))
}

/// Whose connections an action is for: exactly one of `user` and `client`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhoParams {
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
struct DisconnectRequest {
    user: Option<String>,
    client: Option<String>,
    code: Option<u16>,
    reason: Option<String>,
}

/// `POST /api/disconnect {"user": U | "client": C, "code"?: N, "reason"?: "…"}` →
/// `{"disconnected": N}`: closes the connections on every node (default code 3007, which
/// tells clients to reconnect; 3500–3999 and 4500–4999 tell them not to).
async fn disconnect(
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
struct UnsubscribeRequest {
    user: Option<String>,
    client: Option<String>,
    channel: String,
}

/// `POST /api/unsubscribe {"user": U | "client": C, "channel": "…"}` →
/// `{"unsubscribed": N}`: ends those subscriptions on every node; each client gets an
/// `unsubscribe` push with code 120 and does not subscribe again by itself.
async fn unsubscribe(
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
async fn connections(
    State(node): State<Arc<Node>>,
    params: Result<Query<WhoParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Failure> {
    let Query(p) = params.map_err(|e| Failure::new(ErrorCode::BadRequest, e.body_text()))?;
    let action = admin::Action::Connections { who: p.who()? };
    Ok(Json(admin::everywhere(&node, action).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelsParams {
    limit: Option<usize>,
    cursor: Option<String>,
    prefix: Option<String>,
}

/// `GET /api/channels[?limit=N][&cursor=C][&prefix=P]` → `{"channels": [{channel,
/// subscribers}], "cursor"?}`: channels with subscribers on any node, by name, with their
/// subscribers summed over the nodes; pass `cursor` back for the next page.
async fn channels(
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

/// `GET /api/dashboard/ticket` → `{"token": "…", "expires": UNIX}`: what the dashboard
/// connects with to read Herald's own channels (see [`crate::policy::operator`]).
async fn dashboard_ticket(
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
