//! Types that are parsed at the edge: once a request has been turned into these, the rest
//! of the service never sees an unchecked id or configuration value again.

mod health;
mod lease;
mod member_id;
mod pool_config;
mod pool_id;
mod timestamp;

pub use health::{CheckConfig, CheckKind, HealthConfig, InvalidHealthConfig, OutcomeResult};
pub(crate) use lease::hex;
pub use lease::{InvalidLeaseId, InvalidLeaseTtl, LeaseId, LeaseTtl};
pub use member_id::{InvalidMemberId, MAX_MEMBER_ID_LEN, MemberId};
pub use pool_config::{Policy, PoolConfig, RestorePolicy};
pub use pool_id::{InvalidPoolId, PoolId};
pub use timestamp::Timestamp;
