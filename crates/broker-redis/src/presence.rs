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

/// How often a node tells Redis it is alive (and sweeps out silent nodes).
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// A node silent for this long is taken for dead, and its members removed.
pub const NODE_TTL: Duration = Duration::from_secs(10);

/// What every script shares: a node's tag, a member's holders, and its removal.
const COMMON: &str = r#"
local function tag_of(P, node)
  local t = redis.call('HGET', P .. ':ptag', node)
  if not t then
    t = tostring(redis.call('INCR', P .. ':ptagseq'))
    redis.call('HSET', P .. ':ptag', node, t)
  end
  return t
end
-- Holders of node T in "T:N,T:N".
local function count_of(holders, T)
  for t, n in string.gmatch(holders or '', '([^:,]+):(%d+)') do
    if t == T then return tonumber(n) end
  end
  return 0
end
-- The holders with node T's count moved by d ('' when none are left).
local function shift(holders, T, d)
  local out, found = {}, false
  for t, n in string.gmatch(holders or '', '([^:,]+):(%d+)') do
    n = tonumber(n)
    if t == T then n = n + d; found = true end
    if n > 0 then out[#out + 1] = t .. ':' .. n end
  end
  if not found and d > 0 then out[#out + 1] = T .. ':' .. d end
  return table.concat(out, ',')
end
-- Removes member id of channel C from every structure.
local function remove(P, C, id)
  redis.call('HDEL', P .. ':pc:{' .. C .. '}', id)
  -- Its entry is id ++ info; info is JSON, which never holds the byte 255.
  local z = P .. ':pz:{' .. C .. '}'
  local entry = redis.call('ZRANGEBYLEX', z, '[' .. id, '(' .. id .. '\255', 'LIMIT', 0, 1)
  if entry[1] then redis.call('ZREM', z, entry[1]) end
  local user = redis.call('HGET', P .. ':pu:{' .. C .. '}', id)
  if user then
    redis.call('HDEL', P .. ':pu:{' .. C .. '}', id)
    if redis.call('HINCRBY', P .. ':pn:{' .. C .. '}', user, -1) <= 0 then
      redis.call('HDEL', P .. ':pn:{' .. C .. '}', user)
    end
  end
end
-- Takes d holders of node T off member id of C: removed from the node's channel count,
-- and from the channel when no holder is left (then returns 1).
local function release(P, C, id, T, d)
  if redis.call('HINCRBY', P .. ':pnc:' .. T, C, -d) <= 0 then
    redis.call('HDEL', P .. ':pnc:' .. T, C)
  end
  local key = P .. ':pc:{' .. C .. '}'
  local rest = shift(redis.call('HGET', key, id), T, -d)
  if rest ~= '' then
    redis.call('HSET', key, id, rest)
    return 0
  end
  remove(P, C, id)
  return 1
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// Joins and leaves of one node, in order, in one call. ARGV: prefix, node, then five per
/// change: `j` or `l`, channel, id (8 bytes), info, and `u` followed by the user (`''` for
/// none; both empty for a leave). Returns per change 1 when the member is new (join) or left (leave), else 0.
fn changes_script() -> Script {
    Script::new(&format!(
        r#"{COMMON}
local P, node = ARGV[1], ARGV[2]
local T = tag_of(P, node)
redis.call('ZADD', P .. ':palive', now_ms(), node)
local out = {{}}
for i = 3, #ARGV, 5 do
  local C, id, key = ARGV[i + 1], ARGV[i + 2], P .. ':pc:{{' .. ARGV[i + 1] .. '}}'
  local result = 0
  if ARGV[i] == 'j' then
    redis.call('HINCRBY', P .. ':pnc:' .. T, C, 1)
    local before = redis.call('HGET', key, id)
    redis.call('HSET', key, id, shift(before, T, 1))
    if not before then
      result = 1
      redis.call('ZADD', P .. ':pz:{{' .. C .. '}}', 0, id .. ARGV[i + 3])
      local user = string.sub(ARGV[i + 4], 2)
      if ARGV[i + 4] ~= '' then
        redis.call('HSET', P .. ':pu:{{' .. C .. '}}', id, user)
        redis.call('HINCRBY', P .. ':pn:{{' .. C .. '}}', user, 1)
      end
    end
  elseif count_of(redis.call('HGET', key, id), T) > 0 then
    result = release(P, C, id, T, 1)
  end
  out[#out + 1] = result
end
return out
"#
    ))
}

/// ARGV: prefix, node, node TTL ms. Marks the node alive; removes the members of nodes
/// silent for longer than the TTL. Returns `{channel, id, channel, id, …}` of members
/// that left.
fn beat_script() -> Script {
    Script::new(&format!(
        r#"{COMMON}
local P = ARGV[1]
local now = now_ms()
redis.call('ZADD', P .. ':palive', now, ARGV[2])
local dead = redis.call('ZRANGEBYSCORE', P .. ':palive', '-inf', now - tonumber(ARGV[3]))
local out = {{}}
for _, node in ipairs(dead) do
  local T = redis.call('HGET', P .. ':ptag', node)
  if T then
    for _, C in ipairs(redis.call('HKEYS', P .. ':pnc:' .. T)) do
      local all = redis.call('HGETALL', P .. ':pc:{{' .. C .. '}}')
      for i = 1, #all, 2 do
        local n = count_of(all[i + 1], T)
        if n > 0 and release(P, C, all[i], T, n) == 1 then
          out[#out + 1] = C
          out[#out + 1] = all[i]
        end
      end
    end
    redis.call('DEL', P .. ':pnc:' .. T)
    redis.call('HDEL', P .. ':ptag', node)
  end
  redis.call('ZREM', P .. ':palive', node)
end
return out
"#
    ))
}

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
async fn send_changes(store: Arc<Store>, node: String, mut queue: mpsc::UnboundedReceiver<Change>) {
    let script = changes_script();
    let mut batch = Vec::with_capacity(MOST_PER_CALL);
    while queue.recv_many(&mut batch, MOST_PER_CALL).await > 0 {
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
        tokio::spawn(send_changes(store.clone(), listener.node_id.clone(), queue));
        let presence = Arc::new(Self {
            store,
            listener,
            changes,
            beat: beat_script(),
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
        let mut call = self.beat.prepare_invoke();
        call.arg(self.prefix())
            .arg(&self.listener.node_id)
            .arg(NODE_TTL.as_millis() as u64);
        let gone: Vec<Vec<u8>> = self
            .store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await?;
        let events = self.events.lock().as_ref().and_then(Weak::upgrade);
        let Some(events) = events else { return Ok(()) };
        for pair in gone.chunks(2) {
            let channel = std::str::from_utf8(&pair[0]).ok();
            let (Some(channel), Some(id)) = (
                channel.and_then(|c| ChannelName::new(c).ok()),
                pair.get(1).and_then(|id| id_of(id)),
            ) else {
                continue;
            };
            events.expired(&channel, vec![id]);
        }
        Ok(())
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
