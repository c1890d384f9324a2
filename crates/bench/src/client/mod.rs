//! One simulated user: connects over one transport from a given source address, subscribes,
//! reads until told to stop, optionally speaks, and records what it receives.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Request};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::{net::TcpSocket, sync::watch};
use tokio_tungstenite::tungstenite::{
    client::IntoClientRequest, protocol::WebSocketConfig, Message,
};

use crate::{
    netinfo::Counted,
    record::{Recorder, Speak, Tracker},
};

mod deflate;
mod generic;
mod poll;
mod positions;
use deflate::Inflating;
use generic::generic_session;
use poll::poll_session;
use positions::Positions;
pub use positions::{stamp, stamps};

/// How a client reaches the server and what it says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    Ws,
    Sse,
    Stream,
    /// The forever frame, read as the page's iframe would be.
    Iframe,
    Longpoll,
    /// Interval polling, every `ms`.
    Poll {
        ms: u64,
    },
}

impl Transport {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "ws" | "websocket" => Self::Ws,
            "sse" => Self::Sse,
            "stream" => Self::Stream,
            "iframe" => Self::Iframe,
            "longpoll" => Self::Longpoll,
            "poll" => Self::Poll { ms: 1000 },
            other => match other.strip_prefix("poll@") {
                Some(interval) => Self::Poll {
                    ms: humantime::parse_duration(interval)
                        .with_context(|| format!("transport {other}"))?
                        .as_millis() as u64,
                },
                None => {
                    bail!("unknown transport {other:?}: ws, sse, stream, iframe, longpoll, poll, poll@5s")
                }
            },
        })
    }

    pub fn label(&self) -> String {
        match self {
            Self::Ws => "ws".into(),
            Self::Sse => "sse".into(),
            Self::Stream => "stream".into(),
            Self::Iframe => "iframe".into(),
            Self::Longpoll => "longpoll".into(),
            Self::Poll { ms } => format!(
                "poll@{}",
                humantime::format_duration(Duration::from_millis(*ms))
            ),
        }
    }
}

/// A server that is not Herald: its WebSocket or SSE endpoint and what to send to subscribe.
/// `{channel}` in any of them is replaced by the channel name.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Generic {
    /// `ws://host:port/path`, `http://host:port/path` (SSE) or `longpoll+http://host:port/path`
    /// (long-polling as Nchan speaks it: see `client/generic.rs`).
    pub url: String,
    /// Frames sent after a WebSocket opens, in order.
    pub subscribe: Vec<String>,
    /// For each frame of `subscribe` (by position), text the server must have sent first
    /// (protocols with a handshake: Socket.IO's `0{`, then `40{`). Empty: no wait.
    #[serde(default)]
    pub wait_for: Vec<String>,
    /// A frame sent every `heartbeat_ms` (Phoenix-style client heartbeats).
    pub heartbeat: Option<String>,
    pub heartbeat_ms: u64,
    /// The server's application ping and the client's answer to it (Centrifugo's `{}`
    /// and `{}`).
    #[serde(default)]
    pub ping_pong: Option<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientSpec {
    /// Herald's base URL, `http://host:port`.
    pub url: String,
    pub transport: Transport,
    pub channel: String,
    pub source: IpAddr,
    pub generic: Option<Generic>,
    /// Presence runs: connect first (to learn the client id a reconnect sends back) and
    /// count `presence` pushes. WebSocket only.
    #[serde(default)]
    pub presence: bool,
    /// WebSocket clients offer permessage-deflate, as browsers do.
    #[serde(default)]
    pub deflate: bool,
    /// Herald WebSocket clients speak its Protobuf codec (`herald.protobuf`): commands
    /// are sent as Protobuf, and each message read is turned back into its JSON line.
    #[serde(default)]
    pub protobuf: bool,
    /// Herald WebSocket clients subscribe with `delta: "fossil"` and apply the deltas.
    #[serde(default)]
    pub delta: bool,
}

/// Told to every client at once: drop the connection and connect again, either sending the
/// first connection's client id back (`resume`: presence sees the same member) or as a new
/// client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconnect {
    pub generation: u64,
    pub resume: bool,
}

/// Who a client was, kept over its reconnects.
#[derive(Default)]
struct Identity {
    /// The client id its first connection got.
    first: Option<String>,
    /// Send it back on the next connect.
    resume: bool,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

async fn connect_tcp(
    spec: &ClientSpec,
    target: SocketAddr,
    rec: &Tracker,
) -> anyhow::Result<Counted<tokio::net::TcpStream>> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if target.is_ipv4() {
        crate::netinfo::bind_address_no_port(std::os::fd::AsRawFd::as_raw_fd(&socket))?;
    }
    socket
        .bind(SocketAddr::new(spec.source, 0))
        .context("bind")?;
    let stream = socket.connect(target).await.context("connect")?;
    stream.set_nodelay(true)?;
    Ok(Counted::new(stream, rec.wire.clone()))
}

fn address(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url
        .split("://")
        .nth(1)
        .ok_or_else(|| anyhow!("no scheme in {url}"))?;
    let host = rest.split('/').next().unwrap_or(rest);
    host.parse()
        .with_context(|| format!("{url}: the bench connects to IP:PORT addresses"))
}

fn path_of(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    rest.find('/').map_or("/".into(), |i| rest[i..].to_string())
}

/// Runs one client until `stop` turns true, reconnecting whenever `reconnect` changes.
/// Errors before the subscription is confirmed are connection failures; later ones are
/// drops. Both are recorded by kind.
pub async fn run(
    spec: ClientSpec,
    speak: Option<Speak>,
    rec: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
    mut reconnect: watch::Receiver<Reconnect>,
) {
    enum Next {
        Ended(anyhow::Result<()>),
        Reconnect,
    }
    let tracker = Tracker::new(rec);
    let mut identity = Identity::default();
    loop {
        let next = tokio::select! {
            r = session(&spec, speak.as_ref(), &tracker, &mut identity) => Next::Ended(r),
            _ = stop.wait_for(|s| *s) => Next::Ended(Ok(())),
            Ok(()) = reconnect.changed() => Next::Reconnect,
        };
        match next {
            Next::Ended(result) => return tracker.ended(result.err()),
            Next::Reconnect => {
                // Dropping the session closes its socket at once, with no close frame: a
                // connection lost, as in a network cut or a server restart.
                identity.resume = reconnect.borrow_and_update().resume;
                tracker.ended(None);
            }
        }
    }
}

async fn session(
    spec: &ClientSpec,
    speak: Option<&Speak>,
    rec: &Tracker,
    identity: &mut Identity,
) -> anyhow::Result<()> {
    if let Some(generic) = &spec.generic {
        return generic_session(spec, generic, rec).await;
    }
    match spec.transport {
        Transport::Ws => ws_session(spec, speak, rec, identity).await,
        Transport::Sse | Transport::Stream | Transport::Iframe => {
            stream_session(spec, speak, rec).await
        }
        Transport::Longpoll | Transport::Poll { .. } => poll_session(spec, speak, rec).await,
    }
}

fn speak_body(speak: &Speak, channel: &str, n: u64) -> String {
    serde_json::json!({
        "publish": {"channel": channel, "data": {"t": now_ns(), "seq": n, "text": speak.text}}
    })
    .to_string()
}

type Tcp = Counted<tokio::net::TcpStream>;

/// The WebSocket handshake over a connected socket. tungstenite zero-fills its whole read
/// buffer (128 KiB by default) for every read: with 100,000 small messages a second that was
/// a third of a worker's CPU, so clients read with 4 KiB (pushes are small).
/// With `deflate`, the client offers permessage-deflate as a browser does (see
/// [`deflate`]).
async fn handshake(
    url: &str,
    tcp: Tcp,
    deflate: bool,
    protobuf: bool,
) -> anyhow::Result<tokio_tungstenite::WebSocketStream<Inflating<Tcp>>> {
    let config = WebSocketConfig::default().read_buffer_size(4096);
    let mut request = url.into_client_request()?;
    if protobuf {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "herald.protobuf".parse().expect("a valid header value"),
        );
    }
    if deflate {
        request.headers_mut().insert(
            "sec-websocket-extensions",
            deflate::OFFER.parse().expect("a valid header value"),
        );
    }
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        request,
        Inflating::new(tcp, deflate),
        Some(config),
    )
    .await
    .context("websocket handshake")?;
    Ok(ws)
}

async fn ws_session(
    spec: &ClientSpec,
    speak: Option<&Speak>,
    rec: &Tracker,
    identity: &mut Identity,
) -> anyhow::Result<()> {
    let target = address(&spec.url)?;
    let tcp = connect_tcp(spec, target, rec).await?;
    let url = format!(
        "{}/connection/websocket",
        spec.url.replacen("http", "ws", 1)
    );
    let mut ws = handshake(&url, tcp, spec.deflate, spec.protobuf).await?;
    let say = |text: String| match spec.protobuf {
        false => Message::text(text),
        true => Message::binary(herald_protocol::protobuf::frame_of_json(text.as_bytes())),
    };
    let mut frame = String::new();
    if spec.presence {
        let first = identity.first.as_ref().filter(|_| identity.resume);
        let connect = match first {
            Some(id) => serde_json::json!({"id": 2, "connect": {"client": id}}),
            None => serde_json::json!({"id": 2, "connect": {}}),
        };
        frame = format!("{connect}\n");
    }
    let delta = if spec.delta {
        r#","delta":"fossil""#
    } else {
        ""
    };
    frame.push_str(&format!(
        "{{\"id\":1,\"subscribe\":{{\"channel\":\"{}\"{delta}}}}}",
        spec.channel
    ));
    ws.send(say(frame)).await?;
    let mut positions = Positions::default();
    let mut subscribed = false;
    let mut ticker = speaker(speak);
    let mut said = 0;
    loop {
        tokio::select! {
            frame = ws.next() => {
                let frame = frame.ok_or_else(|| anyhow!("closed by server"))??;
                let frame = match frame {
                    Message::Binary(b) if spec.protobuf => {
                        let lines = herald_protocol::protobuf::json_lines(&b)
                            .ok_or_else(|| anyhow!("a frame that is not Protobuf"))?;
                        Message::text(String::from_utf8(lines)?)
                    }
                    other => other,
                };
                match frame {
                    Message::Text(text) => {
                        for line in text.as_str().lines() {
                            if !subscribed && line.contains("\"id\":1") {
                                if line.contains("\"error\"") {
                                    bail!("subscribe refused: {line}");
                                }
                                subscribed = true;
                                rec.connected();
                            } else if line.starts_with("{\"presence\"") {
                                rec.presence_push(line);
                            } else if line.starts_with("{\"id\":2,") {
                                if identity.first.is_none() {
                                    let reply: serde_json::Value = serde_json::from_str(line)?;
                                    identity.first = reply["connect"]["client"].as_str().map(String::from);
                                }
                            } else {
                                positions.push(line, rec);
                            }
                        }
                    }
                    Message::Close(c) => bail!("closed by server: {c:?}"),
                    _ => {}
                }
            }
            _ = tick(&mut ticker) => {
                said += 1;
                ws.send(say(speak_body(speak.unwrap(), &spec.channel, said))).await?;
            }
        }
    }
}

fn speaker(speak: Option<&Speak>) -> Option<tokio::time::Interval> {
    speak.map(|s| {
        let mut i = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_millis(s.offset_ms),
            Duration::from_millis(s.every_ms),
        );
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    })
}

async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1.1 connection; it closes (and its socket reports its packets) when the
/// returned guard is dropped with the client.
async fn http_connection(spec: &ClientSpec, rec: &Tracker) -> anyhow::Result<(Sender, Abort)> {
    let target = address(&spec.url)?;
    let tcp = connect_tcp(spec, target, rec).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, Abort(task)))
}

fn get(spec: &ClientSpec, path_and_query: &str) -> anyhow::Result<Request<Full<Bytes>>> {
    Ok(Request::get(path_and_query)
        .header("host", address(&spec.url)?.to_string())
        .body(Full::new(Bytes::new()))?)
}

async fn send_commands(sender: &mut Sender, spec: &ClientSpec, body: String) -> anyhow::Result<()> {
    sender.ready().await?;
    let req = Request::post("/connection/send")
        .header("host", address(&spec.url)?.to_string())
        .header("content-type", "application/x-ndjson")
        .body(Full::new(Bytes::from(body)))?;
    let res = sender.send_request(req).await?;
    let status = res.status();
    res.into_body().collect().await?;
    if !status.is_success() {
        bail!("send: HTTP {status}");
    }
    Ok(())
}

async fn stream_session(
    spec: &ClientSpec,
    speak: Option<&Speak>,
    rec: &Tracker,
) -> anyhow::Result<()> {
    let (mut sender, _conn) = http_connection(spec, rec).await?;
    let path = match spec.transport {
        Transport::Sse => "sse?",
        Transport::Iframe => "iframe?callback=cb&",
        _ => "stream?",
    };
    let res = sender
        .send_request(get(
            spec,
            &format!("/connection/{path}channel={}", spec.channel),
        )?)
        .await?;
    if !res.status().is_success() {
        bail!("HTTP {}", res.status());
    }
    let mut body: Incoming = res.into_body();
    let _speaker = http_speaker(spec, speak, rec).await?;
    let mut positions = Positions::default();
    let mut pending = String::new();
    let mut subscribed = false;
    loop {
        let frame = body
            .frame()
            .await
            .ok_or_else(|| anyhow!("stream ended"))??;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            let line = line.trim_end();
            let line = line.strip_prefix("data: ").unwrap_or(line);
            // A forever frame's push: `<script>parent.cb(PUSH);</script>` (the rest of the
            // document is padding).
            let line = line
                .strip_prefix("<script>parent.cb(")
                .and_then(|l| l.strip_suffix(");</script>"))
                .unwrap_or(line);
            if !subscribed && line.contains("\"subscribe\"") {
                subscribed = true;
                rec.connected();
            } else if line.contains("\"disconnect\"") {
                bail!("disconnected by server: {line}");
            } else {
                positions.push(line, rec);
            }
        }
    }
}

/// Aborts a task when dropped: a client's helper ends with the client.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// HTTP transports speak through `POST /connection/send` on a connection of their own, so
/// that a held or streaming response never waits for it.
async fn http_speaker(
    spec: &ClientSpec,
    speak: Option<&Speak>,
    rec: &Tracker,
) -> anyhow::Result<Option<Abort>> {
    let Some(speak) = speak.cloned() else {
        return Ok(None);
    };
    let (mut sender, conn) = http_connection(spec, rec).await?;
    let spec = spec.clone();
    let mut ticker = speaker(Some(&speak));
    Ok(Some(Abort(tokio::spawn(async move {
        let _conn = conn;
        let mut said = 0;
        loop {
            tick(&mut ticker).await;
            said += 1;
            let body = speak_body(&speak, &spec.channel, said);
            if send_commands(&mut sender, &spec, body).await.is_err() {
                return;
            }
        }
    }))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_stamp_in_any_framing() {
        assert_eq!(
            stamp(r#"{"pub":{"data":{"t":123,"seq":4}}}"#),
            Some((123, Some(4)))
        );
        assert_eq!(stamp(r#"data: {"x":{"t": 9}}"#), Some((9, None)));
        assert_eq!(stamp(r#"{"t":"text"}"#), None);
        assert_eq!(
            stamp(r#"{"event":"e","data":"{\"t\":77,\"seq\":8}"}"#),
            Some((77, Some(8)))
        );
    }

    /// Centrifugo joins the pushes that wait together in one WebSocket message, a line
    /// each: every one is a delivery (the bench counted only the first, and reported the
    /// rest as lost).
    #[test]
    fn counts_every_publication_of_a_message_that_joins_several() {
        let joined = concat!(
            r#"{"push":{"channel":"c","pub":{"data":{"t":11,"seq":1},"offset":1}}}"#,
            "\n",
            r#"{"push":{"channel":"c","pub":{"data":{"t":12,"seq":2},"offset":2}}}"#
        );
        let all: Vec<_> = stamps(joined).collect();
        assert_eq!(all, [(11, Some(1)), (12, Some(2))]);
        assert_eq!(stamps(r#"{"t":5}"#).count(), 1);
    }

    #[test]
    fn transports_parse_with_poll_intervals() {
        assert_eq!(
            Transport::parse("poll@5s").unwrap(),
            Transport::Poll { ms: 5000 }
        );
        assert_eq!(Transport::parse("websocket").unwrap(), Transport::Ws);
        assert!(Transport::parse("carrier-pigeon").is_err());
        assert_eq!(Transport::Poll { ms: 15000 }.label(), "poll@15s");
    }
}
