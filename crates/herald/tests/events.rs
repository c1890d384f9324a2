//! Backend events survive a `kill -9` of Herald and a restart of the backend: after
//! de-duplication by id, every event arrives exactly once, in order per client.

mod support;

use std::{collections::HashSet, net::SocketAddr, sync::Arc, time::Duration};

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde_json::{json, Value};
use support::Server;

type Posts = Arc<Mutex<Vec<Value>>>;

/// The application's backend, in a runtime of its own so that dropping it ends every
/// connection it holds, as a process exit would. Answers 503 until `healthy`.
struct Backend {
    _runtime: tokio::runtime::Runtime,
}

impl Backend {
    fn start(addr: SocketAddr, healthy: bool, posts: Posts) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .expect("the backend's port is free again");
        let app = axum::Router::new().route(
            "/events",
            axum::routing::post(move |body: String| {
                let posts = posts.clone();
                async move {
                    posts.lock().push(serde_json::from_str(&body).unwrap());
                    if healthy {
                        (axum::http::StatusCode::OK, r#"{"result":{}}"#)
                    } else {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down")
                    }
                }
            }),
        );
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { _runtime: runtime }
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Every event posted, once per id, in the order first posted.
fn unique(posts: &Posts) -> Vec<Value> {
    let mut seen = HashSet::new();
    posts
        .lock()
        .iter()
        .flat_map(|p| p["events"].as_array().cloned().unwrap_or_default())
        .filter(|e| seen.insert(e["id"].as_str().unwrap().to_string()))
        .collect()
}

fn of(events: &[Value], client: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["client"] == client)
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn events_survive_kill_9_and_a_backend_restart_exactly_once_after_de_duplication() {
    let data = tempfile::tempdir().unwrap();
    let backend_addr = free_port();
    let config = data.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "[hooks]\nevents_url = \"http://{backend_addr}/events\"\ncircuit_failures = 1000\n"
        ),
    )
    .unwrap();
    let posts: Posts = Arc::default();
    let backend = Backend::start(backend_addr, false, posts.clone());
    let args = ["--config", config.to_str().unwrap()];
    let mut server = Server::start_in(&data.path().join("store"), &args);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let ws_url = format!("{}/connection/websocket", server.url.replace("http", "ws"));
    // One client connects, subscribes and leaves; another is still connected at the kill.
    let (left, stayed) = rt.block_on(async {
        let mut ids = Vec::new();
        let mut sockets = Vec::new();
        for _ in 0..2 {
            let (mut ws, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
            ws.send(json!({ "id": 1, "connect": {} }).to_string().into())
                .await
                .unwrap();
            ws.send(
                json!({ "id": 2, "subscribe": { "channel": "chat:a" } })
                    .to_string()
                    .into(),
            )
            .await
            .unwrap();
            let reply: Value =
                serde_json::from_str(ws.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
            ids.push(reply["connect"]["client"].as_str().unwrap().to_string());
            sockets.push(ws);
        }
        let mut first = sockets.remove(0);
        first.close(None).await.unwrap();
        while first.next().await.is_some() {}
        std::mem::forget(sockets);
        (ids[0].clone(), ids[1].clone())
    });
    // Posted (and refused) means stored: the deliverer reads what the writer stored.
    wait_until("the stored events were offered to the backend", || {
        let events = unique(&posts);
        of(&events, &left).len() == 3 && of(&events, &stayed).len() == 2
    });
    let offered = unique(&posts);

    assert!(std::process::Command::new("kill")
        .args(["-KILL", &server.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let _ = server.child.wait();
    // The backend goes away too, and comes back healthy after Herald does.
    drop(backend);
    let server = Server::start_in(&data.path().join("store"), &args);
    let delivered: Posts = Arc::default();
    let _backend = Backend::start(backend_addr, true, delivered.clone());

    wait_until("the events were delivered after both restarts", || {
        let events = unique(&delivered);
        of(&events, &left).len() == 3 && of(&events, &stayed).len() == 2
    });
    let events = unique(&delivered);
    assert_eq!(of(&events, &left), ["connect", "subscribe", "disconnect"]);
    assert_eq!(of(&events, &stayed), ["connect", "subscribe"]);
    // The same ids as before the kill: the backend can tell what it saw already.
    for e in &offered {
        assert!(
            events
                .iter()
                .any(|d| d["id"] == e["id"] && d["type"] == e["type"]),
            "{e} was delivered again with the same id"
        );
    }
    drop(server);
}
