-- A new connection of the client sets its will (or none), replacing the stored one.
-- KEYS: 1 {c:id}:w will hash (m message, d delay s, n node, t token, due ms,
--       u user name (absent: none), p peer "host:port"),
--       2 (optional: Redis Cluster) {n:node}:w the node's index of the wills it is to publish
-- ARGV: 1 node, 2 token, 3 message ('' for none), 4 delay s,
--       5 "1" if the connection has a user name, else "0", 6 user name, 7 peer, 8 client id
-- The replaced will's node keeps it in its index until it prunes it (a take
-- there, or an orphan search: services/session/redis.py).
-- Returns: the replaced will {m, d, n, due, u, p}, or false if there was none.
local w = KEYS[1]
local old = redis.call('HMGET', w, 'm', 'd', 'n', 'due', 'u', 'p')
redis.call('DEL', w)
if ARGV[3] ~= '' then
  redis.call('HSET', w, 'm', ARGV[3], 'd', ARGV[4], 'n', ARGV[1], 't', ARGV[2], 'due', '0',
    'p', ARGV[7])
  if ARGV[5] == '1' then redis.call('HSET', w, 'u', ARGV[6]) end
  if KEYS[2] then redis.call('SADD', KEYS[2], ARGV[8]) end
end
if not old[1] then return false end
return old
