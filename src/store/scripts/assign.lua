-- Chooses members under the pool's policy and counts one more assignment for each, in one
-- script so that no other client runs between the choice and the update: two concurrent
-- assigns never both take the same member's last free place. One script for both
-- policies, so an assign is one round trip whatever the pool.
-- First, when a cooldown has ended, it returns up to ARGV[4] due members of this pool (so
-- that a busy pool never waits for the background sweep); with nobody cooling down that
-- costs one ZRANGE on an empty key.
-- least-used: the fewest assignments, equal counts by member bytes (Redis's order for
-- equal scores).
-- least-in-flight: first reclaims a few expired leases of this pool, then takes the first
-- members of the choosing order (see `entry` in leases.lua) that are below max_in_flight,
-- and leases each until now + ttl.
-- It hands out the first ARGV[6] members of that order: distinct, each counted once, in
-- pick order (an assign of several, `count` in the API). With label groups (ARGV[7..]),
-- they are the first members of the same order among those that pass every group
-- (pick_labelled in labels.lua); the rest is the same.
-- ARGV[1] ids for the new leases, one per member asked for, separated by spaces (random,
-- from the service), ARGV[2] ttl in ms or '' for the pool's, ARGV[3] how many expired
-- leases to reclaim first, ARGV[4] how many due members to return first, ARGV[5] most
-- candidates a label filter may check, ARGV[6] how many members, ARGV[7..] label groups
-- "key value value ...".
-- Returns {-1} when the pool does not exist, {-2} when the label filter would check more
-- than ARGV[5] candidates, {0} when there is nothing to assign,
-- {0, ms} when nothing is eligible and the earliest cooldown ends in ms,
-- {1, member, assignments, member, assignments, ...} on a least-used pool,
-- {2, expires_ms, ttl_ms, due hint, member, assignments, in_flight, ...} on a
-- least-in-flight pool, the i-th member leased under the i-th id; the hint is the pool's
-- new earliest due time, or 0 (see `due_by` in leases.lua).
-- `meta` and `first_due` come from assign_fast.lua, which also answers the common assign.
local now = false
if first_due then
    now = now_ms()
    if tonumber(first_due) <= now then
        return_due(now, tonumber(ARGV[4]))
    end
end
local wanted = tonumber(ARGV[6])
local groups = filter_groups(7)
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
local lif = meta[2] == 'least-in-flight'
if lif then
    now = now or now_ms()
    reclaim_expired(now, tonumber(ARGV[3]))
end
-- The order texts (see order_text in labels.lua) of the members to hand out, in order.
local orders
if groups then
    orders = pick_labelled(groups, tonumber(ARGV[5]), lif, wanted)
    if orders == false then
        return {-2}
    end
else
    orders = {}
    local head = redis.call('ZRANGE', KEYS[lif and 5 or 2], 0, wanted - 1, 'WITHSCORES')
    for i = 1, #head, 2 do
        -- By live leases on a least-in-flight pool (the entry holds the rest), else by
        -- assignments.
        orders[#orders + 1] = lif and (string.format('%020d', tonumber(head[i + 1])) .. head[i])
            or order_of(head[i + 1], head[i])
    end
end
if #orders == 0 then
    return nothing_eligible()
end
if not lif then
    local reply = {1}
    for _, order in ipairs(orders) do
        local member = order_member(order, false)
        -- A pool where no member ever had labels skips the label index: no call at all.
        -- The order texts are known here, so the index upkeep reads no numbers again.
        local labels = meta[5] and unlabel(member, false, order)
        local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
        if labels then
            label(member, false, labels, order_of(assignments, member))
        end
        reply[#reply + 1] = member
        reply[#reply + 1] = tonumber(assignments)
    end
    redis.call('HINCRBY', KEYS[1], 'total_assignments', #orders)
    return reply
end
local ttl = tonumber(ARGV[2]) or tonumber(meta[3])
local expires = now + ttl
local reply = {2, expires, ttl, 0}
local ids = {}
for id in string.gmatch(ARGV[1], '%S+') do
    ids[#ids + 1] = id
end
local cap = meta[4] and tonumber(meta[4])
local leased = 0
for _, order in ipairs(orders) do
    local live = tonumber(string.sub(order, 1, 20))
    -- The order puts the fewest live leases first: from the first at the cap on, every
    -- member is at it.
    if cap and live >= cap then
        break
    end
    leased = leased + 1
    local first = string.sub(order, 21)
    local member = string.sub(first, 21)
    local labels = meta[5] and unlabel(member, true, order)
    redis.call('ZREM', KEYS[5], first)
    local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
    live = redis.call('HINCRBY', KEYS[6], member, 1)
    -- `place` with the numbers in hand.
    redis.call('ZADD', KEYS[5], live, entry(assignments, member))
    if labels then
        label(member, true, labels, order_of(assignments, member, live))
    end
    redis.call('HSET', KEYS[7], ids[leased], member)
    redis.call('ZADD', KEYS[8], expires, ids[leased])
    reply[#reply + 1] = member
    reply[#reply + 1] = tonumber(assignments)
    reply[#reply + 1] = live
end
if leased == 0 then
    return {0}
end
redis.call('HINCRBY', KEYS[1], 'total_assignments', leased)
due_by(expires)
reply[4] = due_hint or 0
return reply
