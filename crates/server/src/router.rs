//! Every HTTP route in one table.

use std::sync::Arc;

use axum::{
    extract::{DefaultBodyLimit, State},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use herald_protocol::ErrorCode;

use crate::{
    api,
    error::{Failure, REFUSED_ORIGIN},
    node::Node,
    transport::{poll, send, stream, websocket},
};

/// `GET /healthz`: 200 `ok` while the node accepts connections and can store
/// publications; 503 with the reason while it cannot (storage writes fail, say), so a load
/// balancer sends clients elsewhere until it recovers.
async fn healthz(State(node): State<Arc<Node>>) -> Response {
    match node.broker.health() {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable: {why}\n"),
        )
            .into_response(),
    }
}

/// `GET /readyz`: 200 `ready` while the node can serve its clients: its broker takes
/// publications and, when the broker is remote (Redis), the node reaches it. 503 with the
/// reason otherwise, so a load balancer sends new clients to a node that is ready.
/// (`/healthz` says whether the process is alive and its storage works.)
async fn readyz(State(node): State<Arc<Node>>) -> Response {
    let lost = node.broker.reach().and_then(|r| r.lost);
    match node.broker.health().err().or(lost) {
        None => "ready\n".into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Refuses requests for host names this server does not answer to (DNS rebinding).
/// `/healthz` and `/readyz` tell nothing worth rebinding for, and load balancers probe them
/// by address.
async fn known_host(
    State(node): State<Arc<Node>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if matches!(request.uri().path(), "/healthz" | "/readyz") {
        return next.run(request).await;
    }
    match crate::policy::origin::check_host(&node.settings, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(f) => f.into_response(),
    }
}

/// A page whose origin is refused may read the refusal (only that: the answer holds the
/// error and nothing else), so that a client can tell its user what to configure instead
/// of retrying blind. Every other cross-origin answer follows `allowed_origins`.
async fn readable_refusal(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    let mut response = next.run(request).await;
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        if !headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            && headers.get(REFUSED_ORIGIN).is_some()
        {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.append(header::VARY, HeaderValue::from_static("origin"));
        }
        headers.remove(REFUSED_ORIGIN);
    }
    response
}

/// Serves `metrics_listen`'s surface on `listener` until the node shuts down: `GET
/// /metrics` without a key, and nothing else.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    node: Arc<Node>,
) -> std::io::Result<()> {
    let stop = node.shutdown.clone();
    let router = Router::new()
        .route("/metrics", get(api::metrics))
        .with_state(node);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// The whole HTTP surface of a node; `parked` keeps long-poll sessions between requests
/// (the long-poll transport's own state, which the lean path uses too).
pub fn router(node: Arc<Node>, parked: poll::Parked) -> Router {
    let connection = Router::new()
        .route("/connection/websocket", get(websocket::upgrade))
        .route("/connection/sse", get(stream::sse))
        .route("/connection/stream", get(stream::ndjson))
        .route("/connection/iframe", get(stream::iframe))
        .route("/connection/longpoll", get(poll::longpoll))
        .route("/connection/poll", get(poll::poll))
        .route("/connection/send", post(send::send))
        .merge(crate::fronts::phoenix::polling_routes())
        .layer(axum::Extension(crate::fronts::phoenix::Polls::new(
            parked.store().clone(),
        )))
        .layer(axum::Extension(parked))
        .layer(DefaultBodyLimit::max(
            node.settings.config.client.max_frame_size,
        ))
        .layer(crate::policy::origin::cors(
            &node.settings.config.allowed_origins,
        ))
        .layer(axum::middleware::from_fn(readable_refusal));
    let mut all = Router::new()
        .merge(connection)
        .merge(crate::fronts::pusher::routes(&node))
        .merge(crate::fronts::phoenix::routes())
        .merge(crate::fronts::centrifugo::routes(&node))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if node.settings.config.web {
        all = all.merge(crate::web::routes());
    }
    let body_timeout = node.settings.config.http.body_timeout;
    all.merge(api::routes(node.clone()))
        .fallback(|| async {
            Failure::new(
                ErrorCode::MethodNotFound,
                "no such route; see docs/protocol.md",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            known_host,
        ))
        // A body trickled in slowly holds a socket and a task: bounded like the head.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            body_timeout,
        ))
        .with_state(node)
}
