-- Reads one page of a pool's members from each of its two sets.
-- KEYS[1] meta, KEYS[2] eligible, KEYS[3] ineligible, KEYS[4] taken_out hash.
-- ARGV[1] eligible offset, ARGV[2] ineligible offset, ARGV[3] how many eligible and
-- ARGV[4] how many ineligible members to read (0 skips that set).
-- Returns {-1} when the pool does not exist, else
-- {1, {member, count, ...} eligible, {member, count, ...} ineligible, {info ...}}
-- where info[i] is "<since_ms> <reason>" for the i-th ineligible member.
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
local info = {}
if #ineligible > 0 then
    local names = {}
    for i = 1, #ineligible, 2 do
        names[#names + 1] = ineligible[i]
    end
    info = redis.call('HMGET', KEYS[4], unpack(names))
end
return {1, eligible, ineligible, info}
