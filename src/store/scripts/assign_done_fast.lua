-- The head of assign_done.lua's script (see `picking_after_done` in redis/scripts.rs), run
-- before any helper exists: a steady worker's `done` is an `ok` about an eligible member
-- with a clean record (no failures in a row, no backoff), which changes nothing. That one
-- is answered here, its arguments taken off the end of ARGV (see assign_done.lua for
-- them), and the pick runs as a plain assign does, its fast path included; every other
-- `done` goes on to assign_done.lua with its arguments in place.
local done = nil
do
    local n = #ARGV
    local member, result = ARGV[n - 6], ARGV[n - 5]
    if result == 'ok' and member ~= '' and ARGV[n - 4] == '' and ARGV[n - 3] == ''
        and not redis.call('HGET', KEYS[9], member)
        and redis.call('ZSCORE', KEYS[2], member) then
        done = {1, 0, 0, 0, 0, member}
        for _ = 1, 7 do
            ARGV[#ARGV] = nil
        end
    end
end
