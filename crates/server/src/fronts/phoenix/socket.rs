//! `GET /socket/websocket?vsn=2.0.0[&token=…][&…]`: a Phoenix client's WebSocket.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    extract::{Query, Request, State},
    response::{IntoResponse, Response},
};
use herald_protocol::{
    phoenix::{self, Vsn},
    ErrorCode,
};

use super::{speaker::Phoenix, Sender};
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

/// `GET /socket/websocket`.
pub async fn connect(
    State(node): State<Arc<Node>>,
    Query(mut params): Query<BTreeMap<String, String>>,
    request: Request,
) -> Response {
    if let Some(off) = off(&node) {
        return off;
    }
    let Some(vsn) = Vsn::parse(params.get("vsn").map(String::as_str)) else {
        return Failure::new(
            ErrorCode::BadRequest,
            "unsupported vsn: this server speaks 1.0.0 and 2.0.0",
        )
        .into_response();
    };
    params.remove("vsn");
    let token = match super::auth_token::from_subprotocols(request.headers()) {
        Some(Ok(token)) => Some(token),
        Some(Err(e)) => return Failure::new(ErrorCode::BadRequest, e).into_response(),
        None => None,
    };
    // The `authToken` option is preferred to the `token` param (kept out of the hook's
    // params either way).
    let token = token.or(params.remove("token"));
    let subprotocol = websocket::offers(request.headers(), super::auth_token::SUBPROTOCOL)
        .then_some(super::auth_token::SUBPROTOCOL);
    let opening = move |up| {
        Box::new(Opening {
            up,
            vsn,
            token,
            params,
        })
    };
    websocket::accept(node, request, subprotocol, move |up| run(opening(up)))
}

/// What opening a connection takes; boxed, so that none of it stays in the connection's
/// task (an async fn keeps its arguments, and futures it awaits inline, for its whole
/// run: see the Pusher front's `run`).
struct Opening {
    up: Upgraded,
    vsn: Vsn,
    token: Option<String>,
    params: BTreeMap<String, String>,
}

/// The answer of every Phoenix route while the front is off.
pub fn off(node: &Node) -> Option<Response> {
    (!node.settings.config.phoenix.enabled).then(|| {
        Failure::new(
            ErrorCode::MethodNotFound,
            "the Phoenix front is off ([phoenix] enabled = false)",
        )
        .into_response()
    })
}

async fn run(opening: Box<Opening>) {
    let node = opening.up.node.clone();
    let Some((mut speaker, mut wire)) = Box::pin(open(opening)).await else {
        return;
    };
    let told = driver::drive(&node, &mut speaker, &mut wire, Ok(()), 0).await;
    drop(speaker);
    Box::pin(wire.farewell(told)).await;
}

/// Identifies the client (its `token` param, or the connect hook told its params); a
/// refusal closes the socket with the code Herald's own clients get.
async fn open(opening: Box<Opening>) -> Option<(Phoenix, WebSocket<PhoenixFrames>)> {
    let Opening {
        up,
        vsn,
        token,
        params,
    } = *opening;
    let Upgraded {
        stream,
        early,
        node,
        address,
        mut facts,
        deflate,
    } = up;
    if let Some(facts) = facts.as_mut() {
        facts.params = params;
    }
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(Transport::Phoenix, facts);
    let sender = Sender::random();
    let framing = PhoenixFrames(vsn, sender);
    let wire = WebSocket::open(stream, early, deflate, &session, &node, framing);
    // Who the client is, before anything it sends: a refused token (or connect hook)
    // closes the socket with the code Herald's own clients get.
    let identified = session.identify_once(token.as_deref()).await;
    if let Err(d) = identified {
        drop(session);
        Box::pin(wire.farewell(Some(d))).await;
        return None;
    }
    session.announce();
    Some((Phoenix::new(session, vsn, sender, true), wire))
}

/// How a Phoenix connection is written to: a message per push; the hub writes broadcasts
/// straight to the socket, made once per publication and serializer. Presence changes
/// go through the connection's task, which turns them into `presence_diff`s.
#[derive(Debug)]
pub struct PhoenixFrames(Vsn, Sender);

impl Framing for PhoenixFrames {
    const MESSAGE_PER_PUSH: bool = true;

    fn message<'d>(&self, delivery: &'d Delivery, _: Form) -> Option<(Lane, &'d [u8])> {
        if delivery.offset == 0 {
            return None;
        }
        let vsn = self.0;
        let lane = match vsn {
            Vsn::V1 => crate::fronts::slots::PHOENIX_LANES[0],
            Vsn::V2 => crate::fronts::slots::PHOENIX_LANES[1],
        };
        let broadcast = super::broadcast_of(delivery, vsn);
        // The sender's own event (`broadcast_from`): the task leaves it out.
        broadcast
            .for_connection(self.1)
            .then_some((lane, &broadcast.frame[..]))
    }

    /// A binary broadcast (serializer 2.0.0's, of a binary push) goes as a binary message.
    fn binary_message(&self, message: &[u8]) -> bool {
        self.0 == Vsn::V2 && phoenix::is_binary(message)
    }
}
