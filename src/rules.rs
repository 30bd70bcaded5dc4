//! The pool rules that both stores apply, each written once in Rust with its Lua twin
//! beside it: `rules/<family>.rs` is what the embedded store runs, `rules/<family>.lua` the
//! same functions for the Redis scripts (put in front of the scripts that need them by
//! `store/redis/scripts.rs`), and `rules/twins.rs` a test that runs both on random inputs
//! against a real Redis and compares every answer, so that a change to one side alone
//! fails it. The Lua twins are pure: they read no key, so the test can call them as they
//! are.
//!
//! A layer above [`crate::domain`] (whose configuration values they take) and below
//! [`crate::store`].

pub mod bucket;
pub mod expiry;
pub mod health;
pub mod quality;

#[cfg(test)]
mod twins;
