-- PUBREL of an incoming QoS 2 message: forget its packet id.
-- KEYS: 1 {c:id}:s session hash, 2 r incoming ids set
-- ARGV: 1 epoch, 2 packet id
-- Returns: 1 if it was there, 0 if not, -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
return redis.call('SREM', KEYS[2], ARGV[2])
