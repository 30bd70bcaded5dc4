-- Records the end of a fetch of one source and schedules its next one.
-- KEYS as in leases.lua; KEYS[16] the sources hash (redis/keys.rs).
-- ARGV[1] the source URL, ARGV[2] '1' for a success, '0' for a failure, ARGV[3] ms from
-- now to its next fetch, ARGV[4] the outcome as JSON (kept as given, after the time).
-- Returns {-1} when the pool does not exist, {0} when the source is no longer kept (it was
-- removed from the pool meanwhile: nothing is written), else {1, next} with next its next
-- fetch (ms, Redis clock), for the source index.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local state = redis.call('HGET', KEYS[16], 'n:' .. ARGV[1])
if not state then
    return {0}
end
local _, failures, successes, id = string.match(state, '^(%d+) (%d+) (%d+) (%d+)$')
failures, successes = tonumber(failures), tonumber(successes)
if ARGV[2] == '1' then
    failures, successes = 0, successes + 1
else
    failures = failures + 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local next = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[16],
    'n:' .. ARGV[1], string.format('%.0f %d %d %s', next, failures, successes, id),
    'l:' .. ARGV[1], string.format('%.0f', now) .. ' ' .. ARGV[4])
return {1, next}
