//! The presence scripts. What they share (a member's holders, its join, its release, a
//! dead node's sweep) is one Lua text; where a node's holders of a channel are counted
//! depends on the topology:
//! - on one Redis, per node: `P:pnc:TAG` hash, channel → holders, so a node's sweep finds
//!   its channels there, all in one script;
//! - on a cluster, per channel: `P:pnc:{C}` hash, tag → holders, in the channel's slot; the
//!   node's tags, liveness and the set of channels each node holds members in
//!   (`P:{presence}:pch:TAG`) live in one slot of their own, and a sweep is one call there
//!   to find the dead and one per channel to release their members.

use redis::Script;

/// What every script shares, after the topology's `pnc` (where node `T`'s holders of `C`
/// are counted: key and field).
const COMMON: &str = r#"
-- Node `node`'s tag under B (B = P on one Redis, P:{presence} on a cluster).
local function tag_of(B, node)
  local t = redis.call('HGET', B .. ':ptag', node)
  if not t then
    t = tostring(redis.call('INCR', B .. ':ptagseq'))
    redis.call('HSET', B .. ':ptag', node, t)
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
-- Removes member id of channel C from every structure; returns id ++ info (id alone
-- when its entry is gone).
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
  return entry[1] or id
end
-- Takes d holders of node T off member id of C: removed from the node's channel count,
-- and from the channel when no holder is left (then returns its id ++ info; else false).
local function release(P, C, id, T, d)
  local k, f = pnc(P, C, T)
  if redis.call('HINCRBY', k, f, -d) <= 0 then
    redis.call('HDEL', k, f)
  end
  local key = P .. ':pc:{' .. C .. '}'
  local rest = shift(redis.call('HGET', key, id), T, -d)
  if rest ~= '' then
    redis.call('HSET', key, id, rest)
    return false
  end
  return remove(P, C, id)
end
-- One change of node T: a join (`j`, with info and `u` ++ user or '') or a leave (`l`).
-- 1 when the member is new (join) or left (leave), else 0.
local function change(P, T, kind, C, id, info, user)
  local key = P .. ':pc:{' .. C .. '}'
  if kind == 'j' then
    local k, f = pnc(P, C, T)
    redis.call('HINCRBY', k, f, 1)
    local before = redis.call('HGET', key, id)
    redis.call('HSET', key, id, shift(before, T, 1))
    if before then return 0 end
    redis.call('ZADD', P .. ':pz:{' .. C .. '}', 0, id .. info)
    if user ~= '' then
      local name = string.sub(user, 2)
      redis.call('HSET', P .. ':pu:{' .. C .. '}', id, name)
      redis.call('HINCRBY', P .. ':pn:{' .. C .. '}', name, 1)
    end
    return 1
  elseif count_of(redis.call('HGET', key, id), T) > 0 then
    if release(P, C, id, T, 1) then return 1 end
  end
  return 0
end
-- Releases every holder node T has in C; appends C, id ++ info of each member that left
-- to out.
local function sweep(P, C, T, out)
  local all = redis.call('HGETALL', P .. ':pc:{' .. C .. '}')
  for i = 1, #all, 2 do
    local n = count_of(all[i + 1], T)
    local left = n > 0 and release(P, C, all[i], T, n)
    if left then
      out[#out + 1] = C
      out[#out + 1] = left
    end
  end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// On one Redis: a node's holders per channel, in the node's hash.
const PER_NODE: &str = r#"
local function pnc(P, C, T) return P .. ':pnc:' .. T, C end
"#;

/// On a cluster: a channel's holders per node, in the channel's slot.
const PER_CHANNEL: &str = r#"
local function pnc(P, C, T) return P .. ':pnc:{' .. C .. '}', T end
"#;

/// One Redis. Joins and leaves of one node, in order, in one call. ARGV: prefix, node,
/// then five per change: `j` or `l`, channel, id (8 bytes), info, and `u` followed by the
/// user (`''` for none; both empty for a leave). Returns per change 1 when the member is
/// new (join) or left (leave), else 0.
pub(super) fn changes() -> Script {
    Script::new(&format!(
        r#"{PER_NODE}{COMMON}
local P, node = ARGV[1], ARGV[2]
local T = tag_of(P, node)
redis.call('ZADD', P .. ':palive', now_ms(), node)
local out = {{}}
for i = 3, #ARGV, 5 do
  out[#out + 1] = change(P, T, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
return out
"#
    ))
}

/// One Redis. ARGV: prefix, node, node TTL ms. Marks the node alive; removes the members
/// of nodes silent for longer than the TTL. Returns `{channel, id ++ info, …}` of
/// members that left.
pub(super) fn beat() -> Script {
    Script::new(&format!(
        r#"{PER_NODE}{COMMON}
local P = ARGV[1]
local now = now_ms()
redis.call('ZADD', P .. ':palive', now, ARGV[2])
local dead = redis.call('ZRANGEBYSCORE', P .. ':palive', '-inf', now - tonumber(ARGV[3]))
local out = {{}}
for _, node in ipairs(dead) do
  local T = redis.call('HGET', P .. ':ptag', node)
  if T then
    for _, C in ipairs(redis.call('HKEYS', P .. ':pnc:' .. T)) do
      sweep(P, C, T, out)
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

/// A cluster, the nodes' slot. KEYS: `P:{presence}:palive` (the slot). ARGV: prefix, an
/// operation, node, then:
/// - `tag`, channels the node is about to hold members in: marks the node alive, notes the
///   channels, returns its tag;
/// - `drop`, channels it holds no member in any more: forgets them;
/// - `beat`, TTL ms: marks it alive; returns `{node, tag, {channels}, …}` of nodes silent
///   past the TTL (swept by the caller, channel by channel, then forgotten);
/// - `forget`, TTL ms, nodes: forgets those of them still silent past the TTL.
pub(super) fn cluster_nodes() -> Script {
    Script::new(&format!(
        r#"{PER_CHANNEL}{COMMON}
local P, op, node = ARGV[1], ARGV[2], ARGV[3]
local B = P .. ':{{presence}}'
if op == 'tag' then
  local T = tag_of(B, node)
  redis.call('ZADD', B .. ':palive', now_ms(), node)
  for i = 4, #ARGV do redis.call('SADD', B .. ':pch:' .. T, ARGV[i]) end
  return T
elseif op == 'drop' then
  local T = redis.call('HGET', B .. ':ptag', node)
  if T then
    for i = 4, #ARGV do redis.call('SREM', B .. ':pch:' .. T, ARGV[i]) end
  end
  return 0
end
local ttl, now = tonumber(ARGV[4]), now_ms()
if op == 'beat' then
  redis.call('ZADD', B .. ':palive', now, node)
  local out = {{}}
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', B .. ':palive', '-inf', now - ttl)) do
    local T = redis.call('HGET', B .. ':ptag', d)
    out[#out + 1] = d
    out[#out + 1] = T or ''
    out[#out + 1] = T and redis.call('SMEMBERS', B .. ':pch:' .. T) or {{}}
  end
  return out
end
for i = 5, #ARGV do
  local d = ARGV[i]
  local seen = redis.call('ZSCORE', B .. ':palive', d)
  if seen and tonumber(seen) <= now - ttl then
    local T = redis.call('HGET', B .. ':ptag', d)
    if T then redis.call('DEL', B .. ':pch:' .. T) end
    redis.call('HDEL', B .. ':ptag', d)
    redis.call('ZREM', B .. ':palive', d)
  end
end
return 0
"#
    ))
}

/// A cluster, one channel's slot. KEYS: `P:pc:{C}` (the slot). ARGV: prefix, the node's
/// tag, channel, then four per change: `j` or `l`, id, info, `u` ++ user or `''`. Returns
/// per change 1 when the member is new (join) or left (leave), else 0; then how many
/// holders the node has left in the channel.
pub(super) fn cluster_changes() -> Script {
    Script::new(&format!(
        r#"{PER_CHANNEL}{COMMON}
local P, T, C = ARGV[1], ARGV[2], ARGV[3]
local out = {{}}
for i = 4, #ARGV, 4 do
  out[#out + 1] = change(P, T, ARGV[i], C, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
end
local k, f = pnc(P, C, T)
out[#out + 1] = tonumber(redis.call('HGET', k, f) or 0)
return out
"#
    ))
}

/// A cluster, one channel's slot. KEYS: `P:pc:{C}`. ARGV: prefix, channel, a dead node's
/// tag. Releases the node's holders there; returns `{channel, id ++ info, …}` of members that
/// left.
pub(super) fn cluster_sweep() -> Script {
    Script::new(&format!(
        r#"{PER_CHANNEL}{COMMON}
local P, C, T = ARGV[1], ARGV[2], ARGV[3]
local out = {{}}
sweep(P, C, T, out)
return out
"#
    ))
}
