-- The client rate limit, at the very head of assign.lua and assign_done.lua (inside a
-- `do` block with src/rules/bucket.lua, see `rate_limited` in redis/scripts.rs), so that it
-- is checked in the assign's own call and a refused assign changes nothing, its `done`
-- included. An assign with a client token that has a rate ends its ARGV with
-- "\trate <rate_per_second> <burst> <tokens needed> <most buckets> <client>" (no other
-- argument starts with a tab) and its KEYS with the pool's buckets hash
-- (`{pool}:buckets`, see keys.rs); both are taken off here, so the rest of the script sees
-- the arguments of the same assign without a client, and an assign without them pays one
-- byte comparison.
-- A bucket is the field of its client, "<milli-tokens> <ms>" (rules/bucket.rs's Bucket);
-- a client without one has a full bucket. The hash expires once the last of its buckets
-- would be full again. Past <most buckets>, a new client's bucket starts the hash over
-- (every bucket full: finding the full ones would read them all). A pool that does not
-- exist gets no bucket: the script answers {-1} further on.
-- Refused: {-4, ms until enough tokens}.
local rate_arg = ARGV[#ARGV]
if rate_arg and string.byte(rate_arg, 1) == 9 then
    local buckets = KEYS[#KEYS]
    ARGV[#ARGV] = nil
    KEYS[#KEYS] = nil
    if redis.call('EXISTS', KEYS[1]) == 1 then
        local rate, burst, needed, most, client =
            string.match(rate_arg, '^\trate (%d+) (%d+) (%d+) (%d+) (%S+)$')
        rate, burst, needed = tonumber(rate), tonumber(burst), tonumber(needed)
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local held = redis.call('HGET', buckets, client)
        local milli, at = nil, 0
        if held then
            local m, a = string.match(held, '^(%d+) (%d+)$')
            milli, at = tonumber(m), tonumber(a)
        end
        local ok, value = take(milli, at, rate, burst, now, needed)
        if not ok then
            return {-4, value}
        end
        if not held and redis.call('HLEN', buckets) >= tonumber(most) then
            redis.call('DEL', buckets)
        end
        redis.call('HSET', buckets, client, string.format('%.0f %.0f', value, now))
        local full_in = full_in_ms(value, rate, burst)
        if redis.call('PTTL', buckets) < full_in then
            redis.call('PEXPIRE', buckets, string.format('%.0f', full_in))
        end
    end
end
