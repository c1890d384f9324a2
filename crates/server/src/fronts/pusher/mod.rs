//! The Pusher Channels front (protocol 7): `pusher-js` and Laravel Echo connect to
//! `/app/{key}` unchanged, and the app's backend publishes through Pusher's signed HTTP
//! API (`/apps/{id}/…`), the `pusher` server SDKs and Laravel's broadcaster included.
//!
//! Each app (`[[pusher.apps]]`) is a namespace of Herald's: its channel `NAME` is Herald's
//! `NS:NAME` (see [`herald_protocol::pusher`] for how events are stored), so what Herald's
//! own API and SDK publish there reaches Pusher clients and the reverse, and one app's key
//! never names another app's channels. Public channels are granted to anyone, private and
//! presence channels to a valid signature; the namespace's rules still apply over that.
//!
//! - [`socket`]: the WebSocket endpoint, and the framing the hub writes with;
//! - [`speaker`]: what a client sends, done with the session's own steps;
//! - [`roster`]: presence per user;
//! - [`occupancy`]: who occupies each channel across the cluster, for webhooks;
//! - [`resume`]: what a page that reconnects missed;
//! - [`api`]: the HTTP API;
//! - [`sign`]: the signatures.

mod api;
mod occupancy;
mod resume;
mod roster;
mod sign;
mod socket;
mod speaker;

use std::sync::Arc;

use axum::{
    routing::{get, post},
    Router,
};

use crate::node::Node;

/// Records webhook event `event` of app `app` (an index into `pusher.apps`), its body made
/// by `body` only when the app posts that event.
fn post_webhook(node: &Node, app: usize, event: &str, body: impl FnOnce() -> serde_json::Value) {
    if !node.settings.config.pusher.apps[app].posts(event) {
        return;
    }
    if let Some(log) = node.webhooks.get(app).and_then(Option::as_ref) {
        log.record(&body());
    }
}

/// The front's routes (answering only for configured apps) on `node`.
pub fn routes(node: &Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/app/{key}", get(socket::connect))
        .route("/resume/{page}/app/{key}", get(socket::connect_page))
        .route("/apps/{id}/events", post(api::events))
        .route("/apps/{id}/batch_events", post(api::batch_events))
        .route("/apps/{id}/channels", get(api::channels))
        .route("/apps/{id}/channels/{name}", get(api::channel_info))
        .route("/apps/{id}/channels/{name}/users", get(api::users))
        .route(
            "/apps/{id}/users/{user}/terminate_connections",
            post(api::terminate),
        )
        .layer(axum::Extension(socket::Shared {
            occupancy: occupancy::Occupancy::start(node),
            bookmarks: resume::Bookmarks::start(),
        }))
}

/// The publication `d` as a Pusher event on the channel's Pusher name (the part after the
/// app's namespace), made once per delivery and shared by every Pusher connection.
pub(crate) fn event_of(d: &crate::queue::Delivery) -> &herald_protocol::pusher::Event {
    d.encoded(crate::fronts::slots::PUSHER, |d| {
        let name = d.channel.as_str();
        let name = name.split_once(':').map_or(name, |(_, rest)| rest);
        let name = herald_protocol::pusher::outside_name(name);
        let publication = herald_protocol::Publication {
            offset: d.offset,
            record: d.record.clone(),
        };
        herald_protocol::pusher::event(&name, publication.data())
    })
}
