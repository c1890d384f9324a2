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

/// A WebSocket client that speaks on its own (the SDK pings a quiet connection, since a page
/// never sees the server's pings) gets no server pings on top: it is evidently alive. One
/// that is quiet is pinged.
#[tokio::test]
async fn a_client_that_pings_on_its_own_is_not_pinged_and_a_quiet_one_is() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut cfg = config();
    cfg.client.ping_interval = Duration::from_millis(100);
    let server = start(cfg).await;
    let url = format!("ws://{}/connection/websocket", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    // Pings every 40 ms for a second (ten of the server's periods); counts its pings.
    let mut server_pings = 0;
    let mut every = tokio::time::interval(Duration::from_millis(40));
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    for id in 1.. {
        tokio::select! {
            _ = every.tick() => {
                if tokio::time::Instant::now() >= until {
                    break;
                }
                ws.send(Message::text(format!(r#"{{"id":{id},"ping":{{}}}}"#))).await.unwrap();
            }
            m = ws.next() => {
                if let Message::Ping(_) = m.unwrap().unwrap() {
                    server_pings += 1;
                }
            }
        }
    }
    assert_eq!(server_pings, 0, "pinged although it spoke every 40 ms");
    // Quiet now: the server pings within a few periods.
    let pinged = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Message::Ping(_) = ws.next().await.unwrap().unwrap() {
                return;
            }
        }
    })
    .await;
    assert!(pinged.is_ok(), "a quiet client was never pinged");
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
