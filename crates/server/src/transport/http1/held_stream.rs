//! A stream held on its socket: its task writes through the connection's queue, and while
//! it waits with everything written the hub's direct lane writes publications to the
//! socket itself (see [`crate::queue`]).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use tokio::net::TcpStream;

use super::{chunk, client_left, write, Framing};
use crate::queue::{Delivery, DirectSocket, Form, Lane, Queue};
use crate::transport::{driver::Unwritten, stream};

/// Runs a stream its handler handed back on the socket, after the response's `head`:
/// whether the connection may carry another request, and the socket back if so.
pub(super) async fn run_stream(
    mut stream: TcpStream,
    head: Vec<u8>,
    accepted: Box<stream::Accepted>,
    Framing {
        chunked,
        keep_alive,
    }: Framing,
    write_timeout: Duration,
) -> Option<TcpStream> {
    if !write(&mut stream, &head, write_timeout).await {
        return None;
    }
    drop(head);
    let queue = accepted.queue().clone();
    // HTTP/1.0 streams are not chunked: rare, and left out of the direct lane.
    let lane = accepted.lane().filter(|_| chunked);
    let shared = Arc::new(Shared {
        stream,
        lane,
        open: AtomicBool::new(false),
    });
    if lane.is_some() {
        queue.attach(shared.clone());
    }
    let mut out = ToSocket {
        shared,
        queue,
        chunked,
    };
    // The stream detaches the lane however it ends; then the socket is this task's alone.
    let ended = stream::run(accepted, &mut out).await;
    let ToSocket { shared, queue, .. } = out;
    queue.detach();
    drop(queue);
    let mut stream = Arc::try_unwrap(shared).ok()?.stream;
    // The last chunk, then the connection may carry the next request.
    let closed = ended && (!chunked || write(&mut stream, b"0\r\n\r\n", write_timeout).await);
    (closed && keep_alive).then_some(stream)
}

/// A stream's socket, shared by its task and the hub's direct lane (see [`crate::queue`]):
/// while the stream waits with everything written, the hub writes publications to it
/// itself, framed once per publication for every stream of the same framing.
#[derive(Debug)]
struct Shared {
    stream: TcpStream,
    /// Its framing's lane, if it has one.
    lane: Option<Lane>,
    /// Whether the lane may be used now: an SSE event carries the connection's positions as
    /// its id, which is the publication's own channel position only when the connection
    /// has one channel.
    open: AtomicBool,
}

impl DirectSocket for Shared {
    fn frame<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<&'d Bytes> {
        let lane = self.lane?;
        if !self.open.load(Ordering::Acquire) {
            return None;
        }
        Some(delivery.framed_as(lane, form, |d| {
            let json = d.json_as(form);
            let mut push = Vec::with_capacity(json.len() + 64);
            if lane == Lane::SSE {
                let mut id = String::new();
                herald_protocol::cursor::write_entry(&mut id, &d.channel, &d.epoch, d.offset);
                stream::Framing::Sse.push(json, Some(&id), &mut push);
            } else {
                stream::Framing::Ndjson.push(json, None, &mut push);
            }
            chunk(&push).into()
        }))
    }

    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.try_write(buf)
    }
}

/// A stream's socket, as the stream writes to it: through its queue, which keeps the tail
/// of a direct write the socket did not take whole and sends it first.
struct ToSocket {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    chunked: bool,
}

impl stream::Out for ToSocket {
    async fn send(&mut self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Unwritten> {
        // Nothing to write still sends what a direct write left unsent: the tail of a
        // publication the socket did not take whole wakes the stream for that alone.
        if bytes.is_empty() && !self.queue.has_unsent() {
            return Ok(());
        }
        let bytes = if self.chunked && !bytes.is_empty() {
            chunk(&bytes)
        } else {
            bytes
        };
        // Most writes go out at once: no timer, and no room in the task for waiting.
        let (shared, queue) = (&*self.shared, &*self.queue);
        let taken = bytes.is_empty() || {
            match queue.write_through(shared, &bytes) {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
                Err(_) => return Err(Unwritten::Gone),
            }
        };
        if taken {
            match queue.flush_unsent(shared) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(Unwritten::Gone),
            }
        }
        let rest = (!taken).then_some(bytes);
        let waiting = Box::pin(tokio::time::timeout(
            timeout,
            wait_and_write(shared, queue, rest),
        ));
        match waiting.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Unwritten::Gone),
            Err(_) => Err(Unwritten::Slow),
        }
    }

    async fn gone(&mut self) {
        client_left(&self.shared.stream).await;
    }

    fn idle(&self, session: &crate::session::Session) {
        let open = match self.shared.lane {
            Some(Lane::SSE) => session.subscription_count() == 1,
            Some(_) => true,
            None => false,
        };
        self.shared.open.store(open, Ordering::Release);
    }
}

/// Writes `bytes` (if not taken yet) through `queue` and then its unsent tail, waiting for
/// the socket as needed.
async fn wait_and_write(
    shared: &Shared,
    queue: &Queue,
    bytes: Option<Vec<u8>>,
) -> std::io::Result<()> {
    if let Some(bytes) = bytes {
        // `write_through` takes the bytes whole once any old tail is out.
        loop {
            match queue.write_through(shared, &bytes) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    shared.stream.writable().await?
                }
                Err(e) => return Err(e),
            }
        }
    }
    send_unsent(queue, shared, &shared.stream).await
}

/// Sends what a direct write left unsent on `queue` (see [`Queue::flush_unsent`]) through
/// `socket`, waiting for `stream` to take it.
pub(crate) async fn send_unsent(
    queue: &Queue,
    socket: &dyn DirectSocket,
    stream: &TcpStream,
) -> std::io::Result<()> {
    loop {
        match queue.flush_unsent(socket) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stream.writable().await?,
            done => return done,
        }
    }
}
