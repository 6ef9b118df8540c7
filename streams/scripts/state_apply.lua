-- state_apply.lua: fold one chunk of a batch's newest-per-key rows into the
-- state store, keeping only what is newer than what it holds (DESIGN 3), so
-- a batch applied twice, or two chunks in any order, leave the same state.
-- The rules are services/state/view.py's (the reference fold of the log);
-- tests/streams/test_statestore.py holds this script and the Spark fold to it.
--
-- KEYS (all under one hash tag, `{<topic prefix>state}:`):
--   1 sessions      client -> newest session event (the log's JSON)
--   2 session_v     client -> its version
--   3 session_node  client -> node of that event (where its routes count)
--   4 floors        client -> version below which its subscriptions were cleared
--   5 subs          client -> JSON object: filter -> "version|live|qos|no_local|rap|rh|sid|ts_ms|node"
--                   (one field per client: a node loads a client's subscriptions at once)
--   6 routes        filter \0 node -> live subscriptions of that filter on that node
--   7 retained      topic -> newest retained event (the log's JSON)
--   8 retained_v    topic -> its version
--   9 offsets       topic:partition -> next offset the state reflects
--  10 meta          batch, updated_ms, generation (services.statestore)
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
  if redis.call('HINCRBY', KEYS[6], field, delta) <= 0 then
    redis.call('HDEL', KEYS[6], field)
  end
end

-- Each client's subscriptions are decoded once per call and written back at the end.
local objs, dirty = {}, {}

local function subs_of(client)
  local obj = objs[client]
  if obj == nil then
    local raw = redis.call('HGET', KEYS[5], client)
    obj = raw and cjson.decode(raw) or {}
    objs[client] = obj
  end
  return obj
end

local function parse(value)  -- version, live of a stored subscription
  if not value then return 0, false end
  local v, live = string.match(value, '^(%d+)|(%d)')
  return tonumber(v), live == '1'
end

local function node_of(client)
  return redis.call('HGET', KEYS[3], client) or ''
end

-- A client with a few rows here has them edited into its stored JSON as text:
-- decoding and re-encoding every filter it holds made its n-th SUBSCRIBE cost
-- O(n) table work (the embedded default writes each SUBSCRIBE before its
-- SUBACK). Many rows of one client (a re-seed, a batch) decode it once instead.
local TEXT_ROWS = 4
local texts, edited = {}, {}  -- client -> its stored JSON, edited as text (never decoded)

local function json_string(s)  -- as cjson writes it, '\/' unescaped (see the end)
  return (string.gsub(cjson.encode(s), '\\/', '/'))
end

local function string_end(raw, from)  -- the closing quote of the JSON string whose text starts at from
  while true do
    local q = string.find(raw, '"', from, true)
    local b = q - 1
    while string.byte(raw, b) == 92 do b = b - 1 end  -- a quote after an even run of '\' closes
    if (q - 1 - b) % 2 == 0 then return q end
    from = q + 1
  end
end

-- The stored value of `filter` in `raw` and where its text starts and ends (quotes excluded).
-- A key is found only where an object member starts ('{' or ',' then '"'): inside a JSON
-- string a quote is always escaped, so neither is ever found within a key or a value.
local function text_value(raw, filter)
  local key = json_string(filter) .. ':"'
  local at = string.find(raw, '{' .. key, 1, true) or string.find(raw, ',' .. key, 1, true)
  if not at then return nil end
  local from = at + 1 + #key
  local to = string_end(raw, from) - 1
  return string.sub(raw, from, to), from, to
end

local function set_text(client, filter, value)
  local raw = texts[client]
  local old, from, to = text_value(raw, filter)
  local encoded = json_string(value)
  edited[client] = true
  if old then
    texts[client] = string.sub(raw, 1, from - 2) .. encoded .. string.sub(raw, to + 2)
  elseif raw == '{}' then
    texts[client] = '{' .. json_string(filter) .. ':' .. encoded .. '}'
  else
    texts[client] = string.sub(raw, 1, -2) .. ',' .. json_string(filter) .. ':' .. encoded .. '}'
  end
end

for _ = 1, n_sessions do
  local client, version, node, json = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  if version > tonumber(redis.call('HGET', KEYS[2], client) or '0') then
    redis.call('HSET', KEYS[1], client, json)
    redis.call('HSET', KEYS[2], client, version)
    local old = node_of(client)
    if old ~= node then  -- its live subscriptions now count on the new node
      for filter, value in pairs(subs_of(client)) do
        local _, live = parse(value)
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
    local obj, node = subs_of(client), node_of(client)
    for filter, value in pairs(obj) do
      local v, live = parse(value)
      if v < floor then
        if live then route(filter, node, -1) end
        obj[filter] = nil
        dirty[client] = true
      end
    end
    changed[2] = changed[2] + 1
  end
end

local rows_of = {}  -- client -> its rows here
for r = 0, n_subs - 1 do
  local client = ARGV[i + 4 * r]
  rows_of[client] = (rows_of[client] or 0) + 1
end

for _ = 1, n_subs do
  local client, filter, version, value = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  i = i + 4
  local as_text = objs[client] == nil and rows_of[client] <= TEXT_ROWS
  if as_text and texts[client] == nil then
    texts[client] = redis.call('HGET', KEYS[5], client) or '{}'
  end
  local held, was_live
  if as_text then
    held, was_live = parse((text_value(texts[client], filter)))
  else
    held, was_live = parse(subs_of(client)[filter])
  end
  if version > held and version > tonumber(redis.call('HGET', KEYS[4], client) or '0') then
    local live = string.match(value, '^%d+|(%d)') == '1'
    if as_text then
      set_text(client, filter, value)
    else
      objs[client][filter] = value
      dirty[client] = true
    end
    if live ~= was_live then route(filter, node_of(client), live and 1 or -1) end
    changed[3] = changed[3] + 1
  end
end

for client in pairs(edited) do
  redis.call('HSET', KEYS[5], client, texts[client])
end

for client in pairs(dirty) do
  if next(objs[client]) == nil then
    redis.call('HDEL', KEYS[5], client)
  else
    -- cjson writes '/' as '\/' (every '/' it writes is escaped, so a '\/' is one):
    -- unescaped, a node's JSON decoder reads the million filters faster.
    redis.call('HSET', KEYS[5], client, (string.gsub(cjson.encode(objs[client]), '\\/', '/')))
  end
end

for _ = 1, n_retained do
  local topic, version, json = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  i = i + 3
  if version > tonumber(redis.call('HGET', KEYS[8], topic) or '0') then
    redis.call('HSET', KEYS[7], topic, json)
    redis.call('HSET', KEYS[8], topic, version)
    changed[4] = changed[4] + 1
  end
end

for _ = 1, n_offsets do
  redis.call('HSET', KEYS[9], ARGV[i], ARGV[i + 1])
  i = i + 2
end

if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[10], 'batch', ARGV[6], 'updated_ms', ARGV[7])
end
return changed
