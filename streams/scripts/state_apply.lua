-- state_apply.lua: fold one chunk of a batch's newest-per-key rows into the
-- state store, keeping only what is newer than what it holds (DESIGN 3), so
-- a batch applied twice, or two chunks in any order, leave the same state.
--
-- KEYS (all under one hash tag, `{<topic prefix>state}:`):
--   1 sessions      client -> newest session event (the log's JSON)
--   2 session_v     client -> its version
--   3 session_node  client -> node of that event (where its routes count)
--   4 floors        client -> version below which its subscriptions were cleared
--   5 subs          client \0 filter -> "version|live|qos|no_local|rap|rh|sid|ts_ms|node"
--   6 client_subs   client -> JSON array of its filters present in subs
--   7 routes        filter \0 node -> live subscriptions of that filter on that node
--   8 retained      topic -> newest retained event (the log's JSON)
--   9 retained_v    topic -> its version
--  10 offsets       topic:partition -> next offset the state reflects
--  11 meta          batch, updated_ms, ...
-- ARGV: 1 sessions n, 2 floors n, 3 subs n, 4 retained n, 5 offsets n,
--       6 batch id ("" for none), 7 now ms, then the rows in that order:
--   session (client, version, node, json), floor (client, version),
--   sub (client, filter, version, value), retained (topic, version, json),
--   offset (topic:partition, next offset).
-- Returns {sessions, floors, subs, retained} rows that changed the state.

local n_sessions, n_floors, n_subs = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n_retained, n_offsets = tonumber(ARGV[4]), tonumber(ARGV[5])
local SEP = '\0'
local changed = {0, 0, 0, 0}
local i = 8

local function route(filter, node, delta)
  local field = filter .. SEP .. node
  if redis.call('HINCRBY', KEYS[7], field, delta) <= 0 then
    redis.call('HDEL', KEYS[7], field)
  end
end

-- Filter lists are decoded once per client per call and written back at the end.
local lists, dirty = {}, {}

local function filters_of(client)
  local list = lists[client]
  if list == nil then
    local raw = redis.call('HGET', KEYS[6], client)
    list = raw and cjson.decode(raw) or {}
    lists[client] = list
  end
  return list
end

local function set_filters(client, list)
  lists[client] = list
  dirty[client] = true
end

local function entry(field)  -- version, live of a stored subscription
  local raw = redis.call('HGET', KEYS[5], field)
  if not raw then return 0, false end
  local v, live = string.match(raw, '^(%d+)|(%d)')
  return tonumber(v), live == '1'
end

local function node_of(client)
  return redis.call('HGET', KEYS[3], client) or ''
end

for _ = 1, n_sessions do
  local client, version, node, json = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  if version > tonumber(redis.call('HGET', KEYS[2], client) or '0') then
    redis.call('HSET', KEYS[1], client, json)
    redis.call('HSET', KEYS[2], client, version)
    local old = node_of(client)
    if old ~= node then  -- its live subscriptions now count on the new node
      for _, filter in ipairs(filters_of(client)) do
        local _, live = entry(client .. SEP .. filter)
        if live then
          route(filter, old, -1)
          route(filter, node, 1)
        end
      end
      redis.call('HSET', KEYS[3], client, node)
    end
    changed[1] = changed[1] + 1
  end
end

for _ = 1, n_floors do
  local client, floor = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  if floor > tonumber(redis.call('HGET', KEYS[4], client) or '0') then
    redis.call('HSET', KEYS[4], client, floor)
    local kept, node = {}, node_of(client)
    for _, filter in ipairs(filters_of(client)) do
      local field = client .. SEP .. filter
      local v, live = entry(field)
      if v < floor then
        if live then route(filter, node, -1) end
        redis.call('HDEL', KEYS[5], field)
      else
        kept[#kept + 1] = filter
      end
    end
    set_filters(client, kept)
    changed[2] = changed[2] + 1
  end
end

for _ = 1, n_subs do
  local client, filter, version, value = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  i = i + 4
  local field = client .. SEP .. filter
  local held, was_live = entry(field)
  if version > held and version > tonumber(redis.call('HGET', KEYS[4], client) or '0') then
    local live = string.match(value, '^%d+|(%d)') == '1'
    redis.call('HSET', KEYS[5], field, value)
    if held == 0 then
      local list = filters_of(client)
      list[#list + 1] = filter
      dirty[client] = true
    end
    if live ~= was_live then route(filter, node_of(client), live and 1 or -1) end
    changed[3] = changed[3] + 1
  end
end

for client in pairs(dirty) do
  local list = lists[client]
  if #list == 0 then
    redis.call('HDEL', KEYS[6], client)
  else
    redis.call('HSET', KEYS[6], client, cjson.encode(list))
  end
end

for _ = 1, n_retained do
  local topic, version, json = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  i = i + 3
  if version > tonumber(redis.call('HGET', KEYS[9], topic) or '0') then
    redis.call('HSET', KEYS[8], topic, json)
    redis.call('HSET', KEYS[9], topic, version)
    changed[4] = changed[4] + 1
  end
end

for _ = 1, n_offsets do
  redis.call('HSET', KEYS[10], ARGV[i], ARGV[i + 1])
  i = i + 2
end

if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[11], 'batch', ARGV[6], 'updated_ms', ARGV[7])
end
return changed
