//! Access key management (admin only): issue, list and revoke client access keys.

use crate::{Client, ClientError};
use tessera_auth::{Key, KeyId};
use tessera_wire::{AccessKeyInfo, ManagerRequest, ManagerResponse};

impl Client {
    /// Issues an access key named `name`; its secret is returned once and not stored here.
    pub async fn key_create(&self, name: &str) -> Result<(KeyId, Key), ClientError> {
        let request = ManagerRequest::KeyCreate {
            name: name.to_string(),
        };
        match self.manager_call(request).await? {
            ManagerResponse::KeyCreated { id, key } => Ok((id, key)),
            other => Err(self.unexpected("KeyCreated", other)),
        }
    }

    /// The live access keys (ids and names).
    pub async fn key_list(&self) -> Result<Vec<AccessKeyInfo>, ClientError> {
        match self.manager_call(ManagerRequest::KeyList).await? {
            ManagerResponse::Keys(keys) => Ok(keys),
            other => Err(self.unexpected("Keys", other)),
        }
    }

    /// Revokes an access key: the manager refuses it at once, servers within about a second.
    pub async fn key_remove(&self, key: KeyId) -> Result<(), ClientError> {
        match self.manager_call(ManagerRequest::KeyRemove { key }).await? {
            ManagerResponse::Done => Ok(()),
            other => Err(self.unexpected("Done", other)),
        }
    }
}
