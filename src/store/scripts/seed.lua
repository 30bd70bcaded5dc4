-- Adds members to a pool. New members join the eligible set at the starting count; members
-- already in the pool (eligible or not) keep their count unless reset is asked for.
-- On a least-in-flight pool, added and reset eligible members take their place in the
-- choosing order (they keep any live leases).
-- KEYS as in leases.lua.
-- ARGV[1] explicit starting count or '', ARGV[2] '1' to reset existing members,
-- ARGV[3..] member ids (already validated and de-duplicated).
-- Returns {-1} when the pool does not exist, else {1, start, {1 = added | 0 = existing ...}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local start = ARGV[1]
if start == '' then
    start = redis.call('HGET', KEYS[1], 'start_assignments')
end
if not start then
    -- No agreed count: join at the current minimum so a new member is not flooded.
    start = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2] or '0'
end
local reset = ARGV[2] == '1'
local lif = least_in_flight()
local added = {}
for i = 3, #ARGV do
    local member = ARGV[i]
    local holder = nil
    if redis.call('ZSCORE', KEYS[2], member) then
        holder = KEYS[2]
    elseif redis.call('ZSCORE', KEYS[3], member) then
        holder = KEYS[3]
    end
    if holder then
        if reset then
            if lif then
                unplace(member)
            end
            redis.call('ZADD', holder, start, member)
        end
        added[#added + 1] = 0
    else
        redis.call('ZADD', KEYS[2], start, member)
        added[#added + 1] = 1
    end
    if lif then
        place(member)
    end
end
return {1, tonumber(start), added}
