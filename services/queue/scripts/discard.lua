-- Forget every message and packet id of a client (its session ended);
-- the session hash keeps its epoch and event version.
-- KEYS: 1 {c:id}:s session hash, 2-8 the message-state keys (see enqueue_take.lua)
-- ARGV: none
-- Returns: 1
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('HDEL', KEYS[1], 'qseq', 'pid', 'drops')
return 1
