//! The Phoenix Channels front: `phoenix.js` (and Tsung's Phoenix sessions) connect to
//! `/socket/websocket` unchanged.
//!
//! A topic is Herald's channel of the same name, so everything about it is Herald's: the
//! namespace's rules, tokens (the socket's `token` param is the connection token, a join
//! payload's `token` a subscription token; phoenix.js's `authToken` option is the
//! connection token too, [`auth_token`]), the connect hook (told the socket's params)
//! and the subscribe hook (told the join payload), the publish hook. A client's event on a
//! joined topic is published as `{"event": E, "data": payload}` (`E` renamed by
//! `[phoenix] events`) and broadcast to every member, the sender included, as Phoenix's
//! `broadcast!` does; publications from Herald's API and the other fronts arrive the same
//! way (see [`herald_protocol::phoenix`]).
//!
//! - [`socket`]: the WebSocket endpoint and the framing the hub writes with;
//! - [`speaker`]: joins, leaves, heartbeats and events, over the session;
//! - [`longpoll`]: phoenix.js's long-poll fallback (`/socket/longpoll`), the same speaker.

mod auth_token;
mod longpoll;
mod presence;
mod socket;
mod speaker;

pub use longpoll::Polls;

use std::sync::Arc;

use axum::{routing::get, Router};

use crate::node::Node;

/// The front's WebSocket route.
pub fn routes() -> Router<Arc<Node>> {
    Router::new().route("/socket/websocket", get(socket::connect))
}

/// The long-poll fallback's routes (with the HTTP transports: their CORS and body limit),
/// given the node's long-poll sessions as an extension.
pub fn polling_routes() -> Router<Arc<Node>> {
    Router::new().route("/socket/longpoll", get(longpoll::poll).post(longpoll::send))
}

/// The publication `d` as a Phoenix broadcast on its topic (the channel) for serializer
/// `vsn`, made once per delivery and shared by every Phoenix connection of that serializer.
pub(crate) fn broadcast_of(
    d: &crate::queue::Delivery,
    vsn: herald_protocol::phoenix::Vsn,
) -> &bytes::Bytes {
    use herald_protocol::phoenix::{broadcast, Vsn};
    let i = match vsn {
        Vsn::V1 => 0,
        Vsn::V2 => 1,
    };
    d.encoded(crate::fronts::slots::PHOENIX[i], |d| {
        let publication = herald_protocol::Publication {
            offset: d.offset,
            record: d.record.clone(),
        };
        bytes::Bytes::from(broadcast(vsn, d.channel.as_str(), publication.data()))
    })
}
