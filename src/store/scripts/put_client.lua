-- Creates a client or replaces its configuration (twin: src/store/embedded/clients.rs).
-- KEYS[1]: client id -> "<token sha-256 hex> <config json>"; KEYS[2]: token hex -> id.
-- ARGV[1] the id, ARGV[2] the configuration, ARGV[3] the new token's hash (used only when
-- the client is created), ARGV[4] the most clients kept.
-- Answers 1 created, 0 replaced (its token kept), -1 full.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if record then
    local token = string.match(record, '^(%x+) ')
    redis.call('HSET', KEYS[1], ARGV[1], token .. ' ' .. ARGV[2])
    return 0
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
    return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
return 1
