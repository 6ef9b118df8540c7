-- Claim a client's session: the caller becomes its owner under a new epoch.
-- KEYS: 1 {c:id}:s session hash, 2-8 the client's message-state keys
--       (q queue hash, o queue order zset, z QoS 0 list, f inflight hash,
--        fo inflight order zset, x released set, r incoming QoS 2 set)
--       9 (optional) {n:node}:s the claiming node's index of its sessions (see orphans
--       in redis.py; on Redis Cluster the store keeps it in calls of its own)
-- ARGV: 1 node, 2 clean_start ("1"/"0"), 3 session expiry seconds, 4 client id
-- Returns: {epoch, session_present (1/0), previous node if it was online or false}
-- The epoch is a hybrid logical clock, max(previous + 1, Redis time in us),
-- so it grows even across a session that was deleted and created again.
-- Clean start drops all message state in this same step, and so does a new
-- session (what an expired one left for its grace period, see release.lua). Claiming makes
-- every key persistent again (a release may have set a TTL).
local s = KEYS[1]
local existed = redis.call('EXISTS', s) == 1
local clean = ARGV[2] == '1'
local prev = redis.call('HMGET', s, 'epoch', 'node', 'online')
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = math.max(tonumber(prev[1] or '0') + 1, now_us)
local previous = false
if prev[3] == '1' and prev[2] and prev[2] ~= '' then previous = prev[2] end
if clean or not existed then -- a new session: an expired one's leftovers go too
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
  if existed then redis.call('HDEL', s, 'qseq', 'pid', 'drops') end
end
redis.call('HSET', s, 'epoch', string.format('%.0f', epoch), 'node', ARGV[1],
  'online', '1', 'expiry', ARGV[3])
for i = 1, 8 do redis.call('PERSIST', KEYS[i]) end
if KEYS[9] then redis.call('SADD', KEYS[9], ARGV[4]) end
return {epoch, (existed and not clean) and 1 or 0, previous}
