//! Command-line arguments, and the `pub` / `sub` clients.

use std::{io::Write, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

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
    /// Run the server (embedded memory broker; see docs/configuration.md).
    Serve(ServeArgs),
    /// Publish one message through the HTTP API and print its offset.
    Pub(PubArgs),
    /// Subscribe to a channel and print each publication as one JSON line.
    Sub(SubArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file. Flags override environment variables, which override it.
    #[arg(long, short, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [env: HERALD_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Key for the HTTP API (`Authorization: apikey KEY`) [env: HERALD_API_KEY]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Worker threads, 0 = one per core [env: HERALD_WORKERS] [default: 0]
    #[arg(long)]
    pub workers: Option<usize>,
    /// Log level or tracing filter [env: HERALD_LOG_LEVEL] [default: info]
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log format [env: HERALD_LOG_FORMAT] [default: text]
    #[arg(long, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Browser origin allowed to connect (repeatable; `*` for any) [env: HERALD_ALLOWED_ORIGINS]
    #[arg(long)]
    pub allowed_origin: Vec<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Herald's base URL.
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
}

#[derive(Debug, Args)]
pub struct PubArgs {
    /// Channel to publish to.
    pub channel: String,
    /// The message: JSON (`{"text":"hi"}`, `42`); anything that is not JSON is sent as a
    /// JSON string.
    pub data: String,
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
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn publish(a: PubArgs) -> anyhow::Result<ExitCode> {
    let Some(key) = a.api_key else {
        bail!("an API key is needed: pass --api-key or set HERALD_API_KEY");
    };
    let data: Value = serde_json::from_str(&a.data).unwrap_or(Value::String(a.data));
    let url = format!("{}/api/publish", a.server.url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(&url)
        .header("Authorization", format!("apikey {key}"))
        .json(&json!({ "channel": a.channel, "data": data }))
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
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

pub async fn subscribe(a: SubArgs) -> anyhow::Result<ExitCode> {
    let url = websocket_url(&a.server.url)?;
    let mut cursor = Cursor {
        offset: a.since,
        epoch: a.epoch.clone(),
        printed: 0,
    };
    let mut failures = 0u32;
    loop {
        match session(&url, &a, &mut cursor).await? {
            Ended::Done => return Ok(ExitCode::SUCCESS),
            Ended::Reconnect(why) => {
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

enum Ended {
    Done,
    Reconnect(String),
}

async fn session(url: &str, a: &SubArgs, cursor: &mut Cursor) -> anyhow::Result<Ended> {
    let first = cursor.printed == 0 && cursor.offset == a.since;
    let (mut ws, _) = match tokio_tungstenite::connect_async(url).await {
        Ok(ws) => ws,
        Err(e) if first => return Err(e).with_context(|| format!("cannot connect to {url}")),
        Err(e) => return Ok(Ended::Reconnect(e.to_string())),
    };
    let mut subscribe = json!({ "channel": a.channel });
    if let Some(offset) = cursor.offset {
        subscribe["since"] = json!({ "offset": offset, "epoch": cursor.epoch });
    }
    let command = json!({ "id": 1, "subscribe": subscribe }).to_string();
    ws.send(Message::Text(command.into())).await?;
    let mut out = std::io::stdout().lock();
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
            let publications: Vec<Value> = if v["id"] == 1 {
                if let Some(err) = v.get("error") {
                    bail!(
                        "subscribe failed: {} {}",
                        err["code"],
                        err["message"].as_str().unwrap_or("")
                    );
                }
                let r = &v["subscribe"];
                if r["recovered"] == false {
                    eprintln!(
                        "herald sub: history does not cover offset {} any more; continuing from offset {}",
                        cursor.offset.unwrap_or(0),
                        r["offset"]
                    );
                }
                cursor.epoch = r["epoch"].as_str().map(String::from);
                cursor.offset = r["offset"].as_u64();
                r["publications"].as_array().cloned().unwrap_or_default()
            } else if let Some(p) = v.get("pub") {
                vec![p.clone()]
            } else {
                Vec::new()
            };
            for p in publications {
                let line = json!({ "channel": a.channel, "offset": p["offset"], "epoch": cursor.epoch, "data": p["data"] });
                writeln!(out, "{line}")?;
                out.flush()?;
                cursor.offset = p["offset"].as_u64();
                cursor.printed += 1;
                if a.count.is_some_and(|n| cursor.printed >= n) {
                    let _ = ws.close(None).await;
                    return Ok(Ended::Done);
                }
            }
        }
    }
    Ok(Ended::Reconnect("connection closed".into()))
}
