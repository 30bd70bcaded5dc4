-- Label helpers, put first in front of every pool script that changes members or leases
-- (see `with_helpers` in redis/scripts.rs). Only local functions: nothing runs until a
-- script calls one.
-- KEYS, continuing health.lua:
--   [13] labels hash (member -> its labels as "key=value" lines in key order; absent when none),
--   [14] by_label sorted set: one entry per label of each ELIGIBLE member, all at score 0,
--        "key=value" NUL, then the member's place in the choosing order (see order_text),
--        then, when its labels text is at most CARRIED_LABELS bytes, NUL and that text (see
--        tail_of): an assign that picks the entry then knows every entry of the member to
--        move without reading the labels hash. Entries written before they carried the
--        text have none and are read as those of a member with longer labels are (the
--        hash is read); the member's next move writes them anew;
--   [15] label_members sorted set: one entry per label of EVERY member, all at score 0,
--        "key=value" NUL member, for listings.
-- Entries at one score sort by bytes, and the choosing order is written in fixed-width
-- digits, so the first entry of the range "key=value" NUL is the least-used (least-busy)
-- eligible member carrying that label: one O(log N) ZRANGE BYLEX, whatever the pool's size.
-- Keys and values never hold '=', NUL or a newline (LabelFilter in the service), and member
-- ids are visible ASCII: the NUL after an id sorts it before every id it begins, as the id
-- alone does, so the text an entry carries never changes the order.

-- Longest labels text an entry carries. Mind assign_fast.lua, which writes entries before
-- this file is read and keeps the same bound.
local CARRIED_LABELS = 64

-- A count as 20 digits. Redis answers counts as text (a score, all digits below 2^53), which
-- is padded as it is: formatting a number costs a printf.
local function digits20(count)
    if type(count) == 'string' then
        return string.rep('0', 20 - #count) .. count
    end
    return string.format('%020d', count)
end

-- A member's place in the choosing order, its order text: on least-used pools its
-- assignments as 20 digits, then its id; on least-in-flight pools its live leases as 20
-- digits in front (the order of `by_in_flight`, leases.lua). `live` is nil on least-used
-- pools.
local function order_of(assignments, member, live)
    local text = digits20(assignments) .. member
    if live then
        text = digits20(live) .. text
    end
    return text
end

-- An eligible member's order text from its current numbers; nil when it is not eligible.
local function order_text(member, lif)
    local assignments = redis.call('ZSCORE', KEYS[2], member)
    if not assignments then
        return nil
    end
    return order_of(assignments, member, lif and (redis.call('HGET', KEYS[6], member) or 0))
end

-- The id inside an order text.
local function order_member(order, lif)
    return string.sub(order, lif and 41 or 21)
end

-- One entry per label of `text`, "key=value" NUL `tail`, added to `entries` (a new table
-- when nil).
local function label_entries(text, tail, entries)
    entries = entries or {}
    for pair in string.gmatch(text, '[^\n]+') do
        entries[#entries + 1] = pair .. '\0' .. tail
    end
    return entries
end

-- What a member's entries hold after "key=value" NUL: its order text, then NUL and its
-- labels text when that is short enough to carry.
local function tail_of(order, text)
    if #text <= CARRIED_LABELS then
        return order .. '\0' .. text
    end
    return order
end

-- An entry's tail split into its order text and the labels text it carries (nil when it
-- carries none). An order text has no NUL.
local function split_tail(tail)
    local cut = string.find(tail, '\0', 1, true)
    if cut then
        return string.sub(tail, 1, cut - 1), string.sub(tail, cut + 1)
    end
    return tail, nil
end

-- Takes an eligible member's entries out of by_label; call it before its numbers or its
-- eligibility change. `order` is its order text when the caller has it already (an assign
-- just read it), nil to read it here. `carried` is what the caller read in one of the
-- member's entries: the labels text it carried (then the hash is not read), false when it
-- carried none; nil when the caller read no entry, and then both forms are taken out, since
-- the member's entries may be from before entries carried their text. Returns its labels
-- text (nil when it has none) for `label`.
local function unlabel(member, lif, order, carried)
    local text = carried or redis.call('HGET', KEYS[13], member)
    if not text then
        return nil
    end
    order = order or order_text(member, lif)
    if order then
        local entries
        if carried then
            entries = label_entries(text, order .. '\0' .. text)
        else
            entries = label_entries(text, order)
            if carried == nil then
                label_entries(text, order .. '\0' .. text, entries)
            end
        end
        redis.call('ZREM', KEYS[14], unpack(entries))
    end
    return text
end

-- Puts an eligible member's entries into by_label with its current numbers; `text` is
-- what `unlabel` returned (false to read it here), `order` its new order text when the
-- caller knows it (an assign has the new counts in hand), nil to read it here.
local function label(member, lif, text, order)
    if text == false then
        text = redis.call('HGET', KEYS[13], member)
    end
    if not text then
        return
    end
    order = order or order_text(member, lif)
    if order then
        local args = {}
        for _, e in ipairs(label_entries(text, tail_of(order, text))) do
            -- Text, as every number given to Redis on this path (see digits20).
            args[#args + 1] = '0'
            args[#args + 1] = e
        end
        redis.call('ZADD', KEYS[14], unpack(args))
    end
end

-- Whether a labels text has an operator's `country` other than the `geo_country` the
-- GeoIP file gives (compared without case): the member is a country mismatch.
local function mismatched(text)
    if not text then
        return false
    end
    local lines = '\n' .. text .. '\n'
    local country = string.match(lines, '\ncountry=([^\n]+)\n')
    local geo = string.match(lines, '\ngeo_country=([^\n]+)\n')
    return country ~= nil and geo ~= nil and string.lower(country) ~= string.lower(geo)
end

-- Keeps the pool's count of country mismatches (meta `country_mismatches`) as a member's
-- labels go from `old` to `new` (nil for none): every change of labels passes here.
local function count_mismatch(old, new)
    local by = (mismatched(new) and 1 or 0) - (mismatched(old) and 1 or 0)
    if by ~= 0 then
        redis.call('HINCRBY', KEYS[1], 'country_mismatches', by)
    end
end

-- Replaces a member's labels with `text` ('' for none): its count and state stay.
local function set_labels(member, text, lif)
    local old = unlabel(member, lif)
    if old then
        redis.call('ZREM', KEYS[15], unpack(label_entries(old, member)))
    end
    count_mismatch(old, text ~= '' and text or nil)
    if text == '' then
        redis.call('HDEL', KEYS[13], member)
        return
    end
    redis.call('HSET', KEYS[13], member, text)
    -- Read by assign.lua, which skips the label index in pools that never had labels.
    redis.call('HSET', KEYS[1], 'labelled', 1)
    local args = {}
    for _, e in ipairs(label_entries(text, member)) do
        args[#args + 1] = 0
        args[#args + 1] = e
    end
    redis.call('ZADD', KEYS[15], unpack(args))
    label(member, lif, text)
end

-- Forgets a member's labels (it leaves the pool): call it before it leaves its set.
local function drop_labels(member, lif)
    local old = unlabel(member, lif)
    if old then
        redis.call('ZREM', KEYS[15], unpack(label_entries(old, member)))
        redis.call('HDEL', KEYS[13], member)
        count_mismatch(old, nil)
    end
end

-- Exit addresses (exit_ip.lua): the checks hash (KEYS[11]) holds, besides member -> last
-- check, 'exit ' .. member -> "<ip> <at_ms>" and 'shared ' .. ip -> how many members exit
-- there (absent when none). Member ids and addresses hold no space, so these fields never
-- meet a member's; there are at most two per member. Meta `shared_exit_ips` counts the
-- addresses with two members or more, so the pool's numbers read it in one field.
local function exit_of(member)
    local text = redis.call('HGET', KEYS[11], 'exit ' .. member)
    return text and string.match(text, '^(%S+)')
end

local function count_exit(ip, by)
    local n = redis.call('HINCRBY', KEYS[11], 'shared ' .. ip, by)
    if n <= 0 then
        redis.call('HDEL', KEYS[11], 'shared ' .. ip)
    end
    if (by > 0 and n == 2) or (by < 0 and n == 1) then
        redis.call('HINCRBY', KEYS[1], 'shared_exit_ips', by)
    end
end

-- Records that `member` exits at `ip`, seen at `at_ms`.
local function set_exit(member, ip, at_ms)
    local old = exit_of(member)
    if old ~= ip then
        if old then
            count_exit(old, -1)
        end
        count_exit(ip, 1)
    end
    redis.call('HSET', KEYS[11], 'exit ' .. member, ip .. ' ' .. at_ms)
end

-- Forgets a member's exit address (it leaves the pool).
local function drop_exit(member)
    local old = exit_of(member)
    if old then
        count_exit(old, -1)
        redis.call('HDEL', KEYS[11], 'exit ' .. member)
    end
end

-- A labels text as a table key -> value.
local function labels_table(text)
    local t = {}
    for k, v in string.gmatch(text or '', '([^\n=]+)=([^\n]+)') do
        t[k] = v
    end
    return t
end

-- Filter groups from script arguments "key value value ...", from ARGV[first] on; nil when
-- there are none.
local function filter_groups(first)
    if #ARGV < first then
        return nil
    end
    local groups = {}
    for i = first, #ARGV do
        local words = {}
        for w in string.gmatch(ARGV[i], '%S+') do
            words[#words + 1] = w
        end
        local group = {key = words[1], values = {}, accepts = {}}
        for j = 2, #words do
            group.values[#group.values + 1] = words[j]
            group.accepts[words[j]] = true
        end
        groups[#groups + 1] = group
    end
    return groups
end

-- Whether labels (as a table) pass every group but `skip`.
local function passes(labels, groups, skip)
    for i, group in ipairs(groups) do
        if i ~= skip and not group.accepts[labels[group.key] or ''] then
            return false
        end
    end
    return true
end

-- Byte order, whatever the server's collation (Lua's `<` on strings uses strcoll).
local function bytes_before(a, b)
    local n = math.min(#a, #b)
    for i = 1, n do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then
            return x < y
        end
    end
    return #a < #b
end

-- A labels text with its operator labels replaced by `operator` and those the GeoIP file
-- gave (keys `geo_...`, which operators cannot set) by `geo`, both labels texts, or nil
-- to keep that part as it is; in key order, as LabelFilter writes them.
local function merge_labels(old, operator, geo)
    local lines = {}
    for pair in string.gmatch(old or '', '[^\n]+') do
        local from_geo = string.sub(pair, 1, 4) == 'geo_'
        if (from_geo and not geo) or (not from_geo and not operator) then
            lines[#lines + 1] = pair
        end
    end
    for pair in string.gmatch((operator or '') .. '\n' .. (geo or ''), '[^\n]+') do
        lines[#lines + 1] = pair
    end
    local function key(pair)
        return string.match(pair, '^[^=]*')
    end
    table.sort(lines, function(a, b)
        return bytes_before(key(a), key(b))
    end)
    return table.concat(lines, '\n')
end

-- Replaces a member's operator labels (`operator`) or its labels from the GeoIP file
-- (`geo`), each a labels text or nil to keep, leaving the other part as it was.
local function relabel(member, operator, geo, lif)
    local old = redis.call('HGET', KEYS[13], member)
    local text = merge_labels(old, operator, geo)
    if text ~= (old or '') then
        set_labels(member, text, lif)
    end
end

local function range_of(key, value)
    local pair = key .. '=' .. value
    return '[' .. pair .. '\0', '(' .. pair .. '\1', #pair + 2
end

-- The first `wanted` eligible members, in the choosing order, that pass every group: the
-- tails of their entries (see tail_of) in that order (empty when none does), or false when finding out would take
-- more than `budget` candidate checks. With one group and nothing held it reads the first
-- `wanted` entries of each value's range. Otherwise it walks the ranges of the group with
-- the fewest entries (ZLEXCOUNT) in order, checking the other groups on each member's
-- labels, and stops at the `wanted`-th that passes in each range: the cost is the members
-- skipped, at most `budget`. With `held_until` (see assign.lua), members banned for the
-- request's target or resting are skipped too, each a check, and the earliest time one of
-- those that pass the groups becomes eligible by itself (`waits_for(live)` of assign.lua)
-- comes second. A member has one value per key, so the
-- ranges never share a member.
local function pick_labelled(groups, budget, lif, held_until, wanted, waits_for)
    local smallest, fewest = 1, nil
    if #groups > 1 then
        for i, group in ipairs(groups) do
            local size = 0
            for _, value in ipairs(group.values) do
                local low, high = range_of(group.key, value)
                size = size + redis.call('ZLEXCOUNT', KEYS[14], low, high)
            end
            if not fewest or size < fewest then
                smallest, fewest = i, size
            end
        end
    end
    local found = {}
    local earliest = nil
    local checked = 0
    local walk = groups[smallest]
    for _, value in ipairs(walk.values) do
        local low, high, skip = range_of(walk.key, value)
        local offset = 0
        local taken = 0
        local first_is_choice = #groups == 1 and not held_until
        while taken < wanted do
            local chunk = first_is_choice and wanted or 64
            local entries = redis.call('ZRANGE', KEYS[14], low, high, 'BYLEX', 'LIMIT', offset, chunk)
            if #entries == 0 then
                break
            end
            for _, e in ipairs(entries) do
                local tail = string.sub(e, skip)
                local free = first_is_choice
                if not free then
                    checked = checked + 1
                    if checked > budget then
                        return false
                    end
                    local order, carried = split_tail(tail)
                    local member = order_member(order, lif)
                    local text = carried or redis.call('HGET', KEYS[13], member)
                    if passes(labels_table(text), groups, smallest) then
                        local banned = held_until and held_until(member)
                        if banned then
                            -- A least-in-flight order text starts with the live leases.
                            if not lif or waits_for(tonumber(string.sub(order, 1, 20))) then
                                earliest = math.min(earliest or banned, banned)
                            end
                        else
                            free = true
                        end
                    end
                end
                if free then
                    found[#found + 1] = tail
                    taken = taken + 1
                    if taken == wanted then
                        break
                    end
                end
            end
            offset = offset + #entries
            if #entries < chunk then
                break
            end
        end
    end
    -- Each range is in order already; with several values, merge them (the text a tail
    -- carries never changes the order, see above).
    if #walk.values > 1 then
        table.sort(found, bytes_before)
        for i = #found, wanted + 1, -1 do
            found[i] = nil
        end
    end
    return found, earliest
end
