//! Events for the backend: `connect`, `disconnect`, `subscribe` and `unsubscribe`, posted to
//! `hooks.events_url` at least once, in order per client.
//!
//! Sessions record events into an in-memory queue without waiting. A writer stores them in
//! batches (one publication of up to `events_batch` events) in a stream of the node's
//! broker: on disk with the durable store, in Redis with `storage = "redis"`, so neither a
//! `kill -9` nor a long outage of the backend loses what was stored. A deliverer posts the
//! stored batches in order, retrying with backoff while the backend fails, and remembers
//! the last one the backend accepted in a second stream, so a restart resumes after it.
//! An event's id is its batch's epoch and offset and its place in the batch: the same
//! whenever it is delivered again, for de-duplication.
//!
//! Bounded, and never silently: the queue holds at most `events_max_pending` events
//! (beyond, events are dropped and the next delivery says how many: `dropped`), and the
//! stream keeps `events_kept` batches for `events_ttl` (a batch trimmed before delivery is
//! counted in `lost_batches`).

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use herald_broker::{BrokerError, HistoryQuery, SharedBroker, StreamPolicy};
use herald_protocol::{ChannelName, Epoch, Since};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, Notify};

use super::{lead::Lead, Caller, HookError, Transport};
use crate::config::HooksConfig;

/// The stream of stored batches. `$` is outside the channel-name alphabet, so no client
/// and no API call can name it.
const LOG: &str = "$herald:events";
/// Most stored batches in one post.
const BATCHES_PER_POST: usize = 10;

/// The events hook's log, as nodes name it to each other (see [`super::lead`]).
pub const EVENTS_LOG: &str = "events";

/// The stream whose newest publication is the last batch the backend accepted.
const ACKED: &str = "$herald:events-acked";

/// The streams' namespace (the configuration's, which keeps their retention).
pub use crate::config::EVENTS_NAMESPACE as NAMESPACE;

/// One event, as posted (with its `id` added on delivery).
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    /// `connect`, `disconnect`, `subscribe` or `unsubscribe`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The connection.
    pub client: &'a str,
    /// Its user; absent for anonymous connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    /// Its transport.
    pub transport: Transport,
    /// For subscribe and unsubscribe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<&'a ChannelName>,
    /// For disconnect: the close code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// For disconnect: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    /// When it happened, Unix milliseconds.
    pub time: u64,
}

/// Where stored events are delivered: the events hook, or a Pusher app's webhook
/// ([`crate::fronts::pusher`]). A delivery that fails is tried again, with the same events.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Posts `delivery`; `Err` (why, for the log) when it was not accepted.
    async fn post(&self, delivery: &Delivery) -> Result<(), String>;
}

#[async_trait::async_trait]
impl Sink for Caller {
    async fn post(&self, delivery: &Delivery) -> Result<(), String> {
        match self.call::<serde::de::IgnoredAny>(delivery).await {
            Ok(_) => Ok(()),
            Err(HookError::Refused { code, message }) => Err(format!(
                "the events hook refused a batch ({code}: {message})"
            )),
            Err(HookError::Failed(why)) => Err(why),
        }
    }
}

/// Where a log keeps its events: the stream of stored batches, and the stream of the last
/// batch delivered.
#[derive(Debug, Clone)]
pub struct Streams {
    log: ChannelName,
    acked: ChannelName,
}

impl Streams {
    /// The events hook's streams.
    pub fn events() -> Self {
        Self {
            log: channel(LOG),
            acked: channel(ACKED),
        }
    }

    /// Streams named `$herald:NAME` and `$herald:NAME-acked` (`name` of channel-name
    /// characters), kept by the events' retention.
    pub fn named(name: &str) -> Self {
        Self {
            log: channel(&format!("{NAMESPACE}:{name}")),
            acked: channel(&format!("{NAMESPACE}:{name}-acked")),
        }
    }
}

/// Where sessions record events.
#[derive(Debug)]
pub struct EventLog {
    queue: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    /// Dropped since the backend was last told (it is told with the next delivery).
    dropped: Arc<AtomicU64>,
    /// Dropped since start, for the metrics.
    dropped_total: AtomicU64,
}

impl EventLog {
    /// Starts the writer and the deliverer on `broker` (inside a Tokio runtime); with
    /// several nodes on it, this one delivers while it holds `lead`.
    pub fn start(
        config: &HooksConfig,
        caller: Caller,
        (broker, lead): (SharedBroker, Option<Lead>),
    ) -> Arc<Self> {
        Self::start_to(config, Streams::events(), Arc::new(caller), (broker, lead))
    }

    /// Starts a log of `streams` delivered to `sink`, with `config`'s batching, bounds and
    /// retention (inside a Tokio runtime).
    pub fn start_to(
        config: &HooksConfig,
        streams: Streams,
        sink: Arc<dyn Sink>,
        (broker, lead): (SharedBroker, Option<Lead>),
    ) -> Arc<Self> {
        let (queue, received) = mpsc::unbounded_channel();
        let log = Arc::new(Self {
            queue,
            pending: Arc::default(),
            max_pending: config.events_max_pending,
            dropped: Arc::default(),
            dropped_total: AtomicU64::new(0),
        });
        let policy = config.events_policy();
        let stored = Arc::new(Notify::new());
        tokio::spawn(write(
            received,
            log.pending.clone(),
            config.events_batch,
            broker.clone(),
            (streams.log.clone(), policy),
            stored.clone(),
        ));
        tokio::spawn(deliver(
            (sink, lead),
            broker,
            (streams, policy),
            stored,
            log.dropped.clone(),
        ));
        log
    }

    /// Records an event; never waits.
    pub fn record(&self, event: &impl Serialize) {
        if self.pending.load(Ordering::Relaxed) >= self.max_pending {
            self.drop_one();
            return;
        }
        self.pending.fetch_add(1, Ordering::Relaxed);
        let json = serde_json::to_vec(event).expect("events serialise");
        if self.queue.send(json).is_err() {
            self.drop_one();
        }
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.dropped_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Events dropped since start.
    pub fn dropped(&self) -> u64 {
        self.dropped_total.load(Ordering::Relaxed)
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn channel(name: &str) -> ChannelName {
    ChannelName::internal(name)
}

/// Stores queued events in batches, in the order they were recorded.
async fn write(
    mut received: mpsc::UnboundedReceiver<Vec<u8>>,
    pending: Arc<AtomicUsize>,
    batch: usize,
    broker: SharedBroker,
    (log, policy): (ChannelName, StreamPolicy),
    stored: Arc<Notify>,
) {
    let mut events = Vec::with_capacity(batch);
    while received.recv_many(&mut events, batch).await > 0 {
        let mut body = b"[".to_vec();
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(e);
        }
        body.push(b']');
        let body = Bytes::from(body);
        let mut wait = Backoff::default();
        // A store that fails (a full disk, Redis away) is waited for: the events are only
        // here until it takes them.
        while let Err(e) = broker.publish(&log, body.clone(), policy).await {
            tracing::warn!(error = %e, "storing backend events failed; retrying");
            wait.sleep().await;
        }
        pending.fetch_sub(events.len(), Ordering::Relaxed);
        events.clear();
        stored.notify_one();
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Acked {
    epoch: Epoch,
    offset: u64,
}

/// What a sink is posted (the events hook: as it is).
#[derive(Debug, Serialize)]
pub struct Delivery {
    /// The events, oldest first, each with its `id`.
    pub events: Vec<Box<RawValue>>,
    /// Events dropped before they were stored (the queue was full), since the last
    /// delivery.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped: u64,
    /// Batches trimmed from the log before they were delivered (each up to
    /// `events_batch` events).
    #[serde(skip_serializing_if = "is_zero")]
    pub lost_batches: u64,
    /// The log itself was lost (a store without durability restarted): events before
    /// these may be missing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub log_restarted: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The last batch the backend accepted, as the shared stream remembers it.
async fn read_acked(broker: &SharedBroker, acked_log: &ChannelName) -> Option<Acked> {
    loop {
        match broker.history(acked_log, HistoryQuery::newest(1)).await {
            Ok(h) => {
                return h
                    .publications
                    .last()
                    .and_then(|p| serde_json::from_slice(p.data()).ok())
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the events position failed; retrying");
                Backoff::default().sleep().await;
            }
        }
    }
}

/// Posts stored batches in order, each until the backend accepts it; with a `lead`, only
/// while this node holds it.
async fn deliver(
    (sink, lead): (Arc<dyn Sink>, Option<Lead>),
    broker: SharedBroker,
    (streams, policy): (Streams, StreamPolicy),
    stored: Arc<Notify>,
    dropped: Arc<AtomicU64>,
) {
    let Streams {
        log,
        acked: acked_log,
    } = streams;
    let mut acked: Option<Acked> = None;
    // Whether `acked` is to be read from the shared stream (at start, and after another
    // node delivered for a while).
    let mut stale = true;
    let mut wait = Backoff::default();
    loop {
        if let Some(lead) = &lead {
            if !lead.held().await {
                stale = true;
                let _ = tokio::time::timeout(Duration::from_secs(1), stored.notified()).await;
                continue;
            }
        }
        if stale {
            acked = read_acked(&broker, &acked_log).await;
            stale = false;
        }
        let since = acked.as_ref().map_or(
            Since {
                offset: 0,
                epoch: None,
            },
            |a| Since {
                offset: a.offset,
                epoch: Some(a.epoch.clone()),
            },
        );
        let query = HistoryQuery {
            since: Some(since.clone()),
            limit: BATCHES_PER_POST,
            max_bytes: None,
        };
        let (epoch, batches, lost_batches, log_restarted) = match broker.history(&log, query).await
        {
            Ok(h) => (h.position.epoch, h.publications, 0, false),
            Err(BrokerError::Unrecoverable { current }) => {
                // Trimmed past the last delivered batch, or a new log: start at its oldest.
                let from_start = HistoryQuery {
                    since: Some(Since {
                        offset: 0,
                        epoch: None,
                    }),
                    limit: BATCHES_PER_POST,
                    max_bytes: None,
                };
                match broker.history(&log, from_start).await {
                    Ok(h) => {
                        let same = since.epoch.as_ref() == Some(&current.epoch);
                        let lost = match h.publications.first() {
                            Some(p) if same => p.offset.saturating_sub(since.offset + 1),
                            _ => 0,
                        };
                        (h.position.epoch, h.publications, lost, !same)
                    }
                    Err(_) => (current.epoch, Vec::new(), 0, false),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading backend events failed; retrying");
                wait.sleep().await;
                continue;
            }
        };
        let Some(last) = batches.last().map(|p| p.offset) else {
            // Nothing stored past the last delivery: wait for the writer, or (another
            // node writing to a shared Redis) a second.
            let _ = tokio::time::timeout(Duration::from_secs(1), stored.notified()).await;
            continue;
        };
        let mut events = Vec::new();
        for batch in &batches {
            match serde_json::from_slice::<Vec<serde_json::Map<String, serde_json::Value>>>(
                batch.data(),
            ) {
                Ok(stored) => events.extend(stored.into_iter().enumerate().map(|(i, mut e)| {
                    let id = format!("{}-{}-{i}", epoch.as_str(), batch.offset);
                    e.insert("id".into(), id.into());
                    serde_json::value::to_raw_value(&e).expect("events serialise")
                })),
                // Not written by Herald (a shared Redis): skipped, and said.
                Err(e) => {
                    tracing::error!(error = %e, offset = batch.offset, "a stored event batch is not Herald's; skipped")
                }
            }
        }
        let delivery = Delivery {
            events,
            dropped: dropped.swap(0, Ordering::Relaxed),
            lost_batches,
            log_restarted,
        };
        match sink.post(&delivery).await {
            Ok(()) => {
                wait = Backoff::default();
                let done = Acked {
                    epoch,
                    offset: last,
                };
                let record = Bytes::from(serde_json::to_vec(&done).expect("serialises"));
                let ack_policy = StreamPolicy {
                    history_size: 1,
                    ..policy
                };
                if let Err(e) = broker.publish(&acked_log, record, ack_policy).await {
                    // Delivered but not remembered: delivered again after a restart.
                    tracing::warn!(error = %e, "remembering the events position failed");
                }
                acked = Some(done);
            }
            Err(why) => {
                // Counted again with the next try.
                dropped.fetch_add(delivery.dropped, Ordering::Relaxed);
                tracing::warn!(%why, "delivering events failed; retrying");
                wait.sleep().await;
            }
        }
    }
}

/// Waits that double from 100 ms to 30 s.
#[derive(Debug)]
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(100))
    }
}

impl Backoff {
    async fn sleep(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(30));
    }
}
