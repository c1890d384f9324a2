//! # Herald server
//!
//! ## How a publication reaches a browser
//!
//! 1. [`publish`] checks a publication (from the HTTP API or a client's `publish` command)
//!    and hands it to the [`Broker`](herald_broker::Broker), which assigns the next offset,
//!    stores it, and passes it to the node's hub: one step per channel, so order holds.
//! 2. The [`hub`] encodes the publication once and pushes the same bytes into the
//!    [`queue`] of every local subscriber. It never waits: a full queue marks its
//!    connection as slow.
//! 3. A [`transport`] wakes on its queue, lets the [`session`] drop duplicates and catch
//!    gaps, batches what is ready into one frame, and writes it to the socket.
//!
//! Commands travel the other way: transport → session → broker / hub.

pub mod admin;
pub mod api;
pub mod bounded;
pub mod config;
pub mod error;
pub mod fronts;
pub mod history;
pub mod hooks;
pub mod hub;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod policy;
pub mod publish;
pub mod queue;
pub mod registry;
pub mod relocate;
pub mod router;
pub mod session;
pub mod settings;
pub mod throttle;
pub mod token;
pub mod transport;
pub mod transports;
pub mod web;

use std::{
    future::Future,
    sync::{atomic::Ordering, Arc},
};

use tokio::net::TcpListener;

pub use config::Config;
pub use node::{Embedded, Node};
pub use settings::{BrokerLimits, Settings};

/// Refused sockets still being told why; past this many, more are closed without a word.
const MAX_LINGERING: usize = 1024;

/// How long a refused socket is given to read its 503.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts an accepted socket, or refuses it when the node holds `max_connections` sockets
/// or its peer `limits.connections_per_address`: with a short 503 and code 106, so that a
/// refused client learns why, then closes it.
fn admit_socket(
    node: &Arc<Node>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) -> Option<(tokio::net::TcpStream, Counted)> {
    let limit = node.settings.config.max_connections;
    let message = if limit > 0 && node.sockets.load(Ordering::Relaxed) >= limit {
        node.limits
            .refusals
            .count(limits::Limit::MaxConnections, Some(peer.ip()), limit);
        "the server holds its maximum of connections; retry later"
    } else if let Some(guard) = node.limits.socket(peer.ip()) {
        node.sockets.fetch_add(1, Ordering::Relaxed);
        let counted = Counted {
            sockets: node.sockets.clone(),
            _peer: guard,
        };
        return Some((stream, counted));
    } else {
        "this address holds its maximum of connections; close one or retry later"
    };
    static LINGERING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if LINGERING.fetch_add(1, Ordering::Relaxed) >= MAX_LINGERING {
        LINGERING.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    use herald_protocol::{json::Json, Codec, ErrorCode, Reply};
    let body = Json.reply(&Reply::error(None, ErrorCode::LimitExceeded, message));
    let answer = [
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes(),
        body,
    ]
    .concat();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        // Answer once the request's head is in (HTTP clients take an answer before their
        // request as a broken connection), then read what else comes before closing: closing
        // with unread bytes sends a reset, which can overtake the answer.
        let _ = tokio::time::timeout(LINGER, async {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                match stream.read(&mut buf).await? {
                    0 => break,
                    n => head.extend_from_slice(&buf[..n]),
                }
            }
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            while stream.read(&mut buf).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
        LINGERING.fetch_sub(1, Ordering::Relaxed);
    });
    None
}

/// An open TCP socket, counted by the node and against its peer while it lives.
#[derive(Debug)]
pub struct Counted {
    sockets: Arc<std::sync::atomic::AtomicUsize>,
    _peer: limits::SocketGuard,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.sockets.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `node` on `listener` until `shutdown` resolves, then shuts down gracefully:
/// stops accepting, tells every client to reconnect (close code 3001), lets in-flight
/// requests finish, and returns within `shutdown_timeout`.
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The dashboard's figures, and this node's report to the others sharing its broker.
    web::dashboard::spawn_sampler(&node);
    // Clients of a node that lost its broker go elsewhere.
    relocate::spawn(&node);
    let token = node.shutdown.clone();
    tokio::spawn({
        let token = token.clone();
        async move {
            tokio::select! {
                _ = shutdown => token.cancel(),
                _ = token.cancelled() => {}
            }
        }
    });
    // Sessions kept between requests (Herald's long-polls, the Phoenix front's): the
    // polling transports' own state, which both the router's handlers and the lean path's
    // `Resumer` use.
    let waiting =
        transport::poll::Waiting::new(node.shutdown.token(), Some(&node.metrics.longpolls_kept));
    let parked = transport::poll::Parked::new(
        node.settings.config.http.longpoll_grace,
        waiting,
        node.metrics.longpolls_taken_up.clone(),
    );
    let app = router::router(node.clone(), parked.clone());
    let resumer = transport::poll::Resumer::new(node.clone(), parked);
    let http = &node.settings.config.http;
    // HTTP/1.1 only: browsers speak HTTP/2 only over TLS, which Herald leaves to a proxy.
    // The timer makes the header timeout work (without one hyper silently has none); it
    // runs from the connection's opening and again after every response, so it bounds
    // both a slow request head and an idle keep-alive connection.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(http.header_timeout)
        // The lean path's limit too: both read heads with httparse, by the same rules.
        .max_headers(transport::http1::MAX_HEADERS);
    // Shared: every connection's task holds it while hyper serves the connection.
    let builder = Arc::new(builder);
    // HTTP connections (upgraded WebSockets live on in `node.tasks`).
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = token.cancelled() => break,
        };
        let Some((stream, socket)) = admit_socket(&node, stream, peer) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, resumer, builder, token) =
            (app.clone(), resumer.clone(), builder.clone(), token.clone());
        let limits = transport::http1::Limits {
            header_timeout: http.header_timeout,
            write_timeout: node.settings.config.client.write_timeout,
            body_timeout: http.body_timeout,
        };
        let task = async move {
            let socket = Arc::new(socket);
            // Streams, long-polls and publications are served on the socket itself (see
            // `transport::http1`); the rest, and whatever follows them on the connection,
            // by hyper. The first request is sorted by its first bytes, peeked: a connection
            // for hyper then makes none of the lean path's state.
            let next = transport::http1::next(&stream, limits.header_timeout);
            // Boxed: only the first request waits in it, and the task is as large as its
            // largest step.
            let (stream, unread) =
                match Box::pin(transport::http1::until_shutdown(next, &token)).await {
                    transport::http1::Next::Gone => return,
                    transport::http1::Next::Other => (stream, Vec::new()),
                    transport::http1::Next::Lean => {
                        // Boxed, as is hyper's connection below: a task is as large as the
                        // largest of them, and only one of them serves the connection.
                        let held = Box::pin(transport::http1::serve(
                            (&app, &resumer),
                            stream,
                            peer,
                            socket.clone(),
                            limits,
                            &token,
                        ));
                        match held.await {
                            Some(back) => back,
                            None => return,
                        }
                    }
                };
            let service = hyper::service::service_fn(
                move |mut request: hyper::Request<hyper::body::Incoming>| {
                    // The peer, and the socket's count, which an upgraded WebSocket carries on.
                    request.extensions_mut().insert(limits::Peer(peer));
                    request.extensions_mut().insert(socket.clone());
                    tower::ServiceExt::oneshot(app.clone(), request)
                },
            );
            // Every answer hyper writes has a deadline (see `transport::deadline`).
            let io = transport::deadline::WriteDeadline::new(stream, unread, limits.write_timeout);
            let connection = builder
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .with_upgrades();
            let mut connection = Box::pin(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = token.cancelled() => {
                    // Finish the request in flight, then close.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        };
        connections.spawn(task);
    }
    tracing::info!(connections = node.connection_count(), "shutting down");
    drop(listener);
    let drain = async {
        connections.close();
        connections.wait().await;
        node.tasks.close();
        node.tasks.wait().await;
        Ok(())
    };
    match tokio::time::timeout(node.settings.config.shutdown_timeout, drain).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                connections = node.connection_count(),
                "shutdown timeout reached; closing anyway"
            );
            Ok(())
        }
    }
}
