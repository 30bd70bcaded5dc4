-- Applies outcome reports, in order, to members' failure streaks (the rules are
-- `apply_report` in report.lua, which the assign that carries a report shares). Never
-- touches counts.
-- Checks also count the member's failed checks in a row, for pruning (see prune.lua).
-- KEYS as in labels.lua, leases.lua and health.lua, then [16] the pool's sources, [17..20]
-- its origins, seen, check_fails and prune keys (keys.rs), [21] its ban index (sorted set:
-- target -> when its bans are all forgotten, ms) and [22] pacing, and when reports name
-- targets [23..] one ban hash per target named, "<KEYS[21]>:<target>"
-- (member -> "<until_ms> <ban_ms> <bans in a row>"), expiring when its bans are all
-- forgotten (see keys.rs).
-- ARGV[1] 'worker' or 'check', ARGV[2] jitter draw in [-1, 1], ARGV[3] most targets per
-- pool, ARGV[4] most expired targets to clear, then per report member, result
-- (ok | failed | blocked), detail (checks: what the probe saw), latency in milliseconds
-- (empty for none; a worker's counts in the member's quality, a check's is shown with it), the KEYS slot of its target's ban hash ('' for
-- none).
-- Returns {-1} when the pool does not exist, else {1, {effect, streak, banned_until, ...},
-- due hint} with effect 0 = unknown, 1 = counted, 2 = tripped, 3 = ignored, 4 = returned,
-- 5 = banned, banned_until the end of the member's ban for the report's target (0 when
-- none), and the hint the pool's new earliest due time, or 0 (see `due_by` in leases.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local ctx = report_context(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
local now = ctx.now
local check = ctx.check
local prune = prune_config()

local out = {}
for i = 5, #ARGV, 5 do
    local member, result, slot = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 4])
    local effect, streak, banned_until = apply_report(ctx, member, result, slot, ARGV[i + 3])
    if check and effect ~= 0 then
        local latency = ARGV[i + 3] ~= '' and ('/' .. ARGV[i + 3]) or ''
        redis.call('HSET', KEYS[11], member,
            ms_text(now) .. ' ' .. result .. latency .. ' ' .. ARGV[i + 2])
        -- Checks failed in a row, for `prune.after_failed_checks`: reaching it makes the
        -- member due for removal (prune.lua removes it once it has no live lease).
        if result == 'ok' then
            redis.call('HDEL', KEYS[19], member)
        else
            local fails = redis.call('HINCRBY', KEYS[19], member, 1)
            if prune.checks > 0 and fails >= prune.checks
                and (prune.manual or redis.call('HEXISTS', KEYS[17], member) == 1) then
                redis.call('ZADD', KEYS[20], 'NX', now, member)
            end
        end
    end
    out[#out + 1] = effect
    out[#out + 1] = streak
    out[#out + 1] = banned_until
end
return {1, out, due_hint or 0}
