-- The head of assign.lua, put in front of the helpers (see `fast_path_then_helpers` in
-- redis/scripts.rs): Lua makes a closure of every helper each time a script reaches its
-- definition, and on the common assign (one member of a least-used pool that never had
-- labels and is not paced, asked without a label filter or a target, nobody cooling down)
-- making them cost more than the choice. So that assign chooses and returns here, before
-- any helper exists; every other one goes on to assign.lua with `meta` and `first_due`
-- read. The choice is the same as assign.lua's.
local meta = redis.call('HMGET', KEYS[1], 'created_ms', 'policy', 'lease_ttl_ms', 'max_in_flight',
    'labelled', 'pacing')
if not meta[1] then
    return {-1}
end
local first_due = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2]
-- A target adds keys after the pool's own 22 (its bans and pacing set, see assign.lua).
if not first_due and not meta[5] and not meta[6] and #ARGV < 7 and ARGV[6] == '1'
    and #KEYS < 23
    and meta[2] ~= 'least-in-flight' then
    local chosen = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if chosen then
        local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
        redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
        return {1, chosen, tonumber(assignments)}
    end
end
