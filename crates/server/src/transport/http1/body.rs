//! A publication's request read on the socket: its body, which one `content-length`
//! frames (`head.rs` sends any other to hyper), then the answer the router would give
//! (`api::publish::without_router`).

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
    let answer = match read(stream, unread, length, limits.body_timeout).await? {
        Ok(body) => {
            let response = crate::api::publish::without_router(node, &request, body).await;
            (response, keep_alive)
        }
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
            unread.reserve(length - unread.len());
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

/// The most room kept for a connection's next request after a body was read.
const ROOM_KEPT: usize = 16 * 1024;
