//! A publication's request read on the socket: its head asked what the router's layers
//! ask, then its body, which one `content-length` frames (`head.rs` sends any other to
//! hyper), then the answer the router's handler would give (`api::publish`).

use std::time::Duration;

use axum::{
    http,
    response::{IntoResponse, Response},
};
use tokio::{io::AsyncReadExt, net::TcpStream};

use super::Limits;
use crate::{error::Failure, node::Node};

/// Answers `POST /api/publish` whose head is `request` and whose body is the next `length`
/// bytes of `stream` (some of them perhaps in `unread` already): the answer, and whether the
/// connection may carry another request. `None` when the client left.
pub(super) async fn publish(
    node: &std::sync::Arc<Node>,
    request: http::request::Parts,
    keep_alive: bool,
    (stream, unread, length): (&mut TcpStream, &mut Vec<u8>, usize),
    limits: Limits,
) -> Option<(Response, bool)> {
    if let Err(refused) = crate::api::publish::may_publish(node, &request) {
        // Refused by its head, as the router's layers refuse it: the body is not waited for.
        // What follows is a next request only if all of it has arrived already.
        let whole = unread.len() >= length;
        if whole {
            unread.drain(..length);
        }
        return Some((refused.into_response(), keep_alive && whole));
    }
    let answer = match read(stream, unread, length, limits.body_timeout).await? {
        Ok(body) => (
            crate::api::publish::publish_body(node, body).await,
            keep_alive,
        ),
        // What follows is not known to be a request's head: the connection ends.
        Err(late) => (late.into_response(), false),
    };
    Some(answer)
}

/// The `length` bytes of a request's body that follow its head (read into `unread`, which
/// keeps what follows them); `None` when the client left, `Err` with the answer when they did
/// not arrive within `wait` (the router's answer to a body that times out: 413).
async fn read(
    stream: &mut TcpStream,
    unread: &mut Vec<u8>,
    length: usize,
    wait: Duration,
) -> Option<Result<bytes::Bytes, Failure>> {
    let read = async {
        while unread.len() < length {
            // Room for what may come next, not for all that was announced: a body announced
            // and not sent holds no more than what arrived of it.
            unread.reserve((length - unread.len()).min(READ_ROOM));
            match stream.read_buf(unread).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    };
    match tokio::time::timeout(wait, read).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(_) => {
            return Some(Err(Failure::new(
                herald_protocol::ErrorCode::MessageTooLarge,
                "cannot read request body: it did not arrive within http.body_timeout",
            )))
        }
    }
    let body = bytes::Bytes::copy_from_slice(&unread[..length]);
    unread.drain(..length);
    // A large body's room is not kept for the connection's next requests.
    if unread.capacity() > ROOM_KEPT {
        unread.shrink_to(ROOM_KEPT);
    }
    Some(Ok(body))
}

/// Most room made for one read of a body.
const READ_ROOM: usize = 16 * 1024;

/// The most room kept for a connection's next request after a body was read.
const ROOM_KEPT: usize = 16 * 1024;
