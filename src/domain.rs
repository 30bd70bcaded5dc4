//! Types that are parsed at the edge: once a request has been turned into these, the rest
//! of the service never sees an unchecked id or configuration value again.

mod candidate;
mod client;
pub mod count;
mod exclude;
mod gateway_rules;
mod health;
mod labels;
mod lease;
mod member_id;
mod network;
mod object;
mod pacing;
mod pool_config;
mod pool_id;
mod prune;
mod rules;
mod session;
mod source;
mod target;
mod timestamp;

pub use candidate::{
    Candidate, Host, MASKED_MAX_CHARS, Rejection, Scheme, canonical_member_id, looks_like_address,
    mask_credentials,
};
pub use client::{
    ClientConfig, ClientConfigBody, ClientId, ClientRate, ClientToken, InvalidClientConfig,
    InvalidClientId, InvalidPoolPattern, MAX_BURST, MAX_CLIENT_POOLS, MAX_CLIENTS,
    MAX_RATE_PER_SECOND, PoolPattern, TokenHash,
};
pub use count::{AssignCount, InvalidAssignCount};
pub use exclude::{Exclude, InvalidExclude, MAX_EXCLUDED};
pub use gateway_rules::{GatewayRules, InvalidGatewayRules};
pub use health::{
    CHECK_BODY_WINDOW_BYTES, CheckConfig, CheckKind, HealthConfig, InvalidHealthConfig,
    OutcomeResult,
};
pub use labels::{
    FilterField, GEO_PREFIX, InvalidLabels, LabelFilter, Labels, MAX_FILTER_VALUES,
    MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_LABELS, MAX_STORED_LABELS,
};
pub use lease::{InvalidLeaseId, InvalidLeaseTtl, LeaseId, LeaseTtl};
pub use lease::{hex, random_bytes};
pub use member_id::{InvalidMemberId, MAX_MEMBER_ID_LEN, MemberId};
pub use network::{InvalidNetwork, Network};
pub use pacing::{InvalidPacing, MAX_PACING_INTERVAL_MS, Pacing};
pub use pool_config::{Policy, PoolConfig, RestorePolicy};
pub use pool_id::{InvalidPoolId, PoolId};
pub use prune::{InvalidPrune, MAX_PRUNE_COUNT, PruneConfig};
pub use rules::{PortRange, PortRules, Rules};
pub use session::{
    InvalidSessionId, InvalidSessionTtl, MAX_SESSION_ID_LEN, MAX_SESSIONS, SessionId, SessionTtl,
};
pub use source::{
    DEFAULT_SOURCE_MIN_INTERVAL_MS, InvalidSource, MAX_SOURCE_INTERVAL_MS, MAX_SOURCES,
    SOURCE_INTERVAL_FLOOR_MS, Source, SourceFormat,
};
pub use target::{InvalidTarget, MAX_TARGET_LEN, Target};
pub use timestamp::Timestamp;
