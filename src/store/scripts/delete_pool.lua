-- Deletes a pool without freeing it here: freeing a large pool's sets would hold Redis for
-- as long as they are large (half a second for a million members), and with it every
-- other pool. Every key the pool has is renamed to its graveyard name (RENAME is O(1)),
-- so the pool vanishes for every reader at once, exactly as a DEL would; the service then
-- frees the graveyard keys with UNLINK, which hands large values to Redis's background
-- thread. A graveyard key left behind by a crash in between expires after a day.
-- KEYS[1..n]: every key of the pool (the 22 of every pool script, then the session index
-- and the pacing index: see DELETE_KEY_PARTS in redis/keys.rs), KEYS[n+1..2n]: their
-- graveyard names, in the same order and hash slot. Keys listed only by an index (a
-- session's key, a target's ban hash or pacing set) are left to expire: the renamed index
-- no longer lists them, so no script reads them again.
-- Returns {0} when the pool did not exist, else {1, {graveyard key, ...}}: the keys that
-- were renamed.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {0}
end
local parts = #KEYS / 2
local gone = {}
for i = 1, parts do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        redis.call('RENAME', KEYS[i], KEYS[parts + i])
        redis.call('PEXPIRE', KEYS[parts + i], 86400000)
        gone[#gone + 1] = KEYS[parts + i]
    end
end
return {1, gone}
