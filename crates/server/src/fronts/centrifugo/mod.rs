//! The Centrifugo front: Centrifugo's client SDKs (`centrifuge-js`, `centrifuge-go`, the
//! Dart, Swift, Java and Python ones) connect to `[centrifugo] path`
//! (`/centrifugo/connection/websocket`) unchanged, with its JSON protocol.
//!
//! Unlike the Pusher and Phoenix fronts this one needs no speaker of its own: Centrifugo's
//! model is Herald's (channels, offsets and epochs, recovery, history, presence, JWT,
//! rpc, deltas), so the front is a codec ([`herald_protocol::centrifugo`]) over Herald's
//! own session, driven as Herald's WebSocket is. Everything about a channel is Herald's:
//! the namespace's rules, tokens, hooks, and the store's history, which survives a
//! restart where Centrifugo's memory engine's does not.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use herald_protocol::{Encoding, ErrorCode};

use crate::{
    error::Failure,
    hooks::Transport,
    node::Node,
    queue::{Delivery, Form, Lane},
    session::Session,
    transport::{
        driver::{self, Wire},
        websocket::{self, Framing, Upgraded, WebSocket},
    },
};

/// The front's route, at `[centrifugo] path`.
pub fn routes(node: &Node) -> Router<Arc<Node>> {
    Router::new().route(&node.settings.config.centrifugo.path, get(connect))
}

async fn connect(State(node): State<Arc<Node>>, request: Request) -> Response {
    if !node.settings.config.centrifugo.enabled {
        return Failure::new(
            ErrorCode::MethodNotFound,
            "the Centrifugo front is off ([centrifugo] enabled = false)",
        )
        .into_response();
    }
    websocket::accept(node, request, None, run)
}

async fn run(up: Upgraded) {
    let Upgraded {
        stream,
        early,
        node,
        address,
        facts,
        deflate,
    } = up;
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(Transport::Centrifugo, facts)
        .speaking(Encoding::Centrifugo);
    let mut wire = WebSocket::open(stream, early, deflate, &session, &node, CentrifugoFrames);
    let told = driver::drive(&node, &mut session, &mut wire, Ok(()), 0).await;
    drop(session);
    Box::pin(wire.farewell(told)).await;
}

/// How a Centrifugo connection is written to: pushes joined a line each in one message,
/// as Centrifugo's JSON streams them; the hub writes publications straight to the socket,
/// made once per publication (and form) for every Centrifugo connection. Joins and leaves
/// go through the connection's task, which says them in Centrifugo's words.
#[derive(Debug)]
pub struct CentrifugoFrames;

impl Framing for CentrifugoFrames {
    fn message<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<(Lane, &'d [u8])> {
        if delivery.offset == 0 {
            return None;
        }
        let lane = crate::fronts::slots::CENTRIFUGO_LANE;
        Some((lane, delivery.push(Encoding::Centrifugo, form)))
    }

    fn close(why: &crate::error::Disconnect) -> (u16, String) {
        let (code, _) = herald_protocol::centrifugo::close_code(why.wire_code());
        (code, why.short_reason().to_owned())
    }
}
