-- The quality rule's Lua twins: each function here computes what the function of the same
-- name in src/rules/quality.rs computes, from the same inputs (src/rules/twins.rs runs both
-- on random inputs and compares). Pure: no key is read or written here. Put in front of
-- the scripts that apply outcome reports (store/redis/scripts.rs).

-- rules::quality::QUALITY_WINDOW, MAX_LATENCY_MS and SUCCESS_ONE.
local QUALITY_WINDOW = 50
local MAX_LATENCY_MS = 600000
local SUCCESS_ONE = 1000000

-- rules::quality::decayed: the average after its n-th value x, given the one before.
-- Every operand is a whole number far below 2^53, so the double division floors exactly.
local function decayed(old, n, x)
    local w = math.max(1, math.min(n, QUALITY_WINDOW))
    return math.floor(((w - 1) * old + x + math.floor(w / 2)) / w)
end

-- rules::quality::record: {outcomes, success_ppm, latencies, latency_us} after one more
-- outcome (ok true for a success; latency in ms, or nil).
local function record(q, ok, latency)
    local outcomes = q[1] + 1
    local after = {outcomes, decayed(q[2], outcomes, ok and SUCCESS_ONE or 0), q[3], q[4]}
    if latency then
        after[3] = q[3] + 1
        after[4] = decayed(q[4], after[3], math.min(latency, MAX_LATENCY_MS) * 1000)
    end
    return after
end
