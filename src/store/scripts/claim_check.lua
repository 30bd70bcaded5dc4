-- Claims a pool's next check round: the first replica to ask in an interval gets it and
-- the members to probe; every other replica (and this one, until the interval has passed)
-- is told to wait. The claim is a key that expires after the interval, so a replica that
-- dies mid-round holds nothing for longer than that.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1] interval in ms, ARGV[2] most members to probe.
-- Returns {-1} when the pool does not exist, {1, 0, next} when the round is not this
-- replica's, else {1, 1, next, eligible members, cooling-down members (soonest return
-- first)}, next being when the claim ends (ms, Redis clock): when the pool's next round may
-- start, for the check index (redis/keys.rs).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not redis.call('SET', KEYS[12], '1', 'NX', 'PX', ARGV[1]) then
    return {1, 0, now + math.max(redis.call('PTTL', KEYS[12]), 0)}
end
local limit = tonumber(ARGV[2])
local eligible = redis.call('ZRANGE', KEYS[2], 0, limit - 1)
local cooling = {}
if #eligible < limit then
    cooling = redis.call('ZRANGE', KEYS[10], 0, limit - #eligible - 1)
end
return {1, 1, now + tonumber(ARGV[1]), eligible, cooling}
