-- Ends a live lease at its holder's request. An unknown, ended or expired lease changes
-- nothing: an expired one is left for the sweep (or an assign), which counts it as
-- abandoned.
-- KEYS as in leases.lua. ARGV[1] lease id.
-- Returns {-1} when the pool does not exist, {1, 0} when the lease is not live,
-- {1, 1} when it was released.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
if not live(ARGV[1], now_ms()) then
    return {1, 0}
end
end_lease(ARGV[1])
return {1, 1}
