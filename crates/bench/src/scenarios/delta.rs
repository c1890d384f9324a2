//! Bytes on the wire with delta compression: one WebSocket subscriber, a document of about
//! 2 KB of which one field changes per publication, sent plain and then as Fossil deltas
//! (`delta: "fossil"`), by Herald and, given one, by Centrifugo (its JSON protocol, with the
//! namespace's `allowed_delta_types: ["fossil"]` and `"delta": true` on each publish).
//!
//! Counted: every WebSocket frame that carries a publication, header included, from the
//! second publication on (the first goes whole in either mode). No compression is
//! negotiated, so the bytes are the protocol's own.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::Target;
use crate::{
    report::{Outcome, Table},
    Common,
};

#[derive(Debug, Args, Clone)]
pub struct DeltaArgs {
    /// Publications per run (the first goes whole).
    #[arg(long, default_value_t = 20)]
    pub publications: u64,
    /// A Centrifugo to compare with (`http://IP:PORT`), its namespace `bench` allowing
    /// `fossil` deltas (see `docs/benchmarks.md`).
    #[arg(long)]
    pub centrifugo: Option<String>,
    /// The API key of that Centrifugo's HTTP API.
    #[arg(long, default_value = "bench-api-key")]
    pub centrifugo_key: String,
}

/// The document at `version`: about 2 KB of which only `version` changes.
pub fn document(version: u64) -> Value {
    let fields: serde_json::Map<String, Value> = (0..40)
        .map(|i| {
            let text = format!("value {i} of a dashboard that rarely changes");
            (format!("field{i:02}"), json!(text))
        })
        .collect();
    json!({ "version": version, "fields": fields })
}

/// The two servers' protocols, as far as this scenario needs them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Protocol {
    Herald,
    Centrifugo,
}

struct Run<'a> {
    protocol: Protocol,
    /// The server's base URL.
    url: &'a str,
    /// The publish API's header.
    auth: (&'static str, String),
    delta: bool,
    channel: String,
}

/// What one run received: the first publication's bytes, and the rest's.
#[derive(Debug, Clone, Copy)]
struct Received {
    first: usize,
    rest: usize,
}

pub async fn run(args: DeltaArgs, common: &Common) -> anyhow::Result<Outcome> {
    let target = Target::start(common).await?;
    let herald_auth = ("authorization", format!("apikey {}", target.api_key));
    let mut runs = Vec::new();
    for delta in [false, true] {
        runs.push(Run {
            protocol: Protocol::Herald,
            url: &target.server.url,
            auth: herald_auth.clone(),
            delta,
            channel: format!("bench:delta-{delta}"),
        });
    }
    if let Some(url) = &args.centrifugo {
        for delta in [false, true] {
            runs.push(Run {
                protocol: Protocol::Centrifugo,
                url,
                auth: ("x-api-key", args.centrifugo_key.clone()),
                delta,
                channel: format!("bench:delta-{delta}-{}", std::process::id()),
            });
        }
    }
    let n = args.publications.max(2);
    let mut table = Table::new(
        format!("bytes for a 2 KB document changing one field, {n} publications over WebSocket"),
        &[
            "server",
            "mode",
            "first publication B",
            "next publications B",
            "per publication B",
            "vs plain",
        ],
    );
    let mut plain_rest = None;
    for r in &runs {
        let got = measure(r, n).await?;
        if !r.delta {
            plain_rest = Some(got.rest);
        }
        let ratio = plain_rest
            .filter(|_| r.delta)
            .map(|p| got.rest as f64 / p as f64);
        table.rows.push(vec![
            json!(format!("{:?}", r.protocol)),
            json!(if r.delta { "fossil delta" } else { "plain" }),
            json!(got.first),
            json!(got.rest),
            json!(got.rest / (n as usize - 1)),
            ratio.map_or(json!(1.0), |r| json!((r * 1000.0).round() / 1000.0)),
        ]);
    }
    Ok(Outcome {
        scenario: "delta".into(),
        tables: vec![table],
        notes: vec![
            "bytes: WebSocket frames (header included) that carry a publication, after the first; no compression negotiated".into(),
            "one publication at a time: each is published once the previous one arrived".into(),
        ],
        ..Default::default()
    })
}

async fn measure(run: &Run<'_>, n: u64) -> anyhow::Result<Received> {
    let ws_url = match run.protocol {
        Protocol::Herald | Protocol::Centrifugo => {
            format!("{}/connection/websocket", run.url.replacen("http", "ws", 1))
        }
    };
    let (mut ws, _) = tokio_tungstenite::connect_async(&ws_url)
        .await
        .with_context(|| format!("connect to {ws_url}"))?;
    let mut subscribe = json!({"channel": run.channel});
    if run.delta {
        subscribe["delta"] = json!("fossil");
    }
    let mut frames = Vec::new();
    if run.protocol == Protocol::Centrifugo {
        frames.push(json!({"id": 1, "connect": {}}));
    }
    frames.push(json!({"id": 2, "subscribe": subscribe}));
    for frame in frames {
        ws.send(Message::text(frame.to_string())).await?;
        loop {
            let text = next_text(&mut ws).await?;
            if text.contains("\"error\"") {
                bail!("{:?} refused: {text}", run.protocol);
            }
            if text.contains("\"id\":") {
                break;
            }
        }
    }
    let http = reqwest::Client::new();
    let mut received = Received { first: 0, rest: 0 };
    for version in 1..=n {
        let mut body = json!({"channel": run.channel, "data": document(version)});
        if run.protocol == Protocol::Centrifugo && run.delta {
            body["delta"] = json!(true);
        }
        let r = http
            .post(format!("{}/api/publish", run.url))
            .header(run.auth.0, &run.auth.1)
            .body(body.to_string())
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("publish: HTTP {}", r.status());
        }
        let text = loop {
            let text = next_text(&mut ws).await?;
            if text.contains("\"pub\":") {
                break text;
            }
        };
        let bytes = text.len() + frame_header(text.len());
        if version == 1 {
            received.first = bytes;
        } else {
            received.rest += bytes;
        }
    }
    Ok(received)
}

/// The next text message, within 10 s.
async fn next_text(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> anyhow::Result<String> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .context("nothing from the server in 10 s")?
            .context("the server closed")??;
        if let Message::Text(text) = message {
            return Ok(text.to_string());
        }
    }
}

/// The bytes of a server's (unmasked) WebSocket frame header for `len` bytes of payload.
fn frame_header(len: usize) -> usize {
    match len {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}
