//! The browser SDK (`/herald.js`), the chat demo (`/chat`) and the dashboard
//! (`/dashboard`), compiled into the binary so that one file is the whole deployment. The scripts are built from `sdk/` by its
//! `npm run build`, which also checks that the committed copies are current.

use std::sync::Arc;

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Redirect, Response},
    routing::get,
    Router,
};

use crate::node::Node;

pub mod dashboard;

const HERALD_JS: &str = include_str!("../../assets/herald.js");
const CHAT_JS: &str = include_str!("../../assets/chat.js");
const CHAT_HTML: &str = include_str!("../../assets/chat.html");
const DASHBOARD_JS: &str = include_str!("../../assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("../../assets/dashboard.css");
const DASHBOARD_HTML: &str = include_str!("../../assets/dashboard.html");

/// The pages only run their own scripts, so an injected `<script>` would be refused even if
/// rendering ever let one through.
const PAGE_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'self'";

pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/", get(|| async { Redirect::temporary("/chat") }))
        .route(
            "/herald.js",
            get(|| async { asset(HERALD_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/chat.js",
            get(|| async { asset(CHAT_JS, "text/javascript; charset=utf-8") }),
        )
        .route("/chat", get(chat))
        .route(
            "/dashboard.js",
            get(|| async { asset(DASHBOARD_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/dashboard.css",
            get(|| async { asset(DASHBOARD_CSS, "text/css; charset=utf-8") }),
        )
        // The page holds no figures: it asks for an API key, and every figure it shows
        // comes through the API or a ticket's subscription.
        .route("/dashboard", get(|| async { page(DASHBOARD_HTML) }))
        // Browsers ask for it on every page; an empty answer beats a 404 in the console.
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // Revalidate each time: a new server version serves a new SDK at the same path.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn chat() -> Response {
    page(CHAT_HTML)
}

/// A page of this server, running only its own scripts.
fn page(html: &'static str) -> Response {
    let mut response = asset(html, "text/html; charset=utf-8");
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_POLICY),
    );
    response
}
