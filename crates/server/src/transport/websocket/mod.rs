//! WebSocket transport (RFC 6455 via tungstenite): JSON text frames, several commands or
//! pushes per frame, one line each. Publications usually skip the connection's task: the
//! hub writes them straight to the socket while the task is idle (see [`crate::queue`]).

mod upgrade;
mod wire;

use std::{net::IpAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_protocol::DisconnectCode;
use tokio::{net::TcpStream, time::Instant};
use tokio_tungstenite::WebSocketStream;
use tungstenite::{
    protocol::{
        frame::{
            coding::{Data, OpCode},
            CloseFrame, Frame,
        },
        Role, WebSocketConfig,
    },
    Message, Utf8Bytes,
};

pub use upgrade::upgrade;

use super::MAX_BATCH_BYTES;
use crate::{
    error::Disconnect,
    hooks::{RequestFacts, Transport},
    node::Node,
    session::{ExpiryTimer, Session},
};
use wire::Io;

/// The subprotocol of the JSON codec. Clients may also offer no subprotocol at all.
pub const JSON_SUBPROTOCOL: &str = "herald.json";

type Socket = WebSocketStream<Io>;

async fn run(
    stream: TcpStream,
    early: Vec<u8>,
    node: Arc<Node>,
    address: Option<IpAddr>,
    facts: Option<Box<RequestFacts>>,
) {
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(Transport::Websocket, facts);
    let client = &node.settings.config.client;
    let limit = client.max_frame_size;
    let config = WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
        // Small buffers: most connections are idle most of the time, and client frames are
        // small commands (the buffer grows for a larger frame when its header announces it).
        .read_buffer_size(256)
        .write_buffer_size(0);
    let io = Io::new(stream, session.queue().clone());
    let mut socket =
        WebSocketStream::from_partially_read(io, early, Role::Server, Some(config)).await;
    let (ping_every, idle_timeout, write_timeout) = (
        client.ping_interval,
        client.idle_timeout,
        client.write_timeout,
    );
    let mut ping = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
    let mut last_heard = Instant::now();
    let mut out = Vec::new();
    let mut expiry = ExpiryTimer::default();

    let ended: Option<Disconnect> = loop {
        let step: Result<(), Disconnect> = tokio::select! {
            biased;
            _ = node.shutdown.cancelled() => Err(Disconnect::new(DisconnectCode::Shutdown)),
            message = socket.next() => {
                last_heard = Instant::now();
                // Replies must not be overtaken by publications the hub would write directly.
                session.queue().hold();
                match message {
                    None | Some(Ok(Message::Close(_))) => break None,
                    // Boxed: commands are rare next to idle time, and the command future is
                    // large; inline, every idle connection would carry its space.
                    Some(Ok(Message::Text(text))) => Box::pin(answer(&mut session, &mut socket, text.as_bytes(), &mut out, write_timeout)).await,
                    Some(Ok(Message::Binary(bytes))) => Box::pin(answer(&mut session, &mut socket, &bytes, &mut out, write_timeout)).await,
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => Ok(()),
                    Some(Err(e)) => match read_error(e) {
                        Some(d) => Err(d),
                        None => break None,
                    },
                }
            }
            _ = session.queue().ready() => {
                session.queue().hold();
                Ok(())
            }
            _ = expiry.wait() => session.expire().await.map(|pushes| {
                for push in pushes {
                    crate::session::line(&mut out, &push);
                }
            }),
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
        expiry.follow(&session);
    };

    let id = session.id();
    session.queue().detach();
    session.ending(ended.as_ref());
    // Free the session (and its subscriptions) now; the closing handshake is only manners.
    drop(session);
    // Boxed for the same reason as commands: only a closing connection needs its space.
    Box::pin(close(socket, id, ended)).await;
}

/// Says why (unless the socket is broken) and waits briefly for the peer's Close.
async fn close(mut socket: Socket, id: u64, ended: Option<Disconnect>) {
    if let Some(d) = ended {
        tracing::debug!(session = id, code = d.wire_code(), reason = %d.reason, "websocket closed by server");
        if d.code != DisconnectCode::WriteError {
            let frame = CloseFrame {
                code: d.wire_code().into(),
                reason: Utf8Bytes::from(d.short_reason()),
            };
            if send(&mut socket, Message::Close(Some(frame)), CLOSE_GRACE)
                .await
                .is_ok()
            {
                // RFC 6455 §7.1.1: wait (briefly) for the peer's Close before dropping TCP,
                // so the peer reads our code instead of a reset.
                let _ = tokio::time::timeout(CLOSE_GRACE, async {
                    while let Some(Ok(m)) = socket.next().await {
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

/// Handles a frame's commands, sending their replies in frames of about [`MAX_BATCH_BYTES`]
/// as they are made (each waiting for the client to read): a frame of many history reads
/// is never answered in one piece. The last replies stay in `out` for [`flush`].
async fn answer(
    session: &mut Session,
    socket: &mut Socket,
    frame: &[u8],
    out: &mut Vec<u8>,
    timeout: Duration,
) -> Result<(), Disconnect> {
    let mut rest = frame;
    loop {
        rest = session
            .handle_frame_until(rest, out, MAX_BATCH_BYTES)
            .await?;
        if rest.is_empty() {
            return Ok(());
        }
        send_text(socket, text(out)?, timeout).await?;
    }
}

/// Takes what `out` holds as the text of a frame.
fn text(out: &mut Vec<u8>) -> Result<String, Disconnect> {
    // Frames are built from validated JSON; a defect that broke that ends the connection
    // rather than the task.
    String::from_utf8(std::mem::take(out)).map_err(|_| {
        Disconnect::because(
            DisconnectCode::ServerError,
            "internal error: a frame was not UTF-8",
        )
    })
}

/// Writes replies and queued publications until nothing is left, then hands publications
/// back to the hub's direct lane.
async fn flush(
    session: &mut Session,
    socket: &mut Socket,
    out: &mut Vec<u8>,
    timeout: Duration,
) -> Result<(), Disconnect> {
    loop {
        if out.len() < MAX_BATCH_BYTES {
            session.write_deliveries(out, MAX_BATCH_BYTES - out.len())?;
        }
        if out.is_empty() {
            if session.queue().has_unsent() {
                finish(socket.flush(), timeout).await?;
            }
            if session.queue().release() {
                return Ok(());
            }
            continue;
        }
        send_text(socket, text(out)?, timeout).await?;
    }
}

/// Sends `text` as one message, in frames of at most [`MAX_FRAGMENT`] bytes: tungstenite
/// keeps its write buffer's capacity for the connection's life, so one 130 KB answer sent as
/// one frame would leave every connection that ever got one holding 130 KB.
async fn send_text(socket: &mut Socket, text: String, timeout: Duration) -> Result<(), Disconnect> {
    if text.len() <= MAX_FRAGMENT {
        return send(socket, Message::Text(text.into()), timeout).await;
    }
    let text = Bytes::from(text);
    let (mut at, mut opcode) = (0, OpCode::Data(Data::Text));
    while at < text.len() {
        let mut end = (at + MAX_FRAGMENT).min(text.len());
        // Whole characters in each frame: some clients check UTF-8 frame by frame.
        while !is_char_start(&text, end) {
            end -= 1;
        }
        let frame = Frame::message(text.slice(at..end), opcode, end == text.len());
        send(socket, Message::Frame(frame), timeout).await?;
        (at, opcode) = (end, OpCode::Data(Data::Continue));
    }
    Ok(())
}

/// Whether a character starts at `at` (or the text ends there).
fn is_char_start(text: &[u8], at: usize) -> bool {
    text.get(at).is_none_or(|b| (*b as i8) >= -0x40)
}

/// The largest frame a message is sent in; larger ones are fragmented (RFC 6455 §5.4).
const MAX_FRAGMENT: usize = 16 * 1024;

async fn send(socket: &mut Socket, message: Message, timeout: Duration) -> Result<(), Disconnect> {
    finish(socket.send(message), timeout).await
}

/// Waits for a write, at most `timeout`: a client that does not read is cut off.
async fn finish(
    write: impl std::future::Future<Output = Result<(), tungstenite::Error>>,
    timeout: Duration,
) -> Result<(), Disconnect> {
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Disconnect::new(DisconnectCode::WriteError)),
        Err(_) => Err(super::write_timed_out()),
    }
}

/// Maps a read error to a close: oversized messages get 3503; a broken connection just ends.
fn read_error(e: tungstenite::Error) -> Option<Disconnect> {
    use tungstenite::error::{CapacityError, Error, ProtocolError};
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
