-- The bound of a chunk script (seed, disable, enable, remove, and the sweep's step; see
-- src/store/chunks.rs):
-- ARGV[1] is the bound in microseconds, ARGV[2] the members between two looks at the
-- store's clock. A chunk's size is a guess from what the chunks before it cost, and one
-- member may cost far more than the last (a set's table growing, the machine taking the
-- core): so a chunk looks at the clock after every whole ARGV[2] members and stops at the
-- first look past the bound. What it did is a whole, smaller chunk; its reply answers for
-- those members only, and the service sends the rest as the next chunk.
local chunk_bound = tonumber(ARGV[1])
local chunk_granule = tonumber(ARGV[2])
local chunk_started = redis.call('TIME')

-- Whether a chunk that has handled `handled` of its `asked` members stops here.
local function chunk_spent(handled, asked)
    if handled >= asked or handled % chunk_granule ~= 0 then
        return false
    end
    local now = redis.call('TIME')
    return (now[1] - chunk_started[1]) * 1000000 + (now[2] - chunk_started[2]) >= chunk_bound
end
