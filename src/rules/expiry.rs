//! The expiry rules: how much of what has expired one call clears by itself, so that memory
//! follows what is live while every call stays short (the sweep clears the rest when it
//! falls due). The Lua twin is `expiry.lua` beside this file; `twins.rs` proves they agree.

/// How many entries whose time is over one assign clears, at most, from each set it
/// touches: ended sessions, rests that are over, targets no longer resting.
pub const CLEANUP: usize = 16;
