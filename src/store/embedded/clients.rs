//! The embedded store's clients, by id and by their token's hash (the Redis store keeps
//! the same two maps as two hashes: `put_client.lua`).

use std::collections::{BTreeMap, HashMap};

use crate::domain::{ClientConfig, ClientId, MAX_CLIENTS, TokenHash};
use crate::store::{ClientRecord, PutClient, StoreError};

/// Every client, and which one each token hash opens.
#[derive(Debug, Default)]
pub(super) struct Clients {
    by_id: BTreeMap<ClientId, ClientRecord>,
    by_token: HashMap<TokenHash, ClientId>,
}

impl Clients {
    /// Creates `id` with `token`, or replaces its configuration and keeps its token.
    pub(super) fn put(
        &mut self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<(PutClient, &ClientRecord), StoreError> {
        let put = if let Some(existing) = self.by_id.get_mut(id) {
            existing.config = config.clone();
            PutClient::Replaced
        } else {
            if self.by_id.len() >= MAX_CLIENTS {
                return Err(StoreError::TooManyClients);
            }
            self.set(ClientRecord {
                id: id.clone(),
                config: config.clone(),
                token,
            });
            PutClient::Created
        };
        Ok((put, self.get(id).ok_or(StoreError::ClientNotFound)?))
    }

    /// Gives `id` the token `token`; the old one opens nothing from now on.
    pub(super) fn rotate(
        &mut self,
        id: &ClientId,
        token: TokenHash,
    ) -> Result<&ClientRecord, StoreError> {
        let record = self.by_id.get_mut(id).ok_or(StoreError::ClientNotFound)?;
        self.by_token.remove(&record.token);
        record.token = token;
        self.by_token.insert(token, id.clone());
        Ok(record)
    }

    /// Deletes `id`, or says it does not exist.
    pub(super) fn delete(&mut self, id: &ClientId) -> Result<(), StoreError> {
        self.remove(id.as_str())
            .then_some(())
            .ok_or(StoreError::ClientNotFound)
    }

    pub(super) fn get(&self, id: &ClientId) -> Option<&ClientRecord> {
        self.by_id.get(id)
    }

    /// Every client, by id.
    pub(super) fn all(&self) -> impl Iterator<Item = &ClientRecord> {
        self.by_id.values()
    }

    pub(super) fn by_token(&self, token: TokenHash) -> Option<&ClientRecord> {
        self.by_token.get(&token).and_then(|id| self.by_id.get(id))
    }

    /// Sets a client to `record` whatever it was (recovery, and creation).
    pub(super) fn set(&mut self, record: ClientRecord) {
        if let Some(old) = self.by_id.get(&record.id) {
            self.by_token.remove(&old.token);
        }
        self.by_token.insert(record.token, record.id.clone());
        self.by_id.insert(record.id.clone(), record);
    }

    /// Removes the client named `id`; whether it existed.
    pub(super) fn remove(&mut self, id: &str) -> bool {
        let Ok(id) = ClientId::parse(id) else {
            return false;
        };
        match self.by_id.remove(&id) {
            Some(old) => {
                self.by_token.remove(&old.token);
                true
            }
            None => false,
        }
    }
}
