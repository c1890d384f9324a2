//! The socket of a WebSocket connection, shared by its task and the hub's direct lane (see
//! [`crate::queue`]).
//!
//! Every write, the task's or the hub's, goes through the connection's queue, which keeps
//! a half-written frame's tail and sends it before anything else: two writers, one byte
//! stream, no split frames.

use std::{
    future::poll_fn,
    io,
    sync::Arc,
    task::{ready, Poll},
};

use bytes::Bytes;
use tokio::net::TcpStream;

use super::{deflate, frames};
use herald_protocol::Encoding;

use crate::queue::{frame_each, Delivery, DirectSocket, Form, Lane, Queue, RunKind};

/// How a WebSocket connection's protocol frames what the hub writes to it directly, and
/// the words of its close. Herald's own protocol is [`HeraldFrames`] (no bytes per
/// connection); a front brings its own.
pub trait Framing: Send + Sync + std::fmt::Debug + 'static {
    /// The text of the message that carries `delivery` on this connection, and the lane
    /// under which its frame is made once for every connection like it; `None` when the
    /// connection's task must handle it (it goes through the queue). `form` is the
    /// subscription's (only Herald's own protocol has deltas). Unless each push is a
    /// message of its own, it is the same for every connection of the lane: a run joined
    /// of these messages is made once and shared ([`DirectSocket::run_kind`]).
    fn message<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<(Lane, &'d [u8])>;

    /// The same, for the connection's own task: what [`Framing::message`] gives even
    /// where the hub may not write it itself (a Pusher page that resumes).
    fn message_for_task<'d>(&self, delivery: &'d Delivery) -> Option<(Lane, &'d [u8])> {
        self.message(delivery, Form::Plain)
    }

    /// Whether each push is a message of its own (Herald's protocol puts several in one,
    /// a line each).
    const MESSAGE_PER_PUSH: bool = false;

    /// Whether its messages are binary (a binary codec's), not text.
    fn binary(&self) -> bool {
        false
    }

    /// Whether `message` goes in a binary frame: every message of a binary codec, and
    /// those of a text protocol that carry bytes (Phoenix's binary broadcasts).
    fn binary_message(&self, message: &[u8]) -> bool {
        let _ = message;
        self.binary()
    }

    /// The close code and reason a connection ending for `why` is closed with.
    fn close(why: &crate::error::Disconnect) -> (u16, String) {
        (why.wire_code(), why.short_reason().to_owned())
    }

    /// The protocol's own ping, for a client that counts on hearing one every
    /// `client.ping_interval` whatever else it hears (Centrifugo's clients reconnect
    /// when it is late); `None`: WebSocket pings, sent only on a quiet connection.
    fn app_ping(&self) -> Option<Vec<u8>> {
        None
    }

    /// Whether its [`Framing::app_ping`] goes every period even while the connection talks
    /// (Centrifugo's clients count on it); otherwise only on a quiet connection, as a
    /// WebSocket ping would.
    fn app_ping_regularly(&self) -> bool {
        true
    }
}

/// Herald's own protocol: every publication as the hub encoded it, in a text frame.
#[derive(Debug)]
pub struct HeraldFrames;

impl Framing for HeraldFrames {
    fn message<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<(Lane, &'d [u8])> {
        Some((Lane::WEBSOCKET, delivery.json_as(form)))
    }
}

/// Herald's Protobuf codec: every publication in its Protobuf words, made once for every
/// connection of the codec, in a binary frame.
#[derive(Debug)]
pub struct HeraldProtobufFrames;

impl Framing for HeraldProtobufFrames {
    fn message<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<(Lane, &'d [u8])> {
        let push = delivery.push(Encoding::Protobuf, form);
        Some((Lane::WEBSOCKET_PROTOBUF, push))
    }

    fn binary(&self) -> bool {
        true
    }
}

/// The TCP socket under a WebSocket connection, with its protocol's framing, the codec
/// of its session (which joins pushes that go as one message: the task's and the hub's
/// alike) and whether it compresses (the smallest message it compresses, when deflate was
/// negotiated).
#[derive(Debug)]
pub struct Wire<F> {
    stream: TcpStream,
    framing: F,
    encoding: Encoding,
    compress_from: Option<usize>,
}

impl<F: Framing> Wire<F> {
    /// The frame of `text`, made once per delivery for every connection like this one:
    /// compressed (once per publication, for every connection that negotiated it) when
    /// this one compresses and the text is long enough.
    fn shared_frame<'d>(
        &self,
        delivery: &'d Delivery,
        lane: Lane,
        form: Form,
        text: &[u8],
    ) -> &'d Bytes {
        match self.compress_from {
            Some(min) if text.len() >= min => {
                let binary = self.framing.binary_message(text);
                delivery.deflated_as(lane, form, |_| compressed_frame(text, binary))
            }
            _ => {
                let binary = self.framing.binary_message(text);
                delivery.framed_as(lane, form, |_| message_frame(text, binary))
            }
        }
    }
}

impl<F: Framing> DirectSocket for Wire<F> {
    fn frame<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<&'d Bytes> {
        let (lane, text) = self.framing.message(delivery, form)?;
        Some(self.shared_frame(delivery, lane, form, text))
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.stream.try_write(buf)
    }

    /// Publications that waited together go as one message, as the connection's task
    /// would send them (one frame header, the client reads them as one), unless each push
    /// is a message of its own or the connection compresses (then each goes in its frame
    /// compressed once for every connection).
    fn frame_run(&self, run: &[Arc<Delivery>], out: &mut Vec<u8>) -> usize {
        if F::MESSAGE_PER_PUSH || self.compress_from.is_some() || run.len() < 2 {
            return frame_each(self, run, out);
        }
        thread_local! {
            /// The joined text of a run, before it is framed (a fan-out thread's own).
            static JOINED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        JOINED.with_borrow_mut(|text| {
            text.clear();
            let framed = run
                .iter()
                .map_while(|d| self.framing.message(d, Form::Plain))
                .map(|(_, message)| self.encoding.codec().join(text, message))
                .count();
            if framed > 0 {
                frames::write_message(out, text, false, self.encoding.codec().binary());
            }
            framed
        })
    }

    /// A run's frames depend on the lane and on compression, not on the connection,
    /// except where each push is a message of its own (a Pusher connection leaves out its
    /// own client's events).
    fn run_kind(&self, run: &[Arc<Delivery>]) -> Option<RunKind> {
        if F::MESSAGE_PER_PUSH {
            return None;
        }
        let (lane, _) = self.framing.message(run.first()?, Form::Plain)?;
        Some(RunKind {
            lane,
            compress_from: self.compress_from,
        })
    }
}

/// One final text frame (a server's frames are never masked: RFC 6455 §5.1).
#[cfg(test)]
pub fn text_frame(payload: &[u8]) -> Bytes {
    message_frame(payload, false)
}

/// One final text (or `binary`) frame.
fn message_frame(payload: &[u8], binary: bool) -> Bytes {
    let mut frame = Vec::new();
    frames::write_frame(&mut frame, true, false, opcode_of(binary), payload);
    frame.into()
}

fn opcode_of(binary: bool) -> u8 {
    if binary {
        frames::opcode::BINARY
    } else {
        frames::opcode::TEXT
    }
}

/// One final text frame carrying `payload` compressed (RFC 7692, RSV1 set).
#[cfg(test)]
pub fn compressed_text_frame(payload: &[u8]) -> Bytes {
    compressed_frame(payload, false)
}

/// One final text (or `binary`) frame carrying `payload` compressed.
fn compressed_frame(payload: &[u8], binary: bool) -> Bytes {
    let mut frame = Vec::new();
    let compressed = deflate::compress(payload);
    frames::write_frame(&mut frame, true, true, opcode_of(binary), &compressed);
    frame.into()
}

/// The connection's socket as its task uses it: reads straight from it, writes through the
/// queue (so a direct write's tail always goes first).
#[derive(Debug)]
pub struct Io<F> {
    wire: Arc<Wire<F>>,
    queue: Arc<Queue>,
}

impl<F: Framing> Io<F> {
    /// Wraps `stream`, and opens the direct lane of `queue` to it; `encoding`: its
    /// session's codec; `compress_from`: the smallest message compressed, if the connection
    /// negotiated deflate.
    pub fn new(
        stream: TcpStream,
        queue: Arc<Queue>,
        framing: F,
        encoding: Encoding,
        compress_from: Option<usize>,
    ) -> Self {
        let wire = Arc::new(Wire {
            stream,
            framing,
            encoding,
            compress_from,
        });
        queue.attach(wire.clone());
        Self { wire, queue }
    }

    /// The socket as the hub's direct lane sees it.
    #[cfg(test)]
    pub fn wire(&self) -> &Wire<F> {
        &self.wire
    }

    /// The connection's queue, which writes go through.
    pub fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// How the connection's protocol frames what it writes.
    pub fn framing(&self) -> &F {
        &self.wire.framing
    }

    /// The codec of its session, which joins the pushes that go as one message.
    pub fn encoding(&self) -> Encoding {
        self.wire.encoding
    }

    /// The smallest message this connection's writes compress, if it negotiated deflate.
    pub fn compress_from(&self) -> Option<usize> {
        self.wire.compress_from
    }

    /// The shared frame of `delivery` (the direct lane's), when `text` is what this
    /// connection's framing writes for it: the same words, so the same bytes serve.
    pub fn shared_frame<'d>(&self, delivery: &'d Delivery, text: &[u8]) -> Option<&'d Bytes> {
        let (lane, ours) = self.wire.framing.message_for_task(delivery)?;
        let same = std::ptr::eq(ours, text) || ours == text;
        same.then(|| self.wire.shared_frame(delivery, lane, Form::Plain, ours))
    }

    /// Reads what the socket has onto the end of `buf`, with room for at least `room`
    /// more; 0 when the client closed its side. Cancel-safe: what is read is in `buf` at
    /// once.
    ///
    /// The room is made only when the socket has something to read, and an empty `buf`
    /// is given back while it waits: an idle connection holds no read buffer (0.5 KiB of
    /// its 3.2 when it held one).
    pub async fn read(&self, buf: &mut Vec<u8>, room: usize) -> io::Result<usize> {
        let stream = &self.wire.stream;
        poll_fn(|cx| loop {
            if buf.is_empty() && buf.capacity() > 0 {
                *buf = Vec::new();
            }
            ready!(stream.poll_read_ready(cx))?;
            buf.reserve(room);
            match stream.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        })
        .await
    }

    /// Writes `bytes` now, after any tail of a direct write, as far as the socket takes
    /// them: `Ok(true)` when everything is out, `Ok(false)` when a tail waits for the
    /// socket ([`Io::flush`]), `WouldBlock` when none of `bytes` could go yet ([`Io::write`]).
    pub fn write_now(&self, bytes: &[u8]) -> io::Result<bool> {
        self.queue.write_through(&*self.wire, bytes)?;
        Ok(!self.queue.has_unsent())
    }

    /// Writes `bytes` whole (after any tail of a direct write), waiting for the socket.
    pub async fn write(&self, bytes: &[u8]) -> io::Result<()> {
        self.when_writable(|wire, queue| queue.write_through(wire, bytes).map(drop))
            .await?;
        self.flush().await
    }

    /// Waits until what the socket did not take of earlier writes has gone.
    pub async fn flush(&self) -> io::Result<()> {
        self.when_writable(|wire, queue| queue.flush_unsent(wire))
            .await
    }

    /// Runs `write` until it no longer says `WouldBlock`, waiting for the socket between.
    async fn when_writable(
        &self,
        mut write: impl FnMut(&Wire<F>, &Queue) -> io::Result<()>,
    ) -> io::Result<()> {
        let (wire, queue) = (&*self.wire, &*self.queue);
        poll_fn(|cx| loop {
            match write(wire, queue) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(wire.stream.poll_write_ready(cx))?
                }
                done => return Poll::Ready(done),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compressed_frame_inflates_to_the_plain_ones_payload() {
        let payload = br#"{"push":{"channel":"chat:room","pub":{"offset":7,"data":{"text":"hello hello hello"}}}}"#;
        let plain = text_frame(payload);
        let compressed = compressed_text_frame(payload);
        assert_eq!(plain[0], 0x81);
        assert_eq!(compressed[0], 0xC1, "final, RSV1, text");
        let len = usize::from(compressed[1]);
        assert_eq!(compressed.len(), 2 + len);
        assert_eq!(deflate::inflate(&compressed[2..], 1000).unwrap(), payload);
        assert!(compressed.len() < plain.len());
    }
}
