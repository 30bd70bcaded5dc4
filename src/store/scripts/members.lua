-- Reads one page of a pool's members from each of its two sets.
-- KEYS as in leases.lua.
-- ARGV[1] eligible offset, ARGV[2] ineligible offset, ARGV[3] how many eligible and
-- ARGV[4] how many ineligible members to read (0 skips that set).
-- Returns {-1} when the pool does not exist, else
-- {1, {member, count, ...} eligible, {member, count, ...} ineligible, {info ...},
--  {live ...} eligible, {live ...} ineligible}
-- where info[i] is "<since_ms> <reason>" and live[i] the live leases (or nil) of the i-th
-- member of its set.
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
local function lookup(key, fields)
    if #fields == 0 then
        return {}
    end
    return redis.call('HMGET', key, unpack(fields))
end
local eligible_names, ineligible_names = names(eligible), names(ineligible)
return {
    1, eligible, ineligible, lookup(KEYS[4], ineligible_names),
    lookup(KEYS[6], eligible_names), lookup(KEYS[6], ineligible_names),
}
