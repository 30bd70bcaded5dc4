-- Returns members to the eligible set under a restore policy, atomically with reading the
-- current minimum, so that no assign can move the minimum between the read and the write.
-- Every member of one call (one chunk of an operator's call, see src/store/chunks.rs) is
-- placed against the minimum of the members that were eligible before the call; `restore` in health.lua holds the rule (the same one brings members
-- back after a cooldown). A cooling-down member enabled here has its scheduled return
-- cancelled.
-- Policies apply to the cumulative count only: on a least-in-flight pool the member comes
-- back into the choosing order with the live leases it still holds.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1..2] the chunk's bound (see chunk.lua), ARGV[3] policy or '' for the pool's own,
-- ARGV[4..] member ids.
-- Returns {-1} when the pool does not exist, else
-- {1, policy, {outcome, kept, restored, ...}} with outcome 1 = enabled,
-- 2 = already eligible, 0 = unknown, for each of the first members, all of them unless the
-- chunk stopped at its bound, then the microseconds the script ran (see chunk.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local policy = ARGV[3]
if policy == '' then
    policy = redis.call('HGET', KEYS[1], 'restore') or 'minimum'
end
local minimum = eligible_minimum()
local lif = least_in_flight()
local outcome = {}
for i = 4, #ARGV do
    local member = ARGV[i]
    local kept, restored = restore(member, policy, minimum, lif)
    if kept then
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
    if chunk_spent(i - 3, #ARGV - 3) then
        break
    end
end
return {1, policy, outcome}
