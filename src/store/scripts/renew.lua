-- Extends a live lease to now + ttl. An expired lease cannot be renewed: its member may
-- already have been handed to someone else. The twin of `renew` in embedded.rs.
-- A shorter ttl moves the lease's expiry before the pool's `due` time: `due_by` lowers it,
-- as an assign's new lease does, and the hint goes back so that the service lowers the
-- pool's entry in the due index; else the sweep would find the pool only at the old expiry
-- (or when the safety net's walk came by) and the lease would outlive its ttl.
-- KEYS as in leases.lua. ARGV[1] lease id, ARGV[2] ttl in ms or '' for the pool's.
-- Returns {-1} when the pool does not exist, {1, 0} when the lease is not live, else
-- {1, 1, member, expires_ms, ttl_ms, due hint}: the hint the pool's new earliest due time,
-- or 0 (see `due_by` in leases.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local now = now_ms()
if not live(ARGV[1], now) then
    return {1, 0}
end
local ttl = tonumber(ARGV[2]) or tonumber(redis.call('HGET', KEYS[1], 'lease_ttl_ms'))
local expires = now + ttl
redis.call('ZADD', KEYS[8], 'XX', expires, ARGV[1])
due_by(expires)
return {1, 1, redis.call('HGET', KEYS[7], ARGV[1]), expires, ttl, due_hint or 0}
