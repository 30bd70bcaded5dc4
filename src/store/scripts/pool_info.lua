-- Reads a pool's configuration and numbers in one consistent snapshot.
-- KEYS[1] meta hash, KEYS[2] eligible sorted set, KEYS[3] ineligible sorted set.
-- Returns {-1} when the pool does not exist, else
-- {1, config, created_ms, total_assignments, eligible, ineligible, min or nil, max or nil}.
local meta = redis.call('HMGET', KEYS[1], 'config', 'created_ms', 'total_assignments')
if not meta[1] then
    return {-1}
end
local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local highest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
return {
    1, meta[1], meta[2], meta[3],
    redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
    lowest[2] or false, highest[2] or false,
}
