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

pub mod config;
pub mod error;
pub mod history;
pub mod hub;
pub mod node;
pub mod publish;
pub mod queue;
pub mod router;
pub mod session;
pub mod transport;
pub mod web;

use std::{future::Future, sync::Arc};

use tokio::net::TcpListener;

pub use config::{Config, Settings};
pub use node::Node;

/// Serves `node` on `listener` until `shutdown` resolves, then shuts down gracefully:
/// stops accepting, tells every client to reconnect (close code 3001), lets in-flight
/// requests finish, and returns within `shutdown_timeout`.
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
    let app = router::router(node.clone());
    // HTTP connections (upgraded WebSockets live on in `node.tasks`).
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, _) = tokio::select! {
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
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                tower::ServiceExt::oneshot(app.clone(), request)
            });
        // HTTP/1.1 only: browsers speak HTTP/2 only over TLS, which Herald leaves to a proxy.
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .with_upgrades();
        let token = token.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = token.cancelled() => {
                    // Finish the request in flight, then close.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
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
