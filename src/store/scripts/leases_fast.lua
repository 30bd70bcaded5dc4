-- Put in front of assign_fast.lua (and of assign_done_fast.lua) where the common
-- least-in-flight assign and release are answered before any helper exists: ends the live
-- lease `id` of `member` on a pool where no member ever had labels. It is `end_lease` of
-- leases.lua without the label index upkeep (the pool has none) and without re-reading
-- what it has in hand; the caller has checked that the lease is the member's and live.
-- The pool's meta fields assign_fast.lua chooses by, and the store's clock in ms.
local function pool_meta()
    return redis.call('HMGET', KEYS[1], 'created_ms', 'policy', 'lease_ttl_ms', 'max_in_flight',
        'labelled', 'pacing', 'due')
end

local function clock_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- What a script head read before the pick and changed nothing of (assign_done_fast.lua's
-- release), for assign_fast.lua to take instead of asking Redis again; nil otherwise.
local known_meta, known_now = nil, nil

local function free_lease(id, member)
    redis.call('HDEL', KEYS[7], id)
    redis.call('ZREM', KEYS[8], id)
    local live = redis.call('HINCRBY', KEYS[6], member, -1)
    if live <= 0 then
        redis.call('HDEL', KEYS[6], member)
        live = 0
    end
    -- `place`: only an eligible member is in the choosing order.
    local assignments = redis.call('ZSCORE', KEYS[2], member)
    if assignments then
        redis.call('ZADD', KEYS[5], live, string.format('%020d', tonumber(assignments)) .. member)
    end
end
