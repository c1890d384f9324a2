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
mod scripts;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{
    check_since, Broker, BrokerError, Engine, History, HistoryQuery, NodeLink, NodeRequests,
    PublicationSink, StreamPolicy,
};
use herald_protocol::{json::stored_record, ChannelName, Epoch, Publication, StreamPosition};
use redis::{aio::ConnectionManager, Script};

use endpoint::Endpoint;
pub use endpoint::RedisSentinel;
pub use listener::decode_message;
use listener::Listener;
pub use presence::{RedisPresence, BEAT_EVERY, NODE_TTL};
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
            .field("prefix", &self.store.names.prefix)
            .finish_non_exhaustive()
    }
}

/// The command connection, the key names and the scripts: what the broker and its
/// listener both use to talk to Redis.
pub(crate) struct Store {
    commands: Arc<Commands>,
    pub(crate) names: Names,
    publish: Script,
    publish_once: Script,
    history: Script,
    /// `(replicas, timeout ms)` a publish waits for (`WAIT`), when asked to.
    replicas: Option<(u32, u64)>,
    /// Whether both connections answer.
    pub(crate) reach: reach::Tracker,
    /// How soon a connection that stops answering is given up (see [`reach`]).
    pub(crate) unreachable_after: Duration,
}

/// Connections opened before the node (and its sink) exist, so that a server whose Redis
/// cannot be reached fails at start with a clear error.
pub struct Connected {
    endpoint: Arc<Endpoint>,
    commands: ConnectionManager,
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
        let client = endpoint.client().await?;
        let mut commands = ConnectionManager::new_with_config(client.clone(), command_config())
            .await
            .map_err(unavailable)?;
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
        }
    }

    /// Starts the broker: publications of subscribed channels go to `sink`. Must be called
    /// inside a Tokio runtime (the pub/sub listener is a task).
    pub fn into_broker(self, sink: Arc<dyn PublicationSink>) -> Arc<RedisBroker> {
        let replicas = (self.options.replicas_ack > 0).then(|| {
            let timeout = self.options.replicas_timeout.as_millis() as u64;
            (self.options.replicas_ack, timeout.max(1))
        });
        let store = Arc::new(Store {
            commands: Arc::new(Commands {
                endpoint: self.endpoint.clone(),
                moving: Default::default(),
                moves: Default::default(),
                connection: parking_lot::Mutex::new((0, self.commands)),
            }),
            names: Names {
                prefix: self.options.prefix,
            },
            publish: scripts::publish(),
            publish_once: scripts::publish_once(),
            history: scripts::history(),
            replicas,
            reach: reach::Tracker::default(),
            unreachable_after: self
                .options
                .unreachable_after
                .max(Duration::from_millis(30)),
        });
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

/// How keys and pub/sub channels are named.
#[derive(Debug)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    fn meta(&self, channel: &ChannelName) -> String {
        format!("{}:{{{channel}}}:m", self.prefix)
    }

    fn history(&self, channel: &ChannelName) -> String {
        format!("{}:{{{channel}}}:h", self.prefix)
    }

    /// A publication's idempotency key: in the channel's slot, beside its stream.
    fn idempotency(&self, channel: &ChannelName, key: &str) -> String {
        format!("{}:{{{channel}}}:k:{key}", self.prefix)
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where nodes tell each other of joins and leaves.
    pub(crate) fn presence(&self) -> String {
        format!("{}:presence", self.prefix)
    }

    pub(crate) fn pubsub(&self, channel: &ChannelName) -> String {
        format!("{}:p:{channel}", self.prefix)
    }

    /// Where a node hears requests and answers from other nodes.
    pub(crate) fn node(&self, node: &str) -> String {
        format!("{}:n:{node}", self.prefix)
    }

    /// The nodes' latest figures (hash: node → JSON), and when each reported (sorted set).
    fn nodes(&self) -> (String, String) {
        (
            format!("{}:nodes", self.prefix),
            format!("{}:nodes:seen", self.prefix),
        )
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

/// `url` without its password, for logs and errors.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// How long a command may wait for its answer (and a connection for its handshake).
pub(crate) const COMMAND_WAIT: Duration = Duration::from_secs(5);

/// Whether `e` says the primary is not where the connection is any more: it is gone (the
/// connection cannot be made or was dropped) or it became a replica (`READONLY`).
fn moved(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.code() == Some("READONLY")
}

fn command_config() -> redis::aio::ConnectionManagerConfig {
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

impl Store {
    /// Whether the command connection answers a PING.
    pub(crate) async fn ping(&self) -> Result<(), BrokerError> {
        self.call(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .map(drop)
    }

    /// The `EVALSHA` of a publish script (see [`scripts::publish`]) for `data` on
    /// `channel`; with `once`, the idempotency key and its window (see
    /// [`scripts::publish_once`]).
    fn publish_command(
        &self,
        script: &Script,
        channel: &ChannelName,
        data: &[u8],
        policy: StreamPolicy,
        once: Option<(&str, Duration)>,
    ) -> redis::Cmd {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg(script.get_hash())
            .arg(if once.is_some() { 3 } else { 2 })
            .arg(self.names.meta(channel))
            .arg(self.names.history(channel));
        if let Some((key, _)) = once {
            eval.arg(self.names.idempotency(channel, key));
        }
        eval.arg(data)
            .arg(policy.history_size)
            .arg(millis(policy.history_ttl))
            .arg(millis(policy.meta_ttl.max(policy.history_ttl)))
            .arg(new_epoch().as_str())
            .arg(self.names.pubsub(channel));
        if let Some((_, window)) = once {
            eval.arg(millis(window));
        }
        eval
    }

    /// Runs a publish script's `eval` (loading the script first if Redis lost it) and, with
    /// `replicas_ack`, a `WAIT` in the same pipeline, so both run on one connection: `WAIT`
    /// counts the replicas that have this connection's writes, and a connection made afresh
    /// in between would have none to wait for.
    async fn run_publish<T>(
        &self,
        script: &Script,
        eval: redis::Cmd,
        channel: &ChannelName,
    ) -> Result<T, BrokerError>
    where
        T: redis::FromRedisValue + Send + 'static,
    {
        let Some((replicas, timeout)) = self.replicas else {
            return self
                .call(|mut c| async move {
                    match eval.query_async(&mut c).await {
                        Err(e) if e.code() == Some("NOSCRIPT") => {
                            script.prepare_invoke().load_async(&mut c).await?;
                            eval.query_async(&mut c).await
                        }
                        done => done,
                    }
                })
                .await;
        };
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(replicas)
            .arg(timeout);
        let (answer, acked): (T, u32) = self
            .call(|mut c| async move {
                match pipe.query_async(&mut c).await {
                    Err(e) if e.code() == Some("NOSCRIPT") => {
                        script.prepare_invoke().load_async(&mut c).await?;
                        pipe.query_async(&mut c).await
                    }
                    done => done,
                }
            })
            .await?;
        if acked < replicas {
            return Err(BrokerError::Unavailable(format!(
                "redis: published to {channel}, but only {acked} of the {replicas} replicas \
                 asked for (replicas_ack) had it within {timeout} ms: not acknowledged, and a \
                 failover now could lose it"
            )));
        }
        Ok(answer)
    }

    /// Replaces the command connection now (it stopped answering).
    pub(crate) fn abandon_connection(&self, why: &'static str) {
        let generation = self.commands.connection.lock().0;
        self.commands.replace(generation, why);
    }

    /// Runs one command (or script) on the command connection. A command that times out
    /// replaces the connection: a silent network drop is never noticed otherwise.
    pub(crate) async fn call<T, F, Fut>(&self, command: F) -> Result<T, BrokerError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let commands = &self.commands;
        let (generation, connection) = commands.connection.lock().clone();
        command(connection).await.map_err(|e| {
            if e.is_timeout() {
                commands.replace(generation, "a redis command timed out");
            } else if commands.endpoint.moves() && moved(&e) {
                commands.replace(generation, "the redis primary is gone or was demoted");
            }
            unavailable(e)
        })
    }
}

/// The command connection: where it goes, and the connection itself with how many times it
/// was replaced. redis-rs reconnects by itself when a connection is reset, but not when the
/// network silently drops everything (its commands then time out for good), nor to a
/// primary that moved: [`Commands::replace`] does.
pub(crate) struct Commands {
    endpoint: Arc<Endpoint>,
    /// Whether a new connection is being looked for (a Sentinel asked).
    moving: std::sync::atomic::AtomicBool,
    /// Command connections made to the primary the Sentinels name, after the one before was
    /// lost (a failover, or the same primary back).
    moves: std::sync::atomic::AtomicU64,
    connection: parking_lot::Mutex<(u64, ConnectionManager)>,
}

impl Commands {
    /// Replaces the command connection numbered `failed` (not one that replaced it since):
    /// for a primary that can move, with one to wherever the Sentinels say it is now.
    fn replace(self: &Arc<Self>, failed: u64, why: &'static str) {
        use std::sync::atomic::Ordering;
        if self.connection.lock().0 != failed || self.moving.swap(true, Ordering::AcqRel) {
            return; // replaced already, or being replaced
        }
        let commands = self.clone();
        let replace = async move {
            let fresh = match commands.endpoint.client().await {
                Ok(client) => ConnectionManager::new_lazy_with_config(client, command_config())
                    .map_err(unavailable),
                Err(e) => Err(e),
            };
            match fresh {
                Ok(fresh) => {
                    tracing::warn!("{why}; opening a new command connection");
                    if commands.endpoint.moves() {
                        commands.moves.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut connection = commands.connection.lock();
                    if connection.0 == failed {
                        *connection = (failed + 1, fresh);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot replace the redis command connection"),
            }
            commands.moving.store(false, Ordering::Release);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(replace)),
            Err(_) => self.moving.store(false, Ordering::Release),
        }
    }
}

impl Store {
    /// Where a stream stands, without making it: `None` when it does not exist.
    pub(crate) async fn position(
        &self,
        channel: &ChannelName,
    ) -> Result<Option<StreamPosition>, BrokerError> {
        let meta = self.names.meta(channel);
        let (epoch, offset): (Option<String>, Option<u64>) = self
            .call(|mut c| async move {
                redis::cmd("HMGET")
                    .arg(meta)
                    .arg("e")
                    .arg("o")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        match epoch {
            None => Ok(None),
            Some(epoch) => Ok(Some(StreamPosition {
                epoch: checked_epoch(channel, &epoch)?,
                offset: offset.unwrap_or(0),
            })),
        }
    }

    /// Keeps streams nobody published to alive while this node listens to them (see
    /// [`scripts::KEEP_EMPTY`]).
    pub(crate) async fn keep_empty(&self, channels: &[ChannelName]) -> Result<(), BrokerError> {
        let mut pipe = redis::pipe();
        for channel in channels {
            pipe.cmd("EVAL")
                .arg(scripts::KEEP_EMPTY)
                .arg(1)
                .arg(self.names.meta(channel))
                .arg(millis(herald_broker::EMPTY_STREAM_GRACE))
                .ignore();
        }
        self.call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
            .await
    }

    /// Gives `channel` a new epoch if it still stands below `seen` in `seen`'s epoch (see
    /// [`scripts::RENEW_EPOCH`]); the epoch it has afterwards.
    pub(crate) async fn renew_epoch(
        &self,
        channel: &ChannelName,
        seen: &(Epoch, u64),
    ) -> Result<String, BrokerError> {
        let meta = self.names.meta(channel);
        let (epoch, offset) = (seen.0.as_str().to_string(), seen.1);
        self.call(|mut c| async move {
            redis::cmd("EVAL")
                .arg(scripts::RENEW_EPOCH)
                .arg(1)
                .arg(meta)
                .arg(epoch)
                .arg(offset)
                .arg(new_epoch().as_str())
                .query_async(&mut c)
                .await
        })
        .await
    }

    /// Reads history in one script call (see [`scripts::history`]).
    pub(crate) async fn history(
        &self,
        channel: &ChannelName,
        query: &HistoryQuery,
    ) -> Result<History, BrokerError> {
        let since = query
            .since
            .as_ref()
            .map_or(String::new(), |s| s.offset.to_string());
        let mut script = self.history.key(self.names.meta(channel));
        script
            .key(self.names.history(channel))
            .arg(since)
            .arg(query.limit)
            .arg(new_epoch().as_str())
            .arg(millis(herald_broker::EMPTY_STREAM_GRACE));
        let reply: redis::Value = self
            .call(|mut c| async move { script.invoke_async(&mut c).await })
            .await?;
        let (position, first, entries) = decode_history_reply(channel, reply)?;
        if let Some(since) = &query.since {
            check_since(since, &position, first)?;
        }
        let publications = query.page(entries.iter());
        Ok(History {
            position,
            publications,
        })
    }

    /// Publishes raw bytes on a pub/sub channel; returns how many listeners got them.
    pub(crate) async fn send(&self, to: String, message: Vec<u8>) -> Result<u64, BrokerError> {
        self.call(|mut c| async move {
            redis::cmd("PUBLISH")
                .arg(to)
                .arg(message)
                .query_async(&mut c)
                .await
        })
        .await
    }
}

#[async_trait]
impl Broker for RedisBroker {
    async fn publish(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
    ) -> Result<StreamPosition, BrokerError> {
        let store = &self.store;
        let eval = store.publish_command(&store.publish, channel, &data, policy, None);
        let (epoch, offset): (String, u64) =
            store.run_publish(&store.publish, eval, channel).await?;
        Ok(StreamPosition {
            offset,
            epoch: checked_epoch(channel, &epoch)?,
        })
    }

    async fn publish_once(
        &self,
        channel: &ChannelName,
        data: Bytes,
        policy: StreamPolicy,
        key: &str,
        window: Duration,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        let store = &self.store;
        let once = Some((key, window));
        let eval = store.publish_command(&store.publish_once, channel, &data, policy, once);
        let (epoch, offset, repeat): (String, u64, u8) = store
            .run_publish(&store.publish_once, eval, channel)
            .await?;
        let position = StreamPosition {
            offset,
            epoch: checked_epoch(channel, &epoch)?,
        };
        Ok((position, repeat == 1))
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
        let commands = &self.store.commands;
        Some(herald_broker::Reach {
            topology: if commands.endpoint.moves() {
                "sentinel"
            } else {
                "single"
            },
            moves: commands.moves.load(Relaxed),
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

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_credentials() {
        assert_eq!(
            super::redacted("redis://u:secret@h:1/0"),
            "redis://***@h:1/0"
        );
        assert_eq!(super::redacted("redis://h:1"), "redis://h:1");
    }
}
