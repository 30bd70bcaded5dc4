-- The background sweep's step on one pool: reclaims up to ARGV[3] leases that expired by
-- now and returns up to ARGV[3] members whose cooldown has ended, then writes the time the
-- pool's next work falls due into its `due` field (see `due_by` in leases.lua) and answers
-- it, so that the service puts the pool back into the due index at that time. Several
-- replicas may run it at once: `end_lease` and `return_due` keep both exact.
-- It keeps the bound of a chunk (ARGV[1..2], see chunk.lua): it looks at the clock after
-- every ARGV[2] leases and every ARGV[2] returns, and at the first look past the bound it
-- stops (returning nobody when it stops among the leases) and says so.
-- KEYS as in leases.lua and health.lua.
-- Returns {-1} when the pool does not exist, else {1, reclaimed, returned, next due,
-- stopped} with next due 0 when nothing is scheduled (a time at or before now when a
-- batch was full or the step stopped) and stopped 1 when it stopped at its bound, else 0,
-- then the microseconds the script ran (see chunk.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
local limit = tonumber(ARGV[3])
local reclaimed, stopped = reclaim_expired(now, limit, chunk_spent)
local returned = 0
if not stopped then
    returned, stopped = return_due(now, limit, chunk_spent)
end
local next_due = false
for _, key in ipairs({KEYS[8], KEYS[10]}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
    if first and (not next_due or tonumber(first) < next_due) then
        next_due = tonumber(first)
    end
end
if next_due then
    redis.call('HSET', KEYS[1], 'due', string.format('%.0f', next_due))
else
    redis.call('HDEL', KEYS[1], 'due')
end
return {1, reclaimed, returned, next_due or 0, stopped and 1 or 0}
