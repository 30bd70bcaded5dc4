-- How many bytes this Redis has received from all its clients (`total_net_input_bytes`),
-- which a large operation reads at most every LOAD_SAMPLE_INTERVAL to tell whether others
-- keep Redis busy (`RemoteLoad` in src/store/chunks.rs). KEYS[1] is one of the pool's
-- keys, only so that a cluster runs it on the node that serves the pool's hash slot; the
-- script reads nothing of the pool.
local stats = redis.call('INFO', 'stats')
return tonumber(string.match(stats, 'total_net_input_bytes:(%d+)'))
