//! A hostile backend: a real HTTP server on 127.0.0.1 that answers Herald's hooks with
//! whatever a broken or malicious backend might: mutated bodies (from valid answers),
//! wrong statuses, redirects, bodies past `hooks.max_response_size`, a slow drip, a
//! connection closed mid-answer, or no answer at all.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::{access, mutate};

/// How a hostile backend answers: each answer is drawn from these, by weight.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// A valid answer of the corpus, mutated, with status 200.
    Mutated,
    /// A valid answer, untouched.
    Valid,
    /// Any status, any body.
    Status,
    /// `302` to elsewhere.
    Redirect,
    /// A body larger than the hooks' limit.
    Huge,
    /// A valid answer, a byte at a time, slower than the hook timeout.
    Drip,
    /// Headers, then the connection closed.
    Cut,
    /// Nothing, ever.
    Silent,
}

/// Weights: valid answers often enough that sessions get past `connect` to the hooks
/// after it.
const ANSWERS: [(Answer, u32); 8] = [
    (Answer::Mutated, 30),
    (Answer::Valid, 40),
    (Answer::Status, 7),
    (Answer::Redirect, 3),
    (Answer::Huge, 3),
    (Answer::Drip, 3),
    (Answer::Cut, 7),
    (Answer::Silent, 7),
];

/// Valid answers of the hook a request's path names (`/connect`, …).
fn answers_for(path: &str) -> Vec<Vec<u8>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dated = match path.trim_start_matches('/') {
        // Due in two seconds: the refresh hook is asked while the round still listens.
        "connect" => Some(format!(
            r#"{{"result":{{"user":"9","publish":["chat:*"],"expires":{}}}}}"#,
            now + 2
        )),
        "refresh" => Some(format!(r#"{{"result":{{"expires":{}}}}}"#, now + 3600)),
        _ => None,
    };
    let texts: &[&str] = match path.trim_start_matches('/') {
        "connect" => &[
            r#"{"result":{"user":"7","info":{"name":"Ada"},"subscribe":["chat:*"],"publish":["chat:*"],"expires":4102444800}}"#,
            r#"{"result":{}}"#,
            r#"{"result":{"user":"8","channels":["chat:hooked"]}}"#,
        ],
        "subscribe" => &[
            r#"{"result":{"data":{"state":[1," "]},"expires":4102444800}}"#,
            r#"{"result":{}}"#,
        ],
        "publish" | "rpc" => &[
            r#"{"result":{"data":{"rewritten":true}}}"#,
            r#"{"result":{}}"#,
            r#"{"error":{"code":1001,"message":"no"}}"#,
        ],
        "refresh" => &[r#"{"result":{}}"#],
        _ => &[r#"{"result":{}}"#],
    };
    texts
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .chain(dated.map(String::into_bytes))
        .collect()
}

fn pick(rng: &mut fastrand::Rng) -> Answer {
    let total: u32 = ANSWERS.iter().map(|(_, w)| w).sum();
    let mut n = rng.u32(..total);
    for (answer, weight) in ANSWERS {
        if n < weight {
            return answer;
        }
        n -= weight;
    }
    Answer::Valid
}

/// Requests a hostile backend was sent, by path.
pub type Asked = Arc<Mutex<BTreeMap<String, u64>>>;

/// Starts a hostile backend: its address, what it was asked, and the task serving it.
pub async fn start(seed: u64) -> std::io::Result<(SocketAddr, Asked, tokio::task::AbortHandle)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let asked = Asked::default();
    let counts = asked.clone();
    let task = tokio::spawn(async move {
        let mut rng = fastrand::Rng::with_seed(seed);
        while let Ok((socket, _)) = listener.accept().await {
            let seed = rng.u64(..);
            let counts = counts.clone();
            tokio::spawn(async move { serve(socket, seed, &counts).await });
        }
    });
    Ok((addr, asked, task.abort_handle()))
}

/// Answers every request on one kept-alive connection.
async fn serve(mut socket: TcpStream, seed: u64, asked: &Mutex<BTreeMap<String, u64>>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut read = Vec::new();
    loop {
        // One request: the headers, then Content-Length bytes.
        let Some(end) = read_request(&mut socket, &mut read).await else {
            return;
        };
        let head = String::from_utf8_lossy(&read[..end.min(256)]).into_owned();
        read.drain(..end);
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        if let Ok(mut asked) = asked.lock() {
            *asked.entry(path.to_owned()).or_default() += 1;
        }
        let mut corpus = answers_for(path);
        // Now and then another hook's answer, or a hostile one of the decoder corpus.
        if rng.u8(..8) == 0 {
            corpus.extend(access::hook_answers());
        }
        let corpus = &corpus;
        let answer = pick(&mut rng);
        let valid = corpus[rng.usize(..corpus.len())].clone();
        let (status, body) = match answer {
            Answer::Mutated => (200, mutate::generate(&mut rng, corpus, 4096)),
            Answer::Valid | Answer::Drip => (200, valid),
            Answer::Status => (
                [100, 201, 204, 301, 400, 404, 500, 502, 503, 999][rng.usize(..10)],
                valid,
            ),
            Answer::Redirect => (302, Vec::new()),
            Answer::Huge => (200, vec![b' '; 2 * 1024 * 1024]),
            Answer::Cut | Answer::Silent => (200, valid),
        };
        let mut head = format!(
            "HTTP/1.1 {status} Hostile\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if matches!(answer, Answer::Redirect) {
            head.push_str("Location: http://127.0.0.1:9/elsewhere\r\n");
        }
        head.push_str("\r\n");
        let written = match answer {
            Answer::Silent => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                return;
            }
            Answer::Cut => {
                let _ = socket.write_all(head.as_bytes()).await;
                return;
            }
            Answer::Drip => drip(&mut socket, head.as_bytes(), &body).await,
            _ => {
                let mut all = head.into_bytes();
                all.extend_from_slice(&body);
                socket.write_all(&all).await
            }
        };
        if written.is_err() {
            return;
        }
    }
}

/// Writes the head, then the body a byte every 50 ms.
async fn drip(socket: &mut TcpStream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    socket.write_all(head).await?;
    for b in body {
        socket.write_all(&[*b]).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Reads until `read` holds a whole request; the length of it.
async fn read_request(socket: &mut TcpStream, read: &mut Vec<u8>) -> Option<usize> {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(head) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let headers = String::from_utf8_lossy(&read[..head]).to_ascii_lowercase();
            let length: usize = headers
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let end = head + 4 + length;
            if read.len() >= end {
                return Some(end);
            }
        }
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 || read.len() > 1 << 20 {
            return None;
        }
        read.extend_from_slice(&buf[..n]);
    }
}

/// How long a hook may take in the fuzzed server.
const HOOK_TIMEOUT: Duration = Duration::from_millis(300);
/// Rounds in flight at once.
const PARALLEL: usize = 16;
/// A round's commands each ask at most one hook, one after another, and a round due for
/// its refresh listens up to 4.5 s for it: past this, the connection hangs.
const ROUND_DEADLINE: Duration = Duration::from_secs(7);

/// What a hostile-backend fuzz did and found.
#[derive(Debug, Default)]
pub struct BackendReport {
    pub rounds: u64,
    /// Rounds whose every command was answered, or whose connection was closed.
    pub answered: u64,
    /// WebSocket rounds whose five commands (each asking a hook) were all answered.
    pub every_hook: u64,
    /// Rounds still waiting past [`ROUND_DEADLINE`].
    pub hung: u64,
    pub slowest: Duration,
    /// Hook requests the backend was sent, by path.
    pub asked: BTreeMap<String, u64>,
    pub healthy: bool,
    /// Panics on the server's threads, and the last.
    pub panics: crate::ServerPanics,
    pub elapsed: Duration,
}

impl BackendReport {
    pub fn passed(&self) -> bool {
        self.healthy && self.hung == 0 && self.panics.count == 0
    }
}

impl std::fmt::Display for BackendReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<14} {:>10} rounds  healthy: {}  answered {} ({} past every hook), hung {}, slowest {:.2} s  {:>8.1} s",
            "backend",
            self.rounds,
            self.healthy,
            self.answered,
            self.every_hook,
            self.hung,
            self.slowest.as_secs_f64(),
            self.elapsed.as_secs_f64()
        )?;
        let asked: Vec<String> = self
            .asked
            .iter()
            .map(|(p, n)| format!("{p}: {n}"))
            .collect();
        write!(f, "\n  hooks asked: {}", asked.join(", "))?;
        write!(f, "{}", self.panics)
    }
}

/// Starts a hostile backend and a server whose every hook asks it (timeout 300 ms), then
/// runs `rounds` sessions that make each hook be asked: connect, subscribe, publish, rpc,
/// refresh, over WebSocket, and a poll. Passes when every round is answered (or closed)
/// within [`ROUND_DEADLINE`], the server still answers `/healthz`, and nothing panicked.
pub async fn fuzz(rounds: u64, seed: u64) -> anyhow::Result<BackendReport> {
    let panics_mark = crate::ServerPanics::mark();
    let (backend, asked, backend_task) = start(seed).await?;
    let fuzzed = crate::server::start_with(|config| {
        let url = |hook: &str| Some(format!("http://{backend}/{hook}"));
        config.hooks.connect_url = url("connect");
        config.hooks.subscribe_url = url("subscribe");
        config.hooks.publish_url = url("publish");
        config.hooks.refresh_url = url("refresh");
        config.hooks.rpc_url = url("rpc");
        config.hooks.events_url = url("events");
        config.hooks.timeout = HOOK_TIMEOUT;
        // The circuit would stop asking a backend this broken: keep asking.
        config.hooks.circuit_failures = u32::MAX;
        // A connection due for its refresh hook is asked at its `expires`, not later.
        config.auth.leeway = Duration::ZERO;
        // Every session comes from 127.0.0.1.
        config.limits.hook_calls_per_address = 0;
        // The hooks guard `chat:` here.
        config.namespaces.insert(
            "chat".into(),
            herald_server::config::NamespaceOverride {
                subscribe: Some(herald_server::config::Access::Anyone),
                publish: Some(herald_server::config::Access::Granted),
                subscribe_hook: Some(true),
                publish_hook: Some(true),
                ..Default::default()
            },
        );
    })
    .await?;
    let addr = fuzzed.addr;
    let started = std::time::Instant::now();
    let mut report = BackendReport {
        rounds,
        ..Default::default()
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut in_flight = tokio::task::JoinSet::new();
    for _ in 0..rounds {
        if in_flight.len() >= PARALLEL {
            if let Some(Ok(took)) = in_flight.join_next().await {
                count(&mut report, took);
            }
        }
        let poll = rng.u8(..4) == 0;
        in_flight.spawn(async move {
            let began = std::time::Instant::now();
            let done = tokio::time::timeout(ROUND_DEADLINE, async move {
                if poll {
                    http_round(addr).await;
                    false
                } else {
                    websocket_round(addr).await
                }
            })
            .await;
            done.ok().map(|every| (began.elapsed(), every))
        });
    }
    while let Some(done) = in_flight.join_next().await {
        if let Ok(took) = done {
            count(&mut report, took);
        }
    }
    report.healthy = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .is_ok_and(|r| r.status().is_success());
    report.panics = crate::ServerPanics::since(panics_mark);
    report.elapsed = started.elapsed();
    report.asked = asked.lock().map(|a| a.clone()).unwrap_or_default();
    fuzzed.stop().await;
    backend_task.abort();
    Ok(report)
}

fn count(report: &mut BackendReport, took: Option<(Duration, bool)>) {
    match took {
        Some((took, every_hook)) => {
            report.answered += 1;
            report.every_hook += u64::from(every_hook);
            report.slowest = report.slowest.max(took);
        }
        None => report.hung += 1,
    }
}

/// A WebSocket session whose commands each ask a hook; returns when each is answered
/// (true) or the connection is closed.
async fn websocket_round(addr: SocketAddr) -> bool {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let Ok((mut ws, _)) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/connection/websocket")).await
    else {
        return false;
    };
    let token = access::connection_token();
    let commands = [
        r#"{"id":1,"connect":{}}"#.to_string(),
        r#"{"id":2,"subscribe":{"channel":"chat:hooked"}}"#.into(),
        r#"{"id":3,"publish":{"channel":"chat:hooked","data":{"n":1}}}"#.into(),
        r#"{"id":4,"rpc":{"method":"m","data":[1]}}"#.into(),
        format!(r#"{{"id":5,"refresh":{{"token":"{token}"}}}}"#),
    ];
    if ws.send(Message::text(commands.join("\n"))).await.is_err() {
        return false;
    }
    let mut answered = std::collections::HashSet::new();
    let mut ttl = None;
    while answered.len() < commands.len() {
        let Some(Ok(message)) = ws.next().await else {
            return false; // closed: an answer too (a refused connect closes it) // closed: an answer too (a refused connect closes it)
        };
        let Message::Text(text) = message else {
            continue;
        };
        for line in text.lines() {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                if let Some(id) = v["id"].as_u64() {
                    answered.insert(id);
                }
                ttl = ttl.or(v["connect"]["ttl"].as_u64());
            }
        }
    }
    // Due soon: listen on until the refresh hook was asked (a refusal or a failing
    // backend closes the connection; a new `expires` keeps it).
    if let Some(ttl) = ttl.filter(|t| *t <= 2) {
        // Herald asks once a whole second has passed `expires`.
        let _ = tokio::time::timeout(Duration::from_millis(ttl * 1000 + 2500), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
    }
    true
}

/// A poll: its session asks the connect hook first.
async fn http_round(addr: SocketAddr) {
    let _ = reqwest::get(format!("http://{addr}/connection/poll?channel=chat:hooked")).await;
}
