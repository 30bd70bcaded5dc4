-- Put in front of assign_fast.lua (and of assign_done_fast.lua) where the common
-- least-in-flight assign and release are answered before any helper exists: ends the live
-- lease `id` of `member` on a pool where no member ever had labels. It is `end_lease` of
-- leases.lua without the label index upkeep (the pool has none) and without re-reading
-- what it has in hand; the caller has checked that the lease is the member's and live.
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
