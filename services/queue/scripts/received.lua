-- PUBRECs of outgoing QoS 2 messages: keep them inflight, marked released.
-- KEYS: 1 {c:id}:s session hash, 2 f inflight hash, 3 x released set
-- ARGV: 1 epoch, 2.. packet ids
-- Returns: how many of the ids were inflight (unknown ones are skipped), or -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local known = 0
for i = 2, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    redis.call('SADD', KEYS[3], ARGV[i])
    known = known + 1
  end
end
return known
