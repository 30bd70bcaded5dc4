-- Reads a pool's configuration and numbers in one consistent snapshot.
-- KEYS as in leases.lua.
-- Returns {-1} when the pool does not exist, else {1, name, value, name, value, ...}: every
-- value after its name, in the order below (`PoolInfoReply` in reply.rs reads them so);
-- min_assignments and max_assignments are nil when no member is eligible, abandoned,
-- tripped, recovered and pruned when they never happened.
local meta = redis.call('HMGET', KEYS[1], 'config', 'created_ms', 'total_assignments', 'abandoned',
    'tripped', 'recovered', 'pruned')
if not meta[1] then
    return {-1}
end
local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local highest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
return {
    1,
    'config', meta[1],
    'created_ms', meta[2],
    'total_assignments', meta[3],
    'eligible', redis.call('ZCARD', KEYS[2]),
    'ineligible', redis.call('ZCARD', KEYS[3]),
    'min_assignments', lowest[2] or false,
    'max_assignments', highest[2] or false,
    'in_flight', redis.call('ZCARD', KEYS[8]),
    'abandoned', meta[4],
    'tripped', meta[5],
    'recovered', meta[6],
    'pruned', meta[7],
}
