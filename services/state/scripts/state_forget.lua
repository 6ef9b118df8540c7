-- state_forget.lua: forget ended clients and cleared retained topics in the
-- state store, as the node's ClusterView forgets them (rule 4), so the store
-- stays as bounded as the view. A key is forgotten only if the store holds
-- nothing newer than the version the view forgot (the client came back, or
-- the topic was set again, since: then it stays).
--
-- KEYS: the state store's keys in state_apply.lua's order (sessions,
--   session_v, session_node, floors, subs, routes, retained, retained_v,
--   offsets, meta).
-- ARGV: 1 clients n, 2 topics n, then (client, version) pairs, then
--   (topic, version) pairs.
-- Returns the number of keys forgotten.

local n_clients, n_topics = tonumber(ARGV[1]), tonumber(ARGV[2])
local forgotten = 0
local i = 3

local function has_live(raw)
  if not raw then return false end
  for _, value in pairs(cjson.decode(raw)) do
    if string.match(value, '^%d+|(%d)') == '1' then return true end
  end
  return false
end

for _ = 1, n_clients do
  local client, version = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local held = tonumber(redis.call('HGET', KEYS[2], client) or '0')
  if held <= version and not has_live(redis.call('HGET', KEYS[5], client)) then
    redis.call('HDEL', KEYS[1], client)
    redis.call('HDEL', KEYS[2], client)
    redis.call('HDEL', KEYS[3], client)
    redis.call('HDEL', KEYS[4], client)
    redis.call('HDEL', KEYS[5], client)
    forgotten = forgotten + 1
  end
end

for _ = 1, n_topics do
  local topic, version = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  if tonumber(redis.call('HGET', KEYS[8], topic) or '0') <= version then
    redis.call('HDEL', KEYS[7], topic)
    redis.call('HDEL', KEYS[8], topic)
    forgotten = forgotten + 1
  end
end

return forgotten
