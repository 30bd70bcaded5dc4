-- Returns members to the eligible set under a restore policy, atomically with reading the
-- current minimum, so that no assign can move the minimum between the read and the write.
-- Every member of one call is placed against the minimum of the members that were eligible
-- before the call. The rule is RestorePolicy::restored_count in the service:
--   minimum: the current minimum (its kept count when nothing is eligible)
--   history: max(kept count, current minimum) (its kept count when nothing is eligible)
--   zero:    0
-- Policies apply to the cumulative count only: on a least-in-flight pool the member comes
-- back into the choosing order with the live leases it still holds.
-- KEYS as in leases.lua.
-- ARGV[1] policy or '' for the pool's own, ARGV[2..] member ids.
-- Returns {-1} when the pool does not exist, else
-- {1, policy, {outcome, kept, restored, ...}} with outcome 1 = enabled,
-- 2 = already eligible, 0 = unknown.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local policy = ARGV[1]
if policy == '' then
    policy = redis.call('HGET', KEYS[1], 'restore') or 'minimum'
end
local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
local minimum = lowest and tonumber(lowest)
local lif = least_in_flight()
local outcome = {}
for i = 2, #ARGV do
    local member = ARGV[i]
    local kept = redis.call('ZSCORE', KEYS[3], member)
    if kept then
        kept = tonumber(kept)
        local restored
        if policy == 'zero' then
            restored = 0
        elseif not minimum then
            restored = kept
        elseif policy == 'history' then
            restored = math.max(kept, minimum)
        else
            restored = minimum
        end
        redis.call('ZREM', KEYS[3], member)
        redis.call('HDEL', KEYS[4], member)
        redis.call('ZADD', KEYS[2], restored, member)
        if lif then
            place(member)
        end
        outcome[#outcome + 1] = 1
        outcome[#outcome + 1] = kept
        outcome[#outcome + 1] = restored
    else
        if redis.call('ZSCORE', KEYS[2], member) then
            outcome[#outcome + 1] = 2
        else
            outcome[#outcome + 1] = 0
        end
        outcome[#outcome + 1] = 0
        outcome[#outcome + 1] = 0
    end
end
return {1, policy, outcome}
