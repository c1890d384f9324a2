//! The opening handshake (RFC 6455 §4.2), done here rather than by axum's extractor so that
//! the connection keeps the TCP socket itself: the hub's direct lane writes to it.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Extension,
};
use futures_util::{future::OptionFuture, FutureExt};
use herald_protocol::ErrorCode;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::transport::deadline::WriteDeadline;
use tungstenite::handshake::derive_accept_key;

use super::{deflate, run, run_protobuf, JSON_SUBPROTOCOL, PROTOBUF_SUBPROTOCOL};
use crate::{
    config::Compression, error::Failure, hooks::RequestFacts, limits::Peer, node::Node,
    transport::request, Counted,
};

/// `GET /connection/websocket`: Herald's Protobuf codec for a client that offers its
/// subprotocol, JSON for every other.
pub async fn upgrade(State(node): State<Arc<Node>>, request: Request) -> Response {
    if offers(request.headers(), PROTOBUF_SUBPROTOCOL) {
        return accept(node, request, Some(PROTOBUF_SUBPROTOCOL), run_protobuf);
    }
    let json = offers_json(request.headers());
    let subprotocol = json.then_some(JSON_SUBPROTOCOL);
    accept(node, request, subprotocol, run)
}

/// A connection upgraded to WebSocket, with what its request said.
pub struct Upgraded {
    /// The socket.
    pub stream: tokio::net::TcpStream,
    /// What the client sent after its upgrade request, read already.
    pub early: Vec<u8>,
    /// The node.
    pub node: Arc<Node>,
    /// The client's address (see [`crate::limits`]), when admitted by one.
    pub address: Option<std::net::IpAddr>,
    /// What the connect hook may see of the request.
    pub facts: Option<Box<RequestFacts>>,
    /// Whether permessage-deflate was negotiated.
    pub deflate: bool,
}

/// Answers a WebSocket upgrade request as every WebSocket endpoint does (the node's
/// admission: origin, limits per address, connection count; the handshake; `subprotocol`
/// when one was chosen), then runs `serve` with the connection in a task of its own.
pub fn accept<F, Fut>(
    node: Arc<Node>,
    mut request: Request,
    subprotocol: Option<&'static str>,
    serve: F,
) -> Response
where
    F: FnOnce(Upgraded) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let peer = request.extensions().get::<Peer>().copied().map(Extension);
    // The socket's count lives on with the WebSocket once hyper lets the socket go.
    let counted_socket = request.extensions_mut().remove::<Arc<Counted>>();
    let headers = request.headers();
    let admitted = match request::admit(&node, headers, peer) {
        Ok(admitted) => admitted,
        Err(f) => return f.into_response(),
    };
    let accept = match accept_key(headers) {
        Ok(key) => key,
        Err(f) => return f.into_response(),
    };
    let facts = node.settings.hooks.facts(headers);
    let deflate = match node.settings.config.websocket.compression {
        Compression::On => deflate::negotiate(
            headers
                .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        ),
        Compression::Off => None,
    };
    // hyper offers an upgrade only on connections that can take one (HTTP/1.1 with
    // upgrades enabled); answering 101 without it would leave the client hanging.
    let Some(upgraded) = request.extensions_mut().remove::<OnUpgrade>() else {
        return (
            StatusCode::UPGRADE_REQUIRED,
            [
                (header::CONNECTION, "upgrade"),
                (header::UPGRADE, "websocket"),
            ],
        )
            .into_response();
    };
    let tasks = node.tasks.clone();
    let address = admitted.as_ref().map(|a| a.ip());
    let negotiated = deflate.is_some();
    // Two stages in one task, as an enum: what the handshake needed is gone once the
    // connection runs (an async block would keep it, and the upgrade's result, in the
    // task beside the connection for its whole life: 0.1 KB for every idle connection).
    let connection = socket_of(upgraded).then(move |socket| {
        let running = socket.map(|(stream, early)| {
            let up = Upgraded {
                stream,
                early,
                node,
                address,
                facts,
                deflate: negotiated,
            };
            // The connection counts (for its address and the node) as long as it runs.
            let counted = (counted_socket, admitted);
            serve(up).map(move |()| drop(counted))
        });
        OptionFuture::from(running).map(drop)
    });
    tokio::spawn(tasks.track_future(connection));

    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    if let Some(answer) = deflate {
        h.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static(answer),
        );
    }
    if let Some(subprotocol) = subprotocol {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(subprotocol),
        );
    }
    response
}

/// The TCP socket under an upgraded connection, and what the client sent after its
/// request; `None` when the upgrade failed.
async fn socket_of(upgraded: OnUpgrade) -> Option<(tokio::net::TcpStream, Vec<u8>)> {
    let upgraded = match upgraded.await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "websocket upgrade failed");
            return None;
        }
    };
    // The accept loop serves every connection as `TokioIo<WriteDeadline>`; a WebSocket
    // times its writes itself, on the socket.
    match upgraded.downcast::<TokioIo<WriteDeadline>>() {
        Ok(parts) => Some(socket_and_early(parts)),
        Err(_) => {
            tracing::error!("upgraded connection is not a TCP stream");
            None
        }
    }
}

/// Checks that the request asks for a WebSocket, and answers its key.
fn accept_key(headers: &HeaderMap) -> Result<String, Failure> {
    let bad = |message: &str| Failure::new(ErrorCode::BadRequest, message);
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err(bad("Connection header did not include 'upgrade'"));
    }
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err(bad("Upgrade header did not include 'websocket'"));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(bad("Sec-WebSocket-Version must be 13"));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| bad("Sec-WebSocket-Key header missing"))?;
    Ok(derive_accept_key(key.as_bytes()))
}

/// Whether the client offered the JSON subprotocol; a client that offered none gets none.
fn offers_json(headers: &HeaderMap) -> bool {
    offers(headers, JSON_SUBPROTOCOL)
}

/// Whether the client offered `subprotocol`.
pub fn offers(headers: &HeaderMap, subprotocol: &str) -> bool {
    has_token(headers, header::SEC_WEBSOCKET_PROTOCOL, subprotocol)
}

/// Whether a comma-separated header (any of its occurrences) holds `token`, ignoring case.
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// An upgraded connection's socket, and what the client sent after its upgrade request
/// that was read already: by hyper (`read_buf`, first), then by the lean path before hyper
/// had the connection. A function of its own, so that none of it is kept in the
/// WebSocket's task: a few bytes more there took every connection into the next
/// allocation size, 0.45 KB more each.
fn socket_and_early(
    parts: hyper::upgrade::Parts<TokioIo<WriteDeadline>>,
) -> (tokio::net::TcpStream, Vec<u8>) {
    // `read_buf` is a view of hyper's whole read buffer (8 KiB): copy what the client sent
    // early and let the buffer go, or every connection keeps it.
    let mut early = parts.read_buf.to_vec();
    drop(parts.read_buf);
    let (stream, unread) = parts.io.into_inner().into_inner();
    early.extend_from_slice(&unread);
    (stream, early)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn answers_the_rfc_example_key() {
        let h = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        assert_eq!(accept_key(&h).unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn refuses_requests_that_are_not_websocket_upgrades() {
        let good = [
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "x"),
        ];
        assert!(accept_key(&headers(&good)).is_ok());
        let cases: [(&str, Option<&'static str>); 5] = [
            ("connection", Some("keep-alive")),
            ("upgrade", Some("h2c")),
            ("sec-websocket-version", Some("8")),
            ("sec-websocket-version", None),
            ("sec-websocket-key", None),
        ];
        for (name, value) in cases {
            let mut bad: Vec<_> = good.iter().copied().filter(|(n, _)| *n != name).collect();
            if let Some(v) = value {
                bad.push((name, v));
            }
            let refused = accept_key(&headers(&bad)).expect_err(name);
            assert_eq!(refused.code, ErrorCode::BadRequest, "{name}: {value:?}");
        }
    }

    #[test]
    fn picks_the_json_subprotocol_only_when_offered() {
        assert!(offers_json(&headers(&[(
            "sec-websocket-protocol",
            "other, herald.json"
        )])));
        assert!(!offers_json(&headers(&[(
            "sec-websocket-protocol",
            "other"
        )])));
    }

    #[tokio::test]
    async fn a_connection_that_cannot_be_upgraded_gets_426_not_101() {
        let node = Node::with_memory_broker(crate::config::Config::default().validate().unwrap());
        let mut request = Request::new(Body::empty());
        *request.headers_mut() = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let response = upgrade(State(node), request).await;
        assert_eq!(response.status(), StatusCode::UPGRADE_REQUIRED);
    }
}
