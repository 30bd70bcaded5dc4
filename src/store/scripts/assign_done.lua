-- How the worker's previous use of the pool ended (`done`), applied before the pick in the
-- same script call: put after assign_done_fast.lua (which answers the `done` that changes
-- nothing and the release of a live lease on a pool without labels, with the plain assign
-- as its `pick`), the helpers and report.lua, and followed
-- by assign_fast.lua and assign.lua wrapped in `local function pick_after_done()`, which
-- uses these helpers (see `picking_after_done` in redis/scripts.rs). The report and the
-- release are applied first, so that the pick sees what they did (a member the report
-- takes out is not picked), and then `return with_done(done, pick_after_done())`.
-- KEYS and ARGV are the assign's (see assign.lua; in a session, its two keys and its ARGV[6]
-- included, so that the pick judges the session's member after the report and the
-- release: one they took out is re-pinned), then, after them, this part's own: when
-- the report names a target, one more key, its ban hash (see report.lua); and eight
-- arguments: the member reported about ('' for the lease's member), the result
-- (ok | failed | blocked, '' for no report), the lease to release ('' for none), '1' when
-- the last key is the report's ban hash ('' otherwise), the jitter draw in [-1, 1], most
-- targets per pool and most expired targets to clear (as outcomes.lua's ARGV[2..4]), and
-- the request's latency in ms ('' for none). They
-- are taken off the end of KEYS and ARGV before the pick, which so sees exactly the
-- arguments of an assign without `done`.
-- Returns {-1} when the pool does not exist, else
-- {1, effect, streak, banned_until, released, due hint, member, the pick's reply...}, flat
-- (see `done_reply` in assign_done_fast.lua; in a session the pick's reply is
-- {3, ends_ms, repinned, {the answer}} or {-3}, as assign.lua answers it), with
-- effect -1 when there was no report, else as `apply_report` answers it, released 1 when
-- the lease was live and is now ended (0 otherwise), the hint the pool's new earliest due
-- time after the report and the pick, or 0 (see `due_by` in leases.lua), and the member
-- reported about ('' when none: no report, or a lease unknown).
local DONE_ARGS = 8

local function apply_done()
    local n = #ARGV
    local member, result, lease = ARGV[n - 7], ARGV[n - 6], ARGV[n - 5]
    local slot = ARGV[n - 4] == '1' and #KEYS or nil
    local draw, max_targets, cleanup = ARGV[n - 3], ARGV[n - 2], ARGV[n - 1]
    local latency = ARGV[n]
    local answer = false
    if redis.call('EXISTS', KEYS[1]) == 1 then
        local released = 0
        if lease ~= '' then
            -- The member of a lease that expired and was not reclaimed yet is still known:
            -- the report is about it all the same.
            if member == '' then
                member = redis.call('HGET', KEYS[7], lease) or ''
            end
            if live(lease, now_ms()) and end_lease(lease) then
                released = 1
            end
        end
        local effect, streak, banned_until = -1, 0, 0
        if result ~= '' then
            if member == '' then
                effect = 0
            else
                local ctx = report_context('worker', draw, max_targets, cleanup)
                effect, streak, banned_until = apply_report(ctx, member, result, slot, latency)
            end
        end
        answer = {effect, streak, banned_until, released, 0, member}
    end
    for _ = 1, DONE_ARGS do
        ARGV[#ARGV] = nil
    end
    if slot then
        KEYS[#KEYS] = nil
    end
    return answer
end

-- The whole answer from what `done` did and what the pick replied.
local function with_done(done, picked)
    if not done then
        return {-1}
    end
    done[5] = due_hint or 0
    return done_reply(done, picked)
end

done = apply_done()
