-- PUBACK / PUBCOMP of outgoing messages: drop them from the inflight window.
-- KEYS: 1 {c:id}:s session hash, 2 f inflight hash, 3 fo inflight order zset,
--       4 x released set
-- ARGV: 1 epoch, 2.. packet ids
-- Returns: how many of the ids were inflight, or -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local released = redis.call('EXISTS', KEYS[4]) == 1
local n = 0
for i = 2, #ARGV, 1000 do -- chunks: Lua's unpack has a stack limit
  local j = math.min(i + 999, #ARGV)
  n = n + redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
  redis.call('ZREM', KEYS[3], unpack(ARGV, i, j))
  if released then redis.call('SREM', KEYS[4], unpack(ARGV, i, j)) end
end
return n
