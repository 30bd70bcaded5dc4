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
-- Returns {-1} when the pool does not exist, {-2} when the label filter would check more
-- than ARGV[5] candidates, {0} when there is nothing to assign,
-- {0, ms} when nothing is eligible and the earliest cooldown ends in ms,
-- {1, member, assignments} on a least-used pool,
-- {2, member, assignments, in_flight, expires_ms, ttl_ms, due hint} on a least-in-flight
-- pool, the hint being the pool's new earliest due time, or 0 (see `due_by` in leases.lua).
-- `meta` and `first_due` come from assign_fast.lua, which also answers the common assign.
local now = false
if first_due then
    now = now_ms()
    if tonumber(first_due) <= now then
        return_due(now, tonumber(ARGV[4]))
    end
end
local groups = filter_groups(6)
-- Only on the empty path: how long until the earliest cooling-down member returns. With a
-- label filter that member may not carry the labels, so no wait is given.
local function nothing_eligible()
    if groups then
        return {0}
    end
    local due = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2]
    if due then
        return {0, tonumber(due) - (now or now_ms())}
    end
    return {0}
end
if meta[2] ~= 'least-in-flight' then
    local chosen, order
    if groups then
        order = pick_labelled(groups, tonumber(ARGV[5]), false)
        if order == false then
            return {-2}
        end
        chosen = order and order_member(order, false)
    else
        local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
        chosen = first[1]
        order = chosen and order_of(first[2], chosen)
    end
    if not chosen then
        return nothing_eligible()
    end
    -- A pool where no member ever had labels skips the label index: no call at all. The
    -- order texts are known here, so the index upkeep reads no numbers again.
    local labels = meta[5] and unlabel(chosen, false, order)
    local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
    if labels then
        label(chosen, false, labels, order_of(assignments, chosen))
    end
    redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
    return {1, chosen, tonumber(assignments)}
end
now = now or now_ms()
reclaim_expired(now, tonumber(ARGV[3]))
-- The first entry of the choosing order (see `entry` in leases.lua) and its live leases.
local first, live
if groups then
    local order = pick_labelled(groups, tonumber(ARGV[5]), true)
    if order == false then
        return {-2}
    end
    -- An order text is the live leases (20 digits) in front of the entry.
    first = order and string.sub(order, 21)
    live = order and tonumber(string.sub(order, 1, 20))
else
    local head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    first, live = head[1], tonumber(head[2])
end
if not first then
    return nothing_eligible()
end
-- The first entry has the fewest live leases of all: if it is at the cap, every member is.
if meta[4] and live >= tonumber(meta[4]) then
    return {0}
end
local member = string.sub(first, 21)
local labels = meta[5] and unlabel(member, true, string.format('%020d', live) .. first)
redis.call('ZREM', KEYS[5], first)
local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
live = redis.call('HINCRBY', KEYS[6], member, 1)
-- `place` with the numbers in hand.
redis.call('ZADD', KEYS[5], live, entry(assignments, member))
if labels then
    label(member, true, labels, order_of(assignments, member, live))
end
redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
local ttl = tonumber(ARGV[2]) or tonumber(meta[3])
local expires = now + ttl
redis.call('HSET', KEYS[7], ARGV[1], member)
redis.call('ZADD', KEYS[8], expires, ARGV[1])
due_by(expires)
return {2, member, tonumber(assignments), live, expires, ttl, due_hint or 0}
