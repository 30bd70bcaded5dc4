-- Reads one page of a pool's members from each of its two sets, with their health.
-- KEYS as in labels.lua, leases.lua and health.lua (then [16] sources, [17..20] pruning,
-- [21] the ban index, [22] pacing); for a listing that names a target, [23] its ban hash
-- (as in outcomes.lua).
-- ARGV[1] eligible offset, ARGV[2] ineligible offset, ARGV[3] how many eligible and
-- ARGV[4] how many ineligible members to read (0 skips that set).
-- With a label filter, ARGV[1] is instead how many entries of the label index earlier
-- pages passed, ARGV[3] and ARGV[4] '1' or '0' whether eligible and ineligible members
-- are wanted, ARGV[5] the page size, ARGV[6] most index entries to read, ARGV[7..] label
-- groups "key value value ...": the page walks the entries of the first group's values
-- (each value's members by id) and keeps those that pass every group.
-- With ARGV[7] ':shared' (no label group starts with ':'), the page keeps the members
-- that share their exit address with another member: it walks the eligible set from
-- offset ARGV[1], then the ineligible one from ARGV[2], in set order, reading at most
-- ARGV[6] members, ARGV[3..5] as with a label filter.
-- Returns {-1} when the pool does not exist, else
-- {1, 'eligible', {name, list, ...}, 'ineligible', {name, list, ...}} (with a filter:
-- {2, ..., 'next', offset or -1 when the walk has ended}; with ':shared', {3, ...,
-- 'next', {eligible offset, ineligible offset} or -1}): each set's page as
-- named lists (`MembersReply` in reply.rs reads them in this order): `members` the
-- {member, count, ...} pairs, then one entry per member of the page in each of
-- `taken_out` (ineligible only) "<since_ms> <reason>", `in_flight` the live leases,
-- `health` "<streak> <trips> <cooldown_ms>", `returns` (ineligible only) the ms it comes
-- back at, `checks` "<at_ms> <result>[/<latency_ms>] <detail>", `labels` its labels,
-- `origins` 'import' or the URL of the source that added it, `exits` "<ip> <at_ms>" (see
-- labels.lua) (each nil when none), and for
-- a target `banned_until` the end of its ban (0 when none).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local function page(key, offset, count)
    if tonumber(count) == 0 then
        return {}
    end
    return redis.call('ZRANGE', key, offset, offset + count - 1, 'WITHSCORES')
end
local status = 1
local eligible, ineligible, next_offset
local groups = ARGV[7] ~= ':shared' and filter_groups(7)
if ARGV[7] == ':shared' then
    status = 3
    eligible, ineligible = {}, {}
    local size, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
    local found = 0
    local positions = {tonumber(ARGV[1]), tonumber(ARGV[2])}
    local walks = {{KEYS[2], ARGV[3] == '1', eligible}, {KEYS[3], ARGV[4] == '1', ineligible}}
    local stopped = false
    for w, walk in ipairs(walks) do
        local key, wanted, out = walk[1], walk[2], walk[3]
        while wanted and not stopped do
            local position = positions[w]
            -- At least one entry, so that a spent budget stops the walk only before a
            -- member it has not read (as the embedded store's walk does).
            local entries = redis.call('ZRANGE', key, position,
                position + math.max(1, math.min(budget, 64)) - 1, 'WITHSCORES')
            if #entries == 0 then
                break
            end
            for j = 1, #entries, 2 do
                if found == size or budget == 0 then
                    stopped = true
                    break
                end
                budget = budget - 1
                positions[w] = positions[w] + 1
                local ip = exit_of(entries[j])
                if ip and tonumber(redis.call('HGET', KEYS[11], 'shared ' .. ip) or 0) >= 2 then
                    out[#out + 1] = entries[j]
                    out[#out + 1] = entries[j + 1]
                    found = found + 1
                end
            end
        end
    end
    next_offset = stopped and positions or -1
elseif groups then
    -- Walks the index from where the last page stopped, reading at most ARGV[6] entries.
    status = 2
    eligible, ineligible = {}, {}
    local want_eligible, want_ineligible = ARGV[3] == '1', ARGV[4] == '1'
    local size, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
    local skip = tonumber(ARGV[1])
    local position = 0
    local found = 0
    next_offset = -1
    local walk = groups[1]
    for _, value in ipairs(walk.values) do
        local pair = walk.key .. '=' .. value
        local low, high = '[' .. pair .. '\0', '(' .. pair .. '\1'
        local total = redis.call('ZLEXCOUNT', KEYS[15], low, high)
        -- A value nobody carries holds nothing to list: a full page before it is the last.
        if total == 0 or skip >= position + total then
            position = position + total
        else
            if found == size or budget == 0 then
                next_offset = position
                break
            end
            local start = math.max(0, skip - position)
            position = position + start
            local entries = redis.call('ZRANGE', KEYS[15], low, high, 'BYLEX', 'LIMIT', start, budget)
            for _, e in ipairs(entries) do
                if found == size then
                    next_offset = position
                    break
                end
                budget = budget - 1
                position = position + 1
                local member = string.sub(e, #pair + 2)
                if passes(labels_table(redis.call('HGET', KEYS[13], member)), groups, 1) then
                    local count = redis.call('ZSCORE', KEYS[2], member)
                    if count then
                        if want_eligible then
                            eligible[#eligible + 1] = member
                            eligible[#eligible + 1] = count
                            found = found + 1
                        end
                    elseif want_ineligible then
                        ineligible[#ineligible + 1] = member
                        ineligible[#ineligible + 1] = redis.call('ZSCORE', KEYS[3], member)
                        found = found + 1
                    end
                end
            end
            if next_offset == -1 and start + #entries < total then
                next_offset = position
            end
            if next_offset ~= -1 then
                break
            end
        end
    end
else
    eligible = page(KEYS[2], ARGV[1], ARGV[3])
    ineligible = page(KEYS[3], ARGV[2], ARGV[4])
end
local function names(pairs)
    local out = {}
    for i = 1, #pairs, 2 do
        out[#out + 1] = pairs[i]
    end
    return out
end
local function lookup(command, key, fields)
    if #fields == 0 then
        return {}
    end
    return redis.call(command, key, unpack(fields))
end
-- Origins as listed: 'import', or the URL the source id stands for (kept for the last 256
-- ids given, see claim_sources.lua); nil for members added by hand.
local function origins(members)
    local out = lookup('HMGET', KEYS[17], members)
    local urls = {}
    for n, code in ipairs(out) do
        if code == 'i' then
            out[n] = 'import'
        elseif code then
            local id = string.sub(code, 2)
            urls[id] = urls[id] or redis.call('HGET', KEYS[16], 'u:' .. id)
                or ('removed source #' .. id)
            out[n] = urls[id]
        end
    end
    return out
end
-- The end of each member's ban for the target, 0 when it has none: a hash the index
-- does not list (or lists as forgotten) is a deleted pool's, and means nothing here.
local function bans(members)
    local out = {}
    local now = now_ms()
    local target = string.sub(KEYS[23], #KEYS[21] + 2)
    local forget = redis.call('ZSCORE', KEYS[21], target)
    local texts = {}
    if forget and tonumber(forget) > now and #members > 0 then
        texts = redis.call('HMGET', KEYS[23], unpack(members))
    end
    for n = 1, #members do
        local ends = tonumber(string.match(texts[n] or '', '^(%d+)') or 0)
        out[n] = ends > now and ends or 0
    end
    return out
end
-- Each member's exit address entry (see labels.lua).
local function exits(members)
    local fields = {}
    for n, member in ipairs(members) do
        fields[n] = 'exit ' .. member
    end
    return lookup('HMGET', KEYS[11], fields)
end
-- Each member's quality entry (see quality.lua).
local function qualities(members)
    local fields = {}
    for n, member in ipairs(members) do
        fields[n] = 'q ' .. member
    end
    return lookup('HMGET', KEYS[9], fields)
end
local e, i = names(eligible), names(ineligible)
local reply = {
    status,
    'eligible', {
        'members', eligible,
        'in_flight', lookup('HMGET', KEYS[6], e),
        'health', lookup('HMGET', KEYS[9], e),
        'checks', lookup('HMGET', KEYS[11], e),
        'labels', lookup('HMGET', KEYS[13], e),
        'origins', origins(e),
        'exits', exits(e),
        'quality', qualities(e),
    },
    'ineligible', {
        'members', ineligible,
        'taken_out', lookup('HMGET', KEYS[4], i),
        'in_flight', lookup('HMGET', KEYS[6], i),
        'health', lookup('HMGET', KEYS[9], i),
        'returns', lookup('ZMSCORE', KEYS[10], i),
        'checks', lookup('HMGET', KEYS[11], i),
        'labels', lookup('HMGET', KEYS[13], i),
        'origins', origins(i),
        'exits', exits(i),
        'quality', qualities(i),
    },
}
if #KEYS >= 23 then
    local function add(page, list)
        page[#page + 1] = 'banned_until'
        page[#page + 1] = list
    end
    add(reply[3], bans(e))
    add(reply[5], bans(i))
end
if next_offset then
    reply[#reply + 1] = 'next'
    reply[#reply + 1] = next_offset
end
return reply
