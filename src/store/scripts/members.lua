-- Reads one page of a pool's members from each of its two sets, with their health.
-- KEYS as in leases.lua and health.lua.
-- ARGV[1] eligible offset, ARGV[2] ineligible offset, ARGV[3] how many eligible and
-- ARGV[4] how many ineligible members to read (0 skips that set).
-- Returns {-1} when the pool does not exist, else
-- {1, 'eligible', {name, list, ...}, 'ineligible', {name, list, ...}}: each set's page as
-- named lists (`MembersReply` in reply.rs reads them in this order): `members` the
-- {member, count, ...} pairs, then one entry per member of the page in each of
-- `taken_out` (ineligible only) "<since_ms> <reason>", `in_flight` the live leases,
-- `health` "<streak> <trips> <cooldown_ms>", `returns` (ineligible only) the ms it comes
-- back at, `checks` "<at_ms> <result>[/<latency_ms>] <detail>" (each nil when none).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local function page(key, offset, count)
    if tonumber(count) == 0 then
        return {}
    end
    return redis.call('ZRANGE', key, offset, offset + count - 1, 'WITHSCORES')
end
local eligible = page(KEYS[2], ARGV[1], ARGV[3])
local ineligible = page(KEYS[3], ARGV[2], ARGV[4])
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
local e, i = names(eligible), names(ineligible)
return {
    1,
    'eligible', {
        'members', eligible,
        'in_flight', lookup('HMGET', KEYS[6], e),
        'health', lookup('HMGET', KEYS[9], e),
        'checks', lookup('HMGET', KEYS[11], e),
    },
    'ineligible', {
        'members', ineligible,
        'taken_out', lookup('HMGET', KEYS[4], i),
        'in_flight', lookup('HMGET', KEYS[6], i),
        'health', lookup('HMGET', KEYS[9], i),
        'returns', lookup('ZMSCORE', KEYS[10], i),
        'checks', lookup('HMGET', KEYS[11], i),
    },
}
