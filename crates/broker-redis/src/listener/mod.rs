//! The node's pub/sub connection: subscribes to the channels its clients use, hands their
//! publications to the sink in order, and after a lost connection reconnects and reads the
//! missed publications from history. It also carries requests between nodes, on one
//! pub/sub channel per node.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::{stream::FuturesUnordered, Future, StreamExt};
use herald_broker::{BrokerError, NodeRequests, PublicationSink};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication};
use parking_lot::Mutex;
use tokio::{
    sync::{oneshot, Notify},
    task::AbortHandle,
};

use crate::{unavailable, Store, COMMAND_WAIT};

mod catch_up;
mod connection;
mod pubsub;
use catch_up::{read_back, CatchUp, CATCH_UP_RETRY};
use connection::run;
use pubsub::{Heard, Subscriber};

/// Channels caught up at once after a reconnect.
const CATCH_UP_PARALLEL: usize = 16;

/// Live publications held, over all channels, while their channels catch up. Past it, a
/// channel's held publications are dropped and the hub's gap check takes over for it.
const HELD_BYTES: usize = 16 << 20;

/// How long a subscribe waits for the pub/sub connection before it reports Redis as
/// unavailable.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// A lag probe not back after this long was lost (with a dropped connection): another is
/// sent. Until then, its age is the lag reported.
const PROBE_LOST: Duration = Duration::from_secs(10);

/// How often streams nobody published to, but that this node listens to, are kept alive
/// (well inside [`herald_broker::EMPTY_STREAM_GRACE`]).
const KEEP_EMPTY_EVERY: Duration = Duration::from_secs(20);

/// How long a node waits for another node's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// What hears the presence channel's messages (the presence store, which sits above the
/// listener: it subscribes through it).
pub(crate) trait PresenceListener: Send + Sync {
    fn heard(&self, payload: &[u8]);
}

/// A subscribed channel and the newest publication handed to the sink.
struct Tracked {
    channel: ChannelName,
    last: Option<(Epoch, u64)>,
    /// Where the stream stood just before this node subscribed (`None`: it did not exist).
    /// A catch-up reads from here when nothing was handed over yet.
    floor: Option<(Epoch, u64)>,
    /// Live publications that arrived while the channel catches up, to hand over after
    /// what history returns; `None` when not catching up.
    held: Option<Held>,
}

#[derive(Default)]
struct Held {
    publications: Vec<(Epoch, Publication)>,
    /// Some were dropped (over [`HELD_BYTES`]): what is held no longer follows history.
    overflowed: bool,
}

/// The pub/sub connection's command half, and how to report it dead.
#[derive(Clone)]
struct Connection {
    sink: Subscriber,
    dead: Arc<Notify>,
}

impl Connection {
    /// Runs a subscribe-like call with a time limit; past it, the connection is reported
    /// dead (and replaced), since its answers can no longer be matched.
    async fn timed<F>(&self, call: F) -> Result<(), BrokerError>
    where
        F: Future<Output = redis::RedisResult<()>>,
    {
        match tokio::time::timeout(COMMAND_WAIT, call).await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => {
                self.dead.notify_one();
                Err(BrokerError::Unavailable(
                    "redis: the pub/sub connection did not answer".into(),
                ))
            }
        }
    }
}

pub(crate) struct Listener {
    store: Arc<Store>,
    sink: Arc<dyn PublicationSink>,
    /// This node's id, and the pub/sub channel other nodes reach it on.
    pub(crate) node_id: String,
    node_channel: String,
    /// Where nodes tell each other of joins and leaves, and who hears them here.
    presence_channel: String,
    presence: Mutex<Option<std::sync::Weak<dyn PresenceListener>>>,
    /// Requests this node sent, awaiting answers, by request number.
    asked: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    next_request: AtomicU64,
    answerer: Mutex<Option<std::sync::Weak<dyn NodeRequests>>>,
    /// By pub/sub channel name.
    channels: Mutex<HashMap<Box<str>, Tracked>>,
    /// The connection's command half; `None` while (re)connecting.
    control: tokio::sync::watch::Sender<Option<Connection>>,
    /// Subscribes and unsubscribes share it (they run concurrently; the hub orders those of
    /// one channel); a resubscription after a reconnect takes it alone, so it sees every
    /// channel tracked before it and none is subscribed on the old connection after it.
    /// Every Redis call made under it has a time limit.
    membership: tokio::sync::RwLock<()>,
    held_bytes: AtomicU64,
    task: Mutex<Option<AbortHandle>>,
    /// Times the pub/sub connection came back, and publications read back from history
    /// after it did: for stats and tests.
    pub(crate) reconnects: AtomicU64,
    pub(crate) caught_up: AtomicU64,
    /// On a cluster: times a node's pub/sub connection dropped or a slot moved away under a
    /// channel this node listens to (each then a reconnect).
    pub(crate) moved: AtomicU64,
    /// The lag probe out (its number and when it was published), and the last one's
    /// round trip in microseconds (see [`Listener::lag`]).
    probe: Mutex<Option<(u64, Instant)>>,
    lag_micros: AtomicU64,
}

impl Listener {
    pub(crate) fn spawn(
        endpoint: Arc<crate::Endpoint>,
        store: Arc<Store>,
        sink: Arc<dyn PublicationSink>,
    ) -> Arc<Self> {
        let node_id = crate::new_epoch().as_str().to_string();
        let listener = Arc::new(Self {
            node_channel: store.names.node(&node_id),
            presence_channel: store.names.presence(),
            presence: Mutex::default(),
            node_id,
            store,
            sink,
            asked: Mutex::default(),
            next_request: AtomicU64::new(1),
            answerer: Mutex::default(),
            channels: Mutex::default(),
            control: tokio::sync::watch::Sender::new(None),
            membership: tokio::sync::RwLock::new(()),
            held_bytes: AtomicU64::new(0),
            task: Mutex::default(),
            reconnects: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            probe: Mutex::default(),
            lag_micros: AtomicU64::new(0),
        });
        let task = tokio::spawn(run(Arc::downgrade(&listener), endpoint));
        *listener.task.lock() = Some(task.abort_handle());
        listener
    }

    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }

    /// Waits out a (re)connection in progress.
    async fn wait_connected(&self) -> Result<(), BrokerError> {
        let mut connected = self.control.subscribe();
        let wait = connected.wait_for(Option::is_some);
        let connected = matches!(tokio::time::timeout(CONNECT_WAIT, wait).await, Ok(Ok(_)));
        if !connected {
            return Err(BrokerError::Unavailable(
                "redis: no pub/sub connection".into(),
            ));
        }
        Ok(())
    }

    pub(crate) async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        // Not under `membership`, which the reconnecting task needs.
        self.wait_connected().await?;
        let floor = self.store.position(channel).await?;
        let _membership = self.membership.read().await;
        let name = self.store.names.pubsub(channel);
        let Some(connection) = self.control.borrow().clone() else {
            return Err(BrokerError::Unavailable(
                "redis: the pub/sub connection was lost".into(),
            ));
        };
        // Tracked before the server confirms, so no message can arrive untracked; and
        // untracked again if this is given up (an error, or a caller that stops waiting)
        // before it is confirmed.
        self.channels.lock().insert(
            name.clone().into(),
            Tracked {
                channel: channel.clone(),
                last: None,
                floor: floor.map(|p| (p.epoch, p.offset)),
                held: None,
            },
        );
        let mut untrack = Untrack {
            listener: self,
            name: Some(name.as_str()),
        };
        let mut sink = connection.sink.clone();
        let names = [name.clone()];
        connection.timed(sink.subscribe(&names, &[])).await?;
        untrack.name = None;
        Ok(())
    }

    pub(crate) async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let _membership = self.membership.read().await;
        let name = self.store.names.pubsub(channel);
        if let Some(t) = self.channels.lock().remove(name.as_str()) {
            self.release(t.held.as_ref());
        }
        let connection = self.control.borrow().clone();
        match connection {
            Some(connection) => {
                let mut sink = connection.sink.clone();
                connection.timed(sink.unsubscribe(&name)).await
            }
            // Not subscribed there any more once the connection is back.
            None => Ok(()),
        }
    }

    pub(crate) fn channel_count(&self) -> usize {
        self.channels.lock().len()
    }

    pub(crate) fn hear_presence(&self, presence: std::sync::Weak<dyn PresenceListener>) {
        *self.presence.lock() = Some(presence);
    }

    pub(crate) fn answer_with(&self, handler: std::sync::Weak<dyn NodeRequests>) {
        *self.answerer.lock() = Some(handler);
    }

    /// Publishes `request` on `node`'s channel and waits for its answer.
    pub(crate) async fn ask(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError> {
        let number = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.asked.lock().insert(number, tx);
        let mut message = format!("q{}\n{number}\n", self.node_id).into_bytes();
        message.extend_from_slice(&request);
        let listeners = self.store.send(self.store.names.node(node), message).await;
        let answer = match listeners {
            Err(e) => Err(e),
            Ok(0) => Err(BrokerError::Unavailable(format!(
                "node {node} is not connected"
            ))),
            Ok(_) => match tokio::time::timeout(ANSWER_WAIT, rx).await {
                Ok(Ok(answer)) => Ok(answer),
                _ => Err(BrokerError::Unavailable(format!(
                    "node {node} did not answer"
                ))),
            },
        };
        self.asked.lock().remove(&number);
        answer
    }

    /// Publishes a lag probe on this node's own channel through the command connection,
    /// the way publications travel: [`Listener::lag`] is how long it takes to come back.
    /// One at a time; a probe lost with a dropped connection is replaced after
    /// [`PROBE_LOST`].
    fn send_probe(&self) {
        let number = {
            let mut probe = self.probe.lock();
            if matches!(*probe, Some((_, sent)) if sent.elapsed() < PROBE_LOST) {
                return;
            }
            let number = self.next_request.fetch_add(1, Ordering::Relaxed);
            *probe = Some((number, Instant::now()));
            number
        };
        let (store, to) = (self.store.clone(), self.node_channel.clone());
        tokio::spawn(async move {
            if let Err(e) = store.send(to, format!("t{number}").into_bytes()).await {
                tracing::debug!(error = %e, "could not publish a lag probe");
            }
        });
    }

    fn on_probe(&self, number: Option<u64>) {
        let mut probe = self.probe.lock();
        if let Some((sent_number, sent)) = *probe {
            if Some(sent_number) == number {
                let micros = sent.elapsed().as_micros() as u64;
                self.lag_micros.store(micros, Ordering::Relaxed);
                *probe = None;
            }
        }
    }

    /// How long the last probe took from PUBLISH to this listener, or how long the one
    /// still out has been on its way, if that is longer.
    pub(crate) fn lag(&self) -> Duration {
        let last = Duration::from_micros(self.lag_micros.load(Ordering::Relaxed));
        let out = self
            .probe
            .lock()
            .map_or(Duration::ZERO, |(_, sent)| sent.elapsed());
        last.max(out)
    }

    /// A message on this node's own channel: a request to answer, an answer, or a probe.
    fn on_node_message(self: &Arc<Self>, payload: &[u8]) {
        match decode_node_message(payload) {
            Some(NodeMessage::Probe(number)) => self.on_probe(number),
            Some(NodeMessage::Request {
                origin,
                number,
                request,
            }) => {
                let Some(answerer) = self.answerer.lock().as_ref().and_then(|w| w.upgrade()) else {
                    return;
                };
                let to = self.store.names.node(&String::from_utf8_lossy(origin));
                let mut reply = b"r".to_vec();
                reply.extend_from_slice(number);
                reply.push(b'\n');
                let (request, store) = (Bytes::copy_from_slice(request), self.store.clone());
                // Answering may wait on a session; the listener must not.
                tokio::spawn(async move {
                    reply.extend_from_slice(&answerer.answer(request).await);
                    if let Err(e) = store.send(to, reply).await {
                        tracing::warn!(error = %e, "could not answer another node");
                    }
                });
            }
            Some(NodeMessage::Answer { number, answer }) => {
                if let Some(tx) = number.and_then(|n| self.asked.lock().remove(&n)) {
                    let _ = tx.send(Bytes::copy_from_slice(answer));
                }
            }
            None => tracing::warn!("undecodable message on this node's channel"),
        }
    }

    /// A publication from the live connection: handed over now, or held while its channel
    /// catches up.
    fn on_live(&self, name: &str, epoch: Epoch, publication: Publication) {
        {
            let mut channels = self.channels.lock();
            let Some(tracked) = channels.get_mut(name) else {
                return; // unsubscribed meanwhile
            };
            if let Some(held) = &mut tracked.held {
                let size = publication.record.len() as u64;
                let total = self.held_bytes.fetch_add(size, Ordering::Relaxed) + size;
                if held.overflowed || total > HELD_BYTES as u64 {
                    self.held_bytes.fetch_sub(size, Ordering::Relaxed);
                    self.release(Some(held));
                    held.publications.clear();
                    held.overflowed = true;
                } else {
                    held.publications.push((epoch, publication));
                }
                return;
            }
        }
        self.deliver(name, &epoch, &publication);
    }

    /// Hands one publication to the sink unless it was handed already (a catch-up and the
    /// live connection may both carry it).
    fn deliver(&self, name: &str, epoch: &Epoch, publication: &Publication) -> bool {
        let channel = {
            let mut channels = self.channels.lock();
            let Some(tracked) = channels.get_mut(name) else {
                return false; // unsubscribed meanwhile
            };
            if let Some((last, offset)) = &tracked.last {
                if last == epoch && publication.offset <= *offset {
                    return false;
                }
            }
            tracked.last = Some((epoch.clone(), publication.offset));
            tracked.channel.clone()
        };
        self.sink.on_publication(&channel, epoch, publication);
        true
    }

    fn release(&self, held: Option<&Held>) {
        let bytes: u64 = held
            .iter()
            .flat_map(|h| h.publications.iter())
            .map(|(_, p)| p.record.len() as u64)
            .sum();
        self.held_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Channels this node listens to that have seen no publication.
    fn empty_channels(&self) -> Vec<ChannelName> {
        self.channels
            .lock()
            .values()
            .filter(|t| t.last.is_none() && t.floor.as_ref().is_none_or(|(_, o)| *o == 0))
            .map(|t| t.channel.clone())
            .collect()
    }
}

/// Untracks a channel whose subscription was not confirmed, when dropped armed.
struct Untrack<'a> {
    listener: &'a Listener,
    name: Option<&'a str>,
}

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name {
            if let Some(t) = self.listener.channels.lock().remove(name) {
                self.listener.release(t.held.as_ref());
            }
        }
    }
}

/// A message on a node's own channel.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeMessage<'a> {
    /// `t` + a number: this node's probe, back.
    Probe(Option<u64>),
    /// `q` + origin node `\n` number `\n` request: another node asks.
    Request {
        origin: &'a [u8],
        number: &'a [u8],
        request: &'a [u8],
    },
    /// `r` + number `\n` answer: the answer to this node's request `number`.
    Answer {
        number: Option<u64>,
        answer: &'a [u8],
    },
}

/// Reads a message on a node's own channel; `None` for anything else.
pub fn decode_node_message(payload: &[u8]) -> Option<NodeMessage<'_>> {
    let number = |n: &[u8]| std::str::from_utf8(n).ok().and_then(|n| n.parse().ok());
    match payload.split_first()? {
        (b't', n) => Some(NodeMessage::Probe(number(n))),
        (b'q', rest) => {
            let mut parts = rest.splitn(3, |b| *b == b'\n');
            Some(NodeMessage::Request {
                origin: parts.next()?,
                number: parts.next()?,
                request: parts.next()?,
            })
        }
        (b'r', rest) => {
            let mut parts = rest.splitn(2, |b| *b == b'\n');
            let n = parts.next()?;
            Some(NodeMessage::Answer {
                number: number(n),
                answer: parts.next()?,
            })
        }
        _ => None,
    }
}

/// Decodes a message from a channel's pub/sub channel: `EPOCH\nOFFSET\nDATA`, as the
/// publish script sends it; `None` for anything else. Anyone who can write to the Redis can
/// publish on these channels too, so the epoch and the data are checked as a client's
/// would be before they can reach one.
pub fn decode_message(payload: &[u8]) -> Option<(Epoch, Publication)> {
    let mut parts = payload.splitn(3, |b| *b == b'\n');
    let epoch = Epoch::checked(std::str::from_utf8(parts.next()?).ok()?)?;
    let offset = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let record = stored_record(parts.next()?).ok()?;
    Some((epoch, Publication { offset, record }))
}

#[cfg(test)]
mod tests {
    use super::decode_message as decode;

    #[test]
    fn decodes_what_the_script_sends() {
        let (epoch, p) = decode(b"abc\n42\n{\"a\":\"x\\ny\"}").unwrap();
        assert_eq!(epoch.as_str(), "abc");
        assert_eq!(p.offset, 42);
        assert_eq!(p.data(), b"{\"a\":\"x\\ny\"}");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            &b""[..],
            b"abc",
            b"abc\nx\n{}",
            b"abc\n1",
            // Not JSON: would close a forever frame's script call.
            b"abc\n1\n0}});alert(document.domain)//",
            b"abc\n1\n\"\xff\"",
            b"a\"c\n1\n{}",
            b"\n1\n{}",
        ] {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
    }
}
