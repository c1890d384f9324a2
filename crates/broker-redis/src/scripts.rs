//! The Lua scripts that keep a channel's stream consistent inside Redis: each runs
//! atomically, so offsets, history and pub/sub order agree whatever the number of nodes.
//!
//! Per channel there are two keys, both hash-tagged with the channel so they share a slot:
//! - the **meta** hash: `e` = epoch, `o` = newest offset, `t` = history TTL in ms, `r` = the
//!   replication id of its last write (see [`ON_ANOTHER_HISTORY`]);
//! - the **history**, a Redis stream whose entry ids are `OFFSET-0`, with fields
//!   `d` = data and `t` = append time in ms.

use redis::Script;

/// The start of every script that reads or writes a stream: its meta `m` (`e`, `o`, `t`,
/// `r`), `replid` (this Redis's replication id) and `epoch` (`nil` for a stream that does
/// not exist).
///
/// A stream last written under a replication id that the current one does not continue
/// may have gone back, with no node listening to notice: Redis was restarted from a dump
/// (that may be older than what was acknowledged) without its replication history, as a
/// Redis no replica follows always is. It continues in a new epoch, keeping its history:
/// derived from the old epoch and the new replication id, so every node and every script
/// reaching it computes the same one. A history that continues the stream's (a failover,
/// whose promoted replica names the old one `master_replid2`) keeps its epoch: the
/// promoted replica's data cannot say whether it lacked later writes (its copy of the
/// stream went back with them), and a node listening notices when it catches up. Streams
/// written before this field existed adopt the current history.
const ON_ANOTHER_HISTORY: &str = r#"
local repl = redis.call('INFO', 'replication')
local function field(name) return string.match(repl, name .. ':([%w%-]+)') end
local replid = field('master_replid')
local m = redis.call('HMGET', KEYS[1], 'e', 'o', 't', 'r')
local epoch = m[1]
if epoch and m[4] ~= replid then
  if m[4] and m[4] ~= field('master_replid2') then
    epoch = string.sub(redis.sha1hex(epoch .. ' ' .. replid), 1, 12)
    redis.call('HSET', KEYS[1], 'e', epoch)
  end
  redis.call('HSET', KEYS[1], 'r', replid)
end
"#;

/// What the publish scripts do, up to their answer: `epoch` and `offset` are set.
const PUBLISH_STEPS: &str = r#"
if not epoch then
  epoch = ARGV[5]
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'e', epoch, 'r', replid)
end
local offset = redis.call('HINCRBY', KEYS[1], 'o', 1)
redis.call('HSET', KEYS[1], 't', ARGV[3])
local size = tonumber(ARGV[2])
if size > 0 then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('XADD', KEYS[2], 'MAXLEN', size, offset .. '-0', 'd', ARGV[1], 't', string.format('%.0f', ms))
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('DEL', KEYS[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[6], epoch .. '\n' .. offset .. '\n' .. ARGV[1])
"#;

/// Appends a publication, trims history to its size, and publishes
/// `EPOCH\nOFFSET\nDATA` to the channel's pub/sub channel, all in one step.
///
/// KEYS: meta, history. ARGV: data, history size, history TTL ms, meta TTL ms, the epoch to
/// use if the stream is new, pub/sub channel. Returns `{epoch, offset}`. On a cluster
/// (`sharded`) it sends with `SPUBLISH` to a shard channel in the keys' slot.
pub fn publish(sharded: bool) -> Script {
    Script::new(&format!(
        "{}return {{epoch, offset}}\n",
        publish_steps(sharded)
    ))
}

/// [`ON_ANOTHER_HISTORY`] and [`PUBLISH_STEPS`], sending with `SPUBLISH` when `sharded`.
fn publish_steps(sharded: bool) -> String {
    let steps = format!("{ON_ANOTHER_HISTORY}{PUBLISH_STEPS}");
    if sharded {
        steps.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
    } else {
        steps
    }
}

/// [`publish`], once per idempotency key: a key the channel saw within its window publishes
/// nothing and answers with the first one's position. The key lives in the channel's slot,
/// so the check and the offset's assignment are one atomic step on every node. The
/// channel's keys are also indexed by when they were first seen (a sorted set in the same
/// slot): past the cap, the oldest are forgotten, so a publisher that sends a new key
/// every time holds at most the cap's worth of keys per channel, whatever its rate.
///
/// KEYS: meta, history, the key's, the channel's key index. ARGV: as [`publish`], then the
/// key's window in ms, then the cap. Returns `{epoch, offset, repeat (0 or 1)}`.
pub fn publish_once(sharded: bool) -> Script {
    let publish_steps = publish_steps(sharded);
    Script::new(&format!(
        r#"
local seen = redis.call('GET', KEYS[3])
if seen then
  local at = string.find(seen, ' ', 1, true)
  return {{string.sub(seen, 1, at - 1), tonumber(string.sub(seen, at + 1)), 1}}
end
{publish_steps}
redis.call('SET', KEYS[3], epoch .. ' ' .. offset, 'PX', ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[7])
redis.call('ZADD', KEYS[4], now, KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - window)
local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[8])
if over > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[4], over)
  for i = 1, #oldest, 2 do redis.call('DEL', oldest[i]) end
end
redis.call('PEXPIRE', KEYS[4], window)
return {{epoch, offset, 0}}
"#
    ))
}

/// Reads a stream's position and history. A stream that does not exist yet is created
/// with the given epoch at offset 0, so the epoch a reader sees is the one publications
/// get; such an empty stream lives only the given short TTL after its last read (or
/// [`KEEP_EMPTY`] call), so naming channels leaves nothing lasting in Redis. Publications
/// older than the stream's TTL are dropped first.
///
/// KEYS: meta, history. ARGV: since offset (empty = the newest), limit, the epoch to use if
/// the stream is new, TTL ms of an empty stream. Returns
/// `{epoch, top offset, first readable offset, {offset, data, offset, data, ...}}`.
pub fn history() -> Script {
    Script::new(&format!(
        "{ON_ANOTHER_HISTORY}{}",
        r#"
local top, ttl = tonumber(m[2] or 0), tonumber(m[3] or 0)
if not epoch then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'e', ARGV[3], 'o', 0, 'r', replid)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {ARGV[3], 0, 1, {}}
end
if top == 0 then
  -- Still nothing published: remembered a while longer for its readers, no more.
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {epoch, 0, 1, {}}
end
local function offset_of(id) return tonumber(string.match(id, '^%d+')) end
if ttl > 0 then
  local now = redis.call('TIME')
  local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - ttl
  while true do
    local head = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 64)
    if #head == 0 then break end
    local keep
    for _, e in ipairs(head) do
      if tonumber(e[2][4]) >= cutoff then keep = e[1] break end
    end
    if keep then
      redis.call('XTRIM', KEYS[2], 'MINID', keep)
      break
    end
    redis.call('XTRIM', KEYS[2], 'MINID', (offset_of(head[#head][1]) + 1) .. '-0')
  end
end
local first = top + 1
local head = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if #head > 0 then first = offset_of(head[1][1]) end
local limit = tonumber(ARGV[2])
local out = {}
if limit > 0 then
  local entries = {}
  if ARGV[1] == '' then
    local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', limit)
    for i = #newest, 1, -1 do entries[#entries + 1] = newest[i] end
  else
    local since = tonumber(ARGV[1])
    if (since == 0 or since + 1 >= first) and since < top then
      entries = redis.call('XRANGE', KEYS[2], (since + 1) .. '-0', '+', 'COUNT', limit)
    end
  end
  for _, e in ipairs(entries) do
    out[#out + 1] = offset_of(e[1])
    out[#out + 1] = e[2][2]
  end
end
return {epoch, top, first, out}
"#
    ))
}

/// Where a stream stands, without making it (after [`ON_ANOTHER_HISTORY`]).
///
/// KEYS: meta. Returns `{epoch, offset}`, or nil when the stream does not exist.
pub fn position() -> Script {
    Script::new(&format!(
        "{ON_ANOTHER_HISTORY}{}",
        r#"
if not epoch then return false end
return {epoch, tonumber(m[2] or 0)}
"#
    ))
}

/// Extends the life of a stream nobody published to yet, which a node still listens to, so
/// its subscribers' epoch stays the one publications will get. A stream with publications
/// keeps the TTL its namespace gave it.
///
/// KEYS: meta. ARGV: TTL ms of an empty stream.
pub const KEEP_EMPTY: &str = r#"
if redis.call('HGET', KEYS[1], 'o') == '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
"#;

/// Gives a stream a new epoch when it stands below an offset a node already handed over in
/// that epoch: Redis lost writes (restarted from an older dump, or failed over to a replica
/// that lagged), and the offsets after where it stands now must not be given out again in
/// the epoch clients saw them in. History is kept. When another node noticed first and
/// renewed it already, nothing is done.
///
/// KEYS: meta. ARGV: the epoch seen, the offset seen, the new epoch. Returns the epoch now.
pub const RENEW_EPOCH: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'e', 'o')
if m[1] == ARGV[1] and tonumber(m[2] or 0) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'e', ARGV[3])
  return ARGV[3]
end
return m[1] or ''
"#;
