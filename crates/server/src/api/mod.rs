//! The HTTP API for backends and operators, one file per area: publishing
//! ([`publish`]), history ([`history`]), presence ([`presence`]), acting on connections
//! ([`admin`]), and the node's state ([`status`]: `/metrics`, info, nodes, the dashboard's
//! ticket). Every route needs an API key (`Authorization: apikey KEY`); with no key
//! configured the API is closed and says how to open it. A key may be limited to publishing
//! (POST and DELETE routes) or to reading (GET routes).

mod admin;
mod history;
mod presence;
mod publish;
mod status;

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, Request, State},
    http::header,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use herald_protocol::{ChannelName, ErrorCode};
use serde::{de::DeserializeOwned, Deserialize};

use crate::{config::ApiScope, error::Failure, node::Node};

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

pub(super) fn channel(name: &str) -> Result<ChannelName, Failure> {
    ChannelName::new(name).map_err(|e| Failure::new(ErrorCode::InvalidChannel, e.to_string()))
}

/// A query naming one channel.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChannelParam {
    channel: String,
}
