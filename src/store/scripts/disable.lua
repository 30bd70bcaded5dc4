-- Moves members from the eligible to the ineligible set, keeping their counts, and records
-- why and when. An assign running at the same moment sees a member either before or after
-- the move, never half-moved, because both happen inside scripts.
-- A member keeps its live leases: they stay valid until released or expired, but it
-- leaves the choosing order of a least-in-flight pool.
-- KEYS as in leases.lua.
-- ARGV[1] reason, ARGV[2..] member ids.
-- Returns {-1} when the pool does not exist, else
-- {1, {1 = disabled | 2 = already ineligible | 0 = unknown ...}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local t = redis.call('TIME')
local since = t[1] .. string.format('%03d', math.floor(t[2] / 1000))
local lif = least_in_flight()
local outcome = {}
for i = 2, #ARGV do
    local member = ARGV[i]
    local count = redis.call('ZSCORE', KEYS[2], member)
    if count then
        if lif then
            unplace(member)
        end
        redis.call('ZREM', KEYS[2], member)
        redis.call('ZADD', KEYS[3], count, member)
        redis.call('HSET', KEYS[4], member, since .. ' ' .. ARGV[1])
        outcome[#outcome + 1] = 1
    elseif redis.call('ZSCORE', KEYS[3], member) then
        outcome[#outcome + 1] = 2
    else
        outcome[#outcome + 1] = 0
    end
end
return {1, outcome}
