//! WebSocket transport (RFC 6455 via tungstenite): JSON text frames, several commands or
//! pushes per frame, one line each.

use std::{sync::Arc, time::Duration};

use axum::{
    extract::{
        ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade},
        State,
    },
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use futures_util::SinkExt;
use herald_protocol::DisconnectCode;
use tokio::time::Instant;

use super::{request, MAX_BATCH_BYTES};
use crate::{error::Disconnect, node::Node, session::Session};

/// The subprotocol of the JSON codec. Clients may also offer no subprotocol at all.
pub const JSON_SUBPROTOCOL: &str = "herald.json";

/// `GET /connection/websocket`.
pub async fn upgrade(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if let Err(f) = request::admit(&node, &headers) {
        return f.into_response();
    }
    let limit = node.settings.config.client.max_frame_size;
    ws.protocols([JSON_SUBPROTOCOL])
        .max_message_size(limit)
        .max_frame_size(limit)
        // Small buffers: most connections are idle most of the time, and client frames are
        // small commands (the buffer grows for a larger frame when its header announces it).
        .read_buffer_size(256)
        .write_buffer_size(0)
        .on_upgrade(move |socket| {
            let tasks = node.tasks.clone();
            tasks.track_future(run(socket, node))
        })
}

async fn run(socket: WebSocket, node: Arc<Node>) {
    let mut session = Session::new(&node);
    // One socket, not split halves: the task never reads and writes at the same time, and
    // split() costs a lock on every poll.
    let mut socket = socket;
    let client = &node.settings.config.client;
    let (ping_every, idle_timeout, write_timeout) = (
        client.ping_interval,
        client.idle_timeout,
        client.write_timeout,
    );
    let mut ping = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
    let mut last_heard = Instant::now();
    let mut out = Vec::new();

    let ended: Option<Disconnect> = loop {
        let step: Result<(), Disconnect> = tokio::select! {
            biased;
            _ = node.shutdown.cancelled() => Err(Disconnect::new(DisconnectCode::Shutdown)),
            message = socket.recv() => {
                last_heard = Instant::now();
                match message {
                    None | Some(Ok(Message::Close(_))) => break None,
                    // Boxed: commands are rare next to idle time, and the command future is
                    // large; inline, every idle connection would carry its space.
                    Some(Ok(Message::Text(text))) => Box::pin(session.handle_frame(text.as_bytes(), &mut out)).await,
                    Some(Ok(Message::Binary(bytes))) => Box::pin(session.handle_frame(&bytes, &mut out)).await,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => Ok(()),
                    Some(Err(e)) => match read_error(e) {
                        Some(d) => Err(d),
                        None => break None,
                    },
                }
            }
            _ = session.queue().ready() => Ok(()),
            _ = ping.tick() => {
                if last_heard.elapsed() >= idle_timeout {
                    Err(Disconnect::because(DisconnectCode::Stale, format!("nothing received for {idle_timeout:?}")))
                } else {
                    send(&mut socket, Message::Ping(Default::default()), write_timeout).await
                }
            }
        };
        // Replies first, then whatever publications are queued, in frames of bounded size.
        let flushed = match step {
            Ok(()) => flush(&mut session, &mut socket, &mut out, write_timeout).await,
            Err(d) => Err(d),
        };
        if let Err(d) = flushed {
            break Some(d);
        }
    };

    let id = session.id();
    // Free the session (and its subscriptions) now; the closing handshake is only manners.
    drop(session);
    // Boxed for the same reason as commands: only a closing connection needs its space.
    Box::pin(close(socket, id, ended)).await;
}

/// Says why (unless the socket is broken) and waits briefly for the peer's Close.
async fn close(mut socket: WebSocket, id: u64, ended: Option<Disconnect>) {
    if let Some(d) = ended {
        tracing::debug!(session = id, code = d.code.code(), reason = %d.reason, "websocket closed by server");
        if d.code != DisconnectCode::WriteError {
            let frame = CloseFrame {
                code: d.code.code(),
                reason: Utf8Bytes::from(d.short_reason()),
            };
            if send(&mut socket, Message::Close(Some(frame)), CLOSE_GRACE)
                .await
                .is_ok()
            {
                // RFC 6455 §7.1.1: wait (briefly) for the peer's Close before dropping TCP,
                // so the peer reads our code instead of a reset.
                let _ = tokio::time::timeout(CLOSE_GRACE, async {
                    while let Some(Ok(m)) = socket.recv().await {
                        if let Message::Close(_) = m {
                            break;
                        }
                    }
                })
                .await;
            }
        }
    }
}

/// How long a closing handshake may take.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

async fn flush<S>(
    session: &mut Session,
    tx: &mut S,
    out: &mut Vec<u8>,
    timeout: Duration,
) -> Result<(), Disconnect>
where
    S: futures_util::Sink<Message, Error = axum::Error> + Unpin,
{
    loop {
        if out.len() < MAX_BATCH_BYTES {
            session.write_deliveries(out, MAX_BATCH_BYTES - out.len())?;
        }
        if out.is_empty() {
            return Ok(());
        }
        let text =
            String::from_utf8(std::mem::take(out)).expect("frames are built from UTF-8 JSON");
        send(tx, Message::Text(text.into()), timeout).await?;
    }
}

async fn send<S>(tx: &mut S, message: Message, timeout: Duration) -> Result<(), Disconnect>
where
    S: futures_util::Sink<Message, Error = axum::Error> + Unpin,
{
    match tokio::time::timeout(timeout, tx.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Disconnect::new(DisconnectCode::WriteError)),
        Err(_) => Err(Disconnect::because(
            DisconnectCode::Slow,
            "write timed out; reconnect and resume",
        )),
    }
}

/// Maps a read error to a close: oversized messages get 3503; a broken connection just ends.
fn read_error(e: axum::Error) -> Option<Disconnect> {
    use tungstenite::error::{CapacityError, Error, ProtocolError};
    let e = match e.into_inner().downcast::<Error>() {
        Ok(e) => *e,
        Err(_) => return None,
    };
    match e {
        Error::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
            Some(Disconnect::because(
                DisconnectCode::MessageTooLarge,
                format!("message of {size} bytes is larger than the limit of {max_size}"),
            ))
        }
        Error::Capacity(c) => Some(Disconnect::because(
            DisconnectCode::MessageTooLarge,
            c.to_string(),
        )),
        Error::Utf8(_) => Some(Disconnect::because(
            DisconnectCode::BadRequest,
            "text frame is not valid UTF-8",
        )),
        Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => None,
        Error::Protocol(p) => Some(Disconnect::because(
            DisconnectCode::BadRequest,
            p.to_string(),
        )),
        _ => None,
    }
}
