//! Presence on NATS: each node writes who it holds into a key-value bucket, and every node
//! keeps the whole bucket in memory by watching it.
//!
//! A key is `{CH}.{ID}.{NODE}` (channel in hex, member id in hex, the holding node): one
//! per member per node that holds it, written when the node's first holder joins and
//! deleted when its last leaves, so a node writes nothing for a second tab of the same
//! client. Other nodes hear each change through their watch and count members and users
//! per channel as it comes, so stats are constant time and pages are ranges of an ordered
//! map, with no call to NATS. The price: every node holds every channel's members (about a
//! hundred bytes each), and another node's join reaches this one's view a moment later
//! (the watch's delivery, about a millisecond on one machine).
//!
//! Every node also beats into the figures' neighbour bucket `PREFIX_alive` (entries expire
//! after [`NODE_TTL`]); a node that holds members but stopped beating is taken for dead:
//! every survivor drops its members from its view (and tells its clients through
//! [`PresenceEvents::expired`]), and its keys are purged.

use std::{
    collections::{hash_map::RandomState, HashMap, HashSet},
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use async_nats::{
    jetstream::{self, kv},
    Client, HeaderMap,
};
use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use herald_broker::{
    user_key, BrokerError, Member, PresenceEvents, PresenceStats, PresenceStore, Roster,
};
use herald_protocol::ChannelName;
use parking_lot::Mutex;
use tokio::task::AbortHandle;

use crate::{names::Names, unavailable};

/// How often a node says it is alive (and looks for nodes that stopped).
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// A node silent for this long is taken for dead, and its members removed.
pub const NODE_TTL: Duration = Duration::from_secs(10);

/// Presence kept in NATS for every node that shares it.
pub struct NatsPresence {
    js: jetstream::Context,
    client: Client,
    names: Names,
    node: String,
    bucket: String,
    view: Arc<Mutex<View>>,
    /// Held while sending, so this node's writes reach NATS in the order they were made.
    sending: tokio::sync::Mutex<()>,
    events: Arc<Mutex<Option<Weak<dyn PresenceEvents>>>>,
    connection: Arc<crate::connect::Events>,
    tasks: Vec<AbortHandle>,
}

#[derive(Default)]
struct View {
    /// This node's members: how many of its connections hold each, and its value in the
    /// bucket (written again after a reconnect).
    own: HashMap<(ChannelName, u64), (u32, Bytes)>,
    /// Every channel's members, and the nodes that hold each.
    channels: HashMap<ChannelName, Roster<Vec<String>>>,
    /// Users' keys in the rosters (this node's own hashing: the counts are its own).
    users: RandomState,
    /// What each other node holds, as heard.
    others: HashMap<String, Other>,
    /// Keys of this node whose delete failed, to delete at the next beat.
    undeleted: Vec<String>,
}

struct Other {
    first_heard: Instant,
    /// Seen beating at least once.
    beat: bool,
    holds: HashSet<(ChannelName, u64)>,
}

impl View {
    /// `node` holds the member; true when it is new in the channel.
    fn add(
        &mut self,
        channel: &ChannelName,
        member: &Member,
        user: Option<&str>,
        node: &str,
    ) -> bool {
        let user = user_key(&self.users, user);
        let roster = self.channels.entry(channel.clone()).or_default();
        if let Some(nodes) = roster.holders(member.id) {
            if !nodes.iter().any(|n| n == node) {
                nodes.push(node.to_string());
            }
            return false;
        }
        roster.add(member, user, vec![node.to_string()])
    }

    /// `node` no longer holds member `id`; true when no node does (it left).
    fn remove(&mut self, channel: &ChannelName, id: u64, node: &str) -> bool {
        let Some(roster) = self.channels.get_mut(channel) else {
            return false;
        };
        let Some(nodes) = roster.holders(id) else {
            return false;
        };
        nodes.retain(|n| n != node);
        if !nodes.is_empty() {
            return false;
        }
        roster.remove(id);
        if roster.is_empty() {
            self.channels.remove(channel);
        }
        true
    }
}

/// A key's value: `u` + the user's length (2 bytes) + the user, or `-`; then the info.
fn encode(member: &Member, user: Option<&str>) -> Bytes {
    let mut out = BytesMut::with_capacity(3 + user.map_or(0, str::len) + member.info.len());
    match user {
        Some(user) if user.len() <= u16::MAX as usize => {
            out.put_u8(b'u');
            out.put_u16(user.len() as u16);
            out.put_slice(user.as_bytes());
        }
        _ => out.put_u8(b'-'),
    }
    out.put_slice(&member.info);
    out.freeze()
}

pub(crate) fn decode(value: &Bytes) -> Option<(Option<String>, Bytes)> {
    match value.first()? {
        b'-' => Some((None, value.slice(1..))),
        b'u' => {
            let len = u16::from_be_bytes([*value.get(1)?, *value.get(2)?]) as usize;
            let user = std::str::from_utf8(value.get(3..3 + len)?)
                .ok()?
                .to_string();
            Some((Some(user), value.slice(3 + len..)))
        }
        _ => None,
    }
}

/// The key of member `id` of `channel` as `node` holds it: `{CH}.{ID}.{NODE}`.
fn member_key(channel: &ChannelName, id: u64, node: &str) -> String {
    format!(
        "{}.{id:016x}.{node}",
        hex::encode(channel.as_str().as_bytes())
    )
}

/// The subject a key of `bucket` is written on.
fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// `{CH}.{ID}.{NODE}`, read back.
pub(crate) fn parse_key(key: &str) -> Option<(ChannelName, u64, &str)> {
    let mut parts = key.splitn(3, '.');
    let channel = String::from_utf8(hex::decode(parts.next()?).ok()?).ok()?;
    let id = u64::from_str_radix(parts.next()?, 16).ok()?;
    Some((ChannelName::stored(&channel).ok()?, id, parts.next()?))
}

impl NatsPresence {
    /// Finds or makes the buckets, loads what other nodes hold, and starts the watch and
    /// the beat. Must be called inside a Tokio runtime.
    pub(crate) async fn start(
        client: Client,
        js: jetstream::Context,
        names: Names,
        node: String,
        connection: Arc<crate::connect::Events>,
        replicas: usize,
    ) -> Result<Arc<Self>, BrokerError> {
        let bucket = names.presence_bucket();
        let members = crate::bucket::open(&js, &bucket, None, replicas).await?;
        let alive = crate::bucket::open(
            &js,
            &format!("{}_alive", names.prefix()),
            Some(NODE_TTL),
            replicas,
        )
        .await?;
        let view: Arc<Mutex<View>> = Arc::default();
        let events: Arc<Mutex<Option<Weak<dyn PresenceEvents>>>> = Arc::default();
        alive.put(&node, Bytes::new()).await.map_err(unavailable)?;
        let watch = members.watch_all().await.map_err(unavailable)?;
        let batches = client
            .subscribe(names.presence_batches())
            .await
            .map_err(unavailable)?;
        // In place at the server before start returns, or the first batches other nodes
        // announce (joins and leaves) may pass unheard behind a slow link.
        crate::connect::round_trip(&client).await?;
        let tasks = vec![
            tokio::spawn(hear_changes(watch, view.clone(), node.clone())).abort_handle(),
            tokio::spawn(hear_batches(batches, events.clone(), node.clone())).abort_handle(),
            tokio::spawn(rewrite_after_reconnects(
                (js.clone(), alive.clone()),
                bucket.clone(),
                view.clone(),
                node.clone(),
                connection.reconnected(),
            ))
            .abort_handle(),
            tokio::spawn(beat(
                alive,
                members,
                js.clone(),
                bucket.clone(),
                view.clone(),
                events.clone(),
                node.clone(),
            ))
            .abort_handle(),
        ];
        Ok(Arc::new(Self {
            js,
            client,
            names,
            node,
            bucket,
            view,
            sending: tokio::sync::Mutex::new(()),
            events,
            connection,
            tasks,
        }))
    }

    /// Sends a put (or, without a value, a delete) in this node's order, then waits for
    /// NATS to store it.
    async fn write(&self, subject: String, value: Option<Bytes>) -> Result<(), BrokerError> {
        self.connection.reachable()?;
        let ack = {
            let _turn = self.sending.lock().await;
            match value {
                Some(value) => self.js.publish(subject, value).await,
                None => {
                    let mut headers = HeaderMap::new();
                    headers.insert("KV-Operation", "DEL");
                    self.js
                        .publish_with_headers(subject, headers, Bytes::new())
                        .await
                }
            }
            .map_err(unavailable)?
        };
        tokio::time::timeout(crate::COMMAND_WAIT, ack)
            .await
            .map_err(|_| BrokerError::Unavailable("nats: presence write timed out".into()))?
            .map(|_| ())
            .map_err(unavailable)
    }
}

impl Drop for NatsPresence {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Applies other nodes' changes to the view.
async fn hear_changes(mut watch: kv::Watch, view: Arc<Mutex<View>>, node: String) {
    while let Some(entry) = watch.next().await {
        let Ok(entry) = entry else { continue };
        let Some((channel, id, holder)) = parse_key(&entry.key) else {
            continue;
        };
        if holder == node {
            continue;
        }
        let mut view = view.lock();
        match entry.operation {
            kv::Operation::Put => {
                let Some((user, info)) = decode(&entry.value) else {
                    continue;
                };
                view.add(&channel, &Member { id, info }, user.as_deref(), holder);
                view.others
                    .entry(holder.to_string())
                    .or_insert_with(|| Other {
                        first_heard: Instant::now(),
                        beat: false,
                        holds: HashSet::new(),
                    })
                    .holds
                    .insert((channel, id));
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                view.remove(&channel, id, holder);
                if let Some(other) = view.others.get_mut(holder) {
                    other.holds.remove(&(channel, id));
                }
            }
        }
    }
}

/// Writes every member this node holds again each time its connection is back: a node cut
/// off longer than [`NODE_TTL`] was taken for dead, and its keys purged, by the others.
async fn rewrite_after_reconnects(
    (js, alive): (jetstream::Context, kv::Store),
    bucket: String,
    view: Arc<Mutex<View>>,
    node: String,
    mut reconnected: tokio::sync::watch::Receiver<u64>,
) {
    while reconnected.changed().await.is_ok() {
        // Alive first: a survivor that sees the keys again must not take them for a dead
        // node's at its next beat.
        if let Err(e) = alive.put(&node, Bytes::new()).await {
            tracing::info!(error = %e, "nats: presence beat failed after a reconnect");
        }
        let held: Vec<(String, Bytes)> = view
            .lock()
            .own
            .iter()
            .map(|((channel, id), (_, value))| {
                (
                    kv_subject(&bucket, &member_key(channel, *id, &node)),
                    value.clone(),
                )
            })
            .collect();
        for (key, value) in held {
            if let Err(e) = js.publish(key, value).await {
                tracing::info!(error = %e, "nats: could not write a member again after a reconnect");
            }
        }
    }
}

async fn hear_batches(
    mut batches: async_nats::Subscriber,
    events: Arc<Mutex<Option<Weak<dyn PresenceEvents>>>>,
    node: String,
) {
    while let Some(message) = batches.next().await {
        let payload = message.payload;
        let Some(split) = payload.iter().position(|b| *b == b'\n') else {
            continue;
        };
        if payload[..split] == *node.as_bytes() {
            continue;
        }
        let listener = events.lock().as_ref().and_then(Weak::upgrade);
        if let Some(listener) = listener {
            listener.heard(payload.slice(split + 1..));
        }
    }
}

/// Says this node is alive, retries failed deletes, and removes the members of nodes that
/// stopped.
async fn beat(
    alive: kv::Store,
    members: kv::Store,
    js: jetstream::Context,
    bucket: String,
    view: Arc<Mutex<View>>,
    events: Arc<Mutex<Option<Weak<dyn PresenceEvents>>>>,
    node: String,
) {
    let mut tick = tokio::time::interval(BEAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = alive.put(&node, Bytes::new()).await {
            tracing::info!(error = %e, "nats: presence beat failed");
            continue;
        }
        let undeleted = std::mem::take(&mut view.lock().undeleted);
        for key in undeleted {
            if members.delete(&key).await.is_err() {
                view.lock().undeleted.push(key);
            }
        }
        let Ok(live) = live_nodes(&alive).await else {
            continue;
        };
        let dead = {
            let mut view = view.lock();
            let mut dead = Vec::new();
            for (id, other) in &mut view.others {
                if live.contains(id) {
                    other.beat = true;
                } else if other.beat || other.first_heard.elapsed() > NODE_TTL {
                    dead.push(id.clone());
                }
            }
            dead
        };
        for gone in dead {
            let expired = drop_node(&view, &gone);
            let listener = events.lock().as_ref().and_then(Weak::upgrade);
            if let Some(listener) = listener {
                for (channel, members) in expired {
                    listener.expired(&channel, members);
                }
            }
            // Any survivor may purge them; purging twice is harmless.
            let purged = async {
                js.get_stream(format!("KV_{bucket}"))
                    .await?
                    .purge()
                    .filter(format!("$KV.{bucket}.*.*.{gone}"))
                    .await?;
                Ok::<_, async_nats::Error>(())
            };
            if let Err(e) = purged.await {
                tracing::info!(node = %gone, error = %e, "nats: could not purge a dead node's presence");
            }
        }
    }
}

async fn live_nodes(alive: &kv::Store) -> Result<HashSet<String>, BrokerError> {
    let mut keys = alive.keys().await.map_err(unavailable)?;
    let mut live = HashSet::new();
    while let Some(key) = keys.next().await {
        live.insert(key.map_err(unavailable)?);
    }
    Ok(live)
}

/// Removes what node `gone` held from the view: the members that left, per channel.
fn drop_node(view: &Mutex<View>, gone: &str) -> HashMap<ChannelName, Vec<Member>> {
    let mut view = view.lock();
    let Some(other) = view.others.remove(gone) else {
        return HashMap::new();
    };
    let mut expired: HashMap<ChannelName, Vec<Member>> = HashMap::new();
    for (channel, id) in other.holds {
        let info = view
            .channels
            .get(&channel)
            .and_then(|roster| roster.info(id).cloned())
            .unwrap_or_default();
        if view.remove(&channel, id, gone) {
            expired
                .entry(channel)
                .or_default()
                .push(Member { id, info });
        }
    }
    expired
}

#[async_trait]
impl PresenceStore for NatsPresence {
    async fn join(
        &self,
        channel: &ChannelName,
        member: &Member,
        user: Option<&str>,
    ) -> Result<bool, BrokerError> {
        let value = encode(member, user);
        let new = {
            let mut view = self.view.lock();
            let own = view
                .own
                .entry((channel.clone(), member.id))
                .or_insert_with(|| (0, value.clone()));
            own.0 += 1;
            if own.0 > 1 {
                return Ok(false);
            }
            view.add(channel, member, user, &self.node)
        };
        let written = self
            .write(
                kv_subject(&self.bucket, &member_key(channel, member.id, &self.node)),
                Some(value),
            )
            .await;
        if let Err(e) = written {
            let mut view = self.view.lock();
            let key = (channel.clone(), member.id);
            if let Some(own) = view.own.get_mut(&key) {
                own.0 -= 1;
                if own.0 == 0 {
                    view.own.remove(&key);
                    view.remove(channel, member.id, &self.node);
                }
            }
            return Err(e);
        }
        Ok(new)
    }

    async fn leave(&self, channel: &ChannelName, id: u64) -> Result<bool, BrokerError> {
        let gone = {
            let mut view = self.view.lock();
            let key = (channel.clone(), id);
            let Some(own) = view.own.get_mut(&key) else {
                return Ok(false);
            };
            own.0 -= 1;
            if own.0 > 0 {
                return Ok(false);
            }
            view.own.remove(&key);
            view.remove(channel, id, &self.node)
        };
        let key = member_key(channel, id, &self.node);
        if let Err(e) = self.write(kv_subject(&self.bucket, &key), None).await {
            self.view.lock().undeleted.push(key);
            return Err(e);
        }
        Ok(gone)
    }

    async fn stats(&self, channel: &ChannelName) -> Result<PresenceStats, BrokerError> {
        let view = self.view.lock();
        Ok(view
            .channels
            .get(channel)
            .map_or_else(Default::default, Roster::stats))
    }

    async fn members(
        &self,
        channel: &ChannelName,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Member>, BrokerError> {
        let view = self.view.lock();
        Ok(view
            .channels
            .get(channel)
            .map_or_else(Vec::new, |roster| roster.page(after, limit)))
    }

    async fn announce(&self, batch: Bytes) {
        let mut message = BytesMut::with_capacity(self.node.len() + 1 + batch.len());
        message.put_slice(self.node.as_bytes());
        message.put_u8(b'\n');
        message.put_slice(&batch);
        if let Err(e) = self
            .client
            .publish(self.names.presence_batches(), message.freeze())
            .await
        {
            tracing::info!(error = %e, "nats: a presence batch was not sent");
        }
    }

    fn listen(&self, events: Weak<dyn PresenceEvents>) {
        *self.events.lock() = Some(events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_keys_read_back() {
        let member = Member {
            id: 7,
            info: Bytes::from_static(br#"{"user":"ann"}"#),
        };
        for user in [Some("ann"), None, Some("")] {
            let (back, info) = decode(&encode(&member, user)).unwrap();
            assert_eq!((back.as_deref(), info), (user, member.info.clone()));
        }
        let channel = ChannelName::new("chat:a.b").unwrap();
        let key = member_key(&channel, u64::MAX, "node1");
        assert_eq!(
            key,
            format!("{}.ffffffffffffffff.node1", hex::encode(b"chat:a.b"))
        );
        assert_eq!(parse_key(&key), Some((channel, u64::MAX, "node1")));
        assert_eq!(parse_key("zz.1.n"), None);
    }
}
