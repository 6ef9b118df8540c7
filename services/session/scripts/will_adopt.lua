-- A survivor takes over a will that a dead node was to publish.
-- KEYS: 1 {c:id}:w, 2 {n:dead}:w and 3 {n:node}:w the two nodes' will indexes (both
--       absent on Redis Cluster, where the store keeps them in calls of their own)
-- ARGV: 1 dead node, 2 node, 3 token, 4 now (wall-clock ms), 5 client id
-- Returns: {m, d, due, u, p} (u false: no user name), or false if the dead
-- node no longer has it. A will whose connection was open when the node died
-- is due after its delay.
local cur = redis.call('HMGET', KEYS[1], 'n', 'm', 'd', 'due', 'u', 'p')
if KEYS[2] then redis.call('SREM', KEYS[2], ARGV[5]) end -- listed there or not, it is not the dead node's now
if cur[1] ~= ARGV[1] then return false end
if KEYS[3] then redis.call('SADD', KEYS[3], ARGV[5]) end
local due = tonumber(cur[4] or '0')
if due == 0 then due = tonumber(ARGV[4]) + tonumber(cur[3] or '0') * 1000 end
redis.call('HSET', KEYS[1], 'n', ARGV[2], 't', ARGV[3], 'due', string.format('%.0f', due))
return {cur[2], cur[3], string.format('%.0f', due), cur[5], cur[6]}
