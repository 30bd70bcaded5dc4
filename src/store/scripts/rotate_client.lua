-- Gives a client a new token; the old one opens nothing from now on (twin:
-- src/store/embedded/clients.rs). KEYS as in put_client.lua; ARGV[1] the id, ARGV[2] the
-- new token's hash. Answers 1, or 0 when there is no such client.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
    return 0
end
local old, config = string.match(record, '^(%x+) (.*)$')
redis.call('HDEL', KEYS[2], old)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. config)
return 1
