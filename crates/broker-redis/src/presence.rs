//! Presence in Redis, shared by every node: who is in which channel, counted per node so
//! that the members of a node that stops are removed by the others.
//!
//! Per channel `C` (prefix `P`), all changed only by the scripts below:
//! - `P:pc:{C}` hash: member id (16 hex digits) → holders on all nodes; its length is the
//!   member count;
//! - `P:pm:{C}` hash: member id → public info (JSON, empty for an anonymous client);
//! - `P:pz:{C}` sorted set of member ids, all scored 0, so pages are lexical ranges;
//! - `P:pu:{C}` hash: member id → user, and `P:pn:{C}` hash: user → members; its length
//!   is the distinct users.
//!
//! Per node: `P:pnode:NODE` hash: `C\nID` → holders on that node; and `P:palive`, a
//! sorted set of nodes by their last heartbeat (Redis's clock). Every node beats every
//! [`BEAT_EVERY`]; a beat also removes the members of nodes silent for [`NODE_TTL`], so a
//! member of a node killed with `kill -9` is gone within `NODE_TTL + 2 × BEAT_EVERY`
//! (14 s): its last beat may be up to one beat before its death, and the first survivor
//! beat past the TTL up to one beat after it.
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

use crate::{listener::Listener, Store};

/// How often a node tells Redis it is alive (and sweeps out silent nodes).
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// A node silent for this long is taken for dead, and its members removed.
pub const NODE_TTL: Duration = Duration::from_secs(10);

/// Removes `n` holders of member `id` of channel `C` from the totals; 1 if it left.
const DROP: &str = r#"
local function drop(P, C, id, n)
  local total = redis.call('HINCRBY', P .. ':pc:{' .. C .. '}', id, -n)
  if total > 0 then return 0 end
  redis.call('HDEL', P .. ':pc:{' .. C .. '}', id)
  redis.call('HDEL', P .. ':pm:{' .. C .. '}', id)
  redis.call('ZREM', P .. ':pz:{' .. C .. '}', id)
  local user = redis.call('HGET', P .. ':pu:{' .. C .. '}', id)
  if user then
    redis.call('HDEL', P .. ':pu:{' .. C .. '}', id)
    if redis.call('HINCRBY', P .. ':pn:{' .. C .. '}', user, -1) <= 0 then
      redis.call('HDEL', P .. ':pn:{' .. C .. '}', user)
    end
  end
  return 1
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// ARGV: prefix, channel, id, info, user ('' for none), has user ('1'/'0'), node.
/// Returns 1 when the member is new.
fn join_script() -> Script {
    Script::new(&format!(
        r#"{DROP}
local P, C, id = ARGV[1], ARGV[2], ARGV[3]
redis.call('HINCRBY', P .. ':pnode:' .. ARGV[7], C .. '\n' .. id, 1)
redis.call('ZADD', P .. ':palive', now_ms(), ARGV[7])
if redis.call('HINCRBY', P .. ':pc:{{' .. C .. '}}', id, 1) > 1 then return 0 end
redis.call('HSET', P .. ':pm:{{' .. C .. '}}', id, ARGV[4])
redis.call('ZADD', P .. ':pz:{{' .. C .. '}}', 0, id)
if ARGV[6] == '1' then
  redis.call('HSET', P .. ':pu:{{' .. C .. '}}', id, ARGV[5])
  redis.call('HINCRBY', P .. ':pn:{{' .. C .. '}}', ARGV[5], 1)
end
return 1
"#
    ))
}

/// ARGV: prefix, channel, id, node. Returns 1 when the member left.
fn leave_script() -> Script {
    Script::new(&format!(
        r#"{DROP}
local P, C, id = ARGV[1], ARGV[2], ARGV[3]
local key, field = P .. ':pnode:' .. ARGV[4], C .. '\n' .. id
local held = tonumber(redis.call('HGET', key, field) or '0')
if held <= 0 then return 0 end
if held == 1 then redis.call('HDEL', key, field) else redis.call('HINCRBY', key, field, -1) end
return drop(P, C, id, 1)
"#
    ))
}

/// ARGV: prefix, node, node TTL ms. Marks the node alive; removes the members of nodes
/// silent for longer than the TTL. Returns `{channel, id, channel, id, …}` of members
/// that left.
fn beat_script() -> Script {
    Script::new(&format!(
        r#"{DROP}
local P = ARGV[1]
local now = now_ms()
redis.call('ZADD', P .. ':palive', now, ARGV[2])
local dead = redis.call('ZRANGEBYSCORE', P .. ':palive', '-inf', now - tonumber(ARGV[3]))
local out = {{}}
for _, node in ipairs(dead) do
  local key = P .. ':pnode:' .. node
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local f = fields[i]
    local C, id = string.sub(f, 1, #f - 17), string.sub(f, #f - 15)
    if drop(P, C, id, tonumber(fields[i + 1])) == 1 then
      out[#out + 1] = C
      out[#out + 1] = id
    end
  end
  redis.call('DEL', key)
  redis.call('ZREM', P .. ':palive', node)
end
return out
"#
    ))
}

/// Presence kept in Redis for every node that shares it.
pub struct RedisPresence {
    store: Arc<Store>,
    listener: Arc<Listener>,
    join: Script,
    leave: Script,
    beat: Script,
    events: Mutex<Option<Weak<dyn PresenceEvents>>>,
}

impl std::fmt::Debug for RedisPresence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPresence").finish_non_exhaustive()
    }
}

fn hex(id: u64) -> String {
    format!("{id:016x}")
}

impl RedisPresence {
    /// Presence on `store`, heard through `listener`; beats until dropped.
    pub(crate) fn start(store: Arc<Store>, listener: Arc<Listener>) -> Arc<Self> {
        let presence = Arc::new(Self {
            store,
            listener,
            join: join_script(),
            leave: leave_script(),
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

    /// Marks this node alive and removes the members of nodes that are not.
    pub async fn beat(&self) -> Result<(), BrokerError> {
        let mut call = self.beat.prepare_invoke();
        call.arg(self.prefix())
            .arg(&self.listener.node_id)
            .arg(NODE_TTL.as_millis() as u64);
        let gone: Vec<String> = self
            .store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await?;
        let events = self.events.lock().as_ref().and_then(Weak::upgrade);
        let Some(events) = events else { return Ok(()) };
        for pair in gone.chunks(2) {
            let (Ok(channel), Ok(id)) = (
                ChannelName::new(&pair[0]),
                u64::from_str_radix(&pair[1], 16),
            ) else {
                continue;
            };
            events.expired(&channel, vec![id]);
        }
        Ok(())
    }

    /// A batch another node published.
    pub(crate) fn heard(&self, payload: &[u8]) {
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
        let mut call = self.join.prepare_invoke();
        call.arg(self.prefix())
            .arg(channel.as_str())
            .arg(hex(member.id))
            .arg(member.info.as_ref())
            .arg(user.unwrap_or(""))
            .arg(if user.is_some() { "1" } else { "0" })
            .arg(&self.listener.node_id);
        let new: i64 = self
            .store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await?;
        Ok(new == 1)
    }

    async fn leave(&self, channel: &ChannelName, id: u64) -> Result<bool, BrokerError> {
        let mut call = self.leave.prepare_invoke();
        call.arg(self.prefix())
            .arg(channel.as_str())
            .arg(hex(id))
            .arg(&self.listener.node_id);
        let left: i64 = self
            .store
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await?;
        Ok(left == 1)
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
        let from = after.map_or_else(|| "-".to_string(), |id| format!("({}", hex(id)));
        let ids: Vec<String> = self
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
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let key = format!("{p}:pm:{{{c}}}");
        let wanted = ids.clone();
        let infos: Vec<Option<Vec<u8>>> = self
            .store
            .call(|mut conn| async move {
                redis::cmd("HMGET")
                    .arg(key)
                    .arg(wanted)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(ids
            .iter()
            .zip(infos)
            .filter_map(|(id, info)| {
                // A member that left between the two reads is not listed.
                Some(Member {
                    id: u64::from_str_radix(id, 16).ok()?,
                    info: checked_info(info?)?,
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
