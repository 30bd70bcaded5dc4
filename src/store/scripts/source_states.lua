-- What is kept about the pool's sources, for their listing (at most 16 sources, two
-- fields each, and as many stale ones until the next claim drops them).
-- KEYS as in leases.lua; KEYS[16] the sources hash (redis/keys.rs).
-- Returns {-1} when the pool does not exist, else {1, {field, value, ...}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
return {1, redis.call('HGETALL', KEYS[16])}
