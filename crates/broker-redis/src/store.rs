//! The command connection, the key names and the scripts: what the broker, its listener
//! and its presence store use to talk to Redis.

use std::{sync::Arc, time::Duration};

use herald_broker::{check_since, BrokerError, History, HistoryQuery, StreamPolicy};
use herald_protocol::{ChannelName, Epoch, StreamPosition};
use redis::Script;

use crate::{
    checked_epoch, decode_history_reply,
    endpoint::{Conn, Endpoint},
    millis, new_epoch, reach, rollback, scripts, unavailable,
};

/// Calls made at once on a cluster where one Redis would take a pipeline (a pipeline
/// keeps to one slot).
pub(crate) const CLUSTER_PARALLEL: usize = 64;

/// The command connection, the key names and the scripts: what the broker and its
/// listener both use to talk to Redis.
pub(crate) struct Store {
    commands: Arc<Commands>,
    pub(crate) names: Names,
    publish: Script,
    publish_once: Script,
    history: Script,
    position: Script,
    /// `(replicas, timeout ms)` a publish waits for (`WAIT`), when asked to.
    replicas: Option<(u32, u64)>,
    /// Whether both connections answer.
    pub(crate) reach: reach::Tracker,
    /// How soon a connection that stops answering is given up (see [`reach`]).
    pub(crate) unreachable_after: Duration,
    /// What this node acknowledged lately, to check after a failover (see [`rollback`]).
    pub(crate) acked: rollback::Acked,
}

/// How keys and pub/sub channels are named.
#[derive(Debug)]
pub(crate) struct Names {
    prefix: String,
    /// On a cluster, every name a script or a pipeline uses together shares a hash tag
    /// (one slot), and a channel's publications travel on a shard channel in its slot.
    pub(crate) cluster: bool,
}

impl Names {
    pub(crate) fn meta(&self, channel: &ChannelName) -> String {
        format!("{}:{{{channel}}}:m", self.prefix)
    }

    pub(crate) fn history(&self, channel: &ChannelName) -> String {
        format!("{}:{{{channel}}}:h", self.prefix)
    }

    /// A publication's idempotency key: in the channel's slot, beside its stream.
    pub(crate) fn idempotency(&self, channel: &ChannelName, key: &str) -> String {
        format!("{}:{{{channel}}}:k:{key}", self.prefix)
    }

    /// The channel's idempotency keys by when they were first seen (to forget the oldest
    /// past the cap).
    pub(crate) fn idempotency_index(&self, channel: &ChannelName) -> String {
        format!("{}:{{{channel}}}:ks", self.prefix)
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where nodes tell each other of joins and leaves.
    pub(crate) fn presence(&self) -> String {
        format!("{}:presence", self.prefix)
    }

    /// Where a channel's publications travel: on a cluster, a shard channel in the
    /// channel's slot (the publish script sends there with `SPUBLISH`, and only the primary
    /// of that slot and its replicas carry it).
    pub(crate) fn pubsub(&self, channel: &ChannelName) -> String {
        if self.cluster {
            format!("{}:{{{channel}}}:p", self.prefix)
        } else {
            format!("{}:p:{channel}", self.prefix)
        }
    }

    /// Where a node hears requests and answers from other nodes.
    pub(crate) fn node(&self, node: &str) -> String {
        format!("{}:n:{node}", self.prefix)
    }

    /// The nodes' latest figures (hash: node → JSON), and when each reported (sorted set).
    pub(crate) fn nodes(&self) -> (String, String) {
        if self.cluster {
            return (
                format!("{}:{{nodes}}", self.prefix),
                format!("{}:{{nodes}}:seen", self.prefix),
            );
        }
        (
            format!("{}:nodes", self.prefix),
            format!("{}:nodes:seen", self.prefix),
        )
    }
}

impl Store {
    /// The store for a node: `connection` to the primary `endpoint` names, as `options` say.
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        connection: Conn,
        options: &crate::RedisOptions,
    ) -> Self {
        let cluster = endpoint.is_cluster();
        let replicas = (options.replicas_ack > 0).then(|| {
            let timeout = options.replicas_timeout.as_millis() as u64;
            (options.replicas_ack, timeout.max(1))
        });
        Self {
            commands: Arc::new(Commands {
                endpoint,
                moving: Default::default(),
                moves: Default::default(),
                connection: parking_lot::Mutex::new((0, connection)),
            }),
            names: Names {
                prefix: options.prefix.clone(),
                cluster,
            },
            publish: scripts::publish(cluster),
            publish_once: scripts::publish_once(cluster),
            history: scripts::history(),
            position: scripts::position(),
            replicas,
            reach: reach::Tracker::default(),
            unreachable_after: options.unreachable_after.max(Duration::from_millis(30)),
            acked: rollback::Acked::default(),
        }
    }

    /// Whether the primary can move (found through Sentinels), and how often the command
    /// connection followed it.
    pub(crate) fn moves(&self) -> Option<u64> {
        let commands = &self.commands;
        let moves = commands.moves.load(std::sync::atomic::Ordering::Relaxed);
        commands.endpoint.moves().then_some(moves)
    }

    /// Whether the command connection answers a PING.
    pub(crate) async fn ping(&self) -> Result<(), BrokerError> {
        self.call(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .map(drop)
    }

    /// Publishes `data` on `channel` (see [`scripts::publish`]); with `once`, only if the
    /// idempotency key was not seen within its window (see [`scripts::publish_once`]). The
    /// position, and whether it is a repeat.
    pub(crate) async fn publish(
        &self,
        channel: &ChannelName,
        data: &[u8],
        policy: StreamPolicy,
        once: Option<(&str, Duration)>,
    ) -> Result<(StreamPosition, bool), BrokerError> {
        let script = if once.is_some() {
            &self.publish_once
        } else {
            &self.publish
        };
        let eval = self.publish_command(script, channel, data, policy, once);
        let (epoch, offset, repeat) = match once {
            None => {
                let (epoch, offset): (String, u64) =
                    self.run_publish(script, eval, channel).await?;
                (epoch, offset, 0)
            }
            Some(_) => {
                self.run_publish::<(String, u64, u8)>(script, eval, channel)
                    .await?
            }
        };
        let position = StreamPosition {
            offset,
            epoch: checked_epoch(channel, &epoch)?,
        };
        self.acked.note(channel, &position.epoch, offset);
        Ok((position, repeat == 1))
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
            .arg(if once.is_some() { 4 } else { 2 })
            .arg(self.names.meta(channel))
            .arg(self.names.history(channel));
        if let Some((key, _)) = once {
            eval.arg(self.names.idempotency(channel, key))
                .arg(self.names.idempotency_index(channel));
        }
        eval.arg(data)
            .arg(policy.history_size)
            .arg(millis(policy.history_ttl))
            .arg(millis(policy.meta_ttl.max(policy.history_ttl)))
            .arg(new_epoch().as_str())
            .arg(self.names.pubsub(channel));
        if let Some((_, window)) = once {
            eval.arg(millis(window))
                .arg(herald_broker::once::KEYS_PER_CHANNEL);
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
        let mut pipe = redis::pipe();
        pipe.add_command(eval);
        if let Some((replicas, timeout)) = self.replicas {
            pipe.cmd("WAIT").arg(replicas).arg(timeout);
        }
        let replies: Vec<redis::Value> = self
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
        let unread = |e: &dyn std::fmt::Display| BrokerError::Unavailable(format!("redis: {e}"));
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(redis::Value::Nil);
        let answer = T::from_redis_value(next()).map_err(|e| unread(&e))?;
        if let Some((replicas, timeout)) = self.replicas {
            let acked: u32 = redis::from_redis_value(next()).map_err(|e| unread(&e))?;
            if acked < replicas {
                return Err(BrokerError::Unavailable(format!(
                    "redis: published to {channel}, but only {acked} of the {replicas} replicas \
                     asked for (replicas_ack) had it within {timeout} ms: not acknowledged, and a \
                     failover now could lose it"
                )));
            }
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
        F: FnOnce(Conn) -> Fut,
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
    connection: parking_lot::Mutex<(u64, Conn)>,
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
            match commands.endpoint.commands(true).await {
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
        // A script, not an `HMGET`: a stream last written by another Redis process is read
        // in its new epoch (see `scripts::position`).
        let script = self.position.key(self.names.meta(channel));
        let found: Option<(String, u64)> = self
            .call(|mut c| async move { script.invoke_async(&mut c).await })
            .await?;
        match found {
            None => Ok(None),
            Some((epoch, offset)) => Ok(Some(StreamPosition {
                epoch: checked_epoch(channel, &epoch)?,
                offset,
            })),
        }
    }

    /// Keeps streams nobody published to alive while this node listens to them (see
    /// [`scripts::KEEP_EMPTY`]).
    /// On a cluster, one call per channel (a pipeline keeps to one slot), a few at a time.
    pub(crate) async fn keep_empty(&self, channels: &[ChannelName]) -> Result<(), BrokerError> {
        let keeps = channels.iter().map(|channel| {
            let mut eval = redis::cmd("EVAL");
            eval.arg(scripts::KEEP_EMPTY)
                .arg(1)
                .arg(self.names.meta(channel))
                .arg(millis(herald_broker::EMPTY_STREAM_GRACE));
            eval
        });
        if self.names.cluster {
            return self.each(keeps.collect()).await;
        }
        let mut pipe = redis::pipe();
        for keep in keeps {
            pipe.add_command(keep).ignore();
        }
        self.call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
            .await
    }

    /// Runs `commands` (answered with nothing), [`CLUSTER_PARALLEL`] at a time: where one
    /// Redis takes a pipeline, a cluster needs a call per slot.
    pub(crate) async fn each(&self, commands: Vec<redis::Cmd>) -> Result<(), BrokerError> {
        use futures_util::StreamExt;
        let calls: Vec<_> = commands
            .into_iter()
            .map(|command| {
                self.call(|mut c| async move { command.query_async::<()>(&mut c).await })
            })
            .collect();
        let results: Vec<Result<(), BrokerError>> = futures_util::stream::iter(calls)
            .buffer_unordered(CLUSTER_PARALLEL)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Gives `channel` a new epoch if it still stands below `seen` in `seen`'s epoch (see
    /// [`scripts::RENEW_EPOCH`]); the new epoch if this call gave it, `None` if the stream
    /// stands where it should or another node renewed it first.
    pub(crate) async fn renew_epoch(
        &self,
        channel: &ChannelName,
        seen: &(Epoch, u64),
    ) -> Result<Option<String>, BrokerError> {
        let meta = self.names.meta(channel);
        let (epoch, offset) = (seen.0.as_str().to_string(), seen.1);
        let new = new_epoch().as_str().to_string();
        let now: String = self
            .call(|mut c| {
                let new = new.clone();
                async move {
                    redis::cmd("EVAL")
                        .arg(scripts::RENEW_EPOCH)
                        .arg(1)
                        .arg(meta)
                        .arg(epoch)
                        .arg(offset)
                        .arg(new)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
        Ok((now == new).then_some(now))
    }

    /// The replication id of every primary this node's commands reach (one, or each
    /// shard's on a cluster), from `INFO replication`.
    pub(crate) async fn replication_ids(
        &self,
    ) -> Result<std::collections::BTreeSet<String>, BrokerError> {
        let reply: redis::Value = self
            .call(|mut c| async move {
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut ids = std::collections::BTreeSet::new();
        collect_replids(&reply, &mut ids);
        Ok(ids)
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

/// Whether `e` says the primary is not where the connection is any more: it is gone (the
/// connection cannot be made or was dropped) or it became a replica (`READONLY`).
fn moved(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.code() == Some("READONLY")
}

/// The `master_replid` lines of an `INFO replication` reply: text from one server, or a
/// map of them from a cluster's primaries.
fn collect_replids(reply: &redis::Value, ids: &mut std::collections::BTreeSet<String>) {
    match reply {
        redis::Value::BulkString(b) => {
            let text = String::from_utf8_lossy(b);
            let found = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("master_replid:"));
            ids.extend(found.map(str::to_owned));
        }
        redis::Value::VerbatimString { text, .. } | redis::Value::SimpleString(text) => {
            collect_replids(&redis::Value::BulkString(text.clone().into_bytes()), ids)
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_replids(v, ids)),
        redis::Value::Array(items) => items.iter().for_each(|v| collect_replids(v, ids)),
        _ => {}
    }
}
