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
    transport::websocket::{self, Framing, Upgraded},
};

mod api;

/// The front's routes: its WebSocket at `[centrifugo] path`, its server API under
/// `[centrifugo] api_path`.
pub fn routes(node: &Node) -> Router<Arc<Node>> {
    Router::new()
        .route(&node.settings.config.centrifugo.path, get(connect))
        .merge(api::routes(node))
}

async fn connect(State(node): State<Arc<Node>>, request: Request) -> Response {
    if !node.settings.config.centrifugo.enabled {
        return Failure::new(
            ErrorCode::MethodNotFound,
            "the Centrifugo front is off ([centrifugo] enabled = false)",
        )
        .into_response();
    }
    // Centrifugo's Protobuf clients ask for their codec by subprotocol; JSON ones ask for
    // none.
    let protobuf = websocket::offers(request.headers(), PROTOBUF_SUBPROTOCOL);
    let (encoding, subprotocol) = match protobuf {
        true => (Encoding::CentrifugoProtobuf, Some(PROTOBUF_SUBPROTOCOL)),
        false => (Encoding::Centrifugo, None),
    };
    websocket::accept(node, request, subprotocol, move |up| run(up, encoding))
}

/// The subprotocol of Centrifugo's Protobuf codec.
pub const PROTOBUF_SUBPROTOCOL: &str = "centrifuge-protobuf";

/// Not an async fn, which would keep `up` beside the session made of it (see
/// [`websocket::serve`]).
fn run(up: Upgraded, encoding: Encoding) -> impl std::future::Future<Output = ()> + Send {
    let framing = CentrifugoFrames(encoding);
    websocket::serve(up, Transport::Centrifugo, encoding, framing)
}

/// How a Centrifugo connection of a codec is written to: pushes joined in one message
/// (JSON a line each, Protobuf each with its length), as Centrifugo streams them; the hub
/// writes publications straight to the socket, made once per publication, codec and form
/// for every Centrifugo connection like it. Joins and leaves go through the connection's
/// task, which says them in Centrifugo's words.
#[derive(Debug)]
pub struct CentrifugoFrames(Encoding);

impl Framing for CentrifugoFrames {
    fn message<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<(Lane, &'d [u8])> {
        if delivery.offset == 0 {
            return None;
        }
        let lanes = crate::fronts::slots::CENTRIFUGO_LANES;
        let lane = lanes[usize::from(self.binary())];
        Some((lane, delivery.push(self.0, form)))
    }

    fn binary(&self) -> bool {
        self.0.codec().binary()
    }

    fn close(why: &crate::error::Disconnect) -> (u16, String) {
        let (code, _) = herald_protocol::centrifugo::close_code(why.wire_code());
        (code, why.short_reason().to_owned())
    }

    /// Centrifugo's ping (an empty reply), every `client.ping_interval`, as the connect
    /// reply's `ping` says: its clients reconnect when one is late, and answer each with
    /// an empty command (`pong: true`), which keeps the connection from going idle.
    fn app_ping(&self) -> Option<Vec<u8>> {
        Some(self.0.codec().push(&herald_protocol::Push::Ping))
    }
}
