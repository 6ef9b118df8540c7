-- Everything inflight, oldest first, for resend after a resume.
-- KEYS: 1 {c:id}:s session hash, 2 f inflight hash, 3 fo inflight order zset,
--       4 x released set
-- ARGV: 1 epoch
-- Returns: {packet id, released (1/0), message, ...} or -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
local out = {}
for _, pid in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  out[#out + 1] = tonumber(pid)
  out[#out + 1] = redis.call('SISMEMBER', KEYS[4], pid)
  out[#out + 1] = redis.call('HGET', KEYS[2], pid)
end
return out
