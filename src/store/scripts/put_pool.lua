-- Creates a pool or replaces its configuration.
-- KEYS[1] pool meta hash.
-- ARGV[1] configuration as JSON (read back by the service), ARGV[2] restore policy,
-- ARGV[3] start_assignments or '' for "the current minimum", ARGV[4] max_members or ''
-- for no bound (the seed script reads these two fields, not the JSON).
-- Returns 1 when the pool was created, 0 when it existed.
local created = redis.call('EXISTS', KEYS[1]) == 0
if created then
    local t = redis.call('TIME')
    local now_ms = t[1] .. string.format('%03d', math.floor(t[2] / 1000))
    redis.call('HSET', KEYS[1], 'created_ms', now_ms, 'total_assignments', 0)
end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'restore', ARGV[2])
local optional = {start_assignments = ARGV[3], max_members = ARGV[4]}
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
