-- Records the exit addresses active checks saw (`set_exit` in labels.lua), at the store's
-- clock, each with the labels the GeoIP file gives that address when the service reads
-- one: they replace the member's labels from the file, never the operator's (`relabel`).
-- KEYS as in leases.lua (all the pool's keys).
-- ARGV[1] '1' when each member is followed by its labels from the GeoIP file (a labels
-- text, '' for none), else '0'; then per member: member, address[, labels text].
-- Members no longer in the pool are skipped.
-- Returns {-1} when the pool does not exist, else {1, members recorded}.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1}
end
local lif = least_in_flight()
local now = now_ms()
local step = ARGV[1] == '1' and 3 or 2
local recorded = 0
for i = 2, #ARGV, step do
    local member, ip = ARGV[i], ARGV[i + 1]
    if redis.call('ZSCORE', KEYS[2], member) or redis.call('ZSCORE', KEYS[3], member) then
        set_exit(member, ip, now)
        if step == 3 then
            relabel(member, nil, ARGV[i + 2], lif)
        end
        recorded = recorded + 1
    end
end
return {1, recorded}
