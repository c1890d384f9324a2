//! Starting servers and talking to them.

use std::{collections::VecDeque, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use futures_util::{SinkExt, StreamExt};
pub use herald_broker_redis::testkit::RedisServer;
pub use herald_server::config::Access;
use herald_server::{config::NamespaceOverride, BrokerLimits, Config, Embedded, Node};
use serde_json::{json, Value};
use tokio::{net::TcpStream, task::JoinHandle};
use tokio_tungstenite::{tungstenite::Message, MaybeTlsStream, WebSocketStream};

pub const KEY: &str = "test-api-key-0123";
/// Upper bound for any single wait in these tests; reaching it is a failure.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Test configuration: an API key, and an `open` namespace clients may publish to. No
/// per-address limits: every test client comes from 127.0.0.1 (`limits.rs` tests them).
pub fn config() -> Config {
    let mut c = Config::default();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.api_key = Some(KEY.into());
    c.limits.connections_per_address = 0;
    c.limits.connection_rate_per_address = 0;
    c.limits.commands_per_address = 0;
    c.limits.new_channels_per_address = 0;
    c.limits.hook_calls_per_address = 0;
    c.namespaces.insert(
        "open".into(),
        NamespaceOverride {
            publish: Some(Access::Anyone),
            ..Default::default()
        },
    );
    c
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub node: Arc<Node>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: JoinHandle<std::io::Result<()>>,
    http: reqwest::Client,
}

pub async fn start(config: Config) -> TestServer {
    serve(Node::with_memory_broker(config.validate().unwrap())).await
}

/// A server with the embedded stores of its configuration (durable in `config.data_dir`).
pub async fn start_embedded(config: Config) -> TestServer {
    let settings = config.validate().unwrap();
    serve(Node::embedded(settings, Embedded::Durable).unwrap()).await
}

/// A node whose channels live in `redis`, shared with every other node started on it.
pub async fn start_on_redis(config: Config, redis: &RedisServer) -> TestServer {
    let unreachable_after = std::time::Duration::from_secs(3);
    start_on_redis_at(
        config,
        redis.url(),
        unreachable_after,
        BrokerLimits::default(),
    )
    .await
}

/// A node whose channels live in the Redis at `url`, which it calls unreachable after
/// `unreachable_after` without an answer, and treats as `limits` say then.
pub async fn start_on_redis_at(
    config: Config,
    url: String,
    unreachable_after: std::time::Duration,
    limits: BrokerLimits,
) -> TestServer {
    let mut settings = config.validate().unwrap();
    settings.broker = limits;
    let connected = herald_broker_redis::RedisBroker::connect(herald_broker_redis::RedisOptions {
        unreachable_after,
        ..herald_broker_redis::RedisOptions::at(url, "herald")
    })
    .await
    .unwrap();
    serve(Node::with_engine(settings, |sink| {
        connected.into_engine(sink)
    }))
    .await
}

async fn serve(node: Arc<Node>) -> TestServer {
    let listener = tokio::net::TcpListener::bind(node.settings.config.listen)
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(herald_server::serve(listener, node.clone(), async move {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        node,
        stop: Some(stop),
        handle,
        http: reqwest::Client::new(),
    }
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn client(&self) -> Client {
        let (ws, _) =
            tokio_tungstenite::connect_async(format!("ws://{}/connection/websocket", self.addr))
                .await
                .expect("websocket connects");
        Client::from_socket(ws)
    }

    /// A client speaking Herald's Protobuf codec (`herald.protobuf`): it takes and gives
    /// the same JSON values as [`TestServer::client`], written and read as Protobuf.
    pub async fn protobuf_client(&self) -> Client {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{}/connection/websocket", self.addr)
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("sec-websocket-protocol", "herald.protobuf".parse().unwrap());
        let (ws, response) = tokio_tungstenite::connect_async(request)
            .await
            .expect("websocket connects");
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "herald.protobuf"
        );
        Client {
            protobuf: true,
            ..Client::from_socket(ws)
        }
    }

    /// Sends `body` statelessly (`POST /connection/send`) from `client`; the error code of
    /// each answer line (`None`: a result).
    pub async fn send_codes(
        &self,
        client: &reqwest::Client,
        body: impl Into<String>,
    ) -> Vec<Option<u64>> {
        self.send_codes_with(client, "", body).await
    }

    /// [`TestServer::send_codes`] with a query (`token=…`), as `KEY=VALUE&…`.
    pub async fn send_codes_with(
        &self,
        client: &reqwest::Client,
        query: &str,
        body: impl Into<String>,
    ) -> Vec<Option<u64>> {
        let request = client
            .post(self.url(&format!("/connection/send?{query}")))
            .body(body.into());
        answer_lines(request)
            .await
            .iter()
            .map(|l| l["error"]["code"].as_u64())
            .collect()
    }

    /// Publishes through the HTTP API; returns (offset, epoch).
    pub async fn publish(&self, channel: &str, data: Value) -> (u64, String) {
        let r = self
            .api_post("/api/publish", json!({ "channel": channel, "data": data }))
            .await;
        assert_eq!(r.0, 200, "publish failed: {}", r.1);
        (
            r.1["offset"].as_u64().unwrap(),
            r.1["epoch"].as_str().unwrap().to_string(),
        )
    }

    pub async fn api_post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("Authorization", format!("apikey {KEY}"))
            .json(&body);
        response(r.send().await.unwrap()).await
    }

    pub async fn api_get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(self.url(path))
            .header("Authorization", format!("apikey {KEY}"));
        response(r.send().await.unwrap()).await
    }

    /// A scrape of `/metrics` (with the key).
    pub async fn metrics(&self) -> String {
        let r = self
            .http
            .get(self.url("/metrics"))
            .header("Authorization", format!("apikey {KEY}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let kind = r.headers()["content-type"].to_str().unwrap();
        assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
        r.text().await.unwrap()
    }

    pub async fn stop(mut self) -> std::io::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, &mut self.handle)
            .await
            .expect("server stops in time")
            .unwrap()
    }
}

/// Sends a request whose answer is JSON lines (`/connection/send`), and reads them.
pub async fn answer_lines(request: reqwest::RequestBuilder) -> Vec<Value> {
    let answer = request.send().await.unwrap().text().await.unwrap();
    answer
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A response's status and, when it is not 200, its error code. A 200 body is not read: it
/// may be a stream that never ends.
pub async fn status_and_code(r: reqwest::Response) -> (u16, Option<u64>) {
    let status = r.status().as_u16();
    if status == 200 {
        return (status, None);
    }
    let body: Value = r.json().await.unwrap_or_default();
    (status, body["error"]["code"].as_u64())
}

pub async fn response(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// Waits until `condition` holds, checking on every scheduler turn; fails after PATIENCE.
/// The offsets of a reply's or a history answer's `publications`, in order (none if absent).
pub fn offsets(reply: &Value) -> Vec<u64> {
    reply["publications"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["offset"].as_u64().expect("a publication has an offset"))
        .collect()
}

pub async fn eventually<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A WebSocket client speaking Herald's JSON protocol.
pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Lines of frames already read, not yet examined.
    lines: VecDeque<Value>,
    /// Pushes that arrived while `call` waited for a reply.
    set_aside: VecDeque<Value>,
    next_id: u64,
    /// Whether it speaks Protobuf: commands are turned into it, messages read back as JSON.
    protobuf: bool,
}

/// How a connection ended.
#[derive(Debug, PartialEq)]
pub struct Closed {
    pub code: u16,
    pub reason: String,
}

impl Client {
    pub fn from_socket(ws: WebSocketStream<MaybeTlsStream<TcpStream>>) -> Self {
        Client {
            ws,
            lines: VecDeque::new(),
            set_aside: VecDeque::new(),
            next_id: 1,
            protobuf: false,
        }
    }

    /// Sends commands as JSON lines (in Protobuf, each as its Protobuf message, on a
    /// Protobuf client).
    pub async fn send_text(&mut self, text: impl Into<String>) {
        let text = text.into();
        let message = match self.protobuf {
            false => Message::Text(text.into()),
            true => {
                let commands = herald_protocol::json::decode_frame(text.as_bytes());
                assert!(commands.iter().all(Result::is_ok), "commands: {text}");
                Message::Binary(herald_protocol::protobuf::frame_of_json(text.as_bytes()).into())
            }
        };
        self.ws.send(message).await.unwrap();
    }

    /// Sends a command and returns its reply (a result or an error object). Pushes that
    /// arrive first are kept for [`Client::next_line`].
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(json!({ "id": id, method: params }).to_string())
            .await;
        loop {
            let line = self.unread_line().await;
            if line["id"] == id {
                return line;
            }
            assert!(
                line.get("id").is_none(),
                "reply to another command while waiting for {id}: {line}"
            );
            self.set_aside.push_back(line);
        }
    }

    pub async fn subscribe(&mut self, channel: &str, since: Option<(u64, &str)>) -> Value {
        let mut params = json!({ "channel": channel });
        if let Some((offset, epoch)) = since {
            params["since"] = json!({ "offset": offset, "epoch": epoch });
        }
        let reply = self.call("subscribe", params).await;
        assert!(reply.get("error").is_none(), "subscribe failed: {reply}");
        reply["subscribe"].clone()
    }

    /// A line already read but not examined yet, if any (set aside by `call`, or later in a
    /// frame already read).
    pub fn set_aside_line(&mut self) -> Option<Value> {
        self.set_aside
            .pop_front()
            .or_else(|| self.lines.pop_front())
    }

    /// The next line the server sent (lines set aside by `call` first).
    pub async fn next_line(&mut self) -> Value {
        match self.set_aside.pop_front() {
            Some(line) => line,
            None => self.unread_line().await,
        }
    }

    async fn unread_line(&mut self) -> Value {
        if let Some(line) = self.lines.pop_front() {
            return line;
        }
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("server sent something in time")
                .expect("connection open")
                .expect("read ok");
            if let Message::Binary(frame) = &message {
                assert!(self.protobuf, "a binary message on a JSON connection");
                let lines = herald_protocol::protobuf::json_lines(frame).expect("Protobuf");
                for line in lines.split(|b| *b == b'\n') {
                    self.lines.push_back(serde_json::from_slice(line).unwrap());
                }
                return self.lines.pop_front().expect("a message in the frame");
            }
            if let Message::Text(text) = message {
                assert!(!self.protobuf, "a text message on a Protobuf connection");
                let mut lines = text
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).expect("valid JSON line"));
                let first = lines.next().expect("frame has a line");
                self.lines.extend(lines);
                return first;
            }
            if let Message::Close(frame) = message {
                panic!("connection closed while waiting for a line: {frame:?}");
            }
        }
    }

    /// The next publication push: (channel, offset, data).
    pub async fn next_pub(&mut self) -> (String, u64, Value) {
        loop {
            let line = self.next_line().await;
            if let Some(p) = line.get("pub") {
                return (
                    p["channel"].as_str().unwrap().into(),
                    p["offset"].as_u64().unwrap(),
                    p["data"].clone(),
                );
            }
        }
    }

    /// Reads until the server closes; returns the close code and reason.
    pub async fn closed(&mut self) -> Closed {
        loop {
            match tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("closed in time")
            {
                Some(Ok(Message::Close(Some(f)))) => {
                    return Closed {
                        code: f.code.into(),
                        reason: f.reason.to_string(),
                    }
                }
                Some(Ok(Message::Close(None))) | None => {
                    return Closed {
                        code: 1005,
                        reason: String::new(),
                    }
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    return Closed {
                        code: 1006,
                        reason: e.to_string(),
                    }
                }
            }
        }
    }
}
