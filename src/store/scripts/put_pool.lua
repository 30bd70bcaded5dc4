-- Creates a pool or replaces its configuration. The policy of a pool that has members
-- cannot change: its members' state means nothing under the other policy.
-- KEYS as in leases.lua.
-- ARGV[1] configuration as JSON (read back by the service), ARGV[2] restore policy,
-- ARGV[3] start_assignments or '' for "the current minimum", ARGV[4] policy,
-- ARGV[5] lease_ttl_ms, ARGV[6] max_in_flight or '' for no cap, ARGV[7] max_members or ''
-- for no bound (the scripts read these fields, not the JSON), ARGV[8] the health rules
-- (HealthConfig::script_arg). New health rules apply to the next report; cooldowns
-- already scheduled keep their end. ARGV[9] the prune rules (PruneConfig::script_arg) or
-- '' for none, ARGV[10] health.target_ban_ms (read by outcomes.lua), ARGV[11] pacing
-- (Pacing::script_arg, read by assign.lua) or '' for none, ARGV[12] session_ttl_ms (read by
-- assign.lua).
-- Returns 1 when the pool was created, 0 when it existed, -2 when the policy change was
-- refused (nothing changed).
local created = redis.call('EXISTS', KEYS[1]) == 0
if created then
    local t = redis.call('TIME')
    local now_ms = t[1] .. string.format('%03d', math.floor(t[2] / 1000))
    redis.call('HSET', KEYS[1], 'created_ms', now_ms, 'total_assignments', 0)
else
    local policy = redis.call('HGET', KEYS[1], 'policy') or 'least-used'
    local members = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
    if policy ~= ARGV[4] and members > 0 then
        return -2
    end
end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'restore', ARGV[2], 'policy', ARGV[4],
    'lease_ttl_ms', ARGV[5], 'health', ARGV[8], 'target_ban_ms', ARGV[10],
    'session_ttl_ms', ARGV[12])
local optional = {start_assignments = ARGV[3], max_in_flight = ARGV[6], max_members = ARGV[7],
    prune = ARGV[9], pacing = ARGV[11]}
for field, value in pairs(optional) do
    if value == '' then
        redis.call('HDEL', KEYS[1], field)
    else
        redis.call('HSET', KEYS[1], field, value)
    end
end
if created then
    return 1
end
return 0
