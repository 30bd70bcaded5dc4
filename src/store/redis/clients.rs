//! The Redis store's clients: two hashes in a hash slot of their own (see `keys.rs`), one
//! script per change, so that a client and its token change together.

use redis::Value;

use super::RedisStore;
use super::reply;
use crate::domain::{ClientConfig, ClientId, MAX_CLIENTS, TokenHash};
use crate::store::{ClientRecord, PutClient, StoreError};

impl RedisStore {
    async fn clients_script(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let [records, tokens] = self.client_keys();
        self.eval_on(script, &[&records, &tokens], args).await
    }

    pub(super) async fn put_client_record(
        &self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<PutClient, StoreError> {
        let (config, token, most) = (config.to_json(), token.to_hex(), MAX_CLIENTS.to_string());
        let value = self
            .clients_script(
                &self.scripts.put_client,
                &[
                    id.as_str().as_bytes(),
                    config.as_bytes(),
                    token.as_bytes(),
                    most.as_bytes(),
                ],
            )
            .await?;
        reply::put_client(value)
    }

    pub(super) async fn rotate_client_record(
        &self,
        id: &ClientId,
        token: TokenHash,
    ) -> Result<(), StoreError> {
        let token = token.to_hex();
        let value = self
            .clients_script(
                &self.scripts.rotate_client,
                &[id.as_str().as_bytes(), token.as_bytes()],
            )
            .await?;
        reply::client_changed("rotate_client.lua", value)
    }

    pub(super) async fn delete_client_record(&self, id: &ClientId) -> Result<(), StoreError> {
        let value = self
            .clients_script(&self.scripts.delete_client, &[id.as_str().as_bytes()])
            .await?;
        reply::client_changed("delete_client.lua", value)
    }

    pub(super) async fn client_record(&self, id: &ClientId) -> Result<ClientRecord, StoreError> {
        let [records, _] = self.client_keys();
        let mut hget = redis::cmd("HGET");
        hget.arg(&records).arg(id.as_str());
        reply::client(id, self.command(hget).await?)?.ok_or(StoreError::ClientNotFound)
    }

    pub(super) async fn client_records(&self) -> Result<Vec<ClientRecord>, StoreError> {
        let [records, _] = self.client_keys();
        let mut hgetall = redis::cmd("HGETALL");
        hgetall.arg(&records);
        reply::clients(self.command(hgetall).await?)
    }

    pub(super) async fn client_record_by_token(
        &self,
        token: TokenHash,
    ) -> Result<Option<ClientRecord>, StoreError> {
        let token = token.to_hex();
        let value = self
            .clients_script(&self.scripts.client_by_token, &[token.as_bytes()])
            .await?;
        reply::client_by_token(value)
    }
}
