//! `herald pub` and `herald sub`: a client of the server's HTTP API and of its transports,
//! for a terminal.

use std::{
    io::{Read, Write},
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use herald_protocol::codes::{reconnect_allowed, temporary};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::cli::{PubArgs, SubArgs};

pub async fn publish(a: PubArgs) -> anyhow::Result<ExitCode> {
    let Some(key) = a.api_key else {
        bail!("an API key is needed: pass --api-key or set HERALD_API_KEY");
    };
    let data = message(&a.data, a.string, std::io::stdin().lock())?;
    let url = format!("{}/api/publish", a.server.url.trim_end_matches('/'));
    // Every try carries one key: a retry after an answer that was lost, or that said the
    // outcome is unknown, is stored once.
    let once = a.idempotency_key.clone().unwrap_or_else(own_key);
    let body = json!({ "channel": a.channel, "data": data, "idempotency_key": once });
    let http = reqwest::Client::new();
    let mut wait = std::time::Duration::from_millis(250);
    let mut tries = 0;
    let response = loop {
        tries += 1;
        let sent = http
            .post(&url)
            .header("Authorization", format!("apikey {key}"))
            .json(&body)
            .send()
            .await;
        // Retried: what a node refused for now (503, 504), and a request that reached the
        // server but got no answer. A server that is not there is said at once.
        let retry = match &sent {
            Ok(r) => matches!(r.status().as_u16(), 503 | 504),
            Err(e) => !e.is_connect(),
        };
        if !retry || tries > 4 {
            break sent.map_err(|e| unreachable(&a.server.url, &e))?;
        }
        eprintln!(
            "herald pub: no answer that says it was stored; retrying in {wait:?} with the same key"
        );
        tokio::time::sleep(wait).await;
        wait *= 2;
    };
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

/// A key no other `herald pub` makes: 128 bits from the process's random hasher keys and
/// the clock.
fn own_key() -> String {
    use std::hash::{BuildHasher, RandomState};
    let now = std::time::SystemTime::now();
    let (a, b) = (RandomState::new(), RandomState::new());
    format!(
        "herald-pub-{:016x}{:016x}",
        a.hash_one((now, std::process::id())),
        b.hash_one(now)
    )
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

/// A refusal for now (a temporary error code, or HTTP 503/504): the subscription tries
/// again, as after a dropped connection, instead of giving up.
#[derive(Debug)]
struct ForNow(String);

impl std::fmt::Display for ForNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ForNow {}

/// A transport's refusal (an HTTP error answer) as the reason the server gave; [`ForNow`]
/// when it is a passing one.
fn refused(a: &SubArgs, status: reqwest::StatusCode, body: &str) -> anyhow::Error {
    let answer: Value = serde_json::from_str(body).unwrap_or_default();
    let code = answer["error"]["code"].as_u64();
    let why = match (code, answer["error"]["message"].as_str()) {
        (Some(code), Some(message)) => format!(
            "the server refused {}: {message} (error {code}, HTTP {})",
            a.channel,
            status.as_u16()
        ),
        _ => format!("the server answered {status}: {body}"),
    };
    let passing = match code {
        Some(code) => temporary(code as u16),
        None => matches!(status.as_u16(), 503 | 504),
    };
    if passing {
        ForNow(why).into()
    } else {
        anyhow::anyhow!(why)
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
    if a.protocol == "protobuf" && a.transport != "ws" {
        bail!(
            "--protocol protobuf needs binary frames, which only --transport ws carries; the {} transport speaks JSON",
            a.transport
        );
    }
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
        let printed = cursor.printed;
        let ended = match a.transport.as_str() {
            "ws" => websocket_session(&a, &mut cursor).await,
            "longpoll" | "poll" => polling_session(&a, &mut cursor).await,
            _ => stream_session(&a, &mut cursor).await,
        };
        // Refused for now (the node cannot reach its broker, say): tried again.
        let ended = match ended {
            Err(e) if e.is::<ForNow>() => Ok(Ended::Reconnect(e.to_string())),
            ended => ended,
        };
        match ended {
            Ok(Ended::Done) => return Ok(ExitCode::SUCCESS),
            Err(e) if first => return Err(e),
            Err(e) => return Err(e).context("giving up"),
            Ok(Ended::Reconnect(why)) => {
                // Counted since the last session that delivered something.
                if cursor.printed > printed {
                    failures = 0;
                }
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
        let why = format!(
            "the server refused {}: {} (error {})",
            a.channel,
            err["message"].as_str().unwrap_or(""),
            err["code"]
        );
        if err["code"].as_u64().is_some_and(|c| temporary(c as u16)) {
            return Err(ForNow(why).into());
        }
        bail!(why);
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
    let path = match a.transport.as_str() {
        "sse" => "sse",
        "iframe" => "iframe",
        _ => "stream",
    };
    let mut url = http_url(a, path, cursor);
    if path == "iframe" {
        // The page's function each chunk calls; any name does here.
        url.push_str("&callback=push");
    }
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
            let json = match a.transport.as_str() {
                "sse" => line.strip_prefix("data: "),
                // `<script>parent.CALLBACK(PUSH);</script>`; the document's other lines
                // (its head, padding) carry nothing.
                "iframe" => line
                    .strip_prefix("<script>parent.")
                    .and_then(|l| l.strip_suffix(");</script>"))
                    .and_then(|l| l.split_once('('))
                    .map(|(_, push)| push),
                _ => Some(line),
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
    let protobuf = a.protocol == "protobuf";
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)?;
    if protobuf {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            tokio_tungstenite::tungstenite::http::HeaderValue::from_static("herald.protobuf"),
        );
    }
    let (mut ws, _) = match tokio_tungstenite::connect_async(request).await {
        Ok(ws) => ws,
        Err(e) if cursor.printed == 0 => return Err(unreachable(&a.server.url, &e)),
        Err(e) => return Ok(Ended::Reconnect(with_causes(&e))),
    };
    if let Some(token) = &a.token {
        let connect = json!({ "id": 0, "connect": { "token": token } });
        ws.send(command(connect, protobuf)).await?;
    }
    let mut subscribe = json!({ "channel": a.channel });
    if let Some(token) = &a.sub_token {
        subscribe["token"] = json!(token);
    }
    if let Some(offset) = cursor.offset {
        subscribe["since"] = json!({ "offset": offset, "epoch": cursor.epoch });
    }
    ws.send(command(
        json!({ "id": 1, "subscribe": subscribe }),
        protobuf,
    ))
    .await?;
    while let Some(message) = ws.next().await {
        let text = match message {
            Ok(Message::Text(t)) => t.to_string(),
            Ok(Message::Binary(frame)) if protobuf => protobuf_lines(&frame)?,
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

/// A command, in the connection's codec: JSON text, or its Protobuf message.
fn command(command: Value, protobuf: bool) -> Message {
    let text = command.to_string();
    match protobuf {
        false => Message::Text(text.into()),
        true => Message::Binary(herald_protocol::protobuf::frame_of_json(text.as_bytes()).into()),
    }
}

/// A binary frame of Protobuf messages, as the JSON lines the same messages are.
fn protobuf_lines(frame: &[u8]) -> anyhow::Result<String> {
    let lines = herald_protocol::protobuf::json_lines(frame)
        .context("the server sent a frame that is not Protobuf")?;
    Ok(String::from_utf8(lines)?)
}
