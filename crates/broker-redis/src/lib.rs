//! Herald's Redis broker: several Herald nodes share channels through one Redis.
//!
//! Each channel's stream (epoch, newest offset, history) lives in Redis and is changed
//! only by Lua scripts ([`scripts`]), so offsets are assigned in one place whatever node
//! publishes. The publish script also sends the publication over Redis pub/sub, inside the
//! same atomic step, so every node sees a channel's publications in offset order.
//!
//! A node holds one pub/sub connection ([`listener`]) and subscribes there to the channels
//! its clients use. When that connection drops, the node reconnects, subscribes again and
//! reads from history what it missed while away, so clients see no gap that history can
//! cover; a gap it cannot cover is caught by the hub at the next publication and the
//! clients are told to resume (and then learn `recovered: false`).
//!
//! Durability is Redis's: with `appendonly yes` and `appendfsync always` a publication
//! acknowledged to the publisher survives a Redis restart.

mod endpoint;
mod listener;
mod presence;
mod reach;
mod rollback;
mod scripts;
mod slot;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
pub use endpoint::RedisSentinel;
use endpoint::{Conn, Endpoint};
pub use herald_broker::redacted;
use herald_broker::{
    Broker, BrokerError, Engine, History, HistoryQuery, NodeLink, NodeRequests, PublicationSink,
    StreamPolicy,
};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication, StreamPosition};
use listener::Listener;
pub use listener::{decode_message, decode_node_message, NodeMessage};
pub use presence::{RedisPresence, BEAT_EVERY, NODE_TTL};
pub(crate) use store::Store;
pub use tls::RedisTls;

/// Where Redis is and how Herald names its keys there.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// Put before every key and pub/sub channel, so several Herald clusters (or other
    /// programs) can share one Redis.
    pub prefix: String,
    /// TLS beyond what the URL says (`rediss://` alone uses the system's roots).
    pub tls: RedisTls,
    /// Find the primary through Redis Sentinel (the URL then gives only the credentials,
    /// database and scheme: its host and port are replaced by the primary's).
    pub sentinel: Option<RedisSentinel>,
    /// `host:port` of Redis Cluster nodes (any of them leads to the rest; the URL then
    /// gives only the credentials and scheme). Empty: not a cluster.
    pub cluster: Vec<String>,
    /// Replicas that must have a publication before it is acknowledged (`WAIT`); 0: the
    /// primary's word is enough.
    pub replicas_ack: u32,
    /// How long a publish waits for them.
    pub replicas_timeout: Duration,
    /// How soon a node that stops reaching Redis says so ([`Broker::reach`]): its command
    /// connection is pinged every third of it.
    pub unreachable_after: Duration,
}

impl RedisOptions {
    /// One Redis at `url` under `prefix`, plain: no TLS settings, no Sentinel, no waiting
    /// for replicas.
    pub fn at(url: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: prefix.into(),
            tls: RedisTls::default(),
            sentinel: None,
            cluster: Vec::new(),
            replicas_ack: 0,
            replicas_timeout: Duration::from_secs(1),
            unreachable_after: Duration::from_secs(3),
        }
    }
}

/// A stream store in Redis shared by every node that connects to it.
pub struct RedisBroker {
    store: Arc<Store>,
    listener: Arc<Listener>,
    presence: Arc<presence::RedisPresence>,
    /// The command connection's pings (see [`reach`]).
    probe: tokio::task::AbortHandle,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("prefix", &self.store.names.prefix())
            .finish_non_exhaustive()
    }
}

/// Connections opened before the node (and its sink) exist, so that a server whose Redis
/// cannot be reached fails at start with a clear error.
pub struct Connected {
    endpoint: Arc<Endpoint>,
    commands: Conn,
    options: RedisOptions,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected")
            .field("url", &self.options.url)
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// Opens the command connection and checks that Redis answers.
    pub async fn connect(options: RedisOptions) -> Result<Connected, BrokerError> {
        let endpoint = Endpoint::new(&options)?;
        let mut commands = endpoint.commands(false).await?;
        redis::cmd("PING")
            .query_async::<String>(&mut commands)
            .await
            .map_err(unavailable)?;
        Ok(Connected {
            endpoint: Arc::new(endpoint),
            commands,
            options,
        })
    }

    /// Times the pub/sub connection was re-established, and publications read back from
    /// history to cover what was missed meanwhile.
    pub fn recoveries(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.listener.reconnects.load(Relaxed),
            self.listener.caught_up.load(Relaxed),
        )
    }

    /// The presence store the nodes on this Redis (and prefix) share.
    pub fn presence(&self) -> herald_broker::SharedPresence {
        self.presence.clone()
    }

    /// Connects and starts the broker in one step (tests, tools).
    pub async fn start(
        options: RedisOptions,
        sink: Arc<dyn PublicationSink>,
    ) -> Result<Arc<Self>, BrokerError> {
        Ok(Self::connect(options).await?.into_broker(sink))
    }
}

impl Connected {
    /// Starts the broker as a node's engine: the broker, the link between the nodes on the
    /// same Redis, and the presence they share. Must be called inside a Tokio runtime.
    pub fn into_engine(self, sink: Arc<dyn PublicationSink>) -> Engine {
        let broker = self.into_broker(sink);
        Engine {
            link: Some(broker.clone()),
            presence: Some(broker.presence()),
            broker,
            storage: "redis",
        }
    }

    /// Starts the broker: publications of subscribed channels go to `sink`. Must be called
    /// inside a Tokio runtime (the pub/sub listener is a task).
    pub fn into_broker(self, sink: Arc<dyn PublicationSink>) -> Arc<RedisBroker> {
        let store = Arc::new(Store::new(
            self.endpoint.clone(),
            self.commands,
            &self.options,
        ));
        let probe = tokio::spawn(reach::probe(
            Arc::downgrade(&store),
            store.unreachable_after,
        ));
        let listener = Listener::spawn(self.endpoint, store.clone(), sink);
        let presence = presence::RedisPresence::start(store.clone(), listener.clone());
        let hears: Arc<dyn listener::PresenceListener> = presence.clone();
        listener.hear_presence(Arc::downgrade(&hears));
        Arc::new(RedisBroker {
            store,
            listener,
            presence,
            probe: probe.abort_handle(),
        })
    }
}

impl Drop for RedisBroker {
    fn drop(&mut self) {
        self.probe.abort();
        self.listener.stop();
    }
}

/// How long a node that stopped reporting stays in [`Broker::nodes`]: nodes report every
/// 2 s (the server's choice), so a node that dies leaves the list within this.
pub const NODE_REPORT_TTL: Duration = Duration::from_secs(10);

/// KEYS: figures hash, seen set. ARGV: TTL ms, then node and figures to record (or none,
/// to read only). Drops nodes not seen within the TTL; returns the figures of the rest.
const NODES_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[2], now, ARGV[2])
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
for _, node in ipairs(gone) do
  redis.call('HDEL', KEYS[1], node)
  redis.call('ZREM', KEYS[2], node)
end
if ARGV[2] then return {} end
local live = redis.call('ZRANGE', KEYS[2], 0, -1)
if #live == 0 then return {} end
return redis.call('HMGET', KEYS[1], unpack(live))
"#;

static NODES: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(NODES_SCRIPT));

/// How long a command may wait for its answer (and a connection for its handshake).
pub(crate) const COMMAND_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn command_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(COMMAND_WAIT))
        .set_response_timeout(Some(COMMAND_WAIT))
        .set_number_of_retries(2)
}

fn unavailable(e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

/// Decodes the history script's reply: the stream's position, its first readable offset,
/// and the publications whose data is valid (one that is not was not written by Herald's
/// script and is never handed to a client). Anything else is an error, never a panic: the
/// reply comes from a Redis others may write to.
pub fn decode_history_reply(
    channel: &ChannelName,
    reply: redis::Value,
) -> Result<(StreamPosition, u64, Vec<Publication>), BrokerError> {
    let (epoch, top, first, entries): (String, u64, u64, Vec<(u64, Vec<u8>)>) =
        redis::from_redis_value(reply).map_err(|e| {
            BrokerError::Unavailable(format!("redis: unexpected history reply: {e}"))
        })?;
    let position = StreamPosition {
        offset: top,
        epoch: checked_epoch(channel, &epoch)?,
    };
    let entries = entries
        .into_iter()
        .filter_map(|(offset, data)| match stored_record(&data) {
            Ok(record) => Some(Publication { offset, record }),
            Err(e) => {
                tracing::warn!(%channel, offset, error = %e, "skipping an invalid publication in redis history");
                None
            }
        })
        .collect();
    Ok((position, first, entries))
}

/// An epoch read from Redis, which others may write: checked before any client sees it.
fn checked_epoch(channel: &ChannelName, epoch: &str) -> Result<Epoch, BrokerError> {
    Epoch::checked(epoch).ok_or_else(|| {
        BrokerError::Unavailable(format!(
            "redis: the stream of {channel} has an epoch Herald did not write"
        ))
    })
}

fn new_epoch() -> Epoch {
    Epoch::random(|| fastrand::u64(..))
}

fn millis(d: Duration) -> u64 {
    // PEXPIRE refuses 0; a zero TTL means "as short as possible".
    (d.as_millis() as u64).max(1)
}

#[async_trait]
impl Broker for RedisBroker {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        let published = self.store.publish(channel, &data, policy, None).await?;
        Ok(published.0)
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        let once = Some((key, window));
        self.store.publish(channel, &data, policy, once).await
    }

    async fn history(
        &self,
        channel: &ChannelName,
        query: HistoryQuery,
    ) -> Result<History, BrokerError> {
        self.store.history(channel, &query).await
    }

    async fn remove_history(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        let names = &self.store.names;
        let (meta, history) = (names.meta(channel), names.history(channel));
        self.store
            .call(|mut c| async move {
                redis::cmd("DEL")
                    .arg(meta)
                    .arg(history)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    }

    async fn subscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.listener.subscribe(channel).await
    }

    async fn unsubscribe(&self, channel: &ChannelName) -> Result<(), BrokerError> {
        self.listener.unsubscribe(channel).await
    }

    /// The channels this node listens to: counting every stream in Redis would scan it.
    fn channel_count(&self) -> usize {
        self.listener.channel_count()
    }

    fn delivery_lag(&self) -> Option<Duration> {
        Some(self.listener.lag())
    }

    fn reach(&self) -> Option<herald_broker::Reach> {
        use std::sync::atomic::Ordering::Relaxed;
        let moves = self.store.moves();
        let cluster = self.store.names.cluster;
        Some(herald_broker::Reach {
            topology: if cluster {
                "cluster"
            } else if moves.is_some() {
                "sentinel"
            } else {
                "single"
            },
            moves: if cluster {
                self.listener.moved.load(Relaxed)
            } else {
                moves.unwrap_or(0)
            },
            resubscriptions: self.listener.reconnects.load(Relaxed),
            ..self.store.reach.reach()
        })
    }
}

/// The nodes on one Redis (and prefix) are linked through it: requests travel on pub/sub
/// (see the listener), and live nodes report into one hash.
#[async_trait]
impl NodeLink for RedisBroker {
    fn node_id(&self) -> &str {
        &self.listener.node_id
    }

    async fn ask_node(&self, node: &str, request: Bytes) -> Result<Bytes, BrokerError> {
        self.listener.ask(node, request).await
    }

    fn answer_nodes_with(&self, handler: std::sync::Weak<dyn NodeRequests>) {
        self.listener.answer_with(handler);
    }

    async fn report_node(&self, figures: Bytes) -> Result<(), BrokerError> {
        let (hash, seen) = self.store.names.nodes();
        let mut script = NODES.prepare_invoke();
        script
            .key(hash)
            .key(seen)
            .arg(NODE_REPORT_TTL.as_millis() as u64)
            .arg(&self.listener.node_id)
            .arg(figures.as_ref());
        self.store
            .call(|mut c| async move { script.invoke_async::<()>(&mut c).await })
            .await
    }

    async fn nodes(&self) -> Result<Vec<Bytes>, BrokerError> {
        let (hash, seen) = self.store.names.nodes();
        let mut script = NODES.prepare_invoke();
        script
            .key(hash)
            .key(seen)
            .arg(NODE_REPORT_TTL.as_millis() as u64);
        let figures: Vec<Option<Vec<u8>>> = self
            .store
            .call(|mut c| async move { script.invoke_async(&mut c).await })
            .await?;
        Ok(figures.into_iter().flatten().map(Bytes::from).collect())
    }
}
