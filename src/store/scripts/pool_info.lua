-- Reads a pool's configuration and numbers in one consistent snapshot.
-- KEYS as in leases.lua.
-- Returns {-1} when the pool does not exist, else
-- {1, config, created_ms, total_assignments, eligible, ineligible, min or nil, max or nil,
--  live leases, abandoned or nil, tripped or nil, recovered or nil}.
local meta = redis.call('HMGET', KEYS[1], 'config', 'created_ms', 'total_assignments', 'abandoned',
    'tripped', 'recovered')
if not meta[1] then
    return {-1}
end
local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local highest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
return {
    1, meta[1], meta[2], meta[3],
    redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
    lowest[2] or false, highest[2] or false,
    redis.call('ZCARD', KEYS[8]), meta[4], meta[5], meta[6],
}
