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
