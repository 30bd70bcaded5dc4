-- Claims the pool's sources whose fetch is due: each one claimed is held until now + hold,
-- so that no replica claims it again while this one fetches (and one that dies mid-fetch
-- delays it by no more than the hold); record_source.lua then sets its next fetch. What is
-- kept about sources no longer configured is dropped here. At most 16 sources per pool
-- (and as many stale ones), so the script stays short.
-- KEYS as in leases.lua; KEYS[1] meta, KEYS[16] the sources hash (redis/keys.rs).
-- ARGV[1] hold in ms, ARGV[2..] the pool's configured source URLs.
-- A source seen for the first time is given the pool's next source id (`source_ids` in
-- meta), which stays its own while it is configured; `u:<id>` keeps the URL of the last
-- 256 ids given, for the origins of their members.
-- Returns {-1} when the pool does not exist, else
-- {1, next, {url, failures, successes, id, ...}}: the sources claimed, and next the earliest next fetch of every configured source (ms,
-- Redis clock), for the source index.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[1])
local configured = {}
local claimed = {}
local earliest = nil
local current = {}
local given = {}
for i = 2, #ARGV do
    local url = ARGV[i]
    configured['n:' .. url] = true
    configured['l:' .. url] = true
    local next, failures, successes, id = 0, '0', '0', nil
    local state = redis.call('HGET', KEYS[16], 'n:' .. url)
    if state then
        local n, f, s, i = string.match(state, '^(%d+) (%d+) (%d+) (%d+)$')
        next, failures, successes, id = tonumber(n), f, s, i
    else
        id = tostring(redis.call('HINCRBY', KEYS[1], 'source_ids', 1))
        redis.call('HSET', KEYS[16], 'u:' .. id, url)
        given[#given + 1] = tonumber(id)
    end
    if next <= now then
        next = now + hold
        redis.call('HSET', KEYS[16], 'n:' .. url,
            string.format('%.0f', next) .. ' ' .. failures .. ' ' .. successes .. ' ' .. id)
        claimed[#claimed + 1] = url
        claimed[#claimed + 1] = failures
        claimed[#claimed + 1] = successes
        claimed[#claimed + 1] = id
    end
    if not earliest or next < earliest then
        earliest = next
    end
    current[tonumber(id)] = true
end
-- The URLs of the last 256 ids only (and of every configured source), so that the hash
-- stays bounded however many URLs a pool has had: the members of an older source list as
-- a removed one.
for _, id in ipairs(given) do
    if not current[id - 256] then
        redis.call('HDEL', KEYS[16], 'u:' .. (id - 256))
    end
end
local stale = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[16])) do
    if not configured[field] and string.sub(field, 1, 2) ~= 'u:' then
        stale[#stale + 1] = field
    end
end
if #stale > 0 then
    redis.call('HDEL', KEYS[16], unpack(stale))
end
return {1, earliest or 0, claimed}
