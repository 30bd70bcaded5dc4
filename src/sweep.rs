//! The background sweep: reclaims expired leases and returns members whose cooldown has
//! ended, at a fixed interval, in the pools the store's due index says have such work due
//! (never by reading every pool).
//!
//! Assigns reclaim a few expired leases and return a few due members of their own pool,
//! but a pool nobody assigns from would keep its abandoned leases (and its members'
//! in-flight counts) and its cooled-down members out forever without this. Every replica
//! runs one; both happen inside the store's atomic steps, so two sweeps never reclaim the
//! same lease or return the same member twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::store::{Store, Swept};

/// Sweeps the due pools each `interval` until `stop` completes. A sweep that fails (the store
/// is down) is logged once when failures start and once when they stop, not every tick.
pub async fn run(store: Arc<dyn Store>, interval: Duration, stop: impl Future<Output = ()>) {
    let mut ticks = tokio::time::interval(interval);
    // After a slow sweep, wait a full interval rather than sweeping back to back.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(stop);
    let mut failing = false;
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        match store.sweep().await {
            Ok(Swept {
                reclaimed,
                returned,
            }) => {
                if failing {
                    tracing::info!("background sweep works again");
                    failing = false;
                }
                if reclaimed > 0 {
                    metrics::counter!("pa_leases_reclaimed_total").increment(reclaimed);
                    tracing::info!(reclaimed, "reclaimed abandoned leases");
                }
                if returned > 0 {
                    tracing::info!(returned, "members back after their cooldown");
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "background sweep cannot reach the store; retrying every interval");
                    failing = true;
                }
            }
        }
    }
}
