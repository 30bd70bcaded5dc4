-- Quality helpers, put after the quality rule (src/rules/quality.lua) in front of the
-- scripts that count outcomes (outcomes.lua, and assign_done.lua before its fast path; see
-- redis/scripts.rs). Only local functions: nothing runs until a script calls one.
-- KEYS[9], the health hash, also holds each member's quality beside its health, under the
-- field 'q <member>' (a member id holds no space): "<outcomes> <success_ppm> <latencies>
-- <latency_us>", absent before the first outcome counted (forget, in health.lua, deletes it).

-- Counts one outcome a worker or the gateway reported (result ok | failed | blocked;
-- latency in ms as text, '' or nil for none) in the member's quality (record, the rule).
local function count_outcome(member, result, latency)
    local field = 'q ' .. member
    local text = redis.call('HGET', KEYS[9], field)
    local q = {0, 0, 0, 0}
    if text then
        local o, s, n, l = string.match(text, '^(%d+) (%d+) (%d+) (%d+)$')
        q = {tonumber(o), tonumber(s), tonumber(n), tonumber(l)}
    end
    q = record(q, result == 'ok', tonumber(latency or ''))
    redis.call('HSET', KEYS[9], field,
        string.format('%.0f %.0f %.0f %.0f', q[1], q[2], q[3], q[4]))
end
