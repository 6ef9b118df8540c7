-- The connection ended: its will goes out at a due time (a survivor can see it).
-- KEYS: 1 {c:id}:w   ARGV: 1 token, 2 due (wall-clock ms)
-- Returns: 1, or 0 if the will is no longer this connection's.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'due', ARGV[2])
return 1
