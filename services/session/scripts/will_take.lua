-- Remove the will if it is still this connection's: the caller publishes it.
-- KEYS: 1 {c:id}:w, 2 (optional) {n:node}:w the taking node's will index
-- ARGV: 1 token, 2 the taking node, 3 client id
-- Returns: the message, or false.
-- The node's index loses the client unless a will of it is still the node's.
local cur = redis.call('HMGET', KEYS[1], 't', 'm', 'n')
local mine = cur[1] == ARGV[1]
if KEYS[2] and (mine or cur[3] ~= ARGV[2]) then redis.call('SREM', KEYS[2], ARGV[3]) end
if not mine then return false end
redis.call('DEL', KEYS[1])
return cur[2]
