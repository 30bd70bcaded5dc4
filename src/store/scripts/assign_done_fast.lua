-- The head of assign_done.lua's script (see `picking_after_done` in redis/scripts.rs), with
-- leases_fast.lua before it, run before any helper exists. A steady worker's `done` is
-- either an `ok` about an eligible member with a clean record (no failures in a row, no
-- backoff), which changes nothing but the member's quality (count_outcome), or, on a least-in-flight pool that never had labels,
-- the release of its live lease, with no result or such an `ok` about the lease's member.
-- Those are answered here, their arguments taken off the end of ARGV (see assign_done.lua
-- for them, and for the answer `done` becomes), and the pick runs as a plain assign does,
-- its fast path included; every other `done` (a failure, a target, an unknown or expired
-- lease, a pool with labels) goes on to assign_done.lua with its arguments in place.
local done = nil
-- The whole answer, flat: 1, what `done` did (see assign_done.lua), then the pick's reply.
-- A nested reply costs the service more to read than all the rest of the answer.
local function done_reply(done, picked)
    return {1, done[1], done[2], done[3], done[4], done[5], done[6], unpack(picked)}
end
do
    local n = #ARGV
    local member, result, lease = ARGV[n - 7], ARGV[n - 6], ARGV[n - 5]
    if ARGV[n - 4] ~= '' or (result ~= 'ok' and (result ~= '' or lease == '')) then
        -- a target's ban, a failure, or nothing to do: assign_done.lua
    elseif lease == '' then
        if member ~= '' and not redis.call('HGET', KEYS[9], member)
            and redis.call('ZSCORE', KEYS[2], member) then
            done = {1, 0, 0, 0, 0, member}
            count_outcome(member, result, ARGV[n])
        end
    elseif member == '' then
        local meta = pool_meta()
        local owner = meta[1] and not meta[5] and redis.call('HGET', KEYS[7], lease)
        local expires = owner and redis.call('ZSCORE', KEYS[8], lease)
        -- The `ok` is checked before the release: once released, nothing may fall back.
        if expires and (result == '' or (not redis.call('HGET', KEYS[9], owner)
            and redis.call('ZSCORE', KEYS[2], owner))) then
            local now = clock_ms()
            if tonumber(expires) > now then
                free_lease(lease, owner)
                done = {result == '' and -1 or 1, 0, 0, 1, 0, owner}
                if result ~= '' then
                    count_outcome(owner, result, ARGV[n])
                end
                -- The release changed none of the meta fields, and the pick runs now.
                known_meta, known_now = meta, now
            end
        end
    end
    if done then
        for _ = 1, 8 do
            ARGV[#ARGV] = nil
        end
    end
end
