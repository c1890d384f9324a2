//! A held long-poll answered by the hub itself. While a long-poll on the lean path waits
//! with its session, the session is left in the socket's [`Lane`] and the lane opened on
//! its queue (see [`crate::queue`]): the first publication for it is then written by
//! whoever fans it out, as the whole HTTP answer, and the session is parked there and
//! then for the client's next request. The connection's task is not woken for it: it
//! wakes when that next request arrives (or its hold ends), finds its session gone with
//! the answer, and reads the request. A long-poll answer then costs one task wake-up where
//! it cost two, and the answers of one publication leave one after another from the
//! thread that fans it out, ahead of the requests that follow them.
//!
//! The lane and the task never both answer: the lane answers only while the queue lets
//! it (its lock held, the transport idle), and the task closes the lane under the same
//! lock before it looks at what the lane holds.

use std::{io, pin::Pin, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::{
    net::TcpStream,
    time::{Instant, Sleep},
};

use super::{compose, item, Prepared};
use crate::{
    queue::{Delivery, DirectSocket, Form, Position, Queue},
    session::ExpiryTimer,
    transport::http1::{arrival, send_unsent},
};

/// A held long-poll's socket, with its session while the lane may answer.
#[derive(Debug)]
struct Lane {
    stream: TcpStream,
    /// The long-poll, until the lane answers it or its task takes it back.
    waiting: Mutex<Option<Box<Prepared>>>,
    /// Where a session that the answer does not park (the node began shutting down) is
    /// dropped: its leave is spawned, and the hub's threads have no runtime.
    runtime: tokio::runtime::Handle,
}

impl DirectSocket for Lane {
    fn frame<'d>(&self, _delivery: &'d Delivery, _form: Form) -> Option<&'d Bytes> {
        None
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.stream.try_write(buf)
    }

    fn answer(&self, delivery: &Delivery, position: &Position) -> Option<Bytes> {
        let mut prepared = {
            let mut waiting = self.waiting.lock();
            // Shutting down: the task answers, with the `disconnect` that goes with it.
            if waiting.as_ref()?.node.shutdown.is_cancelled() {
                return None;
            }
            waiting.take()?
        };
        prepared.node.metrics.longpolls_answered_by_hub.inc();
        // The answer's cursor is the session's positions after it.
        item(
            &mut prepared.messages,
            delivery.json_as(position.form(delivery)),
        );
        position.sent(delivery);
        let (answer, unparked) = compose(*prepared);
        if let Some(session) = unparked {
            let _entered = self.runtime.enter();
            drop(session);
        }
        Some(answer.to_http1(true).into())
    }
}

/// How a long-poll held on its socket ended.
#[derive(Debug)]
pub enum HoldEnd {
    /// The hub answered it: the socket is free for the next request.
    Answered(TcpStream),
    /// Its task is to answer it now (something queued, its hold is over, a grant expired,
    /// the node shuts down, or the client sent something before the answer).
    Open(TcpStream, Box<Prepared>),
    /// The client left, or the answer could not be written: the connection is done.
    Gone,
}

/// What woke a held long-poll's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    Queue,
    Over,
    Expiry,
    /// The socket is readable: the next request once the hub has answered (or the
    /// client's end, which the read of that request finds).
    Readable,
}

/// The connection's timer for the end of its long-polls' holds, kept from one to the next.
/// Each hold moves it on, and a timer moved later costs no more than an atomic write:
/// made and dropped per hold, it took the runtime's timer lock twice a long-poll (a
/// thirtieth of a long-poll's CPU, `docs/benchmarks.md`).
pub type HoldTimer = Option<Pin<Box<Sleep>>>;

/// Holds `prepared` on `stream` with the lane open (see the module), until the hub
/// answers it or its task must. A keep-alive connection's long-poll that
/// [`Prepared::answerable_by_hub`]; `write_timeout` bounds sending what the hub's write
/// left unsent; `timer` is the connection's.
pub async fn hold_on_socket(
    mut prepared: Box<Prepared>,
    stream: TcpStream,
    write_timeout: Duration,
    timer: &mut HoldTimer,
) -> HoldEnd {
    let Some(wait) = prepared.wait else {
        return HoldEnd::Open(stream, prepared);
    };
    let until = Instant::now() + wait;
    let over = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
    over.as_mut().reset(until);
    let queue = prepared.session.queue().clone();
    let node = prepared.node.clone();
    let lane = Arc::new(Lane {
        stream,
        waiting: Mutex::new(None),
        runtime: tokio::runtime::Handle::current(),
    });
    let socket: Arc<dyn DirectSocket> = lane.clone();
    let mut expiry = ExpiryTimer::default();
    loop {
        expiry.follow(&prepared.session);
        let open = Open::new(&queue, &socket, &lane.waiting, prepared);
        let woke = if queue.release() {
            tokio::select! {
                _ = queue.ready() => Woke::Queue,
                () = over.as_mut() => Woke::Over,
                () = expiry.wait() => Woke::Expiry,
                _ = node.shutdown.cancelled() => Woke::Over,
                // As epoll tells it, with no system call: the request's own read is the
                // one `recv` the connection makes for it.
                _ = std::future::poll_fn(|cx| lane.stream.poll_read_ready(cx)) => Woke::Readable,
            }
        } else {
            // Something queued while it was not held: answered at once.
            Woke::Queue
        };
        let Some(taken) = open.close() else {
            drop(socket);
            return answered(lane, &queue, woke, write_timeout).await;
        };
        prepared = taken;
        match woke {
            // Unanswered: the client left (it is done), sent bytes before its answer (it
            // is answered at once), or the readiness was stale (the peek clears it).
            Woke::Readable => match arrival(&lane.stream).now_or_never() {
                Some(true) => return HoldEnd::Gone,
                Some(false) => {}
                None => continue,
            },
            Woke::Expiry if !prepared.expired().await => continue,
            // A wake-up left over from before the last answer finds nothing: hold on.
            Woke::Queue if !queue.has_work() => continue,
            _ => {}
        }
        drop(socket);
        return match Arc::try_unwrap(lane) {
            Ok(lane) => HoldEnd::Open(lane.stream, prepared),
            Err(_) => HoldEnd::Gone,
        };
    }
}

/// A lane open on a queue, with its long-poll waiting in it. Closed however the hold ends:
/// if the hold's future is dropped while it waits, the queue must not keep the lane, which
/// holds the session, which holds the queue.
struct Open<'a> {
    queue: &'a Queue,
    socket: &'a Arc<dyn DirectSocket>,
    waiting: &'a Mutex<Option<Box<Prepared>>>,
    closed: bool,
}

impl<'a> Open<'a> {
    /// Leaves `prepared` waiting in the lane and attaches the lane to `queue` (opened when
    /// the queue is released).
    fn new(
        queue: &'a Queue,
        socket: &'a Arc<dyn DirectSocket>,
        waiting: &'a Mutex<Option<Box<Prepared>>>,
        prepared: Box<Prepared>,
    ) -> Self {
        *waiting.lock() = Some(prepared);
        queue.attach(socket.clone());
        Self {
            queue,
            socket,
            waiting,
            closed: false,
        }
    }

    /// Closes the lane: the long-poll if the hub has not answered it, `None` if it has.
    fn close(mut self) -> Option<Box<Prepared>> {
        self.closed = true;
        self.take()
    }

    fn take(&self) -> Option<Box<Prepared>> {
        self.queue.detach_from(self.socket);
        self.waiting.lock().take()
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.closed {
            drop(self.take());
        }
    }
}

/// The hub answered the long-poll: sends what its write left unsent, and hands the socket
/// back for the next request.
async fn answered(lane: Arc<Lane>, queue: &Queue, woke: Woke, write_timeout: Duration) -> HoldEnd {
    // The session has moved on (parked, or taken up by a request on another connection):
    // a wake-up of its queue this task took may be another waiter's.
    if woke == Woke::Queue {
        queue.pass_wake();
    }
    if queue.has_unsent() {
        let flushing = send_unsent(queue, &*lane, &lane.stream);
        if !matches!(
            tokio::time::timeout(write_timeout, flushing).await,
            Ok(Ok(()))
        ) {
            return HoldEnd::Gone;
        }
    }
    match Arc::try_unwrap(lane) {
        Ok(lane) => HoldEnd::Answered(lane.stream),
        Err(_) => HoldEnd::Gone,
    }
}
