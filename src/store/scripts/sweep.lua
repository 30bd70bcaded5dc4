-- The background sweep's step on one pool: reclaims up to ARGV[1] leases that expired by
-- now and returns up to ARGV[1] members whose cooldown has ended. Several replicas may run
-- it at once: `end_lease` and `return_due` keep both exact.
-- KEYS as in leases.lua and health.lua.
-- Returns {-1} when the pool does not exist, else {1, reclaimed, returned}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
local limit = tonumber(ARGV[1])
return {1, reclaim_expired(now, limit), return_due(now, limit)}
