-- Forgets members entirely, eligible or not, history and health included.
-- A removed member's live leases end with it (not counted as abandoned): releasing or
-- renewing one afterwards finds no lease.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1..] member ids.
-- Returns {-1} when the pool does not exist, else {1, {1 = removed | 0 = unknown ...}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local lif = least_in_flight()
local removed = {}
local outcome = {}
for i = 1, #ARGV do
    local member = ARGV[i]
    removed[member] = true
    outcome[#outcome + 1] = forget(member, lif)
end
if lif and redis.call('HLEN', KEYS[7]) > 0 then
    -- Leases are kept by id, so finding a member's takes one pass over the pool's live
    -- leases: fine for a rare operator call, and never done on the assign path. The
    -- members are already out of the order, so ending their leases does not re-place them.
    local leases = redis.call('HGETALL', KEYS[7])
    for i = 1, #leases, 2 do
        if removed[leases[i + 1]] then
            end_lease(leases[i])
        end
    end
end
return {1, outcome}
