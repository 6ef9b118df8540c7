-- The incoming QoS 2 ids awaiting PUBREL (to restore after a resume).
-- KEYS: 1 {c:id}:s session hash, 2 r incoming ids set
-- ARGV: 1 epoch
-- Returns: the ids, or -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
return redis.call('SMEMBERS', KEYS[2])
