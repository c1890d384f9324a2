//! Black-box fuzz of a running server: mutated HTTP requests on every transport's path,
//! oversized headers, raw WebSocket frames after a real handshake, while one WebSocket
//! subscriber waits for publications made through the API throughout. The server passes
//! when it still answers `/healthz` and the subscriber received every publication once, in
//! order.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_broker::{conformance::Recorder, PublicationSink};
use herald_protocol::{ChannelName, Epoch, Publication};
use herald_server::{Config, Node};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_tungstenite::tungstenite::Message;

use crate::mutate;

/// Rounds in flight at once.
const PARALLEL: usize = 32;
/// How long a round reads the server's answer (streams never end by themselves).
const READ_FOR: Duration = Duration::from_millis(300);
/// One publication through the API every this many rounds.
const PUBLISH_EVERY: u64 = 50;
const KEY: &str = "fuzz-api-key-0123";
/// The watcher's channel: in a namespace of its own, which no corpus entry names, so that
/// only the fuzz's own publications reach it.
const WATCHED: &str = "fuzzwatch:only";

/// What a server fuzz did and found.
#[derive(Debug, Default)]
pub struct ServerReport {
    /// The engine's name.
    pub engine: &'static str,
    pub rounds: u64,
    pub published: u64,
    pub received: u64,
    pub in_order: bool,
    pub healthy: bool,
    /// Rounds by the HTTP status they were answered with (0: no answer before the
    /// connection closed or the round's time was up).
    pub statuses: std::collections::BTreeMap<u16, u64>,
    /// Panics on the server's threads (each ended a connection's task), and the last.
    pub panics: crate::ServerPanics,
    /// The process's resident memory (MB) before the rounds, halfway, and after: a server
    /// that leaks grows in the second half as in the first.
    pub rss_mb: [f64; 3],
    pub elapsed: Duration,
}

impl ServerReport {
    pub fn passed(&self) -> bool {
        self.healthy && self.in_order && self.received == self.published && self.panics.count == 0
    }
}

impl std::fmt::Display for ServerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<14} {:>10} rounds  healthy: {}  subscriber got {}/{} publications{}  {:>8.1} s",
            format!("server/{}", self.engine),
            self.rounds,
            self.healthy,
            self.received,
            self.published,
            if self.in_order {
                ", in order"
            } else {
                ", OUT OF ORDER"
            },
            self.elapsed.as_secs_f64()
        )?;
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        write!(f, "\n  answers by status: {}", statuses.join(", "))?;
        let [before, half, after] = self.rss_mb;
        write!(
            f,
            "\n  resident memory: {before:.0} MB before, {half:.0} MB halfway, {after:.0} MB after"
        )?;
        write!(f, "{}", self.panics)
    }
}

/// Requests to mutate: one per transport, the API with its key (every route), two
/// requests on one kept-alive connection, and then some.
fn corpus() -> Vec<Vec<u8>> {
    let host = "Host: 127.0.0.1\r\n";
    let big = "x".repeat(70 * 1024);
    let key = format!("Authorization: apikey {KEY}\r\n");
    let api = |method: &str, path: &str, body: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\n{host}{key}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let token = crate::access::connection_token();
    let room = crate::access::subscription_token("room:a");
    let mut requests: Vec<String> = vec![
        api("POST", "/api/publish", r#"{"channel":"chat:a","data":{"n":[1,2.5,null]},"idempotency_key":"k-1"}"#),
        api("POST", "/api/broadcast", r#"{"channels":["chat:a","room:a"],"data":"x"}"#),
        api("GET", "/api/history?channel=chat:a&since=0&limit=5", ""),
        api("DELETE", "/api/history?channel=chat:b", ""),
        api("GET", "/api/info", ""),
        api("GET", "/api/nodes", ""),
        api("GET", "/api/presence?channel=room:a&limit=2&cursor=0000000000000001", ""),
        api("GET", "/api/presence_stats?channel=room:a", ""),
        api("POST", "/api/disconnect", r#"{"user":"7","code":3000,"reason":"fuzz"}"#),
        api("POST", "/api/unsubscribe", r#"{"client":"abc","channel":"room:a"}"#),
        api("GET", "/api/connections?user=7", ""),
        api("GET", "/api/channels?prefix=chat:&limit=3&after=chat:a", ""),
        api("GET", "/api/dashboard/ticket", ""),
        format!("GET /connection/sse?channel=room:a&token={token}&sub_token={room} HTTP/1.1\r\n{host}\r\n"),
        // A stream of Protobuf messages (each with its length), and its commands.
        format!("GET /connection/stream?protocol=protobuf&channel=chat:a&token={token} HTTP/1.1\r\n{host}\r\n"),
        format!(
            "POST /connection/send?session=x HTTP/1.1\r\n{host}Content-Length: 4\r\n\r\n\x02\x08\x01\x00"
        ),
    ];
    // Centrifugo's server API: its own paths and header, bodies of its own shape.
    let centrifugo = |method: &str, body: &str| {
        format!(
            "POST /centrifugo/api/{method} HTTP/1.1\r\n{host}X-API-Key: {KEY}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    requests.extend([
        centrifugo(
            "publish",
            r#"{"channel":"chat:a","data":{"n":1},"tags":{"t":"x"},"idempotency_key":"c-1"}"#,
        ),
        centrifugo(
            "broadcast",
            r#"{"channels":["chat:a","bad channel"],"data":[1]}"#,
        ),
        centrifugo(
            "history",
            r#"{"channel":"chat:a","limit":-1,"since":{"offset":1,"epoch":""}}"#,
        ),
        centrifugo("history_remove", r#"{"channel":"chat:b"}"#),
        centrifugo("presence", r#"{"channel":"room:a"}"#),
        centrifugo("presence_stats", r#"{"channel":"room:a"}"#),
        centrifugo("channels", r#"{"pattern":"room:*a?"}"#),
        centrifugo("info", "{}"),
        centrifugo(
            "batch",
            r#"{"commands":[{"publish":{"channel":"chat:a","data":1}},{"batch":{}},{"x":{}}]}"#,
        ),
        centrifugo(
            "unsubscribe",
            r#"{"user":"7","channel":"room:a","client":"abc"}"#,
        ),
        centrifugo(
            "disconnect",
            r#"{"user":"7","disconnect":{"code":3500,"reason":"fuzz"}}"#,
        ),
        centrifugo("publish", r#"{"channel":"chat:a","b64data":"AAE="}"#),
    ]);
    // Kept alive: a valid request, then one the mutations reach; through hyper (the API),
    // and through the lean path of held requests (a long-poll answered at once from
    // `chat:a`'s history, which the API rounds fill).
    requests.push(format!(
        "GET /api/info HTTP/1.1\r\n{host}{key}\r\nGET /connection/poll?channel=chat:a&token={token} HTTP/1.1\r\n{host}\r\n"
    ));
    requests.push(format!(
        "GET /connection/longpoll?cursor=chat:a%3B*%3B0&timeout=1 HTTP/1.1\r\n{host}\r\nGET /connection/longpoll?cursor=chat:b%3B*%3B0&channel=room:a&timeout=1 HTTP/1.1\r\n{host}\r\n"
    ));
    // Publications read on the lean path (a body of one length), pipelined, then a request
    // it hands to hyper; and one whose chunks hyper reads.
    let publish = api("POST", "/api/publish", r#"{"channel":"chat:b","data":[1]}"#);
    requests.push(format!(
        "{publish}{publish}GET /api/info HTTP/1.1\r\n{host}{key}\r\n"
    ));
    requests.push(format!(
        "POST /api/publish HTTP/1.1\r\n{host}{key}Transfer-Encoding: chunked\r\n\r\n1d\r\n{{\"channel\":\"chat:b\",\"data\":2}}\r\n0\r\n\r\n"
    ));
    [
        format!("GET /connection/poll?channel=chat:a&channel=chat:b HTTP/1.1\r\n{host}\r\n"),
        format!("GET /connection/longpoll?cursor=chat:a%3B*%3B0&timeout=1 HTTP/1.1\r\n{host}\r\n"),
        format!("GET /connection/sse?channel=chat:a HTTP/1.1\r\n{host}Last-Event-ID: chat:a;abc;3\r\n\r\n"),
        format!("GET /connection/stream?channel=chat:a HTTP/1.1\r\n{host}\r\n"),
        format!("GET /connection/iframe?channel=chat:a&callback=parent.cb HTTP/1.1\r\n{host}\r\n"),
        format!(
            "POST /connection/send HTTP/1.1\r\n{host}Content-Length: 96\r\n\r\n{{\"id\":1,\"publish\":{{\"channel\":\"chat:a\",\"data\":[1,{{\"b\":\"c\"}}]}}}}\n{{\"id\":2,\"history\":{{\"channel\":\"chat:a\"}}}}"
        ),
        format!(
            "POST /connection/send?session=abc-123 HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\n10\r\n{{\"id\":1,\"ping\":{{}}}}\r\n0\r\n\r\n"
        ),
        format!(
            "GET /connection/websocket HTTP/1.1\r\n{host}Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
        format!("GET /api/info HTTP/1.1\r\n{host}Authorization: apikey wrong\r\n\r\n"),
        format!("GET /connection/poll?channel=chat:a HTTP/1.1\r\n{host}X-Big: {big}\r\n\r\n"),
        format!("GET /{} HTTP/1.1\r\n{host}\r\n", "a".repeat(20_000)),
    ]
    .into_iter()
    .chain(requests)
    .map(String::into_bytes)
    .collect()
}

/// A session that signs in with a token, subscribes to a presence channel with a
/// subscription token and reads its members and counts (ids 1 to 4): each answered
/// without an error by the fuzzed server.
pub fn signed_in_commands() -> String {
    let token = crate::access::connection_token();
    let room = crate::access::subscription_token("room:a");
    [
        format!(r#"{{"id":1,"connect":{{"token":"{token}"}}}}"#),
        format!(r#"{{"id":2,"subscribe":{{"channel":"room:a","token":"{room}"}}}}"#),
        r#"{"id":3,"presence":{"channel":"room:a","limit":5}}"#.into(),
        r#"{"id":4,"presence_stats":{"channel":"room:a"}}"#.into(),
    ]
    .join("\n")
}

/// After [`signed_in_commands`]: the connection's and the subscription's tokens refreshed
/// (ids 5 and 6).
pub fn refresh_commands() -> String {
    let token = crate::access::connection_token();
    let room = crate::access::subscription_token("room:a");
    [
        format!(r#"{{"id":5,"refresh":{{"token":"{token}"}}}}"#),
        format!(r#"{{"id":6,"refresh":{{"token":"{room}","channel":"room:a"}}}}"#),
    ]
    .join("\n")
}

/// WebSocket frames (client to server, masked) to mutate after a real handshake.
fn frames() -> Vec<Vec<u8>> {
    let text = |payload: &[u8], opcode: u8, fin: bool| {
        let mask = [1u8, 2, 3, 4];
        let mut f = vec![(u8::from(fin) << 7) | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };
    vec![
        text(signed_in_commands().as_bytes(), 1, true),
        text(refresh_commands().as_bytes(), 1, true),
        text(
            br#"{"id":7,"rpc":{"method":"m","data":{"q":[1]}}}"#,
            1,
            true,
        ),
        text(
            br#"{"id":8,"presence":{"channel":"room:a","cursor":"zz"}}"#,
            1,
            true,
        ),
        text(br#"{"id":1,"connect":{}}"#, 1, true),
        text(
            br#"{"id":2,"subscribe":{"channel":"chat:a","since":{"offset":0}}}"#,
            1,
            true,
        ),
        text(
            br#"{"id":3,"publish":{"channel":"chat:a","data":{"x":1}}}"#,
            1,
            true,
        ),
        text(
            br#"{"id":4,"history":{"channel":"chat:a","limit":5}}"#,
            1,
            true,
        ),
        text(b"\xff\xfe not utf-8", 1, true),
        text(br#"{"id":5,"#, 1, false),
        text(b"ping", 9, true),
        text(b"\x03\xe8bye", 8, true),
        text(b"binary", 2, true),
    ]
}

/// Where the fuzzed server keeps publications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The memory broker.
    Memory,
    /// The durable store, in a directory of its own.
    Durable,
    /// A real `redis-server` started for the run, on a free port.
    Redis,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Memory, Engine::Durable, Engine::Redis];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::Durable => "durable",
            Engine::Redis => "redis",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// Starts a server with its defaults (on `engine`, an API key), fuzzes it for `rounds`
/// rounds from `seed`, and reports.
pub async fn fuzz(rounds: u64, seed: u64) -> anyhow::Result<ServerReport> {
    fuzz_on(Engine::Memory, rounds, seed).await
}

/// [`fuzz`], on `engine`.
pub async fn fuzz_on(engine: Engine, rounds: u64, seed: u64) -> anyhow::Result<ServerReport> {
    let panics_mark = crate::ServerPanics::mark();
    let fuzzed = start_on(engine, |_| {}).await?;
    let addr = fuzzed.addr;
    let started = std::time::Instant::now();
    let received = watch(addr).await?;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://{addr}"),
    };
    let mut published = 0;

    let requests = Arc::new(corpus());
    let frames = Arc::new(frames());
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut statuses = std::collections::BTreeMap::new();
    let mut rss = [resident_mb(), 0.0, 0.0];
    for round in 0..rounds {
        if round == rounds / 2 {
            rss[1] = resident_mb();
        }
        if in_flight.len() >= PARALLEL {
            if let Some(Ok(status)) = in_flight.join_next().await {
                *statuses.entry(status).or_insert(0) += 1;
            }
        }
        let seed = rng.u64(..);
        let (requests, frames) = (requests.clone(), frames.clone());
        in_flight.spawn(async move { one_round(addr, seed, &requests, &frames).await });
        if round % PUBLISH_EVERY == 0 {
            published += 1;
            api.publish(published).await?;
        }
    }
    while let Some(done) = in_flight.join_next().await {
        if let Ok(status) = done {
            *statuses.entry(status).or_insert(0) += 1;
        }
    }
    let offsets = |r: &Recorder| r.offsets(WATCHED);
    received
        .wait_until(Duration::from_secs(10), |r| {
            offsets(r).len() >= published as usize
        })
        .await;
    let got = offsets(&received);
    let report = ServerReport {
        engine: engine.name(),
        rss_mb: {
            rss[2] = resident_mb();
            rss
        },
        rounds,
        published,
        received: got.len() as u64,
        in_order: got.iter().copied().eq(1..=got.len() as u64),
        healthy: api.healthy().await,
        statuses,
        panics: crate::ServerPanics::since(panics_mark),
        elapsed: started.elapsed(),
    };
    fuzzed.stop().await;
    Ok(report)
}

/// A server under fuzz.
pub struct Fuzzed {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// What its engine needs kept (its directory, its Redis) until it stops.
    keep: Box<dyn std::any::Any + Send>,
}

impl Fuzzed {
    /// Stops the server (and its Redis).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
        drop(self.keep);
    }
}

/// Starts the fuzzed server: the memory broker, an API key, an HMAC secret the fuzz
/// signs tokens with, a presence namespace (`room`), per-address limits off.
pub async fn start() -> anyhow::Result<Fuzzed> {
    start_with(|_| {}).await
}

/// [`start`], with `adjust` applied to the configuration last.
pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> anyhow::Result<Fuzzed> {
    start_on(Engine::Memory, adjust).await
}

/// [`start_with`], on `engine`.
pub async fn start_on(engine: Engine, adjust: impl FnOnce(&mut Config)) -> anyhow::Result<Fuzzed> {
    let mut config = Config::default();
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.api_key = Some(KEY.into());
    // Tokens the fuzz mints pass: its sessions sign in, subscribe with subscription tokens
    // and refresh, so what follows a valid token is reached.
    config.auth.hmac_secret = Some(crate::access::SECRET.into());
    config.namespaces.insert(
        "room".into(),
        herald_server::config::NamespaceOverride {
            presence: Some(herald_server::config::Presence::On(
                herald_server::config::Access::Granted,
            )),
            join_leave: Some(true),
            ..Default::default()
        },
    );
    // The watcher stays anonymous (no fuzzed disconnect or unsubscribe of a user names it).
    config.namespaces.insert(
        "fuzzwatch".into(),
        herald_server::config::NamespaceOverride {
            subscribe: Some(herald_server::config::Access::Anyone),
            ..Default::default()
        },
    );
    // Every round comes from 127.0.0.1: per-address limits would refuse most of them
    // before a decoder sees them. Limits have their own tests.
    config.limits.connections_per_address = 0;
    config.limits.connection_rate_per_address = 0;
    config.limits.commands_per_address = 0;
    config.limits.new_channels_per_address = 0;
    let dir = tempfile::tempdir()?;
    config.data_dir = dir.path().to_path_buf();
    adjust(&mut config);
    let settings = config.validate()?;
    let (node, keep): (Arc<Node>, Box<dyn std::any::Any + Send>) = match engine {
        Engine::Memory => (Node::with_memory_broker(settings), Box::new(dir)),
        Engine::Durable => (
            Node::embedded(settings, herald_server::Embedded::Durable)?,
            Box::new(dir),
        ),
        Engine::Redis => {
            let redis = herald_broker_redis::testkit::RedisServer::start();
            let options = herald_broker_redis::RedisOptions::at(redis.url(), "fuzz");
            let connected = herald_broker_redis::RedisBroker::connect(options).await?;
            let node = Node::with_engine(settings, |sink| connected.into_engine(sink));
            (node, Box::new((redis, dir)))
        }
    };
    let listener = tokio::net::TcpListener::bind(node.settings.config.listen).await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(herald_server::serve(listener, node.clone(), async move {
        let _ = stopped.await;
    }));
    Ok(Fuzzed {
        addr,
        stop,
        server,
        keep,
    })
}

/// One mutated request, or a WebSocket handshake followed by mutated frames.
/// Returns the answer's HTTP status (0: none).
async fn one_round(addr: SocketAddr, seed: u64, requests: &[Vec<u8>], frames: &[Vec<u8>]) -> u16 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let Ok(mut socket) = TcpStream::connect(addr).await else {
        return 0;
    };
    let websocket = rng.u8(..4) == 0;
    let first = if websocket {
        requests[7].clone() // a valid upgrade
    } else {
        mutate::generate(&mut rng, requests, 128 * 1024)
    };
    if socket.write_all(&first).await.is_err() {
        return 0;
    }
    if websocket {
        for _ in 0..rng.usize(1..8) {
            let frame = mutate::generate(&mut rng, frames, 70 * 1024);
            if socket.write_all(&frame).await.is_err() {
                break;
            }
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let _ = tokio::time::timeout(READ_FOR, async {
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if answer.len() < 64 {
                answer.extend_from_slice(&buf[..n.min(64)]);
            }
        }
    })
    .await;
    // "HTTP/1.1 200" → 200; no answer at all → 0.
    answer
        .get(9..12)
        .and_then(|code| std::str::from_utf8(code).ok()?.parse().ok())
        .unwrap_or(0)
}

/// A WebSocket subscriber to [`WATCHED`], subscribed once this returns, recording the
/// offsets it receives.
async fn watch(addr: SocketAddr) -> anyhow::Result<Arc<Recorder>> {
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/connection/websocket"))
            .await
            .context("the watching subscriber connects")?;
    socket
        .send(Message::text(format!(
            "{{\"id\":1,\"connect\":{{}}}}\n{{\"id\":2,\"subscribe\":{{\"channel\":\"{WATCHED}\"}}}}"
        )))
        .await?;
    let lines = |message: Message| -> Vec<serde_json::Value> {
        let Message::Text(text) = message else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    // Publications made after the subscribe reply all reach it.
    let subscribed = async {
        while let Some(message) = socket.next().await {
            if let Some(reply) = lines(message?).into_iter().find(|v| v["id"] == 2) {
                anyhow::ensure!(
                    reply.get("error").is_none(),
                    "the watcher could not subscribe: {reply}"
                );
                return Ok(());
            }
        }
        anyhow::bail!("the watcher's connection closed before its subscribe reply")
    };
    tokio::time::timeout(Duration::from_secs(10), subscribed)
        .await
        .context("the watcher's subscribe reply")??;
    let received = Arc::new(Recorder::default());
    let recorder = received.clone();
    let channel = ChannelName::new(WATCHED)?;
    tokio::spawn(async move {
        while let Some(Ok(message)) = socket.next().await {
            for v in lines(message) {
                if v["pub"]["channel"] == WATCHED {
                    let publication = Publication {
                        offset: v["pub"]["offset"].as_u64().unwrap_or(0),
                        record: Bytes::new(),
                    };
                    recorder.on_publication(&channel, &Epoch::new(""), &publication);
                }
            }
        }
    });
    Ok(received)
}

/// The HTTP API calls the fuzz makes.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn publish(&self, n: u64) -> anyhow::Result<()> {
        let response = self
            .http
            .post(format!("{}/api/publish", self.base))
            .header("authorization", format!("apikey {KEY}"))
            .json(&serde_json::json!({"channel": WATCHED, "data": n}))
            .send()
            .await?;
        anyhow::ensure!(
            response.status().is_success(),
            "publish failed: {}",
            response.text().await.unwrap_or_default()
        );
        Ok(())
    }

    async fn healthy(&self) -> bool {
        let health = self.http.get(format!("{}/healthz", self.base)).send().await;
        health.is_ok_and(|r| r.status().is_success())
    }
}

/// This process's resident memory in MB (Linux; 0 elsewhere).
fn resident_mb() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / 1e6)
}
