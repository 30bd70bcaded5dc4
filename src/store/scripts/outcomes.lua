-- Applies outcome reports, in order, to members' failure streaks. Never touches counts.
-- eligible: ok clears the streak and the backoff; failed/blocked extend the streak, and
--   reaching max_consecutive_failures trips the member (see `trip` in health.lua).
-- cooling down: worker reports are ignored (they may describe requests from before the
--   trip); a check that passes brings the member back now, one that fails trips it again.
-- taken out by an operator: ignored.
-- blocked with a target, whatever the member's state: bans the member for that target
--   (see `ban` below); the streak stays as it is.
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
-- (checks with an answer; empty otherwise), the KEYS slot of its target's ban hash ('' for
-- none).
-- Returns {-1} when the pool does not exist, else {1, {effect, streak, banned_until, ...},
-- due hint} with effect 0 = unknown, 1 = counted, 2 = tripped, 3 = ignored, 4 = returned,
-- 5 = banned, banned_until the end of the member's ban for the report's target (0 when
-- none), and the hint the pool's new earliest due time, or 0 (see `due_by` in leases.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
local check = ARGV[1] == 'check'
local draw = tonumber(ARGV[2])
local cfg = health_config()
local lif = least_in_flight()
local prune = prune_config()
local max_targets, cleanup = tonumber(ARGV[3]), tonumber(ARGV[4])
local ban_ms = tonumber(redis.call('HGET', KEYS[1], 'target_ban_ms') or 600000)

-- The member's ban for the target of the hash at KEYS[slot] as {until, ms, bans}, nil when
-- there is none. The index says whether the hash belongs to this pool: a pool deleted and
-- created again leaves a hash behind that expires by itself and is never read.
local function ban_of(slot, member)
    local target = string.sub(KEYS[slot], #KEYS[21] + 2)
    local forget = redis.call('ZSCORE', KEYS[21], target)
    if not forget or tonumber(forget) <= now then
        return nil, target, nil
    end
    local text = redis.call('HGET', KEYS[slot], member)
    if not text then
        return nil, target, tonumber(forget)
    end
    local u, ms, n = string.match(text, '^(%d+) (%d+) (%d+)$')
    return {tonumber(u), tonumber(ms), tonumber(n)}, target, tonumber(forget)
end

-- Bans the member for the target of KEYS[slot]: for ban_ms, doubled for each ban in a row
-- (one that starts before the last one is forgotten, that is as long after its end as it
-- lasted), up to max_cooldown_ms (HealthConfig::ban_ms in the service). A member banned
-- already keeps its ban: the report is about a request from before it. Returns the ban's
-- end and whether it was written; nil when the pool keeps bans for max_targets targets
-- already. The hash and the index expire with their last ban, and each ban clears up to
-- `cleanup` expired targets from the index, so that nothing stays longer than it matters.
local function ban(slot, member)
    local key = KEYS[slot]
    local current, target, forget = ban_of(slot, member)
    if current and current[1] > now then
        return current[1], false
    end
    if not forget then
        local expired = redis.call('ZRANGE', KEYS[21], '-inf', now, 'BYSCORE', 'LIMIT', 0, cleanup)
        if #expired > 0 then
            redis.call('ZREM', KEYS[21], unpack(expired))
        end
        if redis.call('ZCARD', KEYS[21]) >= max_targets then
            return nil
        end
        -- What an earlier pool of this id left, if anything.
        redis.call('DEL', key)
    end
    local bans = 1
    if current and current[1] + current[2] > now then
        bans = current[3] + 1
    end
    local ms = math.min(cfg.max, ban_ms * 2 ^ (bans - 1))
    local ends = now + ms
    redis.call('HSET', key, member, ms_text(ends) .. ' ' .. ms_text(ms) .. ' ' .. ms_text(bans))
    local forgotten = ends + ms
    if not forget or forgotten > forget then
        redis.call('ZADD', KEYS[21], forgotten, target)
        redis.call('PEXPIREAT', key, forgotten)
        local last = redis.call('ZRANGE', KEYS[21], 0, 0, 'REV', 'WITHSCORES')[2]
        redis.call('PEXPIREAT', KEYS[21], last)
    end
    return ends, true
end

local out = {}
for i = 5, #ARGV, 5 do
    local member, result, slot = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 4])
    local streak, trips, cooldown = health_of(member)
    local eligible = redis.call('ZSCORE', KEYS[2], member)
    local cooling = not eligible and redis.call('ZSCORE', KEYS[10], member)
    local known = eligible or cooling or redis.call('ZSCORE', KEYS[3], member)
    local effect
    local banned_until = 0
    if slot and result == 'blocked' and not check then
        if not known then
            effect = 0
        else
            local ends, written = ban(slot, member)
            banned_until = ends or 0
            effect = written and 5 or 3
        end
    elseif not eligible and not cooling then
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
    out[#out + 1] = banned_until
end
return {1, out, due_hint or 0}
