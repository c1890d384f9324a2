//! WebSocket transport (RFC 6455 via tungstenite): JSON text frames, several commands or
//! pushes per frame, one line each. Publications usually skip the connection's task: the
//! hub writes them straight to the socket while the task is idle (see [`crate::queue`]).

mod upgrade;
mod wire;

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_protocol::{DisconnectCode, Encoding};
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

pub use upgrade::{accept, upgrade, Upgraded};
pub use wire::{text_frame, Framing, HeraldFrames};

use super::driver::{self, Heard, Unwritten, Wire, CLOSE_GRACE};
use crate::{
    error::Disconnect,
    hooks::Transport,
    node::Node,
    session::{Positions, Session},
};
use wire::Io;

/// The subprotocol of the JSON codec. Clients may also offer no subprotocol at all.
pub const JSON_SUBPROTOCOL: &str = "herald.json";

type Socket<F> = WebSocketStream<Io<F>>;

async fn run(up: Upgraded) {
    let Upgraded {
        stream,
        early,
        node,
        address,
        facts,
    } = up;
    let mut session = Session::new(&node)
        .at_address(address)
        .came_by(Transport::Websocket, facts);
    // Made in place: a local moved into another keeps its room in the task.
    let mut wire = WebSocket::open(stream, early, &session, &node, HeraldFrames).await;
    let told = driver::drive(&node, &mut session, &mut wire, Ok(()), 0).await;
    // Free the session (and its subscriptions) now; the closing handshake is only manners.
    drop(session);
    // Boxed: only a closing connection needs its space.
    Box::pin(wire.farewell(told)).await;
}

/// A WebSocket connection as the driver sees it: pushes are lines of text frames (or a
/// message each, as its [`Framing`] says), and the client's frames are commands.
pub struct WebSocket<F> {
    socket: Socket<F>,
    /// The session's id, for the log line of its close.
    session: u64,
    /// When the client last sent anything (a pong counts).
    last_heard: Instant,
    /// The codec of its subprotocol (no bytes while there is one).
    encoding: Encoding,
}

impl<F: Framing> WebSocket<F> {
    /// The WebSocket over an upgraded `stream` (`early`: what the client sent after its
    /// upgrade request), for `session`, whose queue's direct lane writes to it framed by
    /// `framing`.
    pub async fn open(
        stream: TcpStream,
        early: Vec<u8>,
        session: &Session,
        node: &Node,
        framing: F,
    ) -> Self {
        let limit = node.settings.config.client.max_frame_size;
        let config = WebSocketConfig::default()
            .max_message_size(Some(limit))
            .max_frame_size(Some(limit))
            // Small buffers: most connections are idle most of the time, and client frames
            // are small commands (the buffer grows for a larger frame when its header
            // announces it).
            .read_buffer_size(256)
            .write_buffer_size(0);
        let io = Io::new(stream, session.queue().clone(), framing);
        WebSocket {
            socket: WebSocketStream::from_partially_read(io, early, Role::Server, Some(config))
                .await,
            session: session.id(),
            last_heard: Instant::now(),
            // Herald's JSON, whether the client asked for `herald.json` or for no
            // subprotocol (a front's pushes are its own JSON, joined the same way).
            encoding: Encoding::Json,
        }
    }
}

impl<F: Framing> Wire for WebSocket<F> {
    fn push(&self, json: &[u8], _at: Positions<'_>, out: &mut Vec<u8>) {
        self.encoding.codec().join(out, json);
    }

    async fn send(&mut self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Unwritten> {
        if bytes.is_empty() {
            // Nothing new: still send the tail of a direct write the socket did not take.
            if self.socket.get_ref().queue().has_unsent() {
                return finish(self.socket.flush(), timeout).await;
            }
            return Ok(());
        }
        if F::MESSAGE_PER_PUSH {
            // A message per line: JSON text holds no raw line break.
            for line in bytes.split(|b| *b == b'\n') {
                let text = std::str::from_utf8(line).map_err(|_| Unwritten::Gone)?;
                send_text(&mut self.socket, text.to_owned(), timeout).await?;
            }
            return Ok(());
        }
        // Frames are built from validated JSON; a defect that broke that ends the
        // connection rather than the task.
        let text = String::from_utf8(bytes).map_err(|_| {
            tracing::error!(
                session = self.session,
                "internal error: a frame was not UTF-8"
            );
            Unwritten::Gone
        })?;
        send_text(&mut self.socket, text, timeout).await
    }

    async fn heard(&mut self) -> Heard {
        let message = self.socket.next().await;
        self.last_heard = Instant::now();
        match message {
            None | Some(Ok(Message::Close(_))) => Heard::Left,
            Some(Ok(Message::Text(text))) => Heard::Frame(Bytes::from(text)),
            Some(Ok(Message::Binary(bytes))) => Heard::Frame(bytes),
            Some(Ok(Message::Pong(payload))) if !payload.is_empty() => Heard::Pong(payload),
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => Heard::Alive,
            Some(Err(e)) => match read_error(e) {
                Some(d) => Heard::Refused(d),
                None => Heard::Left,
            },
        }
    }

    async fn keepalive(&mut self, timeout: Duration) -> Result<(), Unwritten> {
        send(&mut self.socket, Message::Ping(Default::default()), timeout).await
    }

    async fn ping(&mut self, payload: [u8; 8], timeout: Duration) -> Result<(), Unwritten> {
        let payload = Bytes::copy_from_slice(&payload);
        send(&mut self.socket, Message::Ping(payload), timeout).await
    }

    fn silent_for(&self) -> Option<Duration> {
        Some(self.last_heard.elapsed())
    }

    /// Says why and waits briefly for the peer's Close.
    async fn farewell(mut self, ended: Option<Disconnect>) -> bool {
        let Some(d) = ended else {
            return false;
        };
        let (code, reason) = F::close(&d);
        tracing::debug!(session = self.session, code, reason = %d.reason, "websocket closed by server");
        let frame = CloseFrame {
            code: code.into(),
            reason: Utf8Bytes::from(reason),
        };
        if send(&mut self.socket, Message::Close(Some(frame)), CLOSE_GRACE)
            .await
            .is_err()
        {
            return false;
        }
        // RFC 6455 §7.1.1: wait (briefly) for the peer's Close before dropping TCP, so the
        // peer reads our code instead of a reset.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Some(Ok(m)) = self.socket.next().await {
                if let Message::Close(_) = m {
                    break;
                }
            }
        })
        .await;
        true
    }
}

/// Sends `text` as one message, in frames of at most [`MAX_FRAGMENT`] bytes: tungstenite
/// keeps its write buffer's capacity for the connection's life, so one 130 KB answer sent as
/// one frame would leave every connection that ever got one holding 130 KB.
async fn send_text<F: Framing>(
    socket: &mut Socket<F>,
    text: String,
    timeout: Duration,
) -> Result<(), Unwritten> {
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

async fn send<F: Framing>(
    socket: &mut Socket<F>,
    message: Message,
    timeout: Duration,
) -> Result<(), Unwritten> {
    finish(socket.send(message), timeout).await
}

/// Waits for a write, at most `timeout`: a client that does not read is cut off.
async fn finish(
    write: impl std::future::Future<Output = Result<(), tungstenite::Error>>,
    timeout: Duration,
) -> Result<(), Unwritten> {
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Unwritten::Gone),
        Err(_) => Err(Unwritten::Slow),
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
