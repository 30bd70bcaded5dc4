//! What a store keeps of a client (`PUT /clients/{client}`): its configuration and the
//! SHA-256 of its token, never the token.

use crate::domain::{ClientConfig, ClientId, TokenHash};

/// A client as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRecord {
    /// Its id.
    pub id: ClientId,
    /// The pools it may use.
    pub config: ClientConfig,
    /// What the store keeps of its token.
    pub token: TokenHash,
}

/// What `put_client` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutClient {
    /// The client is new, with the token whose hash was given.
    Created,
    /// The client existed: its configuration is replaced and its token kept.
    Replaced,
}
