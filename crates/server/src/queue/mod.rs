//! ④ The per-connection queue: what the hub has handed to one connection and its
//! transport has not written yet.
//!
//! Bounded by bytes. A push never waits: when a connection falls behind past the bound the
//! queue drops everything, marks itself overflowed and wakes its transport, which closes
//! the connection with "slow" (3003) so the client reconnects and resumes from history.
//! An idle queue holds no allocation.
//!
//! **The direct lane.** A transport whose framing is the same for every connection
//! (WebSocket) may attach its socket. While that transport is idle (not handling a command,
//! nothing queued, nothing half-written) the hub writes a publication straight to the socket
//! instead of queueing it and waking the connection's task: a paced publication then costs
//! one `send` per subscriber and no task wake-up. Everything else (a busy transport, a full
//! socket, a delivery that is not the subscription's next offset) takes the queue as before,
//! so order and the exactly-once checks are those of the transport's own path. A held
//! long-poll's lane carries one whole answer instead, made for its connection
//! ([`DirectSocket::answer`]), and closes with it.

use std::{collections::VecDeque, io, sync::Arc};

use bytes::Bytes;
use herald_protocol::ChannelName;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metrics::Wire;

mod conflation;
mod delivery;
mod position;
mod run;
pub use delivery::{Delivery, Encoding, Form, Lane, ENCODINGS, LANES};
pub use position::{Position, Step};
pub use run::{Run, RunKind};

/// A socket the hub may write publications to itself (see the module's "direct lane").
pub trait DirectSocket: Send + Sync + std::fmt::Debug {
    /// The bytes that carry `delivery` in `form` on this kind of socket, made once per
    /// delivery; `None` when this socket cannot take it directly now (it goes through the
    /// queue).
    fn frame<'d>(&self, delivery: &'d Delivery, form: Form) -> Option<&'d Bytes>;
    /// Writes what the socket takes now, without waiting.
    fn try_write(&self, buf: &[u8]) -> io::Result<usize>;
    /// For a socket that carries one answer per request (a held long-poll): the whole
    /// answer that carries `delivery`, made for this connection alone, with `position`
    /// moved to it. The lane closes once it has carried an answer. `None` (the default):
    /// the socket takes the shared [`DirectSocket::frame`], or nothing now.
    fn answer(&self, _delivery: &Delivery, _position: &Position) -> Option<Bytes> {
        None
    }
    /// Appends the bytes that carry `run` (one channel's consecutive publications, whole)
    /// in as few messages as this socket's protocol allows, and says how many of them
    /// (the first ones) it framed: 0 when it takes none directly now. By default each
    /// goes in its own [`DirectSocket::frame`].
    fn frame_run(&self, run: &[Arc<Delivery>], out: &mut Vec<u8>) -> usize {
        frame_each(self, run, out)
    }
    /// The kind of socket whose [`DirectSocket::frame_run`] of `run` is this one's, byte
    /// for byte, so that a fan-out thread frames a run once for all of them; `None` (the
    /// default): its frames are its own.
    fn run_kind(&self, run: &[Arc<Delivery>]) -> Option<RunKind> {
        let _ = run;
        None
    }
}

/// Appends each of `run`'s frames until one cannot be framed; how many were.
pub fn frame_each<S: DirectSocket + ?Sized>(
    socket: &S,
    run: &[Arc<Delivery>],
    out: &mut Vec<u8>,
) -> usize {
    run.iter()
        .map_while(|d| socket.frame(d, Form::Plain))
        .map(|frame| out.extend_from_slice(frame))
        .count()
}

/// A connection's outbound queue.
#[derive(Debug)]
pub struct Queue {
    inner: Mutex<Inner>,
    wake: Notify,
    max_bytes: usize,
}

#[derive(Debug)]
struct Inner {
    items: VecDeque<Arc<Delivery>>,
    bytes: usize,
    overflowed: bool,
    /// The transport is writing or handling a command: the hub queues, so that replies and
    /// queued publications keep their order.
    busy: bool,
    /// The socket of the direct lane, if the transport attached one.
    direct: Option<Arc<dyn DirectSocket>>,
    /// The tail of a write the socket did not take whole; it goes out before anything else,
    /// so frames never interleave.
    unsent: Bytes,
    /// Where its transport's pushes and queued bytes are counted, once the transport is
    /// known.
    wire: Option<Arc<Wire>>,
    /// What an operator ordered and the transport has not carried out yet (boxed: almost
    /// every queue never gets an order).
    orders: Option<Box<Orders>>,
    /// The publications a later one of the same conflation key replaced while they waited
    /// (channel and offset), until the session passes them (boxed: most queues never
    /// conflate).
    superseded: Option<Box<conflation::Superseded>>,
}

/// What an operator ordered a connection to do (`/api/disconnect`, `/api/unsubscribe`),
/// carried out by its session when its transport next drains the queue; and the commands
/// a stream's client sent from elsewhere (`POST /connection/send`), which its transport
/// handles one by one.
#[derive(Debug, Default)]
pub struct Orders {
    /// Close with this code and reason.
    pub end: Option<crate::error::Disconnect>,
    /// Leave these channels, telling the client with an `unsubscribe` push (code 120).
    pub unsubscribe: Vec<ChannelName>,
    /// Commands waiting for the transport, oldest first (at most [`MAX_COMMANDS`]).
    commands: VecDeque<Command>,
}

impl Orders {
    fn is_empty(&self) -> bool {
        self.end.is_none() && self.unsubscribe.is_empty() && self.commands.is_empty()
    }
}

/// A frame of commands a stream's client sent with `POST /connection/send`, handed to the
/// connection that holds its session.
#[derive(Debug)]
pub struct Command {
    /// Commands, one JSON object per line.
    pub frame: Bytes,
    /// Told Ok once handled, or the disconnect if the frame ended the session; `None` for
    /// a frame its connection received itself (WebSocket), which nobody waits for.
    pub done: Option<tokio::sync::oneshot::Sender<Result<(), crate::error::Disconnect>>>,
}

impl Command {
    /// A frame that arrived on its connection: nobody waits for how it went.
    pub fn unanswered(frame: Bytes) -> Self {
        Self { frame, done: None }
    }
}

/// Commands a connection holds before further sends are refused as busy: a client sends
/// one at a time, waiting for each answer.
pub const MAX_COMMANDS: usize = 4;

impl Queue {
    /// An empty queue that overflows past `max_bytes` of encoded publications.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                bytes: 0,
                overflowed: false,
                busy: true,
                direct: None,
                unsent: Bytes::new(),
                wire: None,
                orders: None,
                superseded: None,
            }),
            wake: Notify::new(),
            max_bytes,
        }
    }

    /// Counts what this queue hands over, and holds, in `wire` from now on (once: a
    /// session's transport is said once).
    pub fn count_in(&self, wire: Arc<Wire>) {
        let mut inner = self.inner.lock();
        debug_assert!(
            inner.wire.is_none(),
            "a queue is counted under one transport"
        );
        wire.queued(inner.bytes as i64);
        inner.wire = Some(wire);
    }

    /// Hands the connection an operator's order and wakes its transport. Publications
    /// written before it are not taken back; later ones wait behind it.
    pub fn order(&self, give: impl FnOnce(&mut Orders)) {
        give(self.inner.lock().orders.get_or_insert_with(Box::default));
        self.wake.notify_one();
    }

    /// The orders given since the last call (commands stay for [`Queue::take_command`]).
    pub fn take_orders(&self) -> Option<Orders> {
        let mut inner = self.inner.lock();
        let orders = inner.orders.as_mut()?;
        if orders.end.is_none() && orders.unsubscribe.is_empty() {
            return None;
        }
        let taken = Orders {
            end: orders.end.take(),
            unsubscribe: std::mem::take(&mut orders.unsubscribe),
            commands: VecDeque::new(),
        };
        if orders.is_empty() {
            inner.orders = None;
        }
        Some(taken)
    }

    /// Hands the connection a command frame and wakes its transport; gives it back when
    /// [`MAX_COMMANDS`] are already waiting.
    pub fn command(&self, command: Command) -> Result<(), Command> {
        let mut inner = self.inner.lock();
        let orders = inner.orders.get_or_insert_with(Box::default);
        if orders.commands.len() >= MAX_COMMANDS {
            return Err(command);
        }
        orders.commands.push_back(command);
        drop(inner);
        self.wake.notify_one();
        Ok(())
    }

    /// The oldest command waiting, if any.
    pub fn take_command(&self) -> Option<Command> {
        let mut inner = self.inner.lock();
        let orders = inner.orders.as_mut()?;
        let command = orders.commands.pop_front();
        if orders.is_empty() {
            inner.orders = None;
        }
        command
    }

    /// Opens the direct lane to `socket`; it is used once the transport is first idle.
    pub fn attach(&self, socket: Arc<dyn DirectSocket>) {
        self.inner.lock().direct = Some(socket);
    }

    /// Closes the direct lane: from now on the hub only queues.
    pub fn detach(&self) {
        let mut inner = self.inner.lock();
        inner.direct = None;
        inner.busy = true;
    }

    /// Closes the direct lane if it is still `socket`'s (a long-poll's lane may have closed
    /// itself with an answer, and its session have gone on with another connection's).
    pub fn detach_from(&self, socket: &Arc<dyn DirectSocket>) {
        let mut inner = self.inner.lock();
        if inner
            .direct
            .as_ref()
            .is_some_and(|d| std::ptr::addr_eq(Arc::as_ptr(d), Arc::as_ptr(socket)))
        {
            inner.direct = None;
            inner.busy = true;
        }
    }

    /// Wakes whoever waits for this queue: for a waiter that took a wake-up meant for the
    /// connection its session has moved on to.
    pub fn pass_wake(&self) {
        self.wake.notify_one();
    }

    /// Hands a delivery to the connection: written to the socket at once when the direct
    /// lane is open and idle and the socket takes it, queued otherwise. Never blocks.
    /// Returns false if the queue has overflowed.
    pub fn offer(&self, delivery: &Arc<Delivery>, position: &Position) -> bool {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if let Some(socket) = inner.idle_lane() {
            match position.step(delivery) {
                Step::Duplicate => return true,
                Step::Next => 'direct: {
                    if let Some(answer) = socket.answer(delivery, position) {
                        let written = socket.try_write(&answer);
                        if let Some(wire) = &inner.wire {
                            wire.written(1, delivery.size, delivery.at);
                        }
                        // One answer a request: the lane closes with it, and the session
                        // queues until its next request takes it up.
                        inner.direct = None;
                        inner.busy = true;
                        // What the socket did not take (all of it, if it took nothing or
                        // failed) is the transport's to send, which finds any error.
                        let taken = written.unwrap_or(0);
                        if taken < answer.len() {
                            inner.unsent = answer.slice(taken..);
                            drop(guard);
                            self.wake.notify_one();
                        }
                        return true;
                    }
                    let Some(frame) = socket.frame(delivery, position.form(delivery)) else {
                        break 'direct;
                    };
                    // WouldBlock or a broken socket: queue it; the transport's own write
                    // waits for the socket or finds the error.
                    if let Ok(n) = socket.try_write(frame) {
                        position.sent(delivery);
                        if let Some(wire) = &inner.wire {
                            wire.written(1, delivery.size, delivery.at);
                        }
                        if n < frame.len() {
                            inner.unsent = frame.slice(n..);
                            inner.busy = true;
                            drop(guard);
                            self.wake.notify_one();
                        }
                        return true;
                    }
                }
                Step::Unset | Step::Broken(_) => {}
            }
        }
        self.enqueue(guard, delivery.clone(), Some(position))
    }

    /// Hands the connection a run of one channel's publications at once, in order: for a
    /// fan-out thread that took several jobs of the channel together because it was
    /// behind. When the direct lane is idle, their frames go out in one `send`: one
    /// buffer, made once for every socket of a kind ([`Run`]; measured against one
    /// vectored write per run in `benches/batch_write.rs`: the copy is cheaper), so the
    /// connection's task is not woken to batch them. What the lane cannot take (a delta
    /// subscription, whose every publication has a form of its own; a duplicate or a gap;
    /// a socket that takes no frames, or nothing now) is queued, as
    /// [`Queue::offer_queued`] does. Returns false if the queue has overflowed.
    pub fn offer_run(&self, run: &mut Run, position: &Position) -> bool {
        let mut at = 0;
        'direct: {
            let mut guard = self.inner.lock();
            let inner = &mut *guard;
            let Some(socket) = inner.idle_lane() else {
                break 'direct;
            };
            let deliveries = run.deliveries();
            while let Some(first) = deliveries.get(at) {
                match position.step(first) {
                    Step::Duplicate => at += 1,
                    Step::Next => break,
                    Step::Unset | Step::Broken(_) => break 'direct,
                }
            }
            if at == deliveries.len() || position.takes_deltas() {
                break 'direct;
            }
            let follows = 1 + deliveries[at..]
                .windows(2)
                .take_while(|p| p[1].offset == p[0].offset + 1 && p[1].epoch == p[0].epoch)
                .count();
            let Some(framed) = run.frame(socket, at, at + follows) else {
                break 'direct;
            };
            let (bytes, count) = framed.bytes();
            // WouldBlock or a broken socket: queue them; the transport's own write waits
            // for the socket or finds the error.
            let Ok(n) = socket.try_write(bytes) else {
                break 'direct;
            };
            let tail = (n < bytes.len()).then(|| framed.tail(n));
            for d in &run.deliveries()[at..at + count] {
                position.sent(d);
                if let Some(wire) = &inner.wire {
                    wire.written(1, d.size, d.at);
                }
            }
            at += count;
            if let Some(tail) = tail {
                inner.unsent = tail;
                inner.busy = true;
                drop(guard);
                self.wake.notify_one();
            }
        }
        run.deliveries()[at..]
            .iter()
            .all(|d| self.offer_queued(d, Some(position)))
    }

    /// Queues a delivery for the connection's task, never writing it here: a presence
    /// push, or what a run's direct write could not take (`position`: its subscription's,
    /// for a publication). Returns false if the queue has overflowed.
    pub fn offer_queued(&self, delivery: &Arc<Delivery>, position: Option<&Position>) -> bool {
        self.enqueue(self.inner.lock(), delivery.clone(), position)
    }

    fn enqueue(
        &self,
        mut inner: parking_lot::MutexGuard<'_, Inner>,
        delivery: Arc<Delivery>,
        position: Option<&Position>,
    ) -> bool {
        if inner.overflowed {
            return false;
        }
        if position.is_some_and(Position::conflates) {
            inner.replace_older(&delivery);
        }
        inner.bytes += delivery.size;
        let (wake, accepted) = if inner.bytes > self.max_bytes {
            inner.overflowed = true;
            inner.items = VecDeque::new();
            if let Some(wire) = &inner.wire {
                wire.queued(-((inner.bytes - delivery.size) as i64));
            }
            inner.bytes = 0;
            (true, false)
        } else {
            if let Some(wire) = &inner.wire {
                wire.queued(delivery.size as i64);
            }
            inner.items.push_back(delivery);
            // One wake-up per batch: the transport drains everything queued meanwhile.
            (inner.items.len() == 1, true)
        };
        drop(inner);
        if wake {
            self.wake.notify_one();
        }
        accepted
    }

    /// Waits until something is queued (or the queue overflowed, or a direct write left
    /// a tail to send).
    pub async fn ready(&self) {
        if self.has_work() {
            return;
        }
        self.wake.notified().await;
    }

    /// Whether something is queued (or the queue overflowed, or orders or an unsent tail
    /// wait).
    pub fn has_work(&self) -> bool {
        let inner = self.inner.lock();
        inner.overflowed
            || !inner.items.is_empty()
            || !inner.unsent.is_empty()
            || inner.orders.is_some()
    }

    /// The transport starts writing or handling a command: the hub queues until
    /// [`Queue::release`].
    pub fn hold(&self) {
        self.inner.lock().busy = true;
    }

    /// The transport has written everything: the direct lane may be used again. False (and
    /// still held) when something arrived meanwhile, which the transport must write first.
    pub fn release(&self) -> bool {
        let mut inner = self.inner.lock();
        let done = inner.items.is_empty()
            && inner.unsent.is_empty()
            && !inner.overflowed
            && inner.orders.is_none();
        if done {
            inner.busy = false;
        }
        done
    }

    /// Whether a direct write left a tail that has not gone out yet.
    pub fn has_unsent(&self) -> bool {
        !self.inner.lock().unsent.is_empty()
    }

    /// The transport's own writes to a socket the lane shares: `buf` goes out after any
    /// unsent tail, and whatever of it the socket does not take becomes the new tail, so
    /// `buf` always counts as written whole and no other write can split it. `WouldBlock`
    /// (nothing of `buf` taken) while the old tail cannot go out.
    pub fn write_through(&self, socket: &dyn DirectSocket, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.inner.lock();
        inner.send_unsent(socket)?;
        let n = socket.try_write(buf)?;
        if n < buf.len() {
            inner.unsent = Bytes::copy_from_slice(&buf[n..]);
        }
        Ok(buf.len())
    }

    /// Sends the unsent tail; `WouldBlock` while the socket does not take all of it.
    pub fn flush_unsent(&self, socket: &dyn DirectSocket) -> io::Result<()> {
        self.inner.lock().send_unsent(socket)
    }

    /// Takes queued deliveries, oldest first, until about `max_bytes` are taken.
    /// `Err(Overflowed)` once the queue has overflowed.
    pub fn take(&self, max_bytes: usize, out: &mut Vec<Arc<Delivery>>) -> Result<(), Overflowed> {
        let mut inner = self.inner.lock();
        if inner.overflowed {
            return Err(Overflowed);
        }
        let (mut taken, first) = (0, out.len());
        while taken < max_bytes {
            let Some(d) = inner.items.pop_front() else {
                break;
            };
            taken += d.size;
            out.push(d);
        }
        inner.bytes -= taken;
        if let (Some(wire), Some(oldest)) = (&inner.wire, out.get(first)) {
            wire.queued(-(taken as i64));
            wire.written(out.len() - first, taken, oldest.at);
        }
        if inner.items.is_empty() && inner.items.capacity() > 64 {
            // Give back a burst's memory once it has drained.
            inner.items = VecDeque::new();
        }
        Ok(())
    }
}

impl Inner {
    /// The lane's socket, if it is open and idle: nothing queued, nothing half-sent, the
    /// transport not busy.
    fn idle_lane(&self) -> Option<&dyn DirectSocket> {
        if self.busy
            || !self.items.is_empty()
            || !self.unsent.is_empty()
            || self.overflowed
            || self.orders.is_some()
        {
            return None;
        }
        self.direct.as_deref()
    }

    fn send_unsent(&mut self, socket: &dyn DirectSocket) -> io::Result<()> {
        while !self.unsent.is_empty() {
            let n = socket.try_write(&self.unsent)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let _ = self.unsent.split_to(n);
        }
        Ok(())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        if let Some(wire) = &inner.wire {
            wire.queued(-(inner.bytes as i64));
        }
    }
}

/// The queue overflowed: the connection fell too far behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflowed;

#[cfg(test)]
mod tests;
