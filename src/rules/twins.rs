//! Every rule of [`super`] against its Lua twin: a constant against its twin's value, a
//! function on random inputs (proptest; the smallest failing one is reported), each run
//! through the Rust function here and the Lua function of the same name in a real Redis,
//! the same script text the stores' scripts are made of. A rule changed on one side only
//! fails here.

use std::sync::{Mutex, OnceLock, PoisonError};

use proptest::prelude::*;

use crate::domain::count::MAX_COUNT;
use crate::domain::{HealthConfig, RestorePolicy};

use super::bucket::{self, Bucket};
use super::quality::{self, Quality};
use super::{expiry, health};

/// Calls one twin by name with its arguments, as text; answers its result as text (`%.0f`,
/// as the scripts write numbers into keys).
const CALL: &str = "
local f = ARGV[1]
local n = function(i) return tonumber(ARGV[i]) end
if f == 'cooldown_ms' then
    local cfg = {cooldown = n(2), max = n(3), backoff = n(4), jitter = n(5)}
    return string.format('%.0f', cooldown_ms(cfg, n(6), n(7)))
elseif f == 'ban_ms' then
    return string.format('%.0f', ban_ms(n(2), n(3), n(4)))
elseif f == 'restored_count' then
    local minimum = nil
    if ARGV[4] ~= '' then
        minimum = n(4)
    end
    return string.format('%.0f', restored_count(ARGV[2], n(3), minimum))
elseif f == 'take' then
    local milli, at = nil, 0
    if ARGV[2] ~= '' then
        milli, at = n(2), n(3)
    end
    local ok, value = take(milli, at, n(4), n(5), n(6), n(7))
    return {ok and 1 or 0, string.format('%.0f', value)}
elseif f == 'full_in_ms' then
    return string.format('%.0f', full_in_ms(n(2), n(3), n(4)))
elseif f == 'decayed' then
    return string.format('%.0f', decayed(n(2), n(3), n(4)))
elseif f == 'record' then
    local latency = nil
    if ARGV[7] ~= '' then
        latency = n(7)
    end
    local q = record({n(2), n(3), n(4), n(5)}, ARGV[6] == '1', latency)
    return string.format('%.0f %.0f %.0f %.0f', q[1], q[2], q[3], q[4])
elseif f == 'quality_constants' then
    return string.format('%.0f %.0f %.0f', QUALITY_WINDOW, MAX_LATENCY_MS, SUCCESS_ONE)
elseif f == 'defaults' then
    return {DEFAULT_HEALTH, tostring(DEFAULT_TARGET_BAN_MS)}
elseif f == 'cleanup' then
    return tostring(CLEANUP)
end
return redis.error_reply('no twin called ' .. tostring(f))
";

/// One Redis for every case of the test binary, and a connection to it.
fn redis() -> &'static Mutex<(crate::test_redis::RedisServer, redis::Connection)> {
    static REDIS: OnceLock<Mutex<(crate::test_redis::RedisServer, redis::Connection)>> =
        OnceLock::new();
    REDIS.get_or_init(|| {
        let server = crate::test_redis::RedisServer::start();
        let connection = redis::Client::open(server.url())
            .expect("a valid URL")
            .get_connection()
            .expect("a connection to the test Redis");
        Mutex::new((server, connection))
    })
}

/// The Lua twin `function` called with `args`.
fn lua<T: redis::FromRedisValue>(function: &str, args: &[String]) -> T {
    let script = redis::Script::new(&format!(
        "{}{}{}{}{CALL}",
        include_str!("expiry.lua"),
        include_str!("health.lua"),
        include_str!("bucket.lua"),
        include_str!("quality.lua")
    ));
    let mut redis = redis().lock().unwrap_or_else(PoisonError::into_inner);
    let mut invocation = script.prepare_invoke();
    invocation.arg(function);
    for arg in args {
        invocation.arg(arg);
    }
    invocation
        .invoke(&mut redis.1)
        .expect("the twin runs in Redis")
}

fn number(function: &str, args: &[String]) -> u64 {
    let text: String = lua(function, args);
    text.parse().expect("a whole number")
}

/// A health configuration within the ranges a pool may be given.
fn health_config() -> impl Strategy<Value = HealthConfig> {
    (
        100..=86_400_000u64,
        100..=604_800_000u64,
        1..=10u32,
        0..=50u32,
        100..=604_800_000u64,
    )
        .prop_map(
            |(cooldown_ms, max_cooldown_ms, backoff, jitter_percent, target_ban_ms)| HealthConfig {
                cooldown_ms,
                max_cooldown_ms,
                backoff,
                jitter_percent,
                target_ban_ms,
                ..HealthConfig::default()
            },
        )
}

/// A client's rate and burst within the ranges `PUT /clients/{client}` takes, mostly small.
fn rate_and_burst() -> impl Strategy<Value = (u64, u64)> {
    (
        prop_oneof![3 => 1..=100u64, 1 => 1..=100_000u64],
        prop_oneof![3 => 1..=100u64, 1 => 1..=1_000_000u64],
    )
}

/// A bucket as a store may hold it (or none: full), and a time around its own.
fn bucket_and_now() -> impl Strategy<Value = (Option<Bucket>, u64)> {
    let at = 1_700_000_000_000..=1_800_000_000_000u64;
    (
        // Mostly nearly empty, where assigns are refused and waits computed.
        proptest::option::of((
            prop_oneof![3 => 0..=3_000u64, 1 => 0..=1_000_000_000u64],
            at.clone(),
        )),
        at,
        prop_oneof![3 => 0..=3_000u64, 1 => 0..=100_000_000_000u64],
    )
        .prop_map(|(bucket, at, later)| {
            let bucket = bucket.map(|(milli, at_ms)| Bucket { milli, at_ms });
            // Mostly shortly after the bucket's own time, sometimes before it.
            let now = bucket.map_or(at, |b| b.at_ms) + later;
            (bucket, now.saturating_sub(2_500))
        })
}

/// How many in a row: mostly the first few, sometimes very many.
fn in_a_row() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 1..=40u64, 1 => 1..=1_000_000u64]
}

fn policy() -> impl Strategy<Value = RestorePolicy> {
    prop_oneof![
        Just(RestorePolicy::Minimum),
        Just(RestorePolicy::History),
        Just(RestorePolicy::Zero)
    ]
}

#[test]
fn the_default_rules_of_a_pool_are_the_same_on_both_sides() {
    let defaults: Vec<String> = lua("defaults", &[]);
    assert_eq!(
        defaults,
        [
            HealthConfig::default().script_arg(),
            HealthConfig::DEFAULT_TARGET_BAN_MS.to_string()
        ]
    );
}

#[test]
fn one_call_clears_as_many_expired_entries_on_both_sides() {
    assert_eq!(number("cleanup", &[]), expiry::CLEANUP as u64);
}

#[test]
fn the_quality_constants_are_the_same_on_both_sides() {
    let text: String = lua("quality_constants", &[]);
    assert_eq!(
        text,
        format!(
            "{} {} {}",
            quality::QUALITY_WINDOW,
            quality::MAX_LATENCY_MS,
            quality::SUCCESS_ONE
        )
    );
}

/// A member's quality as a store may hold it: any number of outcomes, averages in range.
fn quality_state() -> impl Strategy<Value = Quality> {
    (
        0..=1_000_000_000u64,
        0..=quality::SUCCESS_ONE,
        0..=1_000_000_000u64,
        0..=quality::MAX_LATENCY_MS * 1000,
    )
        .prop_map(|(outcomes, success_ppm, latencies, latency_us)| Quality {
            outcomes,
            success_ppm,
            latencies,
            latency_us,
        })
}

proptest! {
    // A fixed seed: every run tries the same cases, so a failure here fails again there.
    // Nothing is written to disk; the smallest failing input is in the failure's message.
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7275_6c65),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_cooldown_is_the_same_millisecond_on_both_sides(
        config in health_config(),
        trips in in_a_row(),
        draw in prop_oneof![3 => -1.0..=1.0f64, 1 => Just(-1.0), 1 => Just(0.0), 1 => Just(1.0)],
    ) {
        let args = [
            config.cooldown_ms.to_string(),
            config.max_cooldown_ms.to_string(),
            config.backoff.to_string(),
            config.jitter_percent.to_string(),
            trips.to_string(),
            // The shortest text that reads back as the same double, as the service sends it.
            draw.to_string(),
        ];
        prop_assert_eq!(number("cooldown_ms", &args), health::cooldown_ms(&config, trips, draw));
    }

    #[test]
    fn a_bucket_gives_or_refuses_the_same_tokens_on_both_sides(
        (rate, burst) in rate_and_burst(),
        (bucket, now) in bucket_and_now(),
        needed in prop_oneof![3 => 1..=10u64, 1 => 1..=100u64],
    ) {
        // A bucket never holds more than its burst.
        let bucket = bucket.map(|b| Bucket { milli: b.milli.min(burst * bucket::MILLI), ..b });
        let args = [
            bucket.map_or_else(String::new, |b| b.milli.to_string()),
            bucket.map_or_else(String::new, |b| b.at_ms.to_string()),
            rate.to_string(),
            burst.to_string(),
            now.to_string(),
            needed.to_string(),
        ];
        let (ok, value): (u64, String) = lua("take", &args);
        let value: u64 = value.parse().expect("a whole number");
        let lua = if ok == 1 {
            Ok(Bucket { milli: value, at_ms: now })
        } else {
            Err(value)
        };
        let rust = bucket::take(bucket, rate, burst, now, needed);
        prop_assert_eq!(lua, rust);
        if let Ok(after) = rust {
            let args = [after.milli.to_string(), rate.to_string(), burst.to_string()];
            prop_assert_eq!(number("full_in_ms", &args), bucket::full_in_ms(after, rate, burst));
        }
    }

    #[test]
    fn a_ban_is_the_same_length_on_both_sides(config in health_config(), bans in in_a_row()) {
        let args = [
            config.target_ban_ms.to_string(),
            config.max_cooldown_ms.to_string(),
            bans.to_string(),
        ];
        prop_assert_eq!(number("ban_ms", &args), health::ban_ms(&config, bans));
    }

    #[test]
    fn a_returning_member_restarts_at_the_same_count_on_both_sides(
        policy in policy(),
        kept in 0..=MAX_COUNT,
        minimum in proptest::option::of(0..=MAX_COUNT),
    ) {
        let args = [
            policy.as_str().to_owned(),
            kept.to_string(),
            minimum.map_or_else(String::new, |m| m.to_string()),
        ];
        prop_assert_eq!(
            number("restored_count", &args),
            health::restored_count(policy, kept, minimum)
        );
    }

    #[test]
    fn an_average_decays_to_the_same_number_on_both_sides(
        old in 0..=quality::MAX_LATENCY_MS * 1000,
        n in prop_oneof![3 => 0..=120u64, 1 => 0..=1_000_000_000u64],
        x in 0..=quality::MAX_LATENCY_MS * 1000,
    ) {
        let args = [old.to_string(), n.to_string(), x.to_string()];
        prop_assert_eq!(number("decayed", &args), quality::decayed(old, n, x));
    }

    #[test]
    fn an_outcome_moves_a_member_s_quality_the_same_on_both_sides(
        start in quality_state(),
        outcomes in proptest::collection::vec(
            (any::<bool>(), proptest::option::of(0..=quality::MAX_LATENCY_MS)),
            1..8,
        ),
    ) {
        let mut rust = start;
        let mut text = String::new();
        let mut lua_q = start;
        for (ok, latency) in outcomes {
            rust = quality::record(rust, ok, latency);
            let args = [
                lua_q.outcomes.to_string(),
                lua_q.success_ppm.to_string(),
                lua_q.latencies.to_string(),
                lua_q.latency_us.to_string(),
                if ok { "1" } else { "0" }.to_owned(),
                latency.map_or_else(String::new, |ms| ms.to_string()),
            ];
            text = lua("record", &args);
            let parts: Vec<u64> = text.split(' ').map(|p| p.parse().expect("a number")).collect();
            lua_q = Quality {
                outcomes: parts[0],
                success_ppm: parts[1],
                latencies: parts[2],
                latency_us: parts[3],
            };
        }
        prop_assert_eq!(lua_q, rust, "last Lua answer {}", text);
    }
}
