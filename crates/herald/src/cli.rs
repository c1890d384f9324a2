//! Command-line arguments, and the `pub` / `sub` clients.

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use herald_protocol::codes::reconnect_allowed;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Herald: a real-time messaging server. Every browser transport, one channel model,
/// no message lost.
#[derive(Debug, Parser)]
#[command(name = "herald", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (durable storage in --data-dir by default; see docs/configuration.md).
    Serve(ServeArgs),
    /// Publish one message through the HTTP API and print its offset.
    Pub(PubArgs),
    /// Subscribe to a channel and print each publication as one JSON line.
    Sub(SubArgs),
    /// Mint a client token with the configured key, for tests and scripts.
    Token(crate::token::TokenArgs),
    /// A live view of a running Herald, every node of it: connections, deliveries/s, how
    /// connections ended.
    Top(crate::top::TopArgs),
    /// Measure Herald (or another server): the studies' experiments and the performance goals.
    Bench(Box<herald_bench::BenchArgs>),
    /// A load-generating process of `herald bench` (started by it, not by hand).
    #[command(hide = true)]
    BenchWorker { spec: String },
}

#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file. Flags override environment variables, which override it.
    #[arg(long, short, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, IP:PORT or HOST:PORT (0.0.0.0:8080 for every interface) [env: HERALD_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_parser = listen_address)]
    pub listen: Option<SocketAddr>,
    /// Not an option: `--listen` takes the port. Kept to say so.
    #[arg(long, hide = true)]
    pub port: Option<String>,
    /// Key for the HTTP API (`Authorization: apikey KEY`) [env: HERALD_API_KEY]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Directory for durable history [env: HERALD_DATA_DIR] [default: herald-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where history is kept: durable (in --data-dir), memory, or redis (shared by every node using --redis-url) [env: HERALD_STORAGE] [default: durable]
    #[arg(long, value_parser = ["durable", "memory", "redis"])]
    pub storage: Option<String>,
    /// Redis for --storage redis [env: HERALD_REDIS__URL] [default: redis://127.0.0.1:6379]
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Share the listening address with other processes (SO_REUSEPORT), e.g. several nodes on one machine [env: HERALD_REUSE_PORT]
    #[arg(long)]
    pub reuse_port: bool,
    /// When durable writes reach the disk: group, always or none [env: HERALD_SYNC] [default: group]
    #[arg(long, value_parser = ["group", "always", "none"])]
    pub sync: Option<String>,
    /// Worker threads, 0 = one per core [env: HERALD_WORKERS] [default: 0]
    #[arg(long)]
    pub workers: Option<usize>,
    /// Log level or tracing filter [env: HERALD_LOG_LEVEL] [default: info]
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log format [env: HERALD_LOG_FORMAT] [default: text]
    #[arg(long, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Browser origin allowed to connect (repeatable; `*` for any) [env: HERALD_ALLOWED_ORIGINS='["https://a.example"]']
    #[arg(long)]
    pub allowed_origin: Vec<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Herald's base URL.
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080", value_parser = base_url)]
    pub url: String,
}

/// `--listen`: an IP address and port, or a host name and port (resolved here).
fn listen_address(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = s.parse() {
        return Ok(address);
    }
    if s.parse::<u16>().is_ok() {
        return Err(format!(
            "give an address with the port: 127.0.0.1:{s} (or 0.0.0.0:{s} for every interface)"
        ));
    }
    match s.to_socket_addrs() {
        Ok(mut found) => found
            .next()
            .ok_or_else(|| format!("{s} resolves to no address")),
        Err(e) => Err(format!(
            "not IP:PORT or HOST:PORT ({e}); for example 127.0.0.1:8080"
        )),
    }
}

/// `--url`: an absolute http(s) or ws(s) URL.
fn base_url(s: &str) -> Result<String, String> {
    if !s.contains("://") {
        return Err(format!("the URL needs its scheme: http://{s}"));
    }
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" | "ws" | "wss" => Ok(s.trim_end_matches('/').to_string()),
        other => Err(format!(
            "{other}:// is not Herald's: use http:// or https://"
        )),
    }
}

#[derive(Debug, Args)]
pub struct PubArgs {
    /// Channel to publish to.
    pub channel: String,
    /// The message, as JSON (`{"text":"hi"}`, `42`, `"hi"`), or `-` to read it from standard
    /// input. A bare word (`hello`) is sent as a string; anything else that is not valid
    /// JSON is refused, unless --string says to send the text as it is.
    pub data: String,
    /// Send the message as a JSON string, exactly as given.
    #[arg(long)]
    pub string: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    /// API key.
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct SubArgs {
    /// Channel to subscribe to.
    pub channel: String,
    /// Start after this offset: history after it is printed first (0 = all history).
    #[arg(long)]
    pub since: Option<u64>,
    /// Epoch the --since offset belongs to (from an earlier line's `epoch`).
    #[arg(long, requires = "since")]
    pub epoch: Option<String>,
    /// Exit after printing this many publications.
    #[arg(long)]
    pub count: Option<u64>,
    /// Transport to receive with.
    #[arg(long, default_value = "ws", value_parser = ["ws", "sse", "stream", "longpoll", "poll"])]
    pub transport: String,
    /// Time between requests with --transport poll.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Connection token (see `herald token`).
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Subscription token for the channel.
    #[arg(long)]
    pub sub_token: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn publish(a: PubArgs) -> anyhow::Result<ExitCode> {
    let Some(key) = a.api_key else {
        bail!("an API key is needed: pass --api-key or set HERALD_API_KEY");
    };
    let data = message(&a.data, a.string, std::io::stdin().lock())?;
    let url = format!("{}/api/publish", a.server.url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(&url)
        .header("Authorization", format!("apikey {key}"))
        .json(&json!({ "channel": a.channel, "data": data }))
        .send()
        .await
        .map_err(|e| unreachable(&a.server.url, &e))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    if !status.is_success() {
        bail!(
            "{status}: {}",
            body["error"]["message"].as_str().unwrap_or("unknown error")
        );
    }
    println!("{}", body["offset"]);
    Ok(ExitCode::SUCCESS)
}

/// What `herald pub` sends: `text` (or standard input for `-`) as JSON, or as a string with
/// `as_string`. Text that is not JSON is sent as a string only when it is plainly words,
/// not when it looks like JSON gone wrong (`{"text": hi}`).
fn message(text: &str, as_string: bool, stdin: impl std::io::Read) -> anyhow::Result<Value> {
    let text = if text == "-" {
        let mut read = String::new();
        std::io::BufReader::new(stdin)
            .read_to_string(&mut read)
            .context("reading the message from standard input")?;
        read.strip_suffix('\n').map(String::from).unwrap_or(read)
    } else {
        text.to_string()
    };
    if as_string {
        return Ok(Value::String(text));
    }
    match serde_json::from_str(&text) {
        Ok(value) => Ok(value),
        Err(e) => {
            let looks_like_json = text.trim_start().starts_with(['{', '[', '"']);
            if looks_like_json || text.trim().is_empty() {
                bail!("the message is not valid JSON ({e}); to send it as a string, add --string");
            }
            Ok(Value::String(text))
        }
    }
}

/// A server that could not be reached, on one line: the innermost cause says it best
/// ("Connection refused"; the outer ones repeat it), then where to look.
fn unreachable(base: &str, e: &(dyn std::error::Error + 'static)) -> anyhow::Error {
    let mut cause = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    anyhow::anyhow!(
        "cannot reach {base} ({cause}): is `herald serve` running there? (set the address with --url or HERALD_URL)"
    )
}

/// A transport's refusal (an HTTP error answer) as the reason the server gave.
fn refused(a: &SubArgs, status: reqwest::StatusCode, body: &str) -> anyhow::Error {
    let answer: Value = serde_json::from_str(body).unwrap_or_default();
    match (
        answer["error"]["code"].as_u64(),
        answer["error"]["message"].as_str(),
    ) {
        (Some(code), Some(message)) => anyhow::anyhow!(
            "the server refused {}: {message} (error {code}, HTTP {})",
            a.channel,
            status.as_u16()
        ),
        _ => anyhow::anyhow!("the server answered {status}: {body}"),
    }
}

/// An error and what caused it, on one line (reqwest's own text leaves the cause out).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn websocket_url(base: &str) -> anyhow::Result<String> {
    let base = base.trim_end_matches('/');
    let rest = if let Some(r) = base.strip_prefix("http://") {
        format!("ws://{r}")
    } else if let Some(r) = base.strip_prefix("https://") {
        format!("wss://{r}")
    } else if base.starts_with("ws://") || base.starts_with("wss://") {
        base.to_string()
    } else {
        bail!("--url must start with http://, https://, ws:// or wss:// (got {base:?})");
    };
    Ok(format!("{rest}/connection/websocket"))
}

/// Where the subscription stands, to resume from after a reconnect.
struct Cursor {
    offset: Option<u64>,
    epoch: Option<String>,
    printed: u64,
}

impl Cursor {
    /// The position as a transport cursor (`CHANNEL;EPOCH;OFFSET`, `*` for any epoch).
    fn encode(&self, channel: &str) -> Option<String> {
        let offset = self.offset?;
        Some(format!(
            "{channel};{};{offset}",
            self.epoch.as_deref().unwrap_or("*")
        ))
    }
}

pub async fn subscribe(a: SubArgs) -> anyhow::Result<ExitCode> {
    let mut cursor = Cursor {
        offset: a.since,
        epoch: a.epoch.clone(),
        printed: 0,
    };
    if catch_up(&a, &mut cursor).await? {
        return Ok(ExitCode::SUCCESS);
    }
    let mut failures = 0u32;
    loop {
        let first = cursor.printed == 0 && cursor.offset == a.since;
        let ended = match a.transport.as_str() {
            "ws" => websocket_session(&a, &mut cursor).await,
            "longpoll" | "poll" => polling_session(&a, &mut cursor).await,
            _ => stream_session(&a, &mut cursor).await,
        };
        match ended {
            Ok(Ended::Done) => return Ok(ExitCode::SUCCESS),
            Err(e) if first => return Err(e),
            Err(e) => return Err(e).context("giving up"),
            Ok(Ended::Reconnect(why)) => {
                failures += 1;
                if failures > 20 {
                    bail!("giving up after {failures} reconnects ({why})");
                }
                let wait = Duration::from_millis(200 * u64::from(failures.min(10)));
                eprintln!("herald sub: {why}; resuming in {wait:?}");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Prints the history after `--since` page by page before subscribing: a resume replays at
/// most one page (the server's `max_history_limit` and `max_history_bytes`), so a longer
/// history would otherwise be reported as a gap. True once `--count` are printed. Anything
/// the history command refuses (a namespace closed to history, a position history no longer
/// covers) is left to the subscription, which reports it.
async fn catch_up(a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<bool> {
    let mut url = format!("{}/connection/send?", a.server.url.trim_end_matches('/'));
    push_tokens(&mut url, a);
    let client = reqwest::Client::new();
    while let Some(offset) = cursor.offset {
        let mut since = json!({ "offset": offset });
        if let Some(epoch) = &cursor.epoch {
            since["epoch"] = json!(epoch);
        }
        let command = json!({ "id": 1, "history": { "channel": a.channel, "since": since } });
        let response = client
            .post(&url)
            .body(command.to_string())
            .send()
            .await
            .map_err(|e| unreachable(&a.server.url, &e))?;
        if !response.status().is_success() {
            return Ok(false);
        }
        let reply: Value = response.json().await.unwrap_or_default();
        let page = &reply["history"];
        let publications = page["publications"].as_array().cloned().unwrap_or_default();
        let Some(last) = publications.last().and_then(|p| p["offset"].as_u64()) else {
            return Ok(false);
        };
        if let Some(first) = publications[0]["offset"]
            .as_u64()
            .filter(|f| *f > offset + 1)
        {
            // Only from offset 0: history starts with the oldest publication kept.
            eprintln!(
                "herald sub: history begins at offset {first}; earlier publications are gone"
            );
        }
        cursor.epoch = page["epoch"].as_str().map(String::from);
        if print(a, cursor, publications)? {
            return Ok(true);
        }
        if page["offset"].as_u64() <= Some(last) {
            return Ok(false);
        }
    }
    Ok(false)
}

enum Ended {
    Done,
    Reconnect(String),
}

/// Handles one push (any transport); true once `--count` publications are printed.
fn on_push(v: &Value, a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<bool> {
    let publications: Vec<Value> = if let Some(r) = v.get("subscribe") {
        let epoch_changed = cursor
            .epoch
            .as_deref()
            .is_some_and(|given| r["epoch"].as_str().is_some_and(|now| now != given));
        if r["recovered"] == false && epoch_changed {
            eprintln!(
                "herald sub: epoch {} is not the channel's (it is {}): its history was started anew, so offset {} means nothing there; continuing from offset {}",
                cursor.epoch.as_deref().unwrap_or_default(),
                r["epoch"],
                cursor.offset.unwrap_or(0),
                r["offset"]
            );
        } else if r["recovered"] == false {
            eprintln!(
                "herald sub: history does not cover offset {} any more; continuing from offset {}",
                cursor.offset.unwrap_or(0),
                r["offset"]
            );
        }
        cursor.epoch = r["epoch"]
            .as_str()
            .map(String::from)
            .or(cursor.epoch.take());
        cursor.offset = r["offset"].as_u64().or(cursor.offset);
        r["publications"].as_array().cloned().unwrap_or_default()
    } else if let Some(p) = v.get("pub") {
        vec![p.clone()]
    } else if let Some(d) = v.get("disconnect") {
        if d["reconnect"] == false {
            bail!(
                "server closed the connection: {} {}",
                d["code"],
                d["reason"]
            );
        }
        Vec::new()
    } else if let Some(err) = v.get("error") {
        bail!(
            "the server refused {}: {} (error {})",
            a.channel,
            err["message"].as_str().unwrap_or(""),
            err["code"]
        );
    } else {
        Vec::new()
    };
    print(a, cursor, publications)
}

/// Prints publications, one JSON line each; true once `--count` are printed.
fn print(a: &SubArgs, cursor: &mut Cursor, publications: Vec<Value>) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    for p in publications {
        let mut line = json!({ "channel": a.channel, "offset": p["offset"], "epoch": cursor.epoch, "data": p["data"] });
        // Who sent it, when a client did (its user and info): the API's publications say nothing.
        if let Some(from) = p.get("from") {
            line["from"] = from.clone();
        }
        writeln!(out, "{line}")?;
        out.flush()?;
        cursor.offset = p["offset"].as_u64();
        cursor.printed += 1;
        if a.count.is_some_and(|n| cursor.printed >= n) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn http_url(a: &SubArgs, path: &str, cursor: &Cursor) -> String {
    let mut url = format!(
        "{}/connection/{path}?channel={}",
        a.server.url.trim_end_matches('/'),
        a.channel
    );
    if let Some(c) = cursor.encode(&a.channel) {
        url.push_str("&cursor=");
        url.extend(form_urlencoded::byte_serialize(c.as_bytes()));
    }
    push_tokens(&mut url, a);
    url
}

/// Adds `--token` and `--sub-token` as query parameters.
fn push_tokens(url: &mut String, a: &SubArgs) {
    for (name, token) in [("token", &a.token), ("sub_token", &a.sub_token)] {
        if let Some(token) = token {
            url.push_str(&format!("&{name}="));
            url.extend(form_urlencoded::byte_serialize(token.as_bytes()));
        }
    }
}

async fn stream_session(a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<Ended> {
    let url = http_url(
        a,
        if a.transport == "sse" {
            "sse"
        } else {
            "stream"
        },
        cursor,
    );
    let response = match reqwest::get(&url).await {
        Ok(r) => r,
        Err(e) if cursor.printed == 0 => return Err(unreachable(&a.server.url, &e)),
        Err(e) => return Ok(Ended::Reconnect(with_causes(&e))),
    };
    if !response.status().is_success() {
        let status = response.status();
        return Err(refused(
            a,
            status,
            &response.text().await.unwrap_or_default(),
        ));
    }
    let mut body = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return Ok(Ended::Reconnect(with_causes(&e))),
        };
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = std::str::from_utf8(&line)?.trim_end();
            let json = if a.transport == "sse" {
                line.strip_prefix("data: ")
            } else {
                Some(line)
            };
            let Some(json) = json.filter(|j| !j.is_empty()) else {
                continue;
            };
            if on_push(&serde_json::from_str(json)?, a, cursor)? {
                return Ok(Ended::Done);
            }
        }
    }
    Ok(Ended::Reconnect("stream ended".into()))
}

async fn polling_session(a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<Ended> {
    let client = reqwest::Client::new();
    loop {
        let url = http_url(a, &a.transport, cursor);
        let answer: Value = match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => r.json().await?,
            Ok(r) => {
                let status = r.status();
                return Err(refused(a, status, &r.text().await.unwrap_or_default()));
            }
            Err(e) if cursor.printed == 0 => return Err(unreachable(&a.server.url, &e)),
            Err(e) => return Ok(Ended::Reconnect(with_causes(&e))),
        };
        for m in answer["messages"].as_array().into_iter().flatten() {
            if on_push(m, a, cursor)? {
                return Ok(Ended::Done);
            }
        }
        if let Some(c) = answer["cursor"].as_str().and_then(|c| c.split(';').nth(1)) {
            cursor.epoch = Some(c.to_string());
        }
        if a.transport == "poll" {
            tokio::time::sleep(a.interval).await;
        }
    }
}

async fn websocket_session(a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<Ended> {
    let url = websocket_url(&a.server.url)?;
    let (mut ws, _) = match tokio_tungstenite::connect_async(&url).await {
        Ok(ws) => ws,
        Err(e) if cursor.printed == 0 => return Err(unreachable(&a.server.url, &e)),
        Err(e) => return Ok(Ended::Reconnect(with_causes(&e))),
    };
    if let Some(token) = &a.token {
        let connect = json!({ "id": 0, "connect": { "token": token } }).to_string();
        ws.send(Message::Text(connect.into())).await?;
    }
    let mut subscribe = json!({ "channel": a.channel });
    if let Some(token) = &a.sub_token {
        subscribe["token"] = json!(token);
    }
    if let Some(offset) = cursor.offset {
        subscribe["since"] = json!({ "offset": offset, "epoch": cursor.epoch });
    }
    let command = json!({ "id": 1, "subscribe": subscribe }).to_string();
    ws.send(Message::Text(command.into())).await?;
    while let Some(message) = ws.next().await {
        let text = match message {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(Some(frame))) => {
                let code = u16::from(frame.code);
                if reconnect_allowed(code) {
                    return Ok(Ended::Reconnect(format!(
                        "closed with {code} ({})",
                        frame.reason
                    )));
                }
                bail!("server closed the connection: {code} {}", frame.reason);
            }
            Ok(Message::Close(None)) => return Ok(Ended::Reconnect("connection closed".into())),
            Ok(_) => continue,
            Err(e) => return Ok(Ended::Reconnect(e.to_string())),
        };
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).context("server sent invalid JSON")?;
            // The reply to our subscribe has the same shape as the streams' `subscribe` push.
            if on_push(&v, a, cursor)? {
                let _ = ws.close(None).await;
                return Ok(Ended::Done);
            }
        }
    }
    Ok(Ended::Reconnect("connection closed".into()))
}
