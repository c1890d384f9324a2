//! Presence in Redis, shared by every node: who is in which channel, counted per node so
//! that the members of a node that stops are removed by the others.
//!
//! Kept small, since a channel may have 100,000 members (about 190 bytes of Redis memory
//! per anonymous member, measured by `herald bench presence`). A member's id is its 8 bytes
//! (big-endian), so ids sort as numbers. Per channel `C` (prefix `P`), all changed only by
//! the scripts below:
//! - `P:pz:{C}` sorted set of `ID ++ INFO` (the member's public info, JSON, empty for an
//!   anonymous client), all scored 0: a page is one lexical range, in id order;
//! - `P:pc:{C}` hash: ID → its holders per node, `TAG:N,TAG:N`; its length is the member
//!   count;
//! - `P:pu:{C}` hash: ID → user, and `P:pn:{C}` hash: user → members; its length is the
//!   distinct users.
//!
//! Per node: a small number, its `TAG`, in the hash `P:ptag` (node id → tag, from the
//! counter `P:ptagseq`); `P:pnc:TAG` hash: channel → holders on that node; and `P:palive`,
//! a sorted set of nodes by their last heartbeat (Redis's clock). Every node beats every
//! [`BEAT_EVERY`]; a beat also removes the members of nodes silent for [`NODE_TTL`], so a
//! member of a node killed with `kill -9` is gone within `NODE_TTL + 2 × BEAT_EVERY`
//! (14 s): its last beat may be up to one beat before its death, and the first survivor
//! beat past the TTL up to one beat after it. That sweep reads each of the dead node's
//! channels whole, in one script: rare, but it holds Redis for a moment per 100,000
//! members.
//!
//! On a Redis Cluster every script keeps to one slot: the per-channel keys above already
//! share the channel's; how a node's holders are counted, and how a dead node's channels
//! are found, differ (see [`scripts`] and [`cluster`]).
//!
//! Joins and leaves batched by a node reach the others on the pub/sub channel
//! `P:presence`, as `NODE\nBATCH`.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use herald_broker::{BrokerError, Member, PresenceEvents, PresenceStats, PresenceStore};
use herald_protocol::ChannelName;
use parking_lot::Mutex;
use redis::Script;
use tokio::sync::{mpsc, oneshot};

use crate::{
    listener::{Listener, PresenceListener},
    Store,
};

mod cluster;
mod scripts;

/// How often a node tells Redis it is alive (and sweeps out silent nodes).
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// A node silent for this long is taken for dead, and its members removed.
pub const NODE_TTL: Duration = Duration::from_secs(10);

/// Most joins and leaves sent in one script call.
const MOST_PER_CALL: usize = 256;

/// A join or leave waiting for its script call.
struct Change {
    /// `j` or `l`.
    kind: &'static str,
    channel: ChannelName,
    id: u64,
    info: Bytes,
    /// `u` followed by the user; empty for none.
    user: Vec<u8>,
    done: oneshot::Sender<Result<bool, BrokerError>>,
}

/// Sends the node's joins and leaves, in order, in as few script calls as they allow: one
/// call at a time, holding every change that came meanwhile (up to [`MOST_PER_CALL`]).
/// When connections come by the thousand (a mass reconnect), Redis runs one script per
/// batch instead of one per join, and no join waits behind a queue of single calls until
/// it times out. A lone join goes at once.
async fn send_changes(
    store: Arc<Store>,
    on_cluster: Arc<cluster::Cluster>,
    node: String,
    mut queue: mpsc::UnboundedReceiver<Change>,
) {
    let script = scripts::changes();
    let mut batch = Vec::with_capacity(MOST_PER_CALL);
    while queue.recv_many(&mut batch, MOST_PER_CALL).await > 0 {
        if store.names.cluster {
            on_cluster.send(&store, &node, &mut batch).await;
            continue;
        }
        let mut call = script.prepare_invoke();
        call.arg(store.names.prefix()).arg(&node);
        for c in &batch {
            call.arg(c.kind)
                .arg(c.channel.as_str())
                .arg(&key(c.id)[..])
                .arg(c.info.as_ref())
                .arg(&c.user[..]);
        }
        let results: Result<Vec<i64>, BrokerError> = store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await;
        for (i, c) in batch.drain(..).enumerate() {
            let result = match &results {
                Ok(flags) => Ok(flags.get(i) == Some(&1)),
                Err(e) => Err(e.clone()),
            };
            let _ = c.done.send(result);
        }
    }
}

/// Presence kept in Redis for every node that shares it.
pub struct RedisPresence {
    store: Arc<Store>,
    listener: Arc<Listener>,
    changes: mpsc::UnboundedSender<Change>,
    beat: Script,
    /// The scripts a cluster needs instead (see [`cluster`]).
    cluster: Arc<cluster::Cluster>,
    events: Mutex<Option<Weak<dyn PresenceEvents>>>,
}

impl std::fmt::Debug for RedisPresence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPresence").finish_non_exhaustive()
    }
}

/// A member id as Redis keeps it: 8 bytes, big-endian, so that ids sort as numbers.
fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

fn id_of(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?))
}

impl RedisPresence {
    /// Presence on `store`, heard through `listener`; beats until dropped.
    pub(crate) fn start(store: Arc<Store>, listener: Arc<Listener>) -> Arc<Self> {
        let (changes, queue) = mpsc::unbounded_channel();
        let cluster = Arc::new(cluster::Cluster::new());
        let node = listener.node_id.clone();
        tokio::spawn(send_changes(store.clone(), cluster.clone(), node, queue));
        let presence = Arc::new(Self {
            store,
            listener,
            changes,
            beat: scripts::beat(),
            cluster,
            events: Mutex::default(),
        });
        let weak = Arc::downgrade(&presence);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(BEAT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(presence) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = presence.beat().await {
                    tracing::warn!(error = %e, "presence heartbeat failed");
                }
            }
        });
        presence
    }

    fn prefix(&self) -> &str {
        self.store.names.prefix()
    }

    /// Queues one join or leave for [`send_changes`] and waits for its result.
    async fn change(
        &self,
        kind: &'static str,
        channel: &ChannelName,
        id: u64,
        info: Bytes,
        user: Vec<u8>,
    ) -> Result<bool, BrokerError> {
        let (done, result) = oneshot::channel();
        let change = Change {
            kind,
            channel: channel.clone(),
            id,
            info,
            user,
            done,
        };
        if self.changes.send(change).is_err() {
            return Err(BrokerError::Unavailable("presence is stopping".into()));
        }
        result
            .await
            .unwrap_or_else(|_| Err(BrokerError::Unavailable("presence is stopping".into())))
    }

    /// Marks this node alive and removes the members of nodes that are not.
    pub async fn beat(&self) -> Result<(), BrokerError> {
        if self.store.names.cluster {
            let gone = self
                .cluster
                .beat(&self.store, &self.listener.node_id)
                .await?;
            self.expired(gone);
            return Ok(());
        }
        let mut call = self.beat.prepare_invoke();
        call.arg(self.prefix())
            .arg(&self.listener.node_id)
            .arg(NODE_TTL.as_millis() as u64);
        let gone: Vec<Vec<u8>> = self
            .store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await?;
        self.expired(gone);
        Ok(())
    }

    /// Tells the node of members that left with a dead node: `{channel, id ++ info, …}`.
    fn expired(&self, gone: Vec<Vec<u8>>) {
        let events = self.events.lock().as_ref().and_then(Weak::upgrade);
        let Some(events) = events else { return };
        for pair in gone.chunks(2) {
            let channel = std::str::from_utf8(&pair[0]).ok();
            let (Some(channel), Some(entry)) = (
                channel.and_then(|c| ChannelName::stored(c).ok()),
                pair.get(1),
            ) else {
                continue;
            };
            let Some(id) = id_of(entry) else { continue };
            let info = Bytes::copy_from_slice(&entry[8..]);
            events.expired(&channel, vec![Member { id, info }]);
        }
    }

    /// A batch another node published.
    fn heard_message(&self, payload: &[u8]) {
        let Some(end) = payload.iter().position(|b| *b == b'\n') else {
            return;
        };
        if payload[..end] == *self.listener.node_id.as_bytes() {
            return;
        }
        let events = self.events.lock().as_ref().and_then(Weak::upgrade);
        if let Some(events) = events {
            events.heard(Bytes::copy_from_slice(&payload[end + 1..]));
        }
    }
}

#[async_trait]
impl PresenceStore for RedisPresence {
    async fn join(
        &self,
        channel: &ChannelName,
        member: &Member,
        user: Option<&str>,
    ) -> Result<bool, BrokerError> {
        let user = user.map_or_else(Vec::new, |u| [b"u", u.as_bytes()].concat());
        self.change("j", channel, member.id, member.info.clone(), user)
            .await
    }

    async fn leave(&self, channel: &ChannelName, id: u64) -> Result<bool, BrokerError> {
        self.change("l", channel, id, Bytes::new(), Vec::new())
            .await
    }

    async fn stats(&self, channel: &ChannelName) -> Result<PresenceStats, BrokerError> {
        let (p, c) = (self.prefix(), channel.as_str());
        let (clients, users): (u64, u64) = self
            .store
            .call(|mut conn| async move {
                redis::pipe()
                    .cmd("HLEN")
                    .arg(format!("{p}:pc:{{{c}}}"))
                    .cmd("HLEN")
                    .arg(format!("{p}:pn:{{{c}}}"))
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(PresenceStats { clients, users })
    }

    async fn members(
        &self,
        channel: &ChannelName,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Member>, BrokerError> {
        let (p, c) = (self.prefix(), channel.as_str());
        // After every entry of member `after`: its id followed by any info (never 0xff).
        let from = match after {
            Some(id) => [&b"("[..], &key(id), &[0xff]].concat(),
            None => b"-".to_vec(),
        };
        let entries: Vec<Vec<u8>> = self
            .store
            .call(|mut conn| async move {
                redis::cmd("ZRANGEBYLEX")
                    .arg(format!("{p}:pz:{{{c}}}"))
                    .arg(from)
                    .arg("+")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(entries
            .into_iter()
            .filter_map(|mut entry| {
                let id = id_of(&entry)?;
                Some(Member {
                    id,
                    info: checked_info(entry.split_off(8))?,
                })
            })
            .collect())
    }

    async fn announce(&self, batch: Bytes) {
        let mut message = self.listener.node_id.as_bytes().to_vec();
        message.push(b'\n');
        message.extend_from_slice(&batch);
        let to = self.store.names.presence();
        if let Err(e) = self.store.send(to, message).await {
            tracing::warn!(error = %e, "could not tell other nodes of joins and leaves");
        }
    }

    fn listen(&self, events: Weak<dyn PresenceEvents>) {
        *self.events.lock() = Some(events);
    }
}

/// Info read back from a shared Redis: anyone who can write there could have put anything,
/// so it must be one JSON object on one line before it reaches a client.
fn checked_info(info: Vec<u8>) -> Option<Bytes> {
    if info.is_empty() {
        return Some(Bytes::new());
    }
    let one_object = info.first() == Some(&b'{')
        && !info.contains(&b'\n')
        && serde_json::from_slice::<&serde_json::value::RawValue>(&info).is_ok();
    one_object.then(|| Bytes::from(info))
}

impl PresenceListener for RedisPresence {
    fn heard(&self, payload: &[u8]) {
        self.heard_message(payload);
    }
}
