-- Chooses a member under the pool's policy and counts one more assignment for it, in one
-- script so that no other client runs between the choice and the update: two concurrent
-- assigns never both take the same member's last free place. One script for both
-- policies, so an assign is one round trip whatever the pool.
-- First, when a cooldown has ended, it returns up to ARGV[4] due members of this pool (so
-- that a busy pool never waits for the background sweep); with nobody cooling down that
-- costs one ZRANGE on an empty key.
-- least-used: the fewest assignments, equal counts by member bytes (Redis's order for
-- equal scores).
-- least-in-flight: first reclaims a few expired leases of this pool, then takes the first
-- member of the choosing order (see `entry` in leases.lua) unless it is at max_in_flight,
-- and leases it until now + ttl.
-- With label groups (ARGV[6..]), the choice is the first member of the same order among
-- those that pass every group (pick_labelled in labels.lua); the rest is the same.
-- ARGV[1] id for the new lease (random, from the service), ARGV[2] ttl in ms or '' for
-- the pool's, ARGV[3] how many expired leases to reclaim first, ARGV[4] how many due
-- members to return first, ARGV[5] most candidates a label filter may check, ARGV[6..]
-- label groups "key value value ...".
-- With a target, KEYS[18] is its ban hash (see outcomes.lua): members banned for it are
-- skipped in the choosing order, each costing one check of the ARGV[5] budget; when the
-- budget is spent on banned members the answer is {0, ms} until the first of their bans
-- ends. Without a target there is no KEYS[18] and bans cost nothing.
-- Returns {-1} when the pool does not exist, {-2} when the label filter would check more
-- than ARGV[5] candidates, {0} when there is nothing to assign,
-- {0, ms} when nothing is eligible and the earliest cooldown (or ban for the target) ends
-- in ms,
-- {1, member, assignments} on a least-used pool,
-- {2, member, assignments, in_flight, expires_ms, ttl_ms, due hint} on a least-in-flight
-- pool, the hint being the pool's new earliest due time, or 0 (see `due_by` in leases.lua).
local meta = redis.call('HMGET', KEYS[1], 'created_ms', 'policy', 'lease_ttl_ms', 'max_in_flight',
    'labelled')
if not meta[1] then
    return {-1}
end
local now = false
local first_due = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2]
if first_due then
    now = now_ms()
    if tonumber(first_due) <= now then
        return_due(now, tonumber(ARGV[4]))
    end
end
local groups = filter_groups(6)

-- With a target the pool has live bans for: the end of the member's ban, nil when it has
-- none. A hash the ban index does not list (or lists as forgotten) is a deleted pool's.
local ban_end = nil
if #KEYS >= 18 then
    local forget = redis.call('ZSCORE', KEYS[17], string.sub(KEYS[18], #KEYS[17] + 2))
    now = now or now_ms()
    if forget and tonumber(forget) > now then
        ban_end = function(text)
            local ends = tonumber(string.match(text or '', '^(%d+)') or 0)
            return ends > now and ends or nil
        end
    end
end

-- The first entry of the sorted set `key` (the choosing order) whose member is not banned,
-- with its score, reading the order in chunks with one HMGET each; nil after `budget`
-- banned members or at the end of the order. Also the earliest end of the bans skipped.
-- The first chunk is small: usually the first member is not banned.
local function first_unbanned(key, budget, lif)
    local earliest = nil
    local offset = 0
    while offset < budget do
        local size = math.min(offset == 0 and 4 or 64, budget - offset)
        local entries = redis.call('ZRANGE', key, offset, offset + size - 1, 'WITHSCORES')
        if #entries == 0 then
            break
        end
        local names = {}
        for i = 1, #entries, 2 do
            names[#names + 1] = lif and string.sub(entries[i], 21) or entries[i]
        end
        local texts = redis.call('HMGET', KEYS[18], unpack(names))
        for i = 1, #names do
            local ends = ban_end(texts[i])
            if not ends then
                return entries[2 * i - 1], entries[2 * i], earliest
            end
            earliest = math.min(earliest or ends, ends)
        end
        offset = offset + #names
    end
    return nil, nil, earliest
end

-- Only on the empty path: how long until the earliest cooling-down member returns, or the
-- earliest of `banned_until` (the bans skipped) ends. With a label filter, the first of the
-- RETURNS_CHECKED soonest returns whose member carries the labels; when none of them does,
-- the last of them, which no member carrying the labels can beat (a lower bound); none
-- when fewer are cooling down.
local RETURNS_CHECKED = 16
local function nothing_eligible(banned_until)
    local due
    if groups then
        local soonest = redis.call('ZRANGE', KEYS[10], 0, RETURNS_CHECKED - 1, 'WITHSCORES')
        for i = 1, #soonest, 2 do
            if passes(labels_table(redis.call('HGET', KEYS[13], soonest[i])), groups, 0) then
                due = tonumber(soonest[i + 1])
                break
            end
        end
        if not due and #soonest == 2 * RETURNS_CHECKED then
            due = tonumber(soonest[#soonest])
        end
    else
        due = tonumber(redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2] or nil)
    end
    local first = due and banned_until and math.min(due, banned_until) or due or banned_until
    if first then
        return {0, first - (now or now_ms())}
    end
    return {0}
end
if meta[2] ~= 'least-in-flight' then
    local chosen
    if groups then
        local order, banned_until = pick_labelled(groups, tonumber(ARGV[5]), false, ban_end)
        if order == false then
            return {-2}
        end
        if not order then
            return nothing_eligible(banned_until)
        end
        chosen = order_member(order, false)
    elseif ban_end then
        local score, banned_until
        chosen, score, banned_until = first_unbanned(KEYS[2], tonumber(ARGV[5]), false)
        if not chosen then
            return nothing_eligible(banned_until)
        end
    else
        chosen = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    end
    if not chosen then
        return nothing_eligible()
    end
    -- A pool where no member ever had labels skips the label index: no call at all.
    local labels = meta[5] and unlabel(chosen, false)
    local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
    if labels then
        label(chosen, false, labels)
    end
    redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
    return {1, chosen, tonumber(assignments)}
end
now = now or now_ms()
reclaim_expired(now, tonumber(ARGV[3]))
local first
local banned_until = nil
if groups then
    local order
    order, banned_until = pick_labelled(groups, tonumber(ARGV[5]), true, ban_end)
    if order == false then
        return {-2}
    end
    first = {}
    if order then
        local member = order_member(order, true)
        first = {entry(redis.call('ZSCORE', KEYS[2], member), member), tonumber(string.sub(order, 1, 20))}
    end
elseif ban_end then
    local entry, live
    entry, live, banned_until = first_unbanned(KEYS[5], tonumber(ARGV[5]), true)
    first = {entry, live}
else
    first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
end
if not first[1] then
    return nothing_eligible(banned_until)
end
-- The first entry has the fewest live leases of all (the first not banned: of all those not
-- banned): if it is at the cap, so is every other; a banned one may come back below it.
if meta[4] and tonumber(first[2]) >= tonumber(meta[4]) then
    return banned_until and {0, banned_until - now} or {0}
end
local member = string.sub(first[1], 21)
local labels = meta[5] and unlabel(member, true)
redis.call('ZREM', KEYS[5], first[1])
local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
redis.call('HINCRBY', KEYS[6], member, 1)
place(member)
if labels then
    label(member, true, labels)
end
redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
local ttl = tonumber(ARGV[2]) or tonumber(meta[3])
local expires = now + ttl
redis.call('HSET', KEYS[7], ARGV[1], member)
redis.call('ZADD', KEYS[8], expires, ARGV[1])
due_by(expires)
return {2, member, tonumber(assignments), redis.call('HGET', KEYS[6], member), expires, ttl,
    due_hint or 0}
