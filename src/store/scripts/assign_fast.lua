-- The head of assign.lua, put in front of the helpers (see `fast_path_then_helpers` in
-- redis/scripts.rs) with leases_fast.lua before it: Lua makes a closure of every helper
-- each time a script reaches its definition, and on the common assign (one member of a
-- pool that is not paced, asked without a target, nobody cooling down: on a least-used pool
-- with at most one label, on a least-in-flight one that never had labels and without a
-- filter) making them cost more than the choice. So that assign chooses and returns here,
-- before any helper exists; every other one goes on to assign.lua with `meta` and
-- `first_due` read. The choice and the reply are the same as assign.lua's.
local meta = known_meta or pool_meta()
if not meta[1] then
    return {-1}
end
local first_due = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')[2]
-- An assign that excludes members ends its ARGV with them, a newline first (see assign.lua).
local excluding = #ARGV >= 7 and string.byte(ARGV[#ARGV], 1) == 10
-- A target adds keys after the pool's own 22 (its bans and pacing set, see assign.lua).
if not first_due and not meta[6] and ARGV[6] == '1' and #KEYS < 23 and not excluding then
    if meta[2] ~= 'least-in-flight' then
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
            -- as `unlabel` and `label` move them, here without their closures: an entry that
            -- carries the member's labels text names every entry to move, else the labels
            -- hash does. A value list or several keys go on to pick_labelled.
            -- Numbers go to Redis as text and counts come back as text: Redis writes a Lua
            -- number given to a command with printf's %.17g, and the order text's 20 digits
            -- are the count Redis answered, padded (a count below 2^53 is all digits).
            local chosen, order, entry, carried = nil, nil, nil, nil
            if #ARGV < 7 then
                local head = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
                chosen = head[1]
                order = chosen and string.rep('0', 20 - #head[2]) .. head[2] .. chosen
            elseif #ARGV == 7 then
                local key, value = string.match(ARGV[7], '^(%S+) (%S+)$')
                if key then
                    local pair = key .. '=' .. value
                    entry = redis.call('ZRANGE', KEYS[14], '[' .. pair .. '\0',
                        '(' .. pair .. '\1', 'BYLEX', 'LIMIT', '0', '1')[1]
                    if entry then
                        -- "key=value" NUL, 20 digits, the id, then NUL and the labels text
                        -- when the entry carries it (tail_of in labels.lua).
                        local cut = string.find(entry, '\0', #pair + 22, true)
                        order = string.sub(entry, #pair + 2, cut and cut - 1)
                        chosen = string.sub(order, 21)
                        carried = cut and string.sub(entry, cut + 1) or false
                    end
                end
            end
            if chosen then
                local assignments = redis.call('ZINCRBY', KEYS[2], '1', chosen)
                local text = carried or redis.call('HGET', KEYS[13], chosen)
                if text then
                    local moved = string.rep('0', 20 - #assignments) .. assignments .. chosen
                    -- CARRIED_LABELS of labels.lua.
                    if #text <= 64 then
                        moved = moved .. '\0' .. text
                    end
                    if entry and not string.find(text, '\n', 1, true) then
                        -- The member's one label: its one entry is the one just read.
                        redis.call('ZREM', KEYS[14], entry)
                        redis.call('ZADD', KEYS[14], '0', text .. '\0' .. moved)
                    else
                        -- As `unlabel`: the entries in the form read, or both forms when
                        -- none was read.
                        local tails = {carried and order .. '\0' .. text or order}
                        if carried == nil then
                            tails[2] = order .. '\0' .. text
                        end
                        local old, new = {}, {}
                        for pair in string.gmatch(text, '[^\n]+') do
                            for _, tail in ipairs(tails) do
                                old[#old + 1] = pair .. '\0' .. tail
                            end
                            new[#new + 1] = '0'
                            new[#new + 1] = pair .. '\0' .. moved
                        end
                        redis.call('ZREM', KEYS[14], unpack(old))
                        redis.call('ZADD', KEYS[14], unpack(new))
                    end
                end
                redis.call('HINCRBY', KEYS[1], 'total_assignments', '1')
                return {1, chosen, tonumber(assignments)}
            end
        end
    elseif not meta[5] and #ARGV < 7 then
        -- As assign.lua: reclaim up to ARGV[3] expired leases first (abandoned), then lease
        -- the first member of the choosing order unless it is at max_in_flight (then every
        -- member is, and assign.lua answers why nothing is leased).
        local now = known_now or clock_ms()
        local expired = redis.call('ZRANGE', KEYS[8], '-inf', now, 'BYSCORE', 'LIMIT', 0,
            tonumber(ARGV[3]))
        if #expired > 0 then
            local reclaimed = 0
            for _, id in ipairs(expired) do
                local member = redis.call('HGET', KEYS[7], id)
                if member then
                    free_lease(id, member)
                    reclaimed = reclaimed + 1
                end
            end
            if reclaimed > 0 then
                redis.call('HINCRBY', KEYS[1], 'abandoned', reclaimed)
            end
        end
        local head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
        local cap = meta[4] and tonumber(meta[4])
        if head[1] and not (cap and tonumber(head[2]) >= cap) then
            local member = string.sub(head[1], 21)
            local ttl = tonumber(ARGV[2]) or tonumber(meta[3])
            local expires = now + ttl
            redis.call('ZREM', KEYS[5], head[1])
            local assignments = redis.call('ZINCRBY', KEYS[2], 1, member)
            local live = redis.call('HINCRBY', KEYS[6], member, 1)
            redis.call('ZADD', KEYS[5], live,
                string.format('%020d', tonumber(assignments)) .. member)
            redis.call('HSET', KEYS[7], ARGV[1], member)
            redis.call('ZADD', KEYS[8], expires, ARGV[1])
            redis.call('HINCRBY', KEYS[1], 'total_assignments', 1)
            -- `due_by(expires)` of leases.lua, with `due` read above.
            local hint = 0
            if not meta[7] or tonumber(meta[7]) > expires then
                redis.call('HSET', KEYS[1], 'due', string.format('%.0f', expires))
                hint = expires
            end
            return {2, expires, ttl, hint, member, tonumber(assignments), live}
        end
    end
end
