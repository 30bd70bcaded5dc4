-- Removes a pool and every key it has.
-- KEYS: every key of the pool, leases included (one hash slot; see leases.lua).
-- Returns 1 when the pool existed, 0 otherwise.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
redis.call('DEL', unpack(KEYS))
return 1
