-- The health rules' Lua twins: each function here computes what the function of the same
-- name in src/rules/health.rs computes, from the same inputs (src/rules/twins.rs runs both
-- on random inputs and compares). Pure: no key is read or written here. Put in front of
-- health.lua in every script that trips, bans or restores members (store/redis/scripts.rs).

-- HealthConfig::default().script_arg(): the rules of a pool stored without any.
local DEFAULT_HEALTH = '3 60000 3600000 2 10'

-- HealthConfig::DEFAULT_TARGET_BAN_MS.
local DEFAULT_TARGET_BAN_MS = 600000

-- rules::health::cooldown_ms: the cooldown of the trips-th trip in a row, the same
-- expression in the same order on the same doubles.
local function cooldown_ms(cfg, trips, draw)
    local nominal = math.min(cfg.max, cfg.cooldown * cfg.backoff ^ (trips - 1))
    local jittered = math.floor(nominal * (1 + cfg.jitter / 100 * math.max(-1, math.min(1, draw))))
    return math.max(1, math.min(cfg.max, jittered))
end

-- rules::health::ban_ms: the length of the bans-th ban in a row of a member for a target.
local function ban_ms(target_ban_ms, max_cooldown_ms, bans)
    return math.min(max_cooldown_ms, target_ban_ms * 2 ^ (bans - 1))
end

-- rules::health::restored_count: the count a returning member restarts at, given the count
-- it kept and the minimum among the eligible members (nil when there are none).
local function restored_count(policy, kept, minimum)
    if policy == 'zero' then
        return 0
    elseif not minimum then
        return kept
    elseif policy == 'history' then
        return math.max(kept, minimum)
    end
    return minimum
end
