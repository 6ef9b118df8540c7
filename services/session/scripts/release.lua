-- The owner's connection ended: mark the session offline and let it expire.
-- KEYS: 1 {c:id}:s session hash, 2-8 the client's message-state keys (see claim.lua),
--       9 (optional) {n:node}:s the releasing node's index of its sessions
-- ARGV: 1 epoch, 2 session expiry seconds (0: delete now; >= ARGV 3: never expires),
--       3 the "never expires" value (4294967295), 4 the message state's grace (ms),
--       5 the releasing node, 6 client id
-- Returns: 1, or -1 if the epoch is not current (fenced)
-- Expiry is Redis's own: PEXPIRE on every key of the client, so nothing
-- needs to sweep. Keys created later while offline (enqueue) copy the TTL.
-- The message-state keys (2-8) outlive the session hash by ARGV 4, so the
-- node that logs the expiry can take a shared member's copies (leftovers.lua).
-- The node's index loses the client unless the session is (again) online
-- there: a fenced release is the old owner's after a takeover elsewhere.
local cur = redis.call('HMGET', KEYS[1], 'epoch', 'node', 'online')
if KEYS[9] and not (cur[3] == '1' and cur[2] == ARGV[5] and cur[1] ~= ARGV[1]) then
  redis.call('SREM', KEYS[9], ARGV[6])
end
if cur[1] ~= ARGV[1] then return -1 end
local expiry = tonumber(ARGV[2])
if expiry <= 0 then
  redis.call('DEL', unpack(KEYS, 1, 8))
  return 1
end
redis.call('HSET', KEYS[1], 'online', '0', 'node', '', 'expiry', ARGV[2])
if expiry < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], expiry * 1000)
  for i = 2, 8 do redis.call('PEXPIRE', KEYS[i], expiry * 1000 + tonumber(ARGV[4])) end
end
return 1
