-- Forgets members entirely, eligible or not, history and health included.
-- A removed member's live leases end with it (not counted as abandoned): releasing or
-- renewing one afterwards finds no lease.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1..2] the chunk's bound (see chunk.lua), ARGV[3..] member ids.
-- Returns {-1} when the pool does not exist, else {1, {1 = removed | 0 = unknown ...}},
-- with an outcome for each of the first members, all of them unless the chunk stopped at
-- its bound, then the microseconds the script ran (see chunk.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local lif = least_in_flight()
local removed = {}
local outcome = {}
-- Whether any of the members holds a live lease (its count in `in_flight`, which `forget`
-- leaves to `end_lease`): only then are the pool's leases looked through.
local holding = false
for i = 3, #ARGV do
    local member = ARGV[i]
    removed[member] = true
    if lif and not holding and redis.call('HEXISTS', KEYS[6], member) == 1 then
        holding = true
    end
    outcome[#outcome + 1] = forget(member, lif)
    if chunk_spent(i - 2, #ARGV - 2) then
        break
    end
end
if holding then
    -- Leases are kept by id, so finding a member's takes one pass over the pool's live
    -- leases: done only for a chunk whose members hold some, never on the assign path. The
    -- members are already out of the order, so ending their leases does not re-place them.
    local leases = redis.call('HGETALL', KEYS[7])
    for i = 1, #leases, 2 do
        if removed[leases[i + 1]] then
            end_lease(leases[i])
        end
    end
end
return {1, outcome}
