-- Ends a sticky session (see assign.lua): takes it out of the pool's session index and
-- deletes its key. A session the index does not list as live is not there, whatever key
-- is left (an ended one's, or a deleted pool's, expiring by itself).
-- KEYS[1..22] the pool's keys (as in leases.lua), then KEYS[23] the session index and
-- KEYS[24] the session's key (the index's name, ':', the session id).
-- Returns {-1} when the pool does not exist, {1, 1} when the session was live and is now
-- ended, {1, 0} when there was no such live session.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local index, key = KEYS[#KEYS - 1], KEYS[#KEYS]
local id = string.sub(key, #index + 2)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = tonumber(redis.call('ZSCORE', index, id) or 0)
redis.call('ZREM', index, id)
redis.call('DEL', key)
if ends > now then
    return {1, 1}
end
return {1, 0}
