//! Health, keepalive, cleanup and graceful shutdown.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn healthz_answers_once_the_server_accepts_connections() {
    let server = start(config()).await;
    let r = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), 200);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_closed_connection_leaves_no_state_behind() {
    let server = start(config()).await;
    let mut c = server.client().await;
    c.subscribe("a", None).await;
    c.subscribe("b", None).await;
    assert_eq!(server.node.hub.channel_count(), 2);
    drop(c);
    eventually("the hub forgets the connection", || async {
        server.node.hub.channel_count() == 0 && server.node.connection_count() == 0
    })
    .await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_silent_peer_is_closed_after_the_idle_timeout() {
    let mut cfg = config();
    cfg.client.ping_interval = Duration::from_millis(100);
    cfg.client.idle_timeout = Duration::from_millis(400);
    let server = start(cfg).await;
    let mut c = server.client().await;
    c.subscribe("a", None).await;
    // Not reading means not answering pings: the server must give up on us.
    let started = std::time::Instant::now();
    eventually("the server drops the silent client", || async {
        server.node.connection_count() == 0
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(c.closed().await.code, 3005);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_tells_clients_to_reconnect_and_returns() {
    let server = start(config()).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe("x", None).await;
    let stopping = tokio::spawn(server.stop());
    let closed = a.closed().await;
    assert_eq!(closed.code, 3001, "{closed:?}");
    assert_eq!(b.closed().await.code, 3001);
    stopping.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_does_not_wait_for_connections_between_requests() {
    // Long timeouts, so that waiting for either would show.
    let mut c = config();
    c.http.header_timeout = Duration::from_secs(60);
    c.shutdown_timeout = Duration::from_secs(60);
    let server = start(c).await;
    // One connection that sent nothing yet (a browser's preconnect), one cut short in the
    // middle of a stream's request head.
    let _silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut partial, b"GET /connection/sse HTTP/1.1\r\nHost:")
        .await
        .unwrap();
    let node = server.node.clone();
    eventually("the server holds both sockets", || async {
        node.sockets.load(std::sync::atomic::Ordering::Relaxed) == 2
    })
    .await;
    tokio::time::timeout(Duration::from_secs(5), server.stop())
        .await
        .expect("shutdown returns without waiting out the header timeout")
        .unwrap();
}
