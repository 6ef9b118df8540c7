-- PUBREC of an outgoing QoS 2 message: keep it inflight, marked released.
-- KEYS: 1 {c:id}:s session hash, 2 f inflight hash, 3 x released set
-- ARGV: 1 epoch, 2 packet id
-- Returns: 1 if the id was inflight, 0 if unknown, -1 if fenced
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('SADD', KEYS[3], ARGV[2])
return 1
