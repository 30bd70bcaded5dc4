//! The background reaper: reclaims expired leases in every pool at a fixed interval.
//!
//! Assigns reclaim a few expired leases of their own pool, but a pool nobody assigns from
//! would keep its abandoned leases (and its members' in-flight counts) forever without
//! this. Every replica runs one; reclaiming is done inside the store's atomic steps, so
//! two reapers never reclaim the same lease twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::store::Store;

/// Sweeps every pool each `interval` until `stop` completes. A sweep that fails (the store
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
        match store.reap().await {
            Ok(reclaimed) => {
                if failing {
                    tracing::info!("lease reaper works again");
                    failing = false;
                }
                if reclaimed > 0 {
                    metrics::counter!("pa_leases_reclaimed_total").increment(reclaimed);
                    tracing::info!(reclaimed, "reclaimed abandoned leases");
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "lease reaper cannot reach the store; retrying every interval");
                    failing = true;
                }
            }
        }
    }
}
