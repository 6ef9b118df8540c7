-- Incoming QoS 2 PUBLISH: remember its packet id until PUBREL.
-- KEYS: 1 {c:id}:s session hash, 2 r incoming ids set
-- ARGV: 1 epoch, 2 packet id
-- Returns: 1 if new, 0 if already there (a duplicate), -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
return redis.call('SADD', KEYS[2], ARGV[2])
