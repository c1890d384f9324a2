//! The node's pub/sub connection: subscribes to the channels its clients use, hands their
//! publications to the sink in order, and after a lost connection reconnects and reads the
//! missed publications from history. It also carries requests between nodes, on one
//! pub/sub channel per node.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use futures_util::StreamExt;
use herald_broker::{BrokerError, HistoryQuery, NodeRequests, PublicationSink};
use herald_protocol::{ChannelName, Epoch, Publication, Since};
use parking_lot::Mutex;
use redis::aio::PubSubSink;
use tokio::{sync::oneshot, task::AbortHandle};

use crate::{unavailable, Store};

/// What a catch-up after a reconnect reads at most per channel; a longer gap is left to
/// the hub's gap check (clients resume from history themselves).
const CATCH_UP_LIMIT: usize = 10_000;

/// How long a subscribe waits for the pub/sub connection before it reports Redis as
/// unavailable.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// How long a node waits for another node's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// A subscribed channel and the newest publication handed to the sink.
struct Tracked {
    channel: ChannelName,
    last: Option<(Epoch, u64)>,
}

pub(crate) struct Listener {
    store: Arc<Store>,
    sink: Arc<dyn PublicationSink>,
    /// This node's id, and the pub/sub channel other nodes reach it on.
    pub(crate) node_id: String,
    node_channel: String,
    /// Requests this node sent, awaiting answers, by request number.
    asked: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    next_request: AtomicU64,
    answerer: Mutex<Option<std::sync::Weak<dyn NodeRequests>>>,
    /// By pub/sub channel name.
    channels: Mutex<HashMap<Box<str>, Tracked>>,
    /// The connection's command half; `None` while (re)connecting.
    control: tokio::sync::watch::Sender<Option<PubSubSink>>,
    /// Serialises subscribe/unsubscribe with each other and with a resubscription.
    membership: tokio::sync::Mutex<()>,
    task: Mutex<Option<AbortHandle>>,
    /// Times the pub/sub connection came back, and publications read back from history
    /// after it did: for stats and tests.
    pub(crate) reconnects: AtomicU64,
    pub(crate) caught_up: AtomicU64,
}

impl Listener {
    pub(crate) fn spawn(
        client: redis::Client,
        store: Arc<Store>,
        sink: Arc<dyn PublicationSink>,
    ) -> Arc<Self> {
        let node_id = crate::new_epoch().as_str().to_string();
        let listener = Arc::new(Self {
            node_channel: store.names.node(&node_id),
            node_id,
            store,
            sink,
            asked: Mutex::default(),
            next_request: AtomicU64::new(1),
            answerer: Mutex::default(),
            channels: Mutex::default(),
            control: tokio::sync::watch::Sender::new(None),
            membership: tokio::sync::Mutex::new(()),
            task: Mutex::default(),
            reconnects: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
        });
        let task = tokio::spawn(run(Arc::downgrade(&listener), client));
        *listener.task.lock() = Some(task.abort_handle());
        listener
    }

    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }

    pub(crate) async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        // Wait out a (re)connection in progress, but not while holding `membership`,
        // which the reconnecting task needs.
        let mut connected = self.control.subscribe();
        let wait = connected.wait_for(Option::is_some);
        if !matches!(tokio::time::timeout(CONNECT_WAIT, wait).await, Ok(Ok(_))) {
            return Err(BrokerError::Unavailable(
                "redis: no pub/sub connection".into(),
            ));
        }
        let _membership = self.membership.lock().await;
        let name = self.store.names.pubsub(channel);
        let Some(mut control) = self.control.borrow().clone() else {
            return Err(BrokerError::Unavailable(
                "redis: the pub/sub connection was lost".into(),
            ));
        };
        // Tracked before the server confirms, so no message can arrive untracked.
        self.channels.lock().insert(
            name.clone().into(),
            Tracked {
                channel: channel.clone(),
                last: None,
            },
        );
        if let Err(e) = control.subscribe(&name).await {
            self.channels.lock().remove(name.as_str());
            return Err(unavailable(e));
        }
        Ok(())
    }

    pub(crate) async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let _membership = self.membership.lock().await;
        let name = self.store.names.pubsub(channel);
        self.channels.lock().remove(name.as_str());
        let control = self.control.borrow().clone();
        match control {
            Some(mut control) => control.unsubscribe(&name).await.map_err(unavailable),
            // Not subscribed there any more once the connection is back.
            None => Ok(()),
        }
    }

    pub(crate) fn channel_count(&self) -> usize {
        self.channels.lock().len()
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

    /// A message on this node's own channel: a request to answer, or an answer.
    fn on_node_message(self: &Arc<Self>, payload: &[u8]) {
        match payload.split_first() {
            Some((b'q', rest)) => {
                let mut parts = rest.splitn(3, |b| *b == b'\n');
                let (Some(origin), Some(number), Some(request)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return;
                };
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
            Some((b'r', rest)) => {
                let mut parts = rest.splitn(2, |b| *b == b'\n');
                let (Some(number), Some(answer)) = (parts.next(), parts.next()) else {
                    return;
                };
                let number = std::str::from_utf8(number)
                    .ok()
                    .and_then(|n| n.parse().ok());
                if let Some(tx) = number.and_then(|n| self.asked.lock().remove(&n)) {
                    let _ = tx.send(Bytes::copy_from_slice(answer));
                }
            }
            _ => tracing::warn!("undecodable message on this node's channel"),
        }
    }

    /// Hands one publication to the sink unless it was handed already (a catch-up and the
    /// live connection may both carry it).
    fn deliver(&self, name: &str, epoch: &str, publication: &Publication) -> bool {
        let (channel, epoch) = {
            let mut channels = self.channels.lock();
            let Some(tracked) = channels.get_mut(name) else {
                return false; // unsubscribed meanwhile
            };
            let epoch = match &tracked.last {
                Some((last, offset)) if last.as_str() == epoch => {
                    if publication.offset <= *offset {
                        return false;
                    }
                    last.clone()
                }
                _ => Epoch::new(epoch),
            };
            tracked.last = Some((epoch.clone(), publication.offset));
            (tracked.channel.clone(), epoch)
        };
        self.sink.on_publication(&channel, &epoch, publication);
        true
    }

    /// After a reconnect: what each channel missed, from history, oldest first.
    async fn catch_up(&self) {
        let resumable: Vec<(String, ChannelName, Epoch, u64)> = self
            .channels
            .lock()
            .iter()
            .filter_map(|(name, t)| {
                let (epoch, offset) = t.last.clone()?;
                Some((name.to_string(), t.channel.clone(), epoch, offset))
            })
            .collect();
        for (name, channel, epoch, offset) in resumable {
            let query = HistoryQuery {
                since: Some(Since {
                    offset,
                    epoch: Some(epoch.clone()),
                }),
                limit: CATCH_UP_LIMIT,
                max_bytes: None,
            };
            match self.store.history(&channel, &query).await {
                Ok(history) => {
                    for p in &history.publications {
                        if self.deliver(&name, epoch.as_str(), p) {
                            self.caught_up.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%channel, error = %e, "missed publications cannot be read back; subscribers will resume from history");
                }
            }
        }
    }
}

/// Connects, subscribes to every tracked channel, catches up, then reads until the
/// connection drops; again and again while the broker lives.
async fn run(listener: std::sync::Weak<Listener>, client: redis::Client) {
    let mut backoff = Duration::from_millis(50);
    let mut first = true;
    loop {
        let pubsub = match client.get_async_pubsub().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "redis pub/sub connection failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let Some(me) = listener.upgrade() else { return };
        let (mut control, mut messages) = pubsub.split();
        let subscribed = {
            let _membership = me.membership.lock().await;
            let mut names: Vec<String> = me.channels.lock().keys().map(|k| k.to_string()).collect();
            names.push(me.node_channel.clone());
            let subscribed = control.subscribe(&names).await;
            if subscribed.is_ok() {
                me.control.send_replace(Some(control));
            }
            subscribed
        };
        if let Err(e) = subscribed {
            tracing::warn!(error = %e, "redis resubscribe failed; retrying");
            drop(me);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        }
        if !first {
            tracing::info!("redis pub/sub connection is back");
            me.catch_up().await;
            me.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        backoff = Duration::from_millis(50);
        drop(me);
        while let Some(message) = messages.next().await {
            let Some(me) = listener.upgrade() else { return };
            if message.get_channel_name() == me.node_channel {
                me.on_node_message(message.get_payload_bytes());
                continue;
            }
            match decode(message.get_payload_bytes()) {
                Some((epoch, publication)) => {
                    me.deliver(message.get_channel_name(), epoch, &publication);
                }
                None => tracing::warn!(
                    channel = message.get_channel_name(),
                    "undecodable message on a Herald pub/sub channel"
                ),
            }
        }
        let Some(me) = listener.upgrade() else { return };
        me.control.send_replace(None);
        tracing::warn!("redis pub/sub connection lost; reconnecting");
    }
}

/// `EPOCH\nOFFSET\nDATA`, as the publish script sends it.
fn decode(payload: &[u8]) -> Option<(&str, Publication)> {
    let mut parts = payload.splitn(3, |b| *b == b'\n');
    let epoch = std::str::from_utf8(parts.next()?).ok()?;
    let offset = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let data = Bytes::copy_from_slice(parts.next()?);
    Some((epoch, Publication { offset, data }))
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn decodes_what_the_script_sends() {
        let (epoch, p) = decode(b"abc\n42\n{\"a\":\"x\ny\"}").unwrap();
        assert_eq!(epoch, "abc");
        assert_eq!(p.offset, 42);
        assert_eq!(&p.data[..], b"{\"a\":\"x\ny\"}");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [&b""[..], b"abc", b"abc\nx\n{}", b"abc\n1"] {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
    }
}
