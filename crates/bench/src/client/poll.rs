//! Herald's polling clients: interval polling and long-polling (`GET /connection/poll` and
//! `/connection/longpoll`), each request carrying its cursor, a long-poll sending back the
//! session key of the answer before (as the SDK does).

use std::{collections::HashMap, time::Duration};

use anyhow::bail;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{get, http_connection, http_speaker, ClientSpec, Positions, Speak, Tracker, Transport};

/// An answer, read once: its messages stay text, which is all a push line is read from
/// (a tree of each, written back to text, cost the client a fifth more CPU per delivery
/// than its Nchan long-poller, and on a shared machine the client's CPU is the servers'
/// latency).
#[derive(Deserialize)]
struct PollAnswer<'a> {
    cursor: String,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    /// The session the server parked for the next long-poll (as the SDK sends it back).
    #[serde(default)]
    session_key: Option<String>,
}

#[derive(Deserialize)]
struct Subscribed<'a> {
    #[serde(borrow)]
    subscribe: Option<SubscribeBody<'a>>,
}

#[derive(Deserialize)]
struct SubscribeBody<'a> {
    channel: &'a str,
    epoch: &'a str,
    #[serde(default)]
    offset: u64,
}

pub(super) async fn poll_session(
    spec: &ClientSpec,
    speak: Option<&Speak>,
    rec: &Tracker,
) -> anyhow::Result<()> {
    let (mut sender, _conn) = http_connection(spec, rec).await?;
    let _speaker = http_speaker(spec, speak, rec).await?;
    let mut positions = Positions::default();
    let mut epochs = HashMap::new();
    let mut cursor = String::new();
    let mut first = true;
    let interval = match spec.transport {
        Transport::Poll { ms } => Some(Duration::from_millis(ms)),
        _ => None,
    };
    let mut session_key = String::new();
    loop {
        let held = interval.is_none() && !first;
        let query = {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query
                .append_pair("channel", &spec.channel)
                .append_pair("cursor", &cursor);
            if interval.is_none() {
                query.append_pair("session_key", &session_key);
            }
            query.finish()
        };
        let path = if held { "longpoll" } else { "poll" };
        sender.ready().await?;
        let res = sender
            .send_request(get(spec, &format!("/connection/{path}?{query}"))?)
            .await?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
        }
        let answer: PollAnswer = serde_json::from_slice(&body)?;
        session_key = answer.session_key.unwrap_or_default();
        for m in &answer.messages {
            let line = m.get();
            if !line.starts_with(r#"{"subscribe""#) {
                positions.push(line, rec);
            } else if let Ok(Subscribed { subscribe: Some(s) }) = serde_json::from_str(line) {
                epochs.insert(s.channel.to_string(), s.epoch.to_string());
                positions
                    .last
                    .entry(s.channel.to_string())
                    .or_insert(s.offset);
            }
        }
        if first {
            rec.connected();
            first = false;
        }
        cursor = if answer.cursor.is_empty() {
            positions.cursor(&epochs)
        } else {
            answer.cursor
        };
        if let Some(every) = interval {
            tokio::time::sleep(every).await;
        }
    }
}
