-- Picks the eligible member with the fewest assignments and counts one more for it.
-- Selection and increment happen in this one script so that no other client can run
-- between them: two concurrent assigns never both see the same minimum.
-- Equal counts are ordered by member bytes (Redis's order for equal scores).
-- KEYS[1] pool meta hash, KEYS[2] eligible sorted set (member -> assignments).
-- Returns {-1} when the pool does not exist, {0} when it has no eligible member,
-- {1, member, assignments after this one} otherwise.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local chosen = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if not chosen then
    return {0}
end
local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
return {1, chosen, tonumber(assignments)}
