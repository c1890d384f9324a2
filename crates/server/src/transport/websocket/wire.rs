//! The socket of a WebSocket connection, shared by its task (through tungstenite) and the
//! hub's direct lane (see [`crate::queue`]).
//!
//! Every write, tungstenite's or the hub's, goes through the connection's queue, which keeps
//! a half-written frame's tail and sends it before anything else: two writers, one byte
//! stream, no split frames.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tungstenite::protocol::frame::{
    coding::{Data, OpCode},
    FrameHeader,
};

use crate::queue::{Delivery, DirectSocket, Lane, Queue};

/// How a WebSocket connection's protocol frames what the hub writes to it directly, and
/// the words of its close. Herald's own protocol is [`HeraldFrames`] (no bytes per
/// connection); a front brings its own.
pub trait Framing: Send + Sync + std::fmt::Debug + 'static {
    /// The frame that carries `delivery` on this connection; `None` when the connection's
    /// task must handle it (it goes through the queue).
    fn frame<'d>(&self, delivery: &'d Delivery) -> Option<&'d Bytes>;

    /// Whether each push is a message of its own (Herald's protocol puts several in one,
    /// a line each).
    const MESSAGE_PER_PUSH: bool = false;

    /// The close code and reason a connection ending for `why` is closed with.
    fn close(why: &crate::error::Disconnect) -> (u16, String) {
        (why.wire_code(), why.short_reason().to_owned())
    }
}

/// Herald's own protocol: every publication as the hub encoded it, in a text frame.
#[derive(Debug)]
pub struct HeraldFrames;

impl Framing for HeraldFrames {
    fn frame<'d>(&self, delivery: &'d Delivery) -> Option<&'d Bytes> {
        Some(delivery.framed(Lane::WebSocket, |d| text_frame(&d.json)))
    }
}

/// The TCP socket under a WebSocket connection, with its protocol's framing.
#[derive(Debug)]
pub struct Wire<F>(TcpStream, F);

impl<F: Framing> DirectSocket for Wire<F> {
    fn frame<'d>(&self, delivery: &'d Delivery) -> Option<&'d Bytes> {
        self.1.frame(delivery)
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
}

/// One unmasked, final text frame (a server's frames are never masked: RFC 6455 §5.1).
pub fn text_frame(payload: &[u8]) -> Bytes {
    let header = FrameHeader {
        opcode: OpCode::Data(Data::Text),
        ..FrameHeader::default()
    };
    let mut frame = Vec::with_capacity(payload.len() + 10);
    header
        .format(payload.len() as u64, &mut frame)
        .expect("writing to a Vec cannot fail");
    frame.extend_from_slice(payload);
    frame.into()
}

/// tungstenite's view of the socket: reads straight from it, writes through the queue.
#[derive(Debug)]
pub struct Io<F> {
    wire: Arc<Wire<F>>,
    queue: Arc<Queue>,
}

impl<F: Framing> Io<F> {
    /// Wraps `stream`, and opens the direct lane of `queue` to it.
    pub fn new(stream: TcpStream, queue: Arc<Queue>, framing: F) -> Self {
        let wire = Arc::new(Wire(stream, framing));
        queue.attach(wire.clone());
        Self { wire, queue }
    }

    /// The connection's queue, which writes go through.
    pub fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }
}

impl<F: Framing> AsyncRead for Io<F> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.wire.0.poll_read_ready(cx))?;
            match self.wire.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<F: Framing> AsyncWrite for Io<F> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.queue.write_through(&*self.wire, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.wire.0.poll_write_ready(cx))?
                }
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.queue.flush_unsent(&*self.wire) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.wire.0.poll_write_ready(cx))?
                }
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The socket closes when the connection drops it; only the tail must go first.
        self.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_match_tungstenites_own() {
        for size in [0, 125, 126, 65_535, 65_536] {
            let payload = vec![b'x'; size];
            let mut theirs = Vec::new();
            tungstenite::protocol::frame::Frame::message(
                payload.clone(),
                OpCode::Data(Data::Text),
                true,
            )
            .format(&mut theirs)
            .unwrap();
            assert_eq!(&text_frame(&payload)[..], &theirs[..], "size {size}");
        }
    }
}
