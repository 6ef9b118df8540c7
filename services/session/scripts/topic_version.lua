-- The next event version of a retained topic (any node may write it).
-- KEYS: 1 {t:topic}:v version string
-- ARGV: 1 TTL of the key in ms
-- Returns: the version, max(last + 1, Redis time in us). Because it is a
-- clock, the key may expire (no leak per topic ever retained): a later
-- version still sorts after every earlier one.
local t = redis.call('TIME')
local v = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1,
  tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('SET', KEYS[1], string.format('%.0f', v), 'PX', ARGV[1])
return v
