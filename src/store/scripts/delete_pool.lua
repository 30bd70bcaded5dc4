-- Removes a pool and every key it has.
-- KEYS: meta, eligible, ineligible, taken_out (all of one pool, one hash slot).
-- Returns 1 when the pool existed, 0 otherwise.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
redis.call('DEL', unpack(KEYS))
return 1
