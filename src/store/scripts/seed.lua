-- Adds members to a pool. New members join the eligible set at the starting count; members
-- already in the pool (eligible or not) keep their count unless reset is asked for. Once
-- the pool holds max_members members, further new ones are refused as full.
-- On a least-in-flight pool, added and reset eligible members take their place in the
-- choosing order (they keep any live leases).
-- KEYS as in leases.lua.
-- ARGV[1..2] the chunk's bound (see chunk.lua),
-- ARGV[3] explicit starting count or '', ARGV[4] '1' to reset existing members,
-- ARGV[5] '1' for a dry run (nothing is written), ARGV[6] members earlier chunks of the
-- same dry run would have added, ARGV[7] how many texts follow each member id: '0', '1'
-- its operator labels ("key=value" lines; '' for none; '~' to keep what it has), or '2'
-- those and then its labels from the GeoIP file for its own address (keys `geo_...`; ''
-- for none, '~' to keep), which a member whose exit address a check recorded keeps
-- (those of its exit address win; see exit_ip.lua),
-- ARGV[8] the new members' origin ('' by hand, 'i' imported, 's<id>' from a source; see
-- health.lua), ARGV[9] with a source, its fetch's place in the seen set (else ''): new
-- members take it, and so do members already there from the same source (seen again),
-- ARGV[10..] member ids (validated and de-duplicated), each with its texts.
-- Returns {-1} when the pool does not exist, else
-- {1, start, {1 = added | 0 = existing | 2 = full ...}}, with an outcome for each of the
-- first members, all of them unless the chunk stopped at its bound, then the microseconds
-- the script ran (see chunk.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local meta = redis.call('HMGET', KEYS[1], 'start_assignments', 'max_members')
local start = ARGV[3]
if start == '' then
    start = meta[1]
end
if not start then
    -- No agreed count: join at the current minimum so a new member is not flooded.
    start = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2] or '0'
end
local max = tonumber(meta[2])
local size = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) + tonumber(ARGV[6])
local reset = ARGV[4] == '1'
local dry_run = ARGV[5] == '1'
local lif = least_in_flight() and not dry_run
local outcomes = {}
local texts = tonumber(ARGV[7])
local step = 1 + texts
local origin, seen = ARGV[8], ARGV[9]
local asked = (#ARGV - 9) / step
-- A text or nil for '~' (keep).
local function given(text)
    if text == '~' then
        return nil
    end
    return text
end
for i = 10, #ARGV, step do
    local member = ARGV[i]
    local labels = texts >= 1 and given(ARGV[i + 1]) or nil
    local geo = texts == 2 and given(ARGV[i + 2]) or nil
    local holder = nil
    if redis.call('ZSCORE', KEYS[2], member) then
        holder = KEYS[2]
    elseif redis.call('ZSCORE', KEYS[3], member) then
        holder = KEYS[3]
    end
    if holder then
        if reset and not dry_run then
            if lif then
                unplace(member)
            end
            local text = unlabel(member, lif)
            redis.call('ZADD', holder, start, member)
            label(member, lif, text)
        end
        if geo and exit_of(member) then
            geo = nil
        end
        if (labels or geo) and not dry_run then
            relabel(member, labels, geo, lif)
        end
        if seen ~= '' and not dry_run and redis.call('HGET', KEYS[17], member) == origin then
            redis.call('ZADD', KEYS[18], seen, member)
        end
        outcomes[#outcomes + 1] = 0
    elseif max and size >= max then
        outcomes[#outcomes + 1] = 2
    else
        if not dry_run then
            redis.call('ZADD', KEYS[2], start, member)
            if labels or geo then
                relabel(member, labels, geo, lif)
            end
            if origin ~= '' then
                redis.call('HSET', KEYS[17], member, origin)
            end
            if seen ~= '' then
                redis.call('ZADD', KEYS[18], seen, member)
            end
        end
        size = size + 1
        outcomes[#outcomes + 1] = 1
    end
    if lif then
        place(member)
    end
    if chunk_spent(#outcomes, asked) then
        break
    end
end
return {1, tonumber(start), outcomes}
