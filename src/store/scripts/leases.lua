-- Shared helpers, put in front of every pool script that changes members or leases (see
-- `with_helpers` in redis/scripts.rs). Only local functions: nothing runs until a script calls one.
-- KEYS, the same in every pool script:
--   [1] meta hash, [2] eligible sorted set (member -> assignments), [3] ineligible sorted
--   set, [4] taken_out hash, [5] by_in_flight sorted set (the choosing order below),
--   [6] in_flight hash (member -> live leases, eligible or not; absent when 0),
--   [7] leases hash (lease id -> member), [8] lease_expiry sorted set (lease id -> ms).

local function least_in_flight()
    return redis.call('HGET', KEYS[1], 'policy') == 'least-in-flight'
end

-- The due index (redis/keys.rs): the meta field `due` is never later than the pool's
-- earliest lease expiry or return. A script that schedules work earlier than `due` moves it
-- and reports the new time as its hint; the service then lowers the pool's entry in the
-- index to it (the index lives in another hash slot). Later work leaves `due` alone, so in
-- steady state (a lease or a cooldown behind the earliest) no hint is sent.
local due_hint = false

-- Notes work of this pool that falls due at `at` (ms, Redis clock).
local function due_by(at)
    local due = tonumber(redis.call('HGET', KEYS[1], 'due'))
    if due and due <= at then
        return
    end
    redis.call('HSET', KEYS[1], 'due', string.format('%.0f', at))
    if not due_hint or at < due_hint then
        due_hint = at
    end
end

-- Milliseconds from Redis's own clock: replicas never pass their clocks in.
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The choosing order of a least-in-flight pool is one sorted set over its eligible
-- members: score = live leases, entry = assignments as 20 zero-padded digits, then the
-- member id. Redis orders equal scores by entry bytes, and fixed-width digits compare like
-- the numbers they write, so the first entry is the member with the fewest live leases,
-- then the fewest assignments, then the lowest id bytes. Scores stay small exact integers
-- (nothing is packed into a double) and every change is one ZADD or ZREM.
local function entry(assignments, member)
    return string.format('%020d', tonumber(assignments)) .. member
end

-- Takes an eligible member out of the order; call it before its assignments change.
local function unplace(member)
    local assignments = redis.call('ZSCORE', KEYS[2], member)
    if assignments then
        redis.call('ZREM', KEYS[5], entry(assignments, member))
    end
end

-- Puts an eligible member into the order with its current numbers. The entry does not
-- hold the lease count, so a new lease count only rewrites the score.
local function place(member)
    local assignments = redis.call('ZSCORE', KEYS[2], member)
    if assignments then
        local live = redis.call('HGET', KEYS[6], member) or 0
        redis.call('ZADD', KEYS[5], live, entry(assignments, member))
    end
end

-- Whether a lease exists and has not expired at `now`.
local function live(id, now)
    local expires = redis.call('ZSCORE', KEYS[8], id)
    return expires ~= false and tonumber(expires) > now
end

-- Ends a lease, whatever the reason, and frees its place on its member. Returns false
-- when it had already ended: every way of ending a lease goes through this check, so a
-- lease is never subtracted twice.
local function end_lease(id)
    local member = redis.call('HGET', KEYS[7], id)
    if not member then
        return false
    end
    redis.call('HDEL', KEYS[7], id)
    redis.call('ZREM', KEYS[8], id)
    local labels = unlabel(member, true)
    if redis.call('HINCRBY', KEYS[6], member, -1) <= 0 then
        redis.call('HDEL', KEYS[6], member)
    end
    place(member)
    label(member, true, labels)
    return true
end

-- Reclaims up to `limit` leases expired at `now`, counting them as abandoned. With
-- `spent` (the sweep's bound, see chunk.lua), asks it after each lease whether the step
-- has run long enough, `spent(handled, asked)`, and stops when it has. Returns how many
-- it reclaimed, and whether it stopped before the end.
local function reclaim_expired(now, limit, spent)
    local expired = redis.call('ZRANGE', KEYS[8], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
    local reclaimed = 0
    local stopped = false
    for n, id in ipairs(expired) do
        if end_lease(id) then
            reclaimed = reclaimed + 1
        end
        if spent and spent(n, #expired) then
            stopped = true
            break
        end
    end
    if reclaimed > 0 then
        redis.call('HINCRBY', KEYS[1], 'abandoned', reclaimed)
    end
    return reclaimed, stopped
end

