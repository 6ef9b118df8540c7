-- Read only: is an incoming QoS 2 packet id awaiting PUBREL (a resend)?
-- KEYS: 1 {c:id}:s session hash, 2 r incoming ids set
-- ARGV: 1 epoch, 2 packet id
-- Returns: 1 if there, 0 if not, -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
return redis.call('SISMEMBER', KEYS[2], ARGV[2])
