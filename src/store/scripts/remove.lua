-- Forgets members entirely, eligible or not, history included.
-- KEYS[1] meta, KEYS[2] eligible, KEYS[3] ineligible, KEYS[4] taken_out hash.
-- ARGV[1..] member ids.
-- Returns {-1} when the pool does not exist, else {1, {1 = removed | 0 = unknown ...}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local outcome = {}
for i = 1, #ARGV do
    local member = ARGV[i]
    local removed = redis.call('ZREM', KEYS[2], member) + redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member)
    outcome[#outcome + 1] = math.min(removed, 1)
end
return {1, outcome}
