-- The client rate limit's Lua twins: each function here computes what the function of the
-- same name in src/rules/bucket.rs computes, on the same whole numbers (milli-tokens and
-- ms, all below 2^53, so exact in Lua's doubles); src/rules/twins.rs runs both on random
-- inputs and compares. Pure: no key is read or written here. Put in front of rate.lua at
-- the head of the assign scripts (store/redis/scripts.rs).

-- rules::bucket::refilled: the milli-tokens of a bucket (nil: full) at now.
local function refilled(milli, at, rate, burst, now)
    local full = burst * 1000
    if not milli then
        return full
    end
    local elapsed = math.min(math.max(0, now - at), math.floor(full / rate) + 1)
    return math.min(milli + elapsed * rate, full)
end

-- rules::bucket::take: true and the milli-tokens left, or false and the wait in ms.
local function take(milli, at, rate, burst, now, needed)
    local have = refilled(milli, at, rate, burst, now)
    local want = math.min(needed, burst) * 1000
    if have >= want then
        return true, have - want
    end
    return false, math.ceil((want - have) / rate)
end

-- rules::bucket::full_in_ms: how long until a bucket holding milli is full (at least 1).
local function full_in_ms(milli, rate, burst)
    return math.max(1, math.ceil(math.max(0, burst * 1000 - milli) / rate))
end
