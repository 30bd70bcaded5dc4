-- Reads a pool's configuration and numbers in one consistent snapshot.
-- KEYS: the first eight of leases.lua's (POOL_INFO_KEY_PARTS in keys.rs); it reads 1 (meta),
-- 2 (eligible), 3 (ineligible) and 8 (lease_expiry).
-- Returns {-1} when the pool does not exist, else {1, config, created_ms, total_assignments,
-- eligible, ineligible, min_assignments, max_assignments, in_flight, abandoned, tripped,
-- recovered, pruned, shared_exit_ips, country_mismatches}. Positional, unlike the other replies read by an operator: a page of the
-- pool listing reads a thousand of them, and names doubled each reply's items.
-- min_assignments and max_assignments are nil when no member is eligible; total_assignments,
-- abandoned, tripped, recovered, pruned, shared_exit_ips and country_mismatches nil when
-- they never happened (the last two are kept by labels.lua).
local meta = redis.call('HMGET', KEYS[1], 'config', 'created_ms', 'total_assignments', 'abandoned',
    'tripped', 'recovered', 'pruned', 'shared_exit_ips', 'country_mismatches')
if not meta[1] then
    return {-1}
end
local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local highest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
return {
    1,
    meta[1],
    meta[2],
    meta[3],
    redis.call('ZCARD', KEYS[2]),
    redis.call('ZCARD', KEYS[3]),
    lowest[2] or false,
    highest[2] or false,
    redis.call('ZCARD', KEYS[8]),
    meta[4],
    meta[5],
    meta[6],
    meta[7],
    meta[8],
    meta[9],
}
