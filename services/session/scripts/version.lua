-- The next per-client event version, for the current owner only.
-- KEYS: 1 {c:id}:s session hash
-- ARGV: 1 epoch
-- Returns: the version (a hybrid logical clock, max(last + 1, Redis time in us)),
--          or -1 if the epoch is not current (fenced)
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'ver')
if cur[1] ~= ARGV[1] then return -1 end
local t = redis.call('TIME')
local v = math.max(tonumber(cur[2] or '0') + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[1], 'ver', string.format('%.0f', v))
return v
