-- Outcome helpers, put after health.lua in front of the scripts that apply outcome reports
-- (outcomes.lua, and assign_done.lua for the report an assign carries; see `with_reports`
-- in redis/scripts.rs). Only local functions: nothing runs until a script calls one.
-- KEYS, continuing health.lua: [21] the pool's ban index (sorted set: target -> when its
-- bans are all forgotten, ms), and a report's target names its ban hash by its slot in
-- KEYS, "<KEYS[21]>:<target>" (member -> "<until_ms> <ban_ms> <bans in a row>"), expiring
-- when its bans are all forgotten (see keys.rs).

-- What every report of one script call shares: the clock, who reports ('worker' or
-- 'check'), the jitter draw in [-1, 1], the pool's rules and the ban bounds (most targets
-- per pool, most expired targets to clear per ban).
local function report_context(source, draw, max_targets, cleanup)
    return {
        now = now_ms(),
        check = source == 'check',
        draw = tonumber(draw),
        cfg = health_config(),
        lif = least_in_flight(),
        max_targets = tonumber(max_targets),
        cleanup = tonumber(cleanup),
        ban_ms = tonumber(redis.call('HGET', KEYS[1], 'target_ban_ms') or DEFAULT_TARGET_BAN_MS),
    }
end

-- The member's ban for the target of the hash at KEYS[slot] as {until, ms, bans}, nil when
-- there is none. The index says whether the hash belongs to this pool: a pool deleted and
-- created again leaves a hash behind that expires by itself and is never read.
local function ban_of(ctx, slot, member)
    local target = string.sub(KEYS[slot], #KEYS[21] + 2)
    local forget = redis.call('ZSCORE', KEYS[21], target)
    if not forget or tonumber(forget) <= ctx.now then
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
-- lasted), up to max_cooldown_ms (ban_ms, the rule). A member banned
-- already keeps its ban: the report is about a request from before it. Returns the ban's
-- end and whether it was written; nil when the pool keeps bans for max_targets targets
-- already. The hash and the index expire with their last ban, and each ban clears up to
-- `cleanup` expired targets from the index, so that nothing stays longer than it matters.
local function ban(ctx, slot, member)
    local now = ctx.now
    local key = KEYS[slot]
    local current, target, forget = ban_of(ctx, slot, member)
    if current and current[1] > now then
        return current[1], false
    end
    if not forget then
        local expired = redis.call('ZRANGE', KEYS[21], '-inf', now, 'BYSCORE', 'LIMIT', 0,
            ctx.cleanup)
        if #expired > 0 then
            redis.call('ZREM', KEYS[21], unpack(expired))
        end
        if redis.call('ZCARD', KEYS[21]) >= ctx.max_targets then
            return nil
        end
        -- What an earlier pool of this id left, if anything.
        redis.call('DEL', key)
    end
    local bans = 1
    if current and current[1] + current[2] > now then
        bans = current[3] + 1
    end
    local ms = ban_ms(ctx.ban_ms, ctx.cfg.max, bans)
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

-- Applies one report (result ok | failed | blocked; `slot` the KEYS slot of its target's
-- ban hash, or nil; `latency` in ms as text, '' for none) to the member's failure streak,
-- and, when a worker reports about a member the pool has, counts it in the member's
-- quality (count_outcome, whatever the report did to its health):
-- eligible: ok clears the streak and the backoff; failed/blocked extend the streak, and
--   reaching max_consecutive_failures trips the member (see `trip` in health.lua).
-- cooling down: worker reports are ignored (they may describe requests from before the
--   trip); a check that passes brings the member back now, one that fails trips it again.
-- taken out by an operator: ignored.
-- blocked with a target, whatever the member's state: bans the member for that target
--   (see `ban` above); the streak stays as it is.
-- Returns the effect (0 = unknown, 1 = counted, 2 = tripped, 3 = ignored, 4 = returned,
-- 5 = banned), the streak afterwards and the end of the member's ban for the target (0
-- when none).
local function apply_report(ctx, member, result, slot, latency)
    local check = ctx.check
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
            local ends, written = ban(ctx, slot, member)
            banned_until = ends or 0
            effect = written and 5 or 3
        end
    elseif not eligible and not cooling then
        effect = known and 3 or 0
    elseif cooling and not check then
        effect = 3
    elseif result == 'ok' then
        streak = 0
        if cooling then
            local policy = redis.call('HGET', KEYS[1], 'restore') or 'minimum'
            restore(member, policy, eligible_minimum(), ctx.lif)
            redis.call('HINCRBY', KEYS[1], 'recovered', 1)
            effect = 4
        else
            set_health(member, 0, 0, 0)
            effect = 1
        end
    else
        streak = streak + 1
        if cooling or streak >= ctx.cfg.failures then
            trip(member, result == 'blocked' and 'blocked' or 'unhealthy', ctx.now, streak,
                trips, ctx.cfg, ctx.draw, ctx.lif)
            effect = 2
        else
            set_health(member, streak, trips, cooldown)
            effect = 1
        end
    end
    if effect ~= 0 and not check then
        count_outcome(member, result, latency)
    end
    return effect, streak, banned_until
end
