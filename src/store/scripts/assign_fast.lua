-- The head of assign.lua, put in front of the helpers (see `fast_path_then_helpers` in
-- redis/scripts.rs): Lua makes a closure of every helper each time a script reaches its
-- definition, and on the common assign (one member of a least-used pool that is not paced,
-- asked without a target and with at most one label, nobody cooling down) making them cost
-- more than the choice. So that assign chooses and returns here, before any helper exists;
-- every other one goes on to assign.lua with `meta` and `first_due` read. The choice is the
-- same as assign.lua's.
local meta = redis.call('HMGET', KEYS[1], 'created_ms', 'policy', 'lease_ttl_ms', 'max_in_flight',
    'labelled', 'pacing')
if not meta[1] then
    return {-1}
end
local first_due = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2]
-- A target adds keys after the pool's own 22 (its bans and pacing set, see assign.lua).
if not first_due and not meta[6] and ARGV[6] == '1' and #KEYS < 23
    and meta[2] ~= 'least-in-flight' then
    if not meta[5] then
        if #ARGV < 7 then
            local chosen = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
            if chosen then
                local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
                redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
                return {1, chosen, tonumber(assignments)}
            end
        end
    else
        -- A pool with labels: the plain assign, or one filtering on a single key = value
        -- (ARGV[7] "key value", nothing after it), whose choice is the first entry of that
        -- label's range in by_label (see labels.lua: only eligible members are there, in
        -- the choosing order). Either way the member's label entries move with its count,
        -- as `unlabel` and `label` move them, here without their closures. A value list or
        -- several keys go on to pick_labelled.
        local chosen, order = nil, nil
        if #ARGV < 7 then
            local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
            chosen = head[1]
            order = chosen and string.format('%020d', tonumber(head[2])) .. chosen
        elseif #ARGV == 7 then
            local key, value = string.match(ARGV[7], '^(%S+) (%S+)$')
            if key then
                local pair = key .. '=' .. value
                order = redis.call('ZRANGE', KEYS[14], '[' .. pair .. '\0', '(' .. pair .. '\1',
                    'BYLEX', 'LIMIT', 0, 1)[1]
                if order then
                    order = string.sub(order, #pair + 2)
                    chosen = string.sub(order, 21)
                end
            end
        end
        if chosen then
            local assignments = redis.call('ZINCRBY', KEYS[2], 1, chosen)
            local text = redis.call('HGET', KEYS[13], chosen)
            if text then
                local moved = string.format('%020d', tonumber(assignments)) .. chosen
                local old, new = {}, {}
                for pair in string.gmatch(text, '[^\n]+') do
                    old[#old + 1] = pair .. '\0' .. order
                    new[#new + 1] = 0
                    new[#new + 1] = pair .. '\0' .. moved
                end
                redis.call('ZREM', KEYS[14], unpack(old))
                redis.call('ZADD', KEYS[14], unpack(new))
            end
            redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
            return {1, chosen, tonumber(assignments)}
        end
    end
end
