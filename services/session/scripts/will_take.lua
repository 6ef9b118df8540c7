-- Remove the will if it is still this connection's: the caller publishes it.
-- KEYS: 1 {c:id}:w   ARGV: 1 token
-- Returns: the message, or false.
local cur = redis.call('HMGET', KEYS[1], 't', 'm')
if cur[1] ~= ARGV[1] then return false end
redis.call('DEL', KEYS[1])
return cur[2]
