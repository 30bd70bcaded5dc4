-- Deletes a client and its token (twin: src/store/embedded/clients.rs). KEYS as in
-- put_client.lua; ARGV[1] the id. Answers 1, or 0 when there is no such client.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
    return 0
end
redis.call('HDEL', KEYS[2], string.match(record, '^(%x+) '))
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
