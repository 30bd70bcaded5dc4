-- Health helpers, put after leases.lua in front of every pool script (see `with_helpers` in
-- redis/scripts.rs), with the rules they apply (src/rules/health.lua) before them. Only
-- local functions: nothing runs until a script calls one.
-- KEYS, continuing leases.lua:
--   [9] health hash (member -> "<streak> <trips> <cooldown_ms>"; absent when all are 0),
--   [10] returns sorted set (cooling-down member -> when it comes back, ms, Redis clock),
--   [11] checks hash (member -> "<at_ms> <result>[/<latency_ms>] <detail>", the last active check),
--   [12] check round lease (a string with a ttl; see claim_check.lua).
--   [16] sources hash (see claim_sources.lua), and for pruning (prune.lua): [17] origins
--   hash (member -> 'i' imported | 's<id>' from source id; absent: added by hand), [18]
--   seen sorted set (member of a source -> id * 2^32 + the last fetch that listed it),
--   [19] check_fails hash (member -> checks failed in a row), [20] prune sorted set
--   (member due for removal -> when it was last looked at).
-- A member is cooling down exactly when it is in [10]; an ineligible member that is not
-- there was taken out by an operator and never comes back by itself.

local function ms_text(ms)
    return string.format('%.0f', ms)
end

-- The lowest count among eligible members, or nil when none is eligible.
local function eligible_minimum()
    local lowest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
    return lowest and tonumber(lowest)
end

-- The pool's rules, as put_pool.lua stored them (HealthConfig::script_arg).
local function health_config()
    local text = redis.call('HGET', KEYS[1], 'health') or DEFAULT_HEALTH
    local f, c, m, b, j = string.match(text, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    return {failures = tonumber(f), cooldown = tonumber(c), max = tonumber(m),
        backoff = tonumber(b), jitter = tonumber(j)}
end

local function health_of(member)
    local text = redis.call('HGET', KEYS[9], member)
    if not text then
        return 0, 0, 0
    end
    local streak, trips, cooldown = string.match(text, '^(%d+) (%d+) (%d+)$')
    return tonumber(streak), tonumber(trips), tonumber(cooldown)
end

local function set_health(member, streak, trips, cooldown)
    if streak == 0 and trips == 0 then
        redis.call('HDEL', KEYS[9], member)
    else
        redis.call('HSET', KEYS[9], member,
            ms_text(streak) .. ' ' .. ms_text(trips) .. ' ' .. ms_text(cooldown))
    end
end

-- Moves an eligible member to the ineligible set, keeping its count, with why and since
-- when. Returns false when the member is not eligible.
local function take_out(member, since, reason, lif)
    local count = redis.call('ZSCORE', KEYS[2], member)
    if not count then
        return false
    end
    if lif then
        unplace(member)
    end
    unlabel(member, lif)
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZADD', KEYS[3], count, member)
    redis.call('HSET', KEYS[4], member, since .. ' ' .. reason)
    return true
end

-- Returns an ineligible member to the eligible set at the count `policy` gives it against
-- `minimum` (restored_count, the rule). Whoever brings a member back
-- (an operator, the end of a cooldown, a passing check) cancels its scheduled return and
-- clears its failure streak; the backoff stays until a success. Returns kept, restored,
-- or nil when the member is not ineligible.
local function restore(member, policy, minimum, lif)
    local kept = redis.call('ZSCORE', KEYS[3], member)
    if not kept then
        return nil
    end
    kept = tonumber(kept)
    local restored = restored_count(policy, kept, minimum)
    redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member)
    redis.call('ZADD', KEYS[2], restored, member)
    if lif then
        place(member)
    end
    label(member, lif, false)
    redis.call('ZREM', KEYS[10], member)
    local _, trips, cooldown = health_of(member)
    set_health(member, 0, trips, cooldown)
    return kept, restored
end

-- Returns up to `limit` members whose cooldown ended by `now`, under the pool's restore
-- policy, all against the minimum from before the first. Each return removes the member
-- from the due set inside this script, so however many replicas sweep at once, a member
-- comes back exactly once. With `spent`, stops early as `reclaim_expired` does. Returns
-- how many came back, and whether it stopped before the end.
local function return_due(now, limit, spent)
    local due = redis.call('ZRANGE', KEYS[10], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
    if #due == 0 then
        return 0, false
    end
    local policy = redis.call('HGET', KEYS[1], 'restore') or 'minimum'
    local minimum = eligible_minimum()
    local lif = least_in_flight()
    local returned = 0
    local stopped = false
    for n, member in ipairs(due) do
        redis.call('ZREM', KEYS[10], member)
        if restore(member, policy, minimum, lif) then
            returned = returned + 1
        end
        if spent and spent(n, #due) then
            stopped = true
            break
        end
    end
    redis.call('HINCRBY', KEYS[1], 'recovered', returned)
    return returned, stopped
end

-- Takes a member out for its next cooldown (an eligible one leaves the eligible set; a
-- cooling one has its return pushed back) and schedules its return.
local function trip(member, reason, now, streak, trips, cfg, draw, lif)
    trips = trips + 1
    local cooldown = cooldown_ms(cfg, trips, draw)
    if not take_out(member, ms_text(now), reason, lif) then
        redis.call('HSET', KEYS[4], member, ms_text(now) .. ' ' .. reason)
    end
    redis.call('ZADD', KEYS[10], now + cooldown, member)
    due_by(now + cooldown)
    set_health(member, streak, trips, cooldown)
    redis.call('HINCRBY', KEYS[1], 'tripped', 1)
end

-- Members of one source share the range [id * 2^32, (id + 1) * 2^32) of the seen set.
local SOURCE_SPAN = 4294967296

-- The pool's prune rules, as put_pool.lua stored them (PruneConfig::script_arg).
local function prune_config()
    local text = redis.call('HGET', KEYS[1], 'prune') or '0 0 0'
    local n, k, m = string.match(text, '^(%d+) (%d+) (%d)$')
    return {checks = tonumber(n), absent = tonumber(k), manual = m == '1'}
end

-- Forgets a member entirely, history, health and origin included (not its leases: see
-- remove.lua). Returns 1 when it was a member, else 0.
local function forget(member, lif)
    if lif then
        unplace(member)
    end
    drop_labels(member, lif)
    local removed = redis.call('ZREM', KEYS[2], member) + redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member)
    redis.call('HDEL', KEYS[9], member, 'q ' .. member)
    redis.call('ZREM', KEYS[10], member)
    drop_exit(member)
    redis.call('HDEL', KEYS[11], member)
    redis.call('HDEL', KEYS[17], member)
    redis.call('ZREM', KEYS[18], member)
    redis.call('HDEL', KEYS[19], member)
    redis.call('ZREM', KEYS[20], member)
    return math.min(removed, 1)
end
