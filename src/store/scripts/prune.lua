-- Applies the pool's prune rules one batch at a time. First, with a source, its members
-- last listed at or before a given fetch (a range of the seen set) leave the seen set and
-- become due for removal. Then due members are looked at, earliest first: one that has
-- gone is dropped from the set, one with live leases waits (moved to the back), one still
-- due is removed and counted, one no longer due (a passing check, seen again, the rule
-- switched off) is dropped from the set. Still due: its checks failed in a row reach
-- `after_failed_checks` and it was not added by hand (unless `manual`), or it came from
-- a source, `absent_from_source_fetches` is set, and it is out of the seen set.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1] batch size, ARGV[2] and ARGV[3] the lowest and highest place in the seen set
-- of the source's stale members, or '' for none.
-- Returns {-1} when the pool does not exist, else {1, {removed member, ...}, more} with
-- more 1 when a batch was full and another call may do more.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
local batch = tonumber(ARGV[1])
local more = 0
if ARGV[2] ~= '' then
    local stale = redis.call('ZRANGE', KEYS[18], ARGV[2], ARGV[3], 'BYSCORE', 'LIMIT', 0, batch)
    for _, member in ipairs(stale) do
        redis.call('ZREM', KEYS[18], member)
        redis.call('ZADD', KEYS[20], 'NX', now, member)
    end
    if #stale == batch then
        more = 1
    end
end
local rules = prune_config()
local lif = least_in_flight()
local removed = {}
local due = redis.call('ZRANGE', KEYS[20], 0, batch - 1)
for _, member in ipairs(due) do
    local origin = redis.call('HGET', KEYS[17], member)
    local fails = tonumber(redis.call('HGET', KEYS[19], member)) or 0
    local by_checks = rules.checks > 0 and fails >= rules.checks and (origin or rules.manual)
    local by_absence = rules.absent > 0 and origin and string.sub(origin, 1, 1) == 's'
        and not redis.call('ZSCORE', KEYS[18], member)
    if not redis.call('ZSCORE', KEYS[2], member) and not redis.call('ZSCORE', KEYS[3], member) then
        redis.call('ZREM', KEYS[20], member)
    elseif redis.call('HGET', KEYS[6], member) then
        redis.call('ZADD', KEYS[20], now, member)
    elseif by_checks or by_absence then
        forget(member, lif)
        redis.call('HINCRBY', KEYS[1], 'pruned', 1)
        removed[#removed + 1] = member
    else
        redis.call('ZREM', KEYS[20], member)
    end
end
if #removed > 0 and #due == batch then
    more = 1
end
return {1, removed, more}
