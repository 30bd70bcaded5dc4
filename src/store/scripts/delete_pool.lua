-- Deletes a pool without freeing it here: freeing a large pool's sets would hold Redis for
-- as long as they are large (half a second for a million members), and with it every
-- other pool. Every key the pool has is renamed to its graveyard name (RENAME is O(1)),
-- so the pool vanishes for every reader at once, exactly as a DEL would; the service then
-- frees the graveyard keys with UNLINK, which hands large values to Redis's background
-- thread. A graveyard key left behind by a crash in between expires after a day.
-- KEYS[1..n]: every key of the pool (as in labels.lua), KEYS[n+1..2n]: their graveyard
-- names, in the same order and hash slot, then the pool's ban index and its graveyard
-- name. The ban hashes of its targets are left to expire by themselves (within twice the
-- pool's longest ban): a pool created again under this id has no index naming them, so
-- they are never read (see keys.rs).
-- Returns {0} when the pool did not exist, else {1, {graveyard key, ...}}: the keys that
-- were renamed.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {0}
end
local parts = (#KEYS - 2) / 2
local gone = {}
local function bury(key, grave)
    if redis.call('EXISTS', key) == 1 then
        redis.call('RENAME', key, grave)
        redis.call('PEXPIRE', grave, 86400000)
        gone[#gone + 1] = grave
    end
end
for i = 1, parts do
    bury(KEYS[i], KEYS[parts + i])
end
bury(KEYS[#KEYS - 1], KEYS[#KEYS])
return {1, gone}
