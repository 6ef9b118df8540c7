-- Prune one stale entry of a node's index (found by an orphan search).
-- KEYS: 1 {n:node}:s or {n:node}:w the index, 2 the client's {c:id}:s or {c:id}:w hash
-- ARGV: 1 node, 2 client id, 3 the hash's node field ('node' or 'n'),
--       4 "1" if the entry also needs the session online ('online' = '1')
-- Returns: 1 if removed, 0 if the client is (again) the node's.
local cur = redis.call('HMGET', KEYS[2], ARGV[3], 'online')
if cur[1] == ARGV[1] and (ARGV[4] ~= '1' or cur[2] == '1') then return 0 end
redis.call('SREM', KEYS[1], ARGV[2])
return 1
