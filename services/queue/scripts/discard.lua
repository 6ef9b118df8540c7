-- Forget every message and packet id of a client (its session ended);
-- the session hash keeps its epoch and event version.
-- KEYS: 1 {c:id}:s session hash, 2-8 the message-state keys (see enqueue_take.lua)
-- ARGV: 1 epoch the caller owns, or "-" for "whoever owns it"
-- Returns: 1 if discarded, 0 if a newer owner (or no session) holds the epoch
if ARGV[1] ~= '-' and redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('HDEL', KEYS[1], 'qseq', 'pid', 'drops')
return 1
