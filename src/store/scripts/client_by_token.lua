-- The client a token opens (twin: src/store/embedded/clients.rs). KEYS as in
-- put_client.lua; ARGV[1] the token's hash. Answers {id, record}, or nil.
local id = redis.call('HGET', KEYS[2], ARGV[1])
if not id then
    return false
end
return {id, redis.call('HGET', KEYS[1], id)}
