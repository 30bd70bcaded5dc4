-- A turn of the due index's safety net: the next few pools of the registry, walked by one
-- replica at a time from a position every replica shares (see redis/keys.rs, "The due
-- index"). A turn lasts ARGV[2] ms: another replica asking meanwhile is given nothing, so
-- the walk costs the same whatever the number of replicas, and a replica that dies during
-- its turn leaves the next one to whoever asks after it.
-- KEYS[1] the registry (a sorted set of pool ids at score 0), KEYS[2] the walk (a hash,
-- in the registry's slot: `last` pool handed out, `next` ms on Redis's clock when the next
-- turn may start). ARGV[1] pools per turn, ARGV[2] the turn's length in ms.
-- Returns the turn's pools in id order, none when the turn is another replica's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local walk = redis.call('HMGET', KEYS[2], 'last', 'next')
if walk[2] and now < tonumber(walk[2]) then
    return {}
end
local count = tonumber(ARGV[1])
local from = '-'
if walk[1] then
    from = '(' .. walk[1]
end
local pools = redis.call('ZRANGE', KEYS[1], from, '+', 'BYLEX', 'LIMIT', 0, count)
if #pools < count and walk[1] then
    -- The end of the registry: the walk starts over at the first pool.
    local more = redis.call('ZRANGE', KEYS[1], '-', '+', 'BYLEX', 'LIMIT', 0, count - #pools)
    for _, pool in ipairs(more) do
        pools[#pools + 1] = pool
    end
end
local next = string.format('%.0f', now + tonumber(ARGV[2]))
if #pools == 0 then
    redis.call('HSET', KEYS[2], 'next', next)
else
    redis.call('HSET', KEYS[2], 'last', pools[#pools], 'next', next)
end
return pools
