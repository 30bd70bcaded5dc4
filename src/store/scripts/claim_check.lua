-- Claims a pool's next check round: the first replica to ask in an interval gets it and
-- the members to probe; every other replica (and this one, until the interval has passed)
-- is told to wait. The claim is a key that expires after the interval, so a replica that
-- dies mid-round holds nothing for longer than that.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1] interval in ms, ARGV[2] most members to probe.
-- Returns {-1} when the pool does not exist, {1, 0} when the round is not this replica's,
-- else {1, 1, eligible members, cooling-down members (soonest return first)}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
if not redis.call('SET', KEYS[12], '1', 'NX', 'PX', ARGV[1]) then
    return {1, 0}
end
local limit = tonumber(ARGV[2])
local eligible = redis.call('ZRANGE', KEYS[2], 0, limit - 1)
local cooling = {}
if #eligible < limit then
    cooling = redis.call('ZRANGE', KEYS[10], 0, limit - #eligible - 1)
end
return {1, 1, eligible, cooling}
