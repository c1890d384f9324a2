//! The browser SDK (`/herald.js`) and the chat demo (`/chat`), compiled into the binary so
//! that one file is the whole deployment. The scripts are built from `sdk/` by its
//! `npm run build`, which also checks that the committed copies are current.

use std::sync::Arc;

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Redirect, Response},
    routing::get,
    Router,
};

use crate::node::Node;

const HERALD_JS: &str = include_str!("../assets/herald.js");
const CHAT_JS: &str = include_str!("../assets/chat.js");
const CHAT_HTML: &str = include_str!("../assets/chat.html");

/// The chat page only runs its own scripts, so an injected `<script>` would be refused even if
/// rendering ever let one through.
const CHAT_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'self'";

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
    let mut response = asset(CHAT_HTML, "text/html; charset=utf-8");
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CHAT_POLICY),
    );
    response
}
