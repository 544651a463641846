//! The manager's metadata state machine replicated by openraft instead of tessera-order:
//! the same [`Manager`] over its own redb store at each node, fed the same bytes
//! ([`Proposal`]s, as `ReplicaCore` encodes them) and applied the same way (a batch of
//! committed entries applied without syncing, one sync of the store at the end, then the
//! answers), served to clients over the same authenticated TCP transport and wire messages.
//!
//! What differs from a Tessera replica, on purpose: openraft commits through its leader, so
//! clients talk to the leader only (a Tessera client talks to any replica; the bench uses
//! replica 1 for all); the log is kept in memory at every node ([`crate::raft`]'s store), as
//! tessera-order keeps its log in memory. Snapshots are never built (the runs are short) and
//! installing one is refused.
//!
//! **Reads, two ways ([`Reads`]).** A read (`is_read`) is answered from the leader's own
//! store, either at once ([`Reads::Local`]) or after `Raft::ensure_linearizable`
//! ([`Reads::Linearizable`]). The local way gives read-your-writes (the leader applied every
//! write it acknowledged) but nothing more: a leader deposed by a partition it has not
//! noticed yet answers from a state the new leader's acknowledged writes have left behind.
//! A Tessera replica's local read gives more: it waits until it has applied (and synced)
//! its log as far as the log reached when the read came, which in the order's fast path
//! holds every change any replica acknowledged before (each needs every member's ACK), and
//! it answers locally only under a lease (`tessera_order::Node::read_lease_ends`: its own
//! message, UTO-delivered in its current view, proves every other member heard from it at
//! or after the message was proposed, and no view without it delivers anything until the
//! others have not heard from it for the suspicion timeout). So a Tessera local read is
//! linearizable, given clocks whose rates differ by less than the lease's margin. The
//! openraft read with that guarantee is a leader-lease read, which openraft 0.9 does not
//! offer (its leader lease only keeps followers from voting; `millis_since_quorum_ack` is a
//! metric of unknown age, not a lease a read may lean on). The one it offers,
//! `ensure_linearizable` (read index: a heartbeat round to a quorum per read, then a wait
//! until the leader applied the commit index), is linearizable with no clock assumption at
//! all, so it is stronger than Tessera's and dearer; the local way is weaker and cheaper.
//! The bench measures both, side by side, and names which is which.

use crate::raft::{NodeId, Raft, TypeConfig};
use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tessera_auth::{Claim, Key, Secret};
use tessera_manager::command::{
    is_read, BatchSync, Command, OrderPosition, Proposal, PROPOSAL_VERSION,
};
use tessera_manager::replica::is_local;
use tessera_manager::replica_core::local_answer;
use tessera_manager::Manager;
use tessera_transport::{Accepted, BoxFuture, ConnectionId, FrameHandler};
use tessera_wire::{encode_message, ManagerError, ManagerRequest, ManagerResponse};

/// One node's [`Manager`], applied to by openraft.
#[derive(Clone)]
pub struct ManagerMachine {
    manager: Arc<Mutex<Manager>>,
    applied: Arc<Mutex<Applied>>,
}

/// What openraft asks the state machine to remember besides the store.
#[derive(Default)]
struct Applied {
    last: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

impl ManagerMachine {
    /// Applies to `manager` (opened as a replica's).
    pub fn new(manager: Manager) -> ManagerMachine {
        ManagerMachine {
            manager: Arc::new(Mutex::new(manager)),
            applied: Arc::default(),
        }
    }

    /// The node's manager.
    pub fn manager(&self) -> Arc<Mutex<Manager>> {
        self.manager.clone()
    }

    /// Entries applied so far (the last one's index).
    pub fn applied_index(&self) -> u64 {
        let applied = self.applied.lock().expect("applied lock");
        applied.last.map_or(0, |id| id.index)
    }
}

fn machine_error(why: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(why.to_string())).into()
}

/// Applies `entries` to `manager` as a Tessera replica applies a batch of deliveries: every
/// command without a sync, one sync at the end, run without the manager's lock (local reads
/// meanwhile see the store as it stood before the batch); the encoded answer of each entry.
fn apply_batch(
    manager: &Mutex<Manager>,
    entries: &[Entry<TypeConfig>],
) -> Result<Vec<Vec<u8>>, String> {
    let (answers, sync) = {
        let mut manager = manager.lock().expect("manager lock");
        apply_unsynced(&mut manager, entries)?
    };
    if let Some(sync) = sync {
        let synced = sync.run();
        let mut manager = manager.lock().expect("manager lock");
        manager
            .batch_synced(synced)
            .map_err(|error| error.to_string())?;
    }
    Ok(answers)
}

/// Applies `entries` to `manager` without syncing: their encoded answers and the sync the
/// batch owes.
fn apply_unsynced(
    manager: &mut Manager,
    entries: &[Entry<TypeConfig>],
) -> Result<(Vec<Vec<u8>>, Option<BatchSync>), String> {
    let now = Instant::now();
    manager.begin_batch().map_err(|error| error.to_string())?;
    let mut answers = Vec::with_capacity(entries.len());
    for entry in entries {
        let answer = match &entry.payload {
            EntryPayload::Normal(bytes) => {
                let proposal = match Proposal::decode(bytes) {
                    Ok(proposal) => proposal,
                    Err(error) => {
                        manager.abandon_batch();
                        return Err(format!("entry {}: {error}", entry.log_id.index));
                    }
                };
                manager.set_order_position(OrderPosition {
                    epoch: 1,
                    next: entry.log_id.index + 1,
                });
                let answer = manager.apply(proposal.command, now);
                if let Some(failure) = manager.take_store_failure() {
                    manager.abandon_batch();
                    return Err(format!("entry {}: {failure}", entry.log_id.index));
                }
                answer
            }
            EntryPayload::Blank | EntryPayload::Membership(_) => ManagerResponse::Done,
        };
        answers.push(encode_message(&answer));
    }
    let sync = manager.finish_batch().map_err(|error| error.to_string())?;
    Ok((answers, sync))
}

impl RaftSnapshotBuilder<TypeConfig> for ManagerMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Err(machine_error("snapshots are not built in this bench"))
    }
}

impl RaftStateMachine<TypeConfig> for ManagerMachine {
    type SnapshotBuilder = ManagerMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let applied = self.applied.lock().expect("applied lock");
        Ok((applied.last, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<u8>>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|entry| entry.log_id) else {
            return Ok(Vec::new());
        };
        let membership = entries.iter().rev().find_map(|entry| match &entry.payload {
            EntryPayload::Membership(m) => {
                Some(StoredMembership::new(Some(entry.log_id), m.clone()))
            }
            _ => None,
        });
        // The store syncs: off the async workers, as a Tessera replica's applier thread.
        let manager = self.manager.clone();
        let answers = tokio::task::spawn_blocking(move || apply_batch(&manager, &entries))
            .await
            .map_err(machine_error)?
            .map_err(machine_error)?;
        let mut applied = self.applied.lock().expect("applied lock");
        applied.last = Some(last);
        if let Some(membership) = membership {
            applied.membership = membership;
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> ManagerMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Err(machine_error("snapshots are not installed in this bench"))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<NodeId, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        Err(machine_error("snapshots are not installed in this bench"))
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(None)
    }
}

/// How the leader answers reads (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// From its store at once: read-your-writes, stale at a deposed leader.
    Local,
    /// From its store after `Raft::ensure_linearizable`: linearizable.
    Linearizable,
}

/// The leader's client-facing daemon: the manager's wire requests over Tessera's TCP
/// transport, changes written through openraft, reads from the leader's store.
pub struct Front {
    raft: Raft,
    reads: Reads,
    manager: Arc<Mutex<Manager>>,
    admin_key: Key,
    server_key: Key,
    /// The claim each open connection authenticated as.
    claims: Mutex<HashMap<ConnectionId, Claim>>,
}

impl Front {
    /// Serves through `raft` (the leader's) and its node's `manager`, reads as `reads`
    /// says.
    pub fn new(raft: Raft, manager: Arc<Mutex<Manager>>, secret: &Secret, reads: Reads) -> Front {
        Front {
            raft,
            reads,
            manager,
            admin_key: secret.admin_key(),
            server_key: secret.server_key(),
            claims: Mutex::default(),
        }
    }
}

impl FrameHandler for Front {
    fn peer_key(&self, claim: &Claim) -> Option<Key> {
        match claim {
            Claim::Admin => Some(self.admin_key),
            Claim::Server => Some(self.server_key),
            Claim::Client(_) => None,
        }
    }

    fn opened(&self, connection: ConnectionId, accepted: &Accepted) {
        let mut claims = self.claims.lock().expect("claims lock");
        claims.insert(connection, accepted.claim);
    }

    fn closed(&self, connection: ConnectionId) {
        self.claims.lock().expect("claims lock").remove(&connection);
    }

    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        _payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let claim = self
            .claims
            .lock()
            .expect("claims lock")
            .get(&connection)
            .copied();
        let request: Option<ManagerRequest> = tessera_wire::decode_message(&message).ok();
        let (Some(claim), Some(request)) = (claim, request) else {
            return Box::pin(async { None });
        };
        let (raft, manager, reads) = (self.raft.clone(), self.manager.clone(), self.reads);
        Box::pin(async move {
            let answer = match tessera_manager::authorize(&request, claim.role()) {
                Ok(()) => serve(raft, manager, reads, request).await,
                Err(refused) => encode_message(&ManagerResponse::Error(refused)),
            };
            Some((Bytes::from(answer), Bytes::new()))
        })
    }
}

/// The encoded answer to `request`: from the leader's store if it only reads (and finds
/// what it reads: absence goes through the log, as at a Tessera replica; with
/// [`Reads::Linearizable`] once `ensure_linearizable` returned), else written through
/// openraft and answered once the leader applied and synced it.
async fn serve(
    raft: Raft,
    manager: Arc<Mutex<Manager>>,
    reads: Reads,
    request: ManagerRequest,
) -> Vec<u8> {
    if reads == Reads::Linearizable && is_read(&request) && !is_local(&request) {
        if let Err(error) = raft.ensure_linearizable().await {
            let refused = ManagerError::Unordered(error.to_string());
            return encode_message(&ManagerResponse::Error(refused));
        }
    }
    if is_local(&request) || is_read(&request) {
        let (reading, asked) = (manager.clone(), request.clone());
        let local = tokio::task::spawn_blocking(move || {
            let mut manager = reading.lock().expect("manager lock");
            if is_local(&asked) {
                Some(manager.handle(asked, Instant::now()))
            } else {
                local_answer(&mut manager, &asked, Instant::now())
            }
        })
        .await
        .ok()
        .flatten();
        if let Some(answer) = local {
            return encode_message(&answer);
        }
    }
    let decision = manager.lock().expect("manager lock").decide(&request);
    let proposal = Proposal {
        version: PROPOSAL_VERSION,
        origin: 1,
        incarnation: 1,
        ticket: 0,
        command: Command::Request { request, decision },
    };
    match raft.client_write(proposal.encode()).await {
        Ok(written) => written.data,
        Err(error) => encode_message(&ManagerResponse::Error(ManagerError::Unordered(
            error.to_string(),
        ))),
    }
}
