-- The expiry rules' Lua twins (src/rules/expiry.rs; src/rules/twins.rs proves they agree).
-- Put in front of the scripts with the health rules (store/redis/scripts.rs).

-- rules::expiry::CLEANUP: how many entries whose time is over one assign clears, at most,
-- from each set it touches (ended sessions, rests that are over, targets no longer resting).
local CLEANUP = 16
