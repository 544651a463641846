//! Client access keys: issued, listed and revoked by the admin, looked up at every client
//! handshake, and handed to storage servers as storage keys (see `tessera_auth`).
//!
//! They live in their own table of the manager's store, created with the first key, so a
//! store of format version 1 without it reads as one with no keys (the table's absence is the
//! explicit "no keys yet"; the record below carries its own version):
//!
//! ```text
//! access_keys: u64 (KeyId) -> AccessKeyRecord (postcard: version u8, name, key)
//! ```

use crate::store::Failure;
use crate::Manager;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_auth::{Key, KeyId};
use tessera_wire::{AccessKeyInfo, ManagerError, ManagerResponse};

pub(crate) const ACCESS_KEYS: TableDefinition<u64, &[u8]> = TableDefinition::new("access_keys");
/// Version of [`AccessKeyRecord`]'s encoding.
const ACCESS_KEY_RECORD_VERSION: u8 = 1;
/// Longest key name, in bytes.
pub const KEY_NAME_BYTES_MAX: usize = 256;
/// Most access keys a cluster holds (each handshake looks one up; servers fetch them all).
pub const ACCESS_KEYS_MAX: usize = 4096;

/// One access key as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AccessKeyRecord {
    version: u8,
    name: String,
    key: Key,
}

/// Reads every access key of the store (none if the table was never created).
pub(crate) fn load(db: &redb::Database) -> Result<BTreeMap<KeyId, AccessKeyRecord>, Failure> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(ACCESS_KEYS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
        Err(e) => return Err(Failure::Store(e.into())),
    };
    let mut keys = BTreeMap::new();
    for entry in table.iter()? {
        let (id, record) = entry?;
        let record: AccessKeyRecord = postcard::from_bytes(record.value())?;
        if record.version != ACCESS_KEY_RECORD_VERSION {
            return Err(Failure::UnknownFormat(record.version.into()));
        }
        keys.insert(KeyId(id.value()), record);
    }
    Ok(keys)
}

/// Writes access key `id` into the store in `txn` (recovery puts back keys it was given).
pub(crate) fn insert(
    txn: &redb::WriteTransaction,
    id: KeyId,
    name: &str,
    key: Key,
) -> Result<(), redb::Error> {
    let record = AccessKeyRecord {
        version: ACCESS_KEY_RECORD_VERSION,
        name: name.to_string(),
        key,
    };
    let bytes = postcard::to_stdvec(&record).expect("an access key record encodes");
    txn.open_table(ACCESS_KEYS)?
        .insert(id.0, bytes.as_slice())?;
    Ok(())
}

impl Manager {
    /// The key a client claiming `id` must prove, if it is live.
    pub fn access_key(&self, id: KeyId) -> Option<Key> {
        self.access_keys.get(&id).map(|record| record.key)
    }

    /// Issues an access key named `name` with id and secret drawn by (the caller's
    /// generator), committed before it is answered.
    pub(crate) fn key_create(
        &mut self,
        name: String,
        (id, key): (u64, [u8; 32]),
    ) -> Result<ManagerResponse, Failure> {
        if name.len() > KEY_NAME_BYTES_MAX {
            return Err(ManagerError::Layout(format!(
                "key name of {} bytes, at most {KEY_NAME_BYTES_MAX}",
                name.len()
            ))
            .into());
        }
        if self.access_keys.len() >= ACCESS_KEYS_MAX {
            return Err(ManagerError::Store(format!(
                "{ACCESS_KEYS_MAX} access keys exist; remove one first"
            ))
            .into());
        }
        let id = KeyId(id);
        if self.access_keys.contains_key(&id) {
            return Err(ManagerError::Store("key id collision; try again".into()).into());
        }
        let key = Key(key);
        let record = AccessKeyRecord {
            version: ACCESS_KEY_RECORD_VERSION,
            name,
            key,
        };
        let bytes = postcard::to_stdvec(&record)?;
        self.commit_key(id, Some(&bytes))?;
        self.access_keys.insert(id, record);
        Ok(ManagerResponse::KeyCreated { id, key })
    }

    /// Revokes an access key.
    pub(crate) fn key_remove(&mut self, id: KeyId) -> Result<ManagerResponse, Failure> {
        if !self.access_keys.contains_key(&id) {
            return Err(ManagerError::UnknownKey(id).into());
        }
        self.commit_key(id, None)?;
        self.access_keys.remove(&id);
        Ok(ManagerResponse::Done)
    }

    /// The live access keys, without their secrets.
    pub(crate) fn key_list(&self) -> ManagerResponse {
        ManagerResponse::Keys(
            self.access_keys
                .iter()
                .map(|(&id, record)| AccessKeyInfo {
                    id,
                    name: record.name.clone(),
                })
                .collect(),
        )
    }

    /// The storage keys of the live access keys, for servers.
    pub(crate) fn storage_keys(&self) -> ManagerResponse {
        ManagerResponse::StorageKeys(
            self.access_keys
                .iter()
                .map(|(&id, record)| (id, record.key.storage_key()))
                .collect(),
        )
    }

    fn commit_key(&mut self, id: KeyId, record: Option<&[u8]>) -> Result<(), Failure> {
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(ACCESS_KEYS)?;
            match record {
                Some(bytes) => table.insert(id.0, bytes)?,
                None => table.remove(id.0)?,
            };
        }
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Manager, ManagerConfig};
    use std::time::Instant;
    use tessera_wire::{ManagerError, ManagerRequest, ManagerResponse};

    #[test]
    fn access_keys_persist_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let mut manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
        let create = ManagerRequest::KeyCreate {
            name: "alice".into(),
        };
        let ManagerResponse::KeyCreated { id, key } = manager.handle(create, now) else {
            panic!("key created");
        };
        assert_eq!(manager.access_key(id), Some(key));
        drop(manager);
        let mut manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
        assert_eq!(manager.access_key(id), Some(key), "kept across a restart");
        let ManagerResponse::StorageKeys(list) = manager.handle(ManagerRequest::StorageKeys, now)
        else {
            panic!("storage keys");
        };
        assert_eq!(
            list,
            vec![(id, key.storage_key())],
            "servers get storage keys only"
        );
        let remove = ManagerRequest::KeyRemove { key: id };
        assert_eq!(manager.handle(remove.clone(), now), ManagerResponse::Done);
        assert_eq!(
            manager.handle(remove, now),
            ManagerResponse::Error(ManagerError::UnknownKey(id))
        );
        drop(manager);
        let manager = Manager::open(dir.path(), ManagerConfig::default()).unwrap();
        assert_eq!(manager.access_key(id), None, "revoked for good");
    }
}
