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
-- With a target, KEYS[23] is its ban hash (see outcomes.lua), KEYS[24] its pacing set and
-- KEYS[25] the pool's pacing index (see `rest` below):
-- members banned for it are skipped in the choosing order, each costing one check of the
-- ARGV[5] budget; when the budget is spent on skipped members the answer is {0, ms} until
-- the first of them is free again. Without a target there is no KEYS[23] and bans cost
-- nothing.
-- Pacing (meta `pacing`, "<min_interval_ms> <per_target 0|1>"): each member handed out
-- rests until now + min_interval_ms, in KEYS[22] (pool-wide) or KEYS[24] (per target;
-- assigns without a target are then not paced), and resting members are skipped the same
-- way. Since the choice and the rest are one script, no two assigns, whatever their
-- replica, ever hand out a resting member.
-- Returns {-1} when the pool does not exist, {-2} when the label filter would check more
-- than ARGV[5] candidates, {0} when there is nothing to assign,
-- {0, ms} when nothing is eligible and the earliest cooldown (or ban for the target) ends
-- in ms,
-- {1, member, assignments, member, assignments, ...} on a least-used pool,
-- {2, expires_ms, ttl_ms, due hint, member, assignments, in_flight, ...} on a
-- least-in-flight pool, the i-th member leased under the i-th id; the hint is the pool's
-- new earliest due time, or 0 (see `due_by` in leases.lua).
-- Sticky sessions: with a session, ARGV[6] is "session <ttl_ms, 0 for the pool's>
-- <max_sessions> <ttl_ms of a pool that never set one>" (its one member; never '1', so the
-- fast path leaves it alone) and the last two KEYS are the pool's session index (session
-- id -> when it ends, ms; expires with its last) and the session's key (its member, with
-- the session's ttl), after the target's keys when there is a target. A live session whose
-- member is still eligible for this request (eligible, not banned for the target, carrying
-- the labels, below max_in_flight) gets that member, pacing or not (it rests all the same);
-- otherwise the member is chosen as without a session and pinned. Every assign slides a
-- live session; one that finds nothing leaves its member pinned. A session key is valid
-- only while the index lists it as live, so a deleted pool's (left to expire, see
-- delete_pool.lua) is never read. Up to CLEANUP ended sessions leave the index per assign.
-- The answer is then {3, session ends_ms (0 when none is live), 1 when re-pinned else 0,
-- the answer as without a session}, or {-3} when a new session would pass max_sessions.
-- Exclude: the last ARGV, when it starts with a newline, lists members this call must not
-- hand out (a newline before each id), as if they were ineligible for it: skipped in the
-- choosing order like a banned member (a check each) but bringing no wait, since nothing
-- makes them eligible by themselves; a session's member among them is re-pinned.
-- `meta`, `first_due` and `excluding` come from assign_fast.lua, which also answers the
-- common assign.
local now = false
if first_due then
    now = now_ms()
    if tonumber(first_due) <= now then
        return_due(now, tonumber(ARGV[4]))
    end
end
local session = nil
do
    local ttl, cap, fallback = string.match(ARGV[6], '^session (%d+) (%d+) (%d+)$')
    if ttl then
        session = {index = KEYS[#KEYS - 1], key = KEYS[#KEYS], ttl = tonumber(ttl),
            cap = tonumber(cap)}
        if session.ttl == 0 then
            session.ttl = tonumber(redis.call('HGET', KEYS[1], 'session_ttl_ms') or fallback)
        end
        session.id = string.sub(session.key, #session.index + 2)
    end
end
local excluded = nil
if excluding then
    excluded = {}
    for id in string.gmatch(ARGV[#ARGV], '[^\n]+') do
        excluded[id] = true
    end
    ARGV[#ARGV] = nil
end
-- When an excluded member is free again: never (math.huge), dropped from any wait.
local NEVER = math.huge
local wanted = session and 1 or tonumber(ARGV[6])
local groups = filter_groups(7)
-- Whether the assign names a target: its three keys follow the pool's 22.
local targeted = #KEYS - (session and 2 or 0) >= 25

-- With a target the pool has live bans for: whether its ban hash is to be read. A hash the
-- ban index does not list (or lists as forgotten) is a deleted pool's.
local bans = false
if targeted then
    local forget = redis.call('ZSCORE', KEYS[21], string.sub(KEYS[23], #KEYS[21] + 2))
    now = now or now_ms()
    bans = forget and tonumber(forget) > now
end
-- The pacing set this assign rests its member in and skips resting members by (nil when
-- the pool is not paced for it), and the interval. A target's set is valid only while the
-- pacing index (KEYS[25]) lists the target with a rest not yet over: one it does not list
-- is a deleted pool's (delete_pool.lua renames the index, not the sets it lists) or holds
-- only rests that are over, and is `stale`: not read, and unlinked by the first rest.
local rests, interval, stale, paced_target = nil, nil, false, nil
if meta[6] then
    local ms, per_target = string.match(meta[6], '^(%d+) ([01])$')
    now = now or now_ms()
    if per_target == '0' then
        rests = KEYS[22]
    elseif targeted then
        rests = KEYS[24]
        paced_target = string.sub(KEYS[24], #KEYS[22] + 2)
        local last = redis.call('ZSCORE', KEYS[25], paced_target)
        stale = not (last and tonumber(last) > now)
    end
    interval = tonumber(ms)
end

-- Until when a member is not to be handed out for this request (banned for its target,
-- resting, or NEVER when excluded), nil when it is free. nil as a whole when nothing is
-- skipped.
local held_until = nil
local resting = not stale and rests
if bans or resting or excluded then
    held_until = function(member)
        if excluded and excluded[member] then
            return NEVER
        end
        local ends = nil
        if bans then
            local text = redis.call('HGET', KEYS[23], member)
            local banned = tonumber(string.match(text or '', '^(%d+)') or 0)
            ends = banned > now and banned or nil
        end
        if resting then
            local rest = tonumber(redis.call('ZSCORE', resting, member) or 0)
            if rest > now then
                ends = math.max(ends or rest, rest)
            end
        end
        return ends
    end
end

-- Whether the end of a skipped member's hold (its ban for the target, its rest) makes it
-- eligible by itself, so that an empty answer waits for it: on a least-in-flight pool with
-- max_in_flight, only for a member below the cap, with `live` leases (read from its entry
-- in the choosing order); one at the cap is still at it when its hold ends. The rule of
-- `Pool::wait_counts` in embedded.rs.
local lease_cap = meta[2] == 'least-in-flight' and meta[4] and tonumber(meta[4]) or nil
local function waits_for(live)
    return not lease_cap or live < lease_cap
end

-- The first `wanted` entries of the sorted set `key` (the choosing order) whose members
-- are free, each as {entry, score}, in order; fewer after `budget` held members or at the
-- end of the order. Also the earliest time one of the members skipped becomes eligible by
-- itself (`waits_for`; the score of an entry of the least-in-flight order is its live
-- leases). The first chunk is small: usually the first members are free.
local function first_free(key, budget, lif)
    local found = {}
    local earliest = nil
    local offset = 0
    local held = 0
    while #found < wanted and held < budget do
        local size = offset == 0 and wanted + 3 or 64
        local entries = redis.call('ZRANGE', key, offset, offset + size - 1, 'WITHSCORES')
        if #entries == 0 then
            break
        end
        for i = 1, #entries, 2 do
            local ends = held_until(lif and string.sub(entries[i], 21) or entries[i])
            if not ends then
                found[#found + 1] = {entries[i], entries[i + 1]}
                if #found == wanted then
                    break
                end
            else
                if not lif or waits_for(tonumber(entries[i + 1])) then
                    earliest = math.min(earliest or ends, ends)
                end
                held = held + 1
                if held >= budget then
                    break
                end
            end
        end
        offset = offset + #entries / 2
    end
    return found, earliest
end

-- Up to CLEANUP entries of the sorted set `key` whose time is over leave it.
local function clear_over(key)
    local over = redis.call('ZRANGE', key, '-inf', now, 'BYSCORE', 'LIMIT', 0, CLEANUP)
    if #over > 0 then
        redis.call('ZREM', key, unpack(over))
    end
end

-- Rests the member handed out until now + interval. Its entry replaces its last; up to
-- CLEANUP entries already over are removed, and the set expires with its last entry, so the
-- set holds no more than what rests now, give or take what the next assigns clear.
-- A target's set is listed in the pacing index until its last rest ends (GT: a shorter
-- interval set meanwhile never cuts a longer rest short); the index clears up to CLEANUP
-- targets whose rests are over and expires with its last. A stale set (see above) is
-- unlinked first, whatever its size: UNLINK leaves freeing a large one to Redis's
-- background thread, so the assign stays short.
local function rest(member)
    if stale then
        redis.call('UNLINK', rests)
        stale = false
    else
        clear_over(rests)
    end
    local ends = now + interval
    redis.call('ZADD', rests, ends, member)
    redis.call('PEXPIREAT', rests, ends)
    if paced_target then
        clear_over(KEYS[25])
        redis.call('ZADD', KEYS[25], 'GT', ends, paced_target)
        local last = redis.call('ZRANGE', KEYS[25], 0, 0, 'REV', 'WITHSCORES')[2]
        redis.call('PEXPIREAT', KEYS[25], last)
    end
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
local lif = meta[2] == 'least-in-flight'
if lif then
    now = now or now_ms()
    reclaim_expired(now, tonumber(ARGV[3]))
end
-- With a session: its member's order text when the session is live and the member still
-- eligible for this request; the live session slides.
local pinned_order = nil
if session then
    now = now or now_ms()
    local ended = redis.call('ZRANGE', session.index, '-inf', now, 'BYSCORE', 'LIMIT', 0, CLEANUP)
    if #ended > 0 then
        redis.call('ZREM', session.index, unpack(ended))
    end
    local ends = tonumber(redis.call('ZSCORE', session.index, session.id) or 0)
    local member = ends > now and redis.call('GET', session.key) or nil
    if member then
        session.live = true
        local order = order_text(member, lif)
        if order and bans then
            local text = redis.call('HGET', KEYS[23], member)
            order = tonumber(string.match(text or '', '^(%d+)') or 0) <= now and order or nil
        end
        if order and excluded and excluded[member] then
            order = nil
        end
        if order and groups
            and not passes(labels_table(redis.call('HGET', KEYS[13], member)), groups, 0) then
            order = nil
        end
        if order and lif and meta[4] and tonumber(string.sub(order, 1, 20)) >= tonumber(meta[4]) then
            order = nil
        end
        pinned_order = order
        redis.call('PEXPIRE', session.key, session.ttl)
        redis.call('ZADD', session.index, now + session.ttl, session.id)
        if redis.call('PTTL', session.index) < session.ttl then
            redis.call('PEXPIRE', session.index, session.ttl)
        end
    elseif redis.call('ZCARD', session.index) >= session.cap then
        return {-3}
    end
end
-- The answer as it goes back: with a session, a member chosen afresh is pinned, and the
-- session's state goes in front.
local function answer(reply)
    if not session then
        return reply
    end
    local repinned = 0
    if reply[1] > 0 and not pinned_order then
        local member = reply[1] == 1 and reply[2] or reply[5]
        redis.call('SET', session.key, member, 'PX', session.ttl)
        redis.call('ZADD', session.index, now + session.ttl, session.id)
        if redis.call('PTTL', session.index) < session.ttl then
            redis.call('PEXPIRE', session.index, session.ttl)
        end
        repinned = session.live and 1 or 0
        session.live = true
    end
    return {3, session.live and now + session.ttl or 0, repinned, reply}
end
-- The order texts (see order_text in labels.lua) of the members to hand out, in order,
-- and the earliest time a member skipped for this request is free again. Read from the
-- label index, they are its entries' tails (see tail_of in labels.lua), which may carry
-- the member's labels text, and then the index upkeep below need not read it.
local orders, banned_until
local from_index = groups ~= nil and not pinned_order
if pinned_order then
    orders = {pinned_order}
elseif groups then
    orders, banned_until = pick_labelled(groups, tonumber(ARGV[5]), lif, held_until, wanted,
        waits_for)
    if orders == false then
        return {-2}
    end
else
    local heads = {}
    if held_until then
        heads, banned_until = first_free(KEYS[lif and 5 or 2], tonumber(ARGV[5]), lif)
    else
        local head = redis.call('ZRANGE', KEYS[lif and 5 or 2], 0, wanted - 1, 'WITHSCORES')
        for i = 1, #head, 2 do
            heads[#heads + 1] = {head[i], head[i + 1]}
        end
    end
    orders = {}
    for _, head in ipairs(heads) do
        -- By live leases on a least-in-flight pool (the entry holds the rest), else by
        -- assignments.
        orders[#orders + 1] = lif and (string.format('%020d', tonumber(head[2])) .. head[1])
            or order_of(head[2], head[1])
    end
end
if banned_until == NEVER then
    banned_until = nil
end
if #orders == 0 then
    return answer(nothing_eligible(banned_until))
end
if not lif then
    local reply = {1}
    for _, tail in ipairs(orders) do
        local order, carried = split_tail(tail)
        if from_index then
            carried = carried or false
        end
        local member = order_member(order, false)
        -- A pool where no member ever had labels skips the label index: no call at all.
        -- The order texts are known here, so the index upkeep reads no numbers again.
        local labels = meta[5] and unlabel(member, false, order, carried)
        local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
        if labels then
            label(member, false, labels, order_of(assignments, member))
        end
        if rests then
            rest(member)
        end
        reply[#reply + 1] = member
        reply[#reply + 1] = tonumber(assignments)
    end
    redis.call('HINCRBY', KEYS[1], 'total_assignments', #orders)
    return answer(reply)
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
for _, tail in ipairs(orders) do
    local order, carried = split_tail(tail)
    if from_index then
        carried = carried or false
    end
    local live = tonumber(string.sub(order, 1, 20))
    -- The order puts the fewest live leases first (of those not held): from the first at
    -- the cap on, every member is at it; a held one below it is waited for (`waits_for`).
    if cap and live >= cap then
        break
    end
    leased = leased + 1
    local first = string.sub(order, 21)
    local member = string.sub(first, 21)
    local labels = meta[5] and unlabel(member, true, order, carried)
    redis.call('ZREM', KEYS[5], first)
    local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
    live = redis.call('HINCRBY', KEYS[6], member, 1)
    -- `place` with the numbers in hand.
    redis.call('ZADD', KEYS[5], live, entry(assignments, member))
    if labels then
        label(member, true, labels, order_of(assignments, member, live))
    end
    if rests then
        rest(member)
    end
    redis.call('HSET', KEYS[7], ids[leased], member)
    redis.call('ZADD', KEYS[8], expires, ids[leased])
    reply[#reply + 1] = member
    reply[#reply + 1] = tonumber(assignments)
    reply[#reply + 1] = live
end
if leased == 0 then
    return answer(banned_until and {0, banned_until - now} or {0})
end
redis.call('HINCRBY', KEYS[1], 'total_assignments', leased)
due_by(expires)
reply[4] = due_hint or 0
return answer(reply)
