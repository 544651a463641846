//! The keys a storage server accepts peers with: the admin's and the servers' storage keys,
//! derived from the cluster secret, and the storage keys of the live client access keys,
//! fetched from the manager every [`STORAGE_KEYS_INTERVAL`] (so a key revoked at the manager is
//! refused here within about that long) and at once when a client presents a key not known
//! yet (at most every [`STORAGE_KEYS_REFRESH_MIN`], so strangers cannot make a server flood
//! the manager).

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Credential, Key, KeyId, Secret};
use tessera_transport::{ManagerReplicas, TcpConfig, TcpTransport, Transport};
use tessera_wire::{ManagerRequest, ManagerResponse};

/// How often the server asks the manager for the live access keys.
pub const STORAGE_KEYS_INTERVAL: Duration = Duration::from_secs(1);
/// Least time between two fetches asked for by handshakes with unknown keys.
pub const STORAGE_KEYS_REFRESH_MIN: Duration = Duration::from_millis(100);
/// How often it asks until the first answer (a fresh server serves no client before it).
const STORAGE_KEYS_RETRY: Duration = Duration::from_millis(100);

/// The keys this server accepts.
pub(crate) struct ServerKeys {
    admin: Key,
    server: Key,
    /// What this server proves at the manager.
    pub(crate) credential: Credential,
    clients: RwLock<HashMap<KeyId, Key>>,
    /// The manager, or every replica of a replicated one (any of them answers), as the
    /// heartbeats learn them.
    managers: Arc<ManagerReplicas>,
    transport: Arc<TcpTransport>,
    /// When the last fetch started and when one last succeeded; one fetch at a time.
    last_fetch: tokio::sync::Mutex<(Option<Instant>, Option<Instant>)>,
    /// Keys of datagram sessions keyed by handshakes and not opened yet, oldest first.
    datagram: std::sync::Mutex<(HashMap<u64, Key>, std::collections::VecDeque<u64>)>,
}

/// Datagram session keys a server keeps waiting for their sessions; the oldest go first.
const DATAGRAM_KEYS_WAITING_MAX: usize = 4096;

impl ServerKeys {
    /// The keys derived from `secret`, with no client key yet.
    pub(crate) fn new(secret: &Secret, managers: Arc<ManagerReplicas>) -> ServerKeys {
        let credential = Credential {
            claim: Claim::Server,
            key: secret.server_key(),
        };
        let config = TcpConfig {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(3),
        };
        ServerKeys {
            admin: secret.admin_key().storage_key(),
            server: secret.server_key().storage_key(),
            credential,
            clients: RwLock::new(HashMap::new()),
            managers,
            transport: Arc::new(TcpTransport::with_credential(config, Some(credential))),
            last_fetch: tokio::sync::Mutex::new((None, None)),
            datagram: std::sync::Mutex::new(Default::default()),
        }
    }

    /// A handshake keyed datagram session `session`.
    pub(crate) fn datagram_keyed(&self, session: u64, key: Key) {
        let mut guard = self.datagram.lock().unwrap();
        let (keys, order) = &mut *guard;
        if keys.insert(session, key).is_none() {
            order.push_back(session);
        }
        while order.len() > DATAGRAM_KEYS_WAITING_MAX {
            if let Some(old) = order.pop_front() {
                keys.remove(&old);
            }
        }
    }

    /// The key of datagram session `session`, handed out once.
    pub(crate) fn take_datagram_key(&self, session: u64) -> Option<Key> {
        let mut guard = self.datagram.lock().unwrap();
        let (keys, order) = &mut *guard;
        let key = keys.remove(&session)?;
        order.retain(|s| *s != session);
        Some(key)
    }

    /// The storage key `claim` must prove here.
    pub(crate) fn key(&self, claim: &Claim) -> Option<Key> {
        match claim {
            Claim::Admin => Some(self.admin),
            Claim::Server => Some(self.server),
            Claim::Client(id) => self.clients.read().unwrap().get(id).copied(),
        }
    }

    /// Have keys fetched after this call began: fetch them, at least `min_gap` after the
    /// last fetch started (waiting out the rest), unless a fetch that began after this call
    /// already brought them. Whether fresh keys are in.
    pub(crate) async fn fetch(&self, min_gap: Duration) -> bool {
        let asked = Instant::now();
        let mut last = self.last_fetch.lock().await;
        let (started, succeeded) = &mut *last;
        if succeeded.is_some_and(|done| done > asked) && started.is_some_and(|s| s >= asked) {
            return true;
        }
        if let Some(wait) = started.and_then(|s| min_gap.checked_sub(s.elapsed())) {
            tokio::time::sleep(wait).await;
        }
        *started = Some(Instant::now());
        let mut answer = None;
        for manager in self.managers.addrs() {
            let asked = tessera_transport::call::<_, ManagerResponse>(
                &self.transport as &dyn Transport,
                manager,
                &ManagerRequest::StorageKeys,
                Bytes::new(),
            )
            .await;
            let answered = asked.is_ok();
            answer = Some(asked);
            if answered {
                break;
            }
        }
        let answer = answer.expect("at least one manager");
        match answer {
            Ok((ManagerResponse::StorageKeys(list), _)) => {
                *self.clients.write().unwrap() = list.into_iter().collect();
                *succeeded = Some(Instant::now());
                true
            }
            Ok((other, _)) => {
                tracing::warn!("manager answered StorageKeys with {other:?}");
                false
            }
            Err(e) => {
                tracing::debug!("cannot fetch access keys: {e}");
                false
            }
        }
    }
}

/// Keep the client keys up to date with the manager's, forever.
pub(crate) async fn keep_keys(keys: Arc<ServerKeys>) {
    let mut fetched = false;
    loop {
        fetched |= keys.fetch(Duration::ZERO).await;
        let wait = if fetched {
            STORAGE_KEYS_INTERVAL
        } else {
            STORAGE_KEYS_RETRY
        };
        tokio::time::sleep(wait).await;
    }
}
