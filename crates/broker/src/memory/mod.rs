//! The embedded memory broker: per-channel rings, lost on restart (new epochs after).

use std::{
    collections::{HashMap, VecDeque},
    hash::BuildHasher,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use async_trait::async_trait;
use bytes::Bytes;
use herald_protocol::{ChannelName, Epoch, Publication, StreamPosition};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::{Broker, BrokerError, History, HistoryQuery, Policies, PublicationSink, StreamPolicy};

const SHARDS: usize = 64;

type Streams = HashMap<ChannelName, Arc<Mutex<Stream>>>;

/// A single-node broker keeping streams in memory.
///
/// Publish holds only its channel's lock while it appends and hands the publication to the
/// sink, so channels never wait for each other and one channel's order is the lock's order.
pub struct MemoryBroker {
    shards: Box<[Mutex<Streams>]>,
    hasher: std::collections::hash_map::RandomState,
    sink: Arc<dyn PublicationSink>,
    policies: Policies,
    /// Streams nobody published to (see [`crate::MAX_UNWRITTEN_STREAMS`]).
    empty: AtomicUsize,
    /// Idempotency keys seen.
    once: crate::once::Once,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("channels", &self.channel_count())
            .finish()
    }
}

struct Stream {
    epoch: Epoch,
    top: u64,
    history: VecDeque<(Instant, Publication)>,
    policy: StreamPolicy,
    last_publish: Instant,
    /// This node has subscribers: keep the stream (and its epoch) however idle it is.
    subscribed: bool,
}

impl Stream {
    fn new(policy: StreamPolicy) -> Self {
        Self {
            epoch: Epoch::random(|| fastrand::u64(..)),
            top: 0,
            history: VecDeque::new(),
            policy,
            last_publish: Instant::now(),
            subscribed: false,
        }
    }

    fn position(&self) -> StreamPosition {
        StreamPosition {
            offset: self.top,
            epoch: self.epoch.clone(),
        }
    }

    fn trim(&mut self, now: Instant) {
        while self.history.len() > self.policy.history_size {
            self.history.pop_front();
        }
        while let Some((at, _)) = self.history.front() {
            if now.saturating_duration_since(*at) < self.policy.history_ttl {
                break;
            }
            self.history.pop_front();
        }
    }

    fn expired(&self, now: Instant) -> bool {
        // A stream nobody ever published to is only remembered briefly after its last reader.
        let keep = if self.top == 0 {
            crate::EMPTY_STREAM_GRACE
        } else {
            self.policy.meta_ttl
        };
        !self.subscribed
            && self.history.is_empty()
            && now.saturating_duration_since(self.last_publish) >= keep
    }

    fn read(&mut self, query: &HistoryQuery) -> Result<History, BrokerError> {
        self.trim(Instant::now());
        let position = self.position();
        let window = self.history.iter().map(|(_, p)| p);
        let publications = match &query.since {
            None => query.page(window),
            Some(since) => {
                let first = self.history.front().map_or(self.top + 1, |(_, p)| p.offset);
                crate::check_since(since, &position, first)?;
                let skip = (since.offset + 1).saturating_sub(first) as usize;
                query.page(window.skip(skip))
            }
        };
        Ok(History {
            position,
            publications,
        })
    }
}

impl MemoryBroker {
    /// A broker handing publications to `sink`. Inside a Tokio runtime it also starts a
    /// task that drops expired history every second (it stops when the broker is dropped).
    pub fn new(sink: Arc<dyn PublicationSink>) -> Arc<Self> {
        Self::with_policies(sink, crate::default_policies())
    }

    /// Like [`MemoryBroker::new`], keeping each channel by `policies` from its first use.
    pub fn with_policies(sink: Arc<dyn PublicationSink>, policies: Policies) -> Arc<Self> {
        let broker = Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            sink,
            policies,
            empty: AtomicUsize::new(0),
            once: Default::default(),
        });
        crate::spawn_sweeper(&broker, Self::sweep);
        broker
    }

    fn shard(&self, channel: &ChannelName) -> &Mutex<Streams> {
        &self.shards[(self.hasher.hash_one(channel) as usize) % SHARDS]
    }

    fn stream(&self, channel: &ChannelName) -> Arc<Mutex<Stream>> {
        self.shard(channel)
            .lock()
            .entry(channel.clone())
            .or_insert_with(|| {
                self.empty.fetch_add(1, Ordering::Relaxed);
                Arc::new(Mutex::new(Stream::new((self.policies)(channel))))
            })
            .clone()
    }

    fn existing(&self, channel: &ChannelName) -> Option<Arc<Mutex<Stream>>> {
        self.shard(channel).lock().get(channel).cloned()
    }

    /// Drops expired publications everywhere and forgets streams idle past their meta TTL.
    /// One shard at a time, so publishers never wait for the whole sweep. Beyond
    /// [`crate::MAX_UNWRITTEN_STREAMS`] streams nobody published to, those without a
    /// subscriber are forgotten before their grace is over (a poller of one is then told a
    /// new epoch at offset 0, which loses nothing).
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut excess = self
            .empty
            .load(Ordering::Relaxed)
            .saturating_sub(crate::MAX_UNWRITTEN_STREAMS);
        for shard in self.shards.iter() {
            shard.lock().retain(|_, stream| {
                let mut stream = stream.lock();
                stream.trim(now);
                let evicted = excess > 0 && stream.top == 0 && !stream.subscribed;
                let keep = !evicted && !stream.expired(now);
                if !keep && stream.top == 0 {
                    excess = excess.saturating_sub(1);
                    self.empty.fetch_sub(1, Ordering::Relaxed);
                }
                keep
            });
        }
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        let stream = self.stream(channel);
        let mut stream = stream.lock();
        let now = Instant::now();
        stream.policy = policy;
        if stream.top == 0 {
            self.empty.fetch_sub(1, Ordering::Relaxed);
        }
        stream.top += 1;
        stream.last_publish = now;
        let publication = Publication {
            offset: stream.top,
            record: data,
        };
        if policy.history_size > 0 {
            stream.history.push_back((now, publication.clone()));
        }
        stream.trim(now);
        // Still under the channel lock: this is what keeps fan-out in offset order.
        self.sink
            .on_publication(channel, &stream.epoch, &publication);
        Ok(stream.position())
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: std::time::Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        self.once
            .publish(channel, key, window, || self.publish(channel, data, policy))
            .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        // Reading makes the stream so the epoch a reader sees is the one later publications
        // carry; one nobody publishes to is forgotten `EMPTY_STREAM_GRACE` after its last read.
        let stream = self.stream(channel);
        let mut stream = stream.lock();
        if stream.top == 0 {
            stream.last_publish = Instant::now();
        }
        stream.read(&query)
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        if let Some(removed) = self.shard(channel).lock().remove(channel) {
            if removed.lock().top == 0 {
                self.empty.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        // One node: the sink already receives every publication; this only keeps the
        // stream's epoch alive while someone listens.
        self.stream(channel).lock().subscribed = true;
        Ok(())
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        if let Some(stream) = self.existing(channel) {
            let mut stream = stream.lock();
            stream.subscribed = false;
            if stream.top == 0 {
                stream.last_publish = Instant::now();
            }
        }
        Ok(())
    }

    fn channel_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests;
