-- Takes the pools whose time has come from a due index (a sorted set of pool id -> ms on
-- Redis's clock, in a hash slot of its own; see redis/keys.rs). With a hold of 0 they leave
-- the index: whoever took them puts each back at its next due time. With a hold, they stay,
-- moved to now + hold, so that no other replica takes them meanwhile and a replica that dies
-- before putting them back loses them for no longer than the hold.
-- KEYS[1] the index. ARGV[1] most pools to take, ARGV[2] hold in ms (0: remove).
-- Returns the pools taken, earliest first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then
    return due
end
local hold = tonumber(ARGV[2])
if hold == 0 then
    redis.call('ZREM', KEYS[1], unpack(due))
else
    local args = {}
    for _, pool in ipairs(due) do
        args[#args + 1] = string.format('%.0f', now + hold)
        args[#args + 1] = pool
    end
    redis.call('ZADD', KEYS[1], unpack(args))
end
return due
