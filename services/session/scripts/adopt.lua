-- A survivor ends the connection a dead node had: the session goes offline
-- under a new epoch (so a late write of the dead node fails), exactly once.
-- KEYS: 1 {c:id}:s session hash, 2-8 the client's message-state keys (see claim.lua),
--       9 (optional: Redis Cluster) {n:dead}:s the dead node's index of its sessions
-- ARGV: 1 the dead node, 2 the "never expires" value (4294967295), 3 client id,
--       4 the message state's grace (ms, see release.lua)
-- Returns: {epoch, version, expiry}, or false if the dead node no longer has
-- it online (resumed elsewhere, ended, or adopted by another survivor).
-- Expiry 0 discards the session's keys now; otherwise they expire as after
-- a release (release.lua).
local s = KEYS[1]
local cur = redis.call('HMGET', s, 'epoch', 'node', 'online', 'expiry', 'ver')
-- Either way the dead node's index no longer lists it: a claim there would
-- have set the session's node in the same step as its index entry.
if KEYS[9] then redis.call('SREM', KEYS[9], ARGV[3]) end
if cur[3] ~= '1' or cur[2] ~= ARGV[1] then return false end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = math.max(tonumber(cur[1] or '0') + 1, now_us)
local version = math.max(tonumber(cur[5] or '0') + 1, now_us)
local expiry = tonumber(cur[4] or '0')
if expiry <= 0 then
  redis.call('DEL', unpack(KEYS, 1, 8))
else
  redis.call('HSET', s, 'epoch', string.format('%.0f', epoch), 'online', '0', 'node', '',
    'ver', string.format('%.0f', version))
  if expiry < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], expiry * 1000)
    for i = 2, 8 do redis.call('PEXPIRE', KEYS[i], expiry * 1000 + tonumber(ARGV[4])) end
  end
end
return {string.format('%.0f', epoch), string.format('%.0f', version), expiry}
