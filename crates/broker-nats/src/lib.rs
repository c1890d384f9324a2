//! Herald's NATS JetStream broker: several Herald nodes share channels, history, offsets
//! and presence through NATS alone.
//!
//! - Each retention (history size and age, in practice each namespace) has a JetStream
//!   stream; a channel is a subject in it, its publications the subject's messages with
//!   their offset and epoch in headers ([`store`]). A channel's retention is the one the
//!   node's [`Policies`] give (its namespace's), for publishing and reading alike: the
//!   policy a publish carries is the same in the server, and is not used here.
//! - Publishing is a compare-and-set on the channel's newest stream sequence, so offsets
//!   are gap-free however many nodes write.
//! - Streams republish what they stored; each node listens to the channels its clients
//!   use, and catches up from history after its connection was lost ([`live`]).
//! - Idempotency keys ([`once`]), presence ([`presence`]) and the nodes' figures ([`link`])
//!   live in JetStream too.
//!
//! Durability is JetStream's: file storage, as many replicas as the stream has (one on a
//! single server). `docs/nats.md` tells what each step costs.

mod bucket;
mod connect;
mod lag;
mod link;
mod live;
mod names;
mod once;
mod presence;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

use std::{sync::Arc, time::Duration};

use async_nats::{jetstream::stream::Stream, Client};
use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    Broker, BrokerError, Engine, History, HistoryQuery, NodeLink, NodeRequests, Policies,
    PublicationSink, StreamPolicy,
};
use herald_protocol::{ChannelName, StreamPosition};

pub use connect::{NatsAuth, NatsOptions, NatsTls};
pub use herald_broker::redacted;
pub use link::NODE_REPORT_TTL;
pub use names::valid_prefix;
pub use once::LONGEST_WINDOW;
pub use presence::{NatsPresence, BEAT_EVERY, NODE_TTL};

use connect::Events;
use link::Link;
use live::Live;
use store::Store;

/// Runs every decoder of what this broker reads back from NATS (which others can write
/// to) over `input`, for the fuzzer (`herald-fuzz`, target `nats-message`): its first line
/// as a presence key, the rest as a presence value and an idempotency key's record, and
/// the first two lines as a message's offset and epoch headers with the rest as its data.
/// Never panics, whatever `input` is.
#[doc(hidden)]
pub fn decode_stored(input: &[u8]) {
    let mut lines = input.splitn(3, |b| *b == b'\n');
    let first = lines.next().unwrap_or_default();
    let second = lines.next().unwrap_or_default();
    let rest = lines.next().unwrap_or_default();
    if let Ok(key) = std::str::from_utf8(first) {
        let _ = presence::parse_key(key);
        // As async-nats hands headers over: only values it could parse from the wire.
        let value = |text: &str| text.parse::<async_nats::HeaderValue>().ok();
        let epoch = std::str::from_utf8(second).ok();
        if let (Some(offset), Some(epoch)) = (value(key), epoch.and_then(value)) {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(store::OFFSET, offset);
            headers.insert(store::EPOCH, epoch);
            let _ = (
                store::headers_offset(&headers),
                store::headers_epoch(&headers),
            );
        }
    }
    let _ = presence::decode(&Bytes::copy_from_slice(input));
    once::decode(input);
    let _ = herald_protocol::json::stored_record(rest);
}

/// How long a request to NATS may wait for its answer.
pub(crate) const COMMAND_WAIT: Duration = Duration::from_secs(5);

fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("nats: {e}"))
}

/// A stream store in NATS JetStream shared by every node that connects to it.
pub struct NatsBroker {
    store: Arc<Store>,
    lag: lag::Lag,
    keys: Stream,
    live: Arc<Live>,
    link: Link,
    presence: Arc<NatsPresence>,
    events: Arc<Events>,
    topology: &'static str,
}

impl std::fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBroker")
            .field("prefix", &self.store.names.prefix())
            .finish_non_exhaustive()
    }
}

/// A connection made and checked before the node (and its sink) exist, so that a server
/// whose NATS cannot be reached, or has no JetStream, fails at start with a clear error.
pub struct Connected {
    client: Client,
    lag: lag::Lag,
    events: Arc<Events>,
    store: Arc<Store>,
    keys: Stream,
    link: Link,
    presence: Arc<NatsPresence>,
    topology: &'static str,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected").finish_non_exhaustive()
    }
}

impl NatsBroker {
    /// Connects, checks that JetStream answers, and finds or makes what Herald keeps there.
    /// Must be called inside a Tokio runtime (presence starts its tasks).
    pub async fn connect(
        options: NatsOptions,
        policies: Policies,
    ) -> Result<Connected, BrokerError> {
        let (client, events) = connect::connect(&options).await?;
        let js = async_nats::jetstream::new(client.clone());
        let names = names::Names::new(&options.prefix);
        let replicas = options.replicas.max(1);
        let store = Arc::new(Store::open(js.clone(), names.clone(), policies, replicas).await?);
        let keys = once::open_stream(&store).await?;
        let node_id = format!("{:016x}", fastrand::u64(..));
        let link = Link::open(
            client.clone(),
            &js,
            names.clone(),
            node_id.clone(),
            replicas,
        )
        .await?;
        let every = (options.unreachable_after / 3).max(Duration::from_millis(100));
        let lag = lag::Lag::start(
            client.clone(),
            js.clone(),
            &names,
            &node_id,
            every,
            replicas,
        )
        .await?;
        let presence =
            NatsPresence::start(client.clone(), js, names, node_id, events.clone(), replicas)
                .await?;
        Ok(Connected {
            client,
            lag,
            events,
            store,
            keys,
            link,
            presence,
            topology: if options.urls.len() > 1 {
                "cluster"
            } else {
                "single"
            },
        })
    }

    /// Connects and starts the broker in one step (tests, tools).
    pub async fn start(
        options: NatsOptions,
        policies: Policies,
        sink: Arc<dyn PublicationSink>,
    ) -> Result<Arc<Self>, BrokerError> {
        Ok(Self::connect(options, policies).await?.into_broker(sink))
    }

    /// The presence store the nodes on this NATS (and prefix) share.
    pub fn presence(&self) -> herald_broker::SharedPresence {
        self.presence.clone()
    }

    /// Publications read back from history after reconnects.
    pub fn caught_up(&self) -> u64 {
        self.live
            .caught_up
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Connected {
    /// Starts the broker as a node's engine: the broker, the link between the nodes on the
    /// same NATS, and the presence they share.
    pub fn into_engine(self, sink: Arc<dyn PublicationSink>) -> Engine {
        let broker = self.into_broker(sink);
        Engine {
            link: Some(broker.clone()),
            presence: Some(broker.presence()),
            broker,
            storage: "nats",
        }
    }

    /// Starts the broker: publications of subscribed channels go to `sink`. Must be called
    /// inside a Tokio runtime.
    pub fn into_broker(self, sink: Arc<dyn PublicationSink>) -> Arc<NatsBroker> {
        let live = Live::new(
            self.client,
            self.store.clone(),
            sink,
            self.events.reconnected(),
        );
        Arc::new(NatsBroker {
            store: self.store,
            lag: self.lag,
            keys: self.keys,
            live,
            link: self.link,
            presence: self.presence,
            events: self.events,
            topology: self.topology,
        })
    }
}

impl Drop for NatsBroker {
    fn drop(&mut self) {
        self.live.stop();
    }
}

#[async_trait]
impl Broker for NatsBroker {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        _policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        self.events.reachable()?;
        let policy = self.store.policy(channel);
        match self.store.publish(channel, &data, &policy, None).await? {
            store::Published::New(position) | store::Published::Before(position) => Ok(position),
            store::Published::Gone => Err(BrokerError::Unavailable(
                "nats: a publication without a message id was taken for a repeat".into(),
            )),
        }
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        _policy: StreamPolicy,
        key: &str,
        window: Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        self.events.reachable()?;
        let policy = self.store.policy(channel);
        once::publish_once(
            &self.store,
            &self.keys,
            channel,
            &data,
            &policy,
            key,
            window,
        )
        .await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.events.reachable()?;
        self.store.history(channel, &query).await
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.events.reachable()?;
        self.store.remove(channel).await
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.events.reachable()?;
        self.live.subscribe(channel).await
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.live.unsubscribe(channel);
        Ok(())
    }

    /// The channels this node listens to: counting every subject in NATS would read them
    /// all.
    fn channel_count(&self) -> usize {
        self.live.channel_count()
    }

    fn delivery_lag(&self) -> Option<Duration> {
        Some(self.lag.lag())
    }

    fn reach(&self) -> Option<herald_broker::Reach> {
        Some(self.events.reach(self.topology))
    }
}

/// The nodes on one NATS (and prefix) are linked through it: requests travel as NATS
/// requests, live nodes report into a key-value bucket.
#[async_trait]
impl NodeLink for NatsBroker {
    fn node_id(&self) -> &str {
        &self.link.node_id
    }

    async fn ask_node(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError> {
        self.link.ask(node, request).await
    }

    fn answer_nodes_with(&self, handler: std::sync::Weak<dyn NodeRequests>) {
        self.link.answer_with(handler);
    }

    async fn report_node(&self, figures: Bytes) -> Result<(), BrokerError> {
        self.link.report(figures).await
    }

    async fn nodes(&self) -> Result<Vec<Bytes>, BrokerError> {
        self.link.nodes().await
    }
}
