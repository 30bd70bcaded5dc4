-- Applies outcome reports, in order, to members' failure streaks. Never touches counts.
-- eligible: ok clears the streak and the backoff; failed/blocked extend the streak, and
--   reaching max_consecutive_failures trips the member (see `trip` in health.lua).
-- cooling down: worker reports are ignored (they may describe requests from before the
--   trip); a check that passes brings the member back now, one that fails trips it again.
-- taken out by an operator: ignored.
-- Checks also count the member's failed checks in a row, for pruning (see prune.lua).
-- KEYS as in leases.lua and health.lua.
-- ARGV[1] 'worker' or 'check', ARGV[2] jitter draw in [-1, 1], then per report
-- member, result (ok | failed | blocked), detail (checks: what the probe saw), latency in
-- milliseconds (checks with an answer; empty otherwise).
-- Returns {-1} when the pool does not exist, else {1, {effect, streak, ...}, due hint} with
-- effect 0 = unknown, 1 = counted, 2 = tripped, 3 = ignored, 4 = returned, and the hint the
-- pool's new earliest due time, or 0 (see `due_by` in leases.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
local check = ARGV[1] == 'check'
local draw = tonumber(ARGV[2])
local cfg = health_config()
local lif = least_in_flight()
local prune = prune_config()
local out = {}
for i = 3, #ARGV, 4 do
    local member, result = ARGV[i], ARGV[i + 1]
    local streak, trips, cooldown = health_of(member)
    local eligible = redis.call('ZSCORE', KEYS[2], member)
    local cooling = not eligible and redis.call('ZSCORE', KEYS[10], member)
    local effect
    if not eligible and not cooling then
        effect = redis.call('ZSCORE', KEYS[3], member) and 3 or 0
    elseif cooling and not check then
        effect = 3
    elseif result == 'ok' then
        streak = 0
        if cooling then
            local policy = redis.call('HGET', KEYS[1], 'restore') or 'minimum'
            restore(member, policy, eligible_minimum(), lif)
            redis.call('HINCRBY', KEYS[1], 'recovered', 1)
            effect = 4
        else
            set_health(member, 0, 0, 0)
            effect = 1
        end
    else
        streak = streak + 1
        if cooling or streak >= cfg.failures then
            trip(member, result == 'blocked' and 'blocked' or 'unhealthy', now, streak, trips,
                cfg, draw, lif)
            effect = 2
        else
            set_health(member, streak, trips, cooldown)
            effect = 1
        end
    end
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
end
return {1, out, due_hint or 0}
