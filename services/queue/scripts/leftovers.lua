-- Take what an expired session left: its shared QoS 1/2 copies not yet
-- acknowledged, for the node that logs the expiry to hand to other members.
-- KEYS: 1 {c:id}:s session hash, 2-8 the message-state keys (see enqueue_take.lua)
-- ARGV: none
-- Returns: the messages (serialized: byte 2 holds the QoS in bits 0-1 and
--   "has a share group" in bit 5), inflight ones not PUBREC'd first, then
--   queued ones; every message-state key is deleted in the same step, so one
--   caller gets them. Nothing if the client has a session (again): release.lua
--   and adopt.lua let these keys outlive the session hash by a grace period.
if redis.call('EXISTS', KEYS[1]) == 1 then return {} end
local out = {}
local function keep(m)
  local flags = string.byte(m, 2)
  if flags % 4 > 0 and math.floor(flags / 32) % 2 == 1 then out[#out + 1] = m end
end
for _, pid in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
  if redis.call('SISMEMBER', KEYS[7], pid) == 0 then
    local m = redis.call('HGET', KEYS[5], pid)
    if m then keep(m) end
  end
end
for _, seq in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local m = redis.call('HGET', KEYS[2], seq)
  if m then keep(m) end
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return out
