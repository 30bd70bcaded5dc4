-- Reclaims up to ARGV[1] leases of one pool that expired by now (the background reaper's
-- step; several replicas may run it at once, and `end_lease` keeps it exact).
-- KEYS as in leases.lua.
-- Returns {-1} when the pool does not exist, else {1, how many were reclaimed}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
return {1, reap(now_ms(), tonumber(ARGV[1]))}
