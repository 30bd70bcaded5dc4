-- Moves members from the eligible to the ineligible set, keeping their counts, and records
-- why and when. An assign running at the same moment sees a member either before or after
-- the move, never half-moved, because both happen inside scripts.
-- A member cooling down is taken over by the operator: its scheduled return is cancelled
-- and the operator's reason replaces `unhealthy`, so it never comes back by itself.
-- A member keeps its live leases: they stay valid until released or expired, but it
-- leaves the choosing order of a least-in-flight pool.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1..2] the chunk's bound (see chunk.lua), ARGV[3] reason, ARGV[4..] member ids.
-- Returns {-1} when the pool does not exist, else
-- {1, {1 = disabled | 2 = already ineligible | 0 = unknown ...}}, with an outcome for each
-- of the first members, all of them unless the chunk stopped at its bound, then the
-- microseconds the script ran (see chunk.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local since = ms_text(now_ms())
local lif = least_in_flight()
local outcome = {}
local reason = ARGV[3]
for i = 4, #ARGV do
    local member = ARGV[i]
    if take_out(member, since, reason, lif) then
        outcome[#outcome + 1] = 1
    elseif redis.call('ZREM', KEYS[10], member) == 1 then
        redis.call('HSET', KEYS[4], member, since .. ' ' .. reason)
        outcome[#outcome + 1] = 1
    elseif redis.call('ZSCORE', KEYS[3], member) then
        outcome[#outcome + 1] = 2
    else
        outcome[#outcome + 1] = 0
    end
    if chunk_spent(i - 3, #ARGV - 3) then
        break
    end
end
return {1, outcome}
