//! One replica of a replicated manager: the [`Manager`] state machine fed, in uniform total
//! order, by `tessera-order` over UDP (`tessera-order-udp`).
//!
//! The replicas are listed once, in the same order everywhere (`--peers`): replica `i`
//! (1-based) is order node `i - 1`, listens for clients, servers and the admin on TCP at the
//! `i`-th address and for the order's datagrams on UDP at the same port. Every datagram
//! carries a MAC under a key derived from the cluster secret ([`Secret::replica_key`]), so only
//! holders of the secret take part in the order, and a metadata change has no path into the
//! replicated state but an authenticated TCP connection to a replica.
//!
//! **The life of a change.** The daemon receives a request, checks the connection's role,
//! lets its manager [`decide`](Manager::decide) what is local to the receiving replica
//! (placement over the servers it believes live, a new key's seed), and proposes the
//! [`Command`] with a ticket. The applier thread takes every UTO delivery in position order,
//! applies it to the manager (committing to this replica's redb) and, for its own tickets,
//! hands the answer back to the waiting request: a request is answered only once it is
//! ordered, applied and committed here. The applier takes every delivery waiting for it as
//! one batch (at most [`BATCH_DELIVERIES_MAX`]): it applies them all without syncing the
//! store, then syncs once ([`crate::command::BatchSync`], an empty durable commit: it makes
//! every earlier commit durable), and only then answers; a batch that fails is neither
//! synced nor answered (the replica stops). The order reports each message twice, as a
//! preliminary delivery and then in UTO order; the preliminary ones change nothing here and
//! do not end a batch.
//!
//! **The lock and the sync.** The applier holds the manager's lock (and the core's) while
//! it applies a batch, not while it syncs it (the sync needs only the database). So
//! requests are decided ([`Manager::decide`](crate::Manager::decide): placement, a new
//! key's seed), their access keys checked and proposed, and reads answered locally between
//! batches and while they sync; the request path takes these locks on tokio workers, and
//! holds them for an apply at most, never for an fsync.
//!
//! **Reads while batches sync.** A batch's commits are in the store (redb shows a commit
//! made without sync to every later transaction), but on this replica's disk only once a
//! sync after them ends. A local read must not see them before: if every replica crashed at
//! once before any synced the batch (a power cut), the group would start again from the
//! most advanced store (see Starting), which lacks them, and undo what a client had read,
//! though nobody had acknowledged it. So a read answered locally sees the store as it stood
//! when it was last durable: [`Manager::begin_batch`](crate::Manager::begin_batch) pins a
//! read transaction when a batch begins with nothing unsynced, and local reads use it while
//! any batch is being applied or waits for its sync; a sync that ends while later batches
//! are still unsynced moves the pin to the store as it stood when that sync began
//! ([`Manager::batches_synced`](crate::Manager::batches_synced): everything in it was
//! committed before the durable commit), and the pin goes once nothing is unsynced. The
//! only commits in a pinned state made without sync are those that asked for none: a
//! grow-only `SetSize` (which a single manager too commits without sync, and a crash may
//! undo, by design: the client's `SyncFile` restates the size) and the `once` records of
//! ordered reads (which no local read looks at). Reads lose nothing they were promised: a
//! synced connection's ordered request was answered after a sync that covered its batch,
//! and that sync moved the pin past the batch first, so the batch is in every later pinned
//! state (read-your-writes holds), and a pinned state is never older than one a read saw
//! before (the pin moves forward only). What a read takes from
//! memory rather than from the store is local or advisory, as before, and may be newer than
//! the pinned state: the servers' liveness and addresses in a file's columns (a replica's
//! own judgement, never replicated), whether a server is known (a server asks for its
//! files and orphans only once its registration was answered), and whether a file is
//! pending (a file pending only in the unsynced batch is absent from the pinned state, so
//! its lookup is ordered). A file's missed stripes come from the pinned state alone (every
//! column's debts are read then, not only those of servers that owe something now).
//! Ordered requests, applied in the batch, read what the batch changed, as they must.
//!
//! **Reads** ([`is_read`]: lookups, listings, debts, orphans) are answered from the
//! replica's own store once the connection they come on is *synced*: one ordered request on
//! it was answered here, in the view this replica is still a normal member of. That request
//! was ordered after every change acknowledged before it was sent, by any replica, so from
//! then on a client sees its own writes and everything acknowledged before its first request.
//! A local read also waits until the replica has applied (and synced) its log as far as the
//! log reached when the read came ([`Replica::caught_up_to_now`], at most
//! [`READ_BARRIER_WAIT_MAX`], else it is ordered): a change is acknowledged only once every
//! member's ACK holds it, so a change another replica acknowledged before the read came is
//! in that stretch, and the read sees it (a client told of another's write by a third
//! party reads it too: a column that came to owe a stripe, above all). No message is sent
//! for it; an idle replica answers at once, a busy one after its current batches. This
//! holds in the fast path; while a view changes, reads are ordered (below). The first request of a connection, a
//! read answered "not found" (absence is always asked through the order), any read after a
//! view change, and everything while the replica suspects a peer, catches up or starts,
//! are ordered as before; a refusal (`Unordered`, after which the client moves on) unsyncs
//! the connection, so a client that comes back on it after writing elsewhere is ordered
//! again. `Status`, `KeyList`,
//! `StorageKeys`, `Replica` and `Snapshot` are answered from the replica's own state, and so
//! are reservations (`Reserve`, `RenewReservation`, `ReleaseReservation`: soft state each
//! replica keeps on its own).
//!
//! **Catching up.** A replica that restarts has forgotten the order (tessera-order's
//! [`Start::Restarted`]): it joins the current view and delivers from some position `p` on
//! ([`Event::Joined`]). Everything before `p` comes from a peer: it asks the others, in turn,
//! for a [`ManagerRequest::Snapshot`] (the peer copies every table of its store as a read
//! transaction sees it, at the position it stands at, `n`, into a file of its own, and sends
//! that file in pieces of at most [`SNAPSHOT_PIECE_BYTES_MAX`], so a store of any size
//! crosses) until one has `n >= p`, installs the copy as its store, and applies the
//! deliveries from `n` on (those below were in the copy). Until then
//! it refuses requests with [`ManagerError::Unordered`], and clients try another replica.
//! A replica that starts or installs a store presumes the servers it records in their
//! stored state for one heartbeat timeout
//! ([`Manager::presume_live`](crate::Manager::presume_live)): they heartbeat through the
//! order, and the group heard them meanwhile.
//!
//! **Starting.** Whether a replica rejoins ([`Start::Restarted`]) or starts with the group
//! ([`Start::Initial`]) is decided by asking the peers: if a majority of all replicas are
//! members of a view without it, it rejoins and catches up as above. Otherwise the whole
//! group is starting (the first time, or after every replica stopped or crashed), and the
//! stores may differ: a replica may have lagged the others, or lost its directory. Every
//! store records where it stands in the order ([`OrderPosition`]: the group's epoch, which
//! counts whole-group starts, and the next position of that epoch's order), written in the
//! same commit as every change it applies. A starting replica answers `Replica` with that
//! and role `starting`, and waits until every replica answers: it copies the store of one
//! that stands further, if any does, and once every replica stands where it does (or runs
//! the next epoch already), it records the next epoch at position 0 and starts the order
//! node. Every acknowledged change is in the store of the replica that acknowledged it
//! (committed before the answer), so the most advanced store of all holds them all; the
//! price is that the group starts only when every replica answers.
//!
//! **Incarnations.** Each start takes an incarnation above the last one in
//! `replica.incarnation` and at least the seconds since 2025 ([`clock_incarnation`]): a
//! replica whose directory was wiped is still a new process to its peers (it lost what it
//! acknowledged to them), rejoins as restarted and catches up.
//!
//! **Membership** ([`crate::group`]): the group is the one the store records (at first
//! `--peers`); `Replica::change_group` adds or removes one replica per ordered change, a
//! new replica starts with [`ReplicaConfig::join`], and a removed one stops its order node
//! once a majority of the new group is normal in a later view.
//!
//! **Not handled** (see the README): a start of the group while a replica is down for good
//! (it waits for every replica).

use crate::command::{Command, OrderPosition};
use crate::daemon::Served;
use crate::group::ReplicaGroup;
use crate::replica_core::{Applied, Counters, ReplicaCore, StageClock, StageTimes, REPLICA_STAGES};
use crate::ManagerConfig;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Credential, Secret};
use tessera_order::{Event, NodeId, Start};
use tessera_order_udp::{Broadcast, DriverConfig, Handle};
use tessera_transport::{ConnectionId, TcpConfig, TcpTransport};
use tessera_wire::{ManagerError, ManagerRequest, ManagerResponse, ReplicaStatus};
use tokio::sync::oneshot;

/// Longest a request waits to be ordered and applied before the client is told to try
/// another replica.
pub const ORDER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a peer may take to answer a probe or a snapshot request.
const PEER_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between rounds of snapshot requests to peers that are not far enough yet.
const CATCH_UP_PAUSE: Duration = Duration::from_millis(100);
/// Longest a local read waits for this replica to apply what any replica may have
/// acknowledged before it came ([`Replica::caught_up_to_now`]); a read that would wait
/// longer is ordered instead.
const READ_BARRIER_WAIT_MAX: Duration = Duration::from_secs(1);
/// Most deliveries applied as one batch, with one sync of the store.
pub const BATCH_DELIVERIES_MAX: usize = 256;
/// Least time between two logs of the replica's [`Counters`].
const COUNTERS_EVERY: Duration = Duration::from_millis(500);
/// How often the applier looks at lease deadlines when no delivery comes.
const APPLIER_TICK: Duration = Duration::from_millis(100);
/// Marks of where the order stood that the applier keeps per once expiry time (see
/// [`OnceMarks`]): the expiry cutoff is at most this fraction of it late.
const ONCE_MARKS_MAX: u32 = 16;
/// Least time between two proposals of the same `ExpireOnce` cutoff while records remain.
const ONCE_EXPIRY_AGAIN: Duration = Duration::from_secs(1);
/// Largest piece of a store copy a replica sends in one frame (half a frame's payload).
pub const SNAPSHOT_PIECE_BYTES_MAX: u64 = 8 << 20;
/// Where a replica writes the store copy it fetches, before it installs it.
const INCOMING_FILE_NAME: &str = "manager.redb.incoming";
/// Most replicas in a group.
pub const REPLICAS_MAX: usize = 16;

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// `--id` is not a position in `--peers`.
    #[error("replica id {id} is not in 1..={peers} (the addresses of --peers)")]
    Id {
        /// The id given.
        id: u16,
        /// Addresses listed.
        peers: usize,
    },
    /// Too many or too few replicas.
    #[error("{0} replicas: a replicated manager has 1..={REPLICAS_MAX}")]
    Count(usize),
    /// The UDP socket for the order could not be bound, or the driver not started.
    #[error("total order on {addr}: {detail}")]
    Order {
        /// The address.
        addr: SocketAddr,
        /// What failed.
        detail: String,
    },
    /// The replica's store says it was removed from the group.
    #[error(
        "replica {0} was removed from the group (its store says so): to bring it back, wipe \
         its directory and add it again (`tessera manager add`)"
    )]
    Removed(u16),
    /// The incarnation file could not be read or written.
    #[error("incarnation file {path}: {error}")]
    Incarnation {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// What the request handlers and the applier thread share.
pub(crate) struct Replica {
    /// This replica's id (1-based).
    pub(crate) id: u16,
    /// `--peers`: where replicas the store names no address for listen.
    peers: Vec<SocketAddr>,
    /// The order node, once started.
    handle: Mutex<Option<Handle>>,
    /// The sans-IO state (positions, role, tickets, synced connections); its position
    /// moves only while the manager's lock is held (lock the manager first). Neither lock
    /// is held while a batch syncs (module doc).
    core: Mutex<ReplicaCore>,
    waiters: Mutex<HashMap<u64, Waiter>>,
    /// Held while a copy of the store is made for a peer.
    outgoing: Mutex<()>,
    /// See [`ReplicaConfig::catch_up_piece_bytes`].
    catch_up_piece_bytes: u32,
    /// Reads answered locally or ordered, counted without the core's lock.
    reads: ReadCounts,
    /// Where the time of the ordered requests answered here went ([`REPLICA_STAGES`]).
    stages: StageClock,
    /// Where local reads stand: every position below it is applied and synced here, so in
    /// the state they see. Published by the applier between events.
    readable: tokio::sync::watch::Sender<OrderPosition>,
    /// Tests only: the applier takes no event while set (a replica that lags).
    #[cfg(test)]
    pub(crate) applier_paused: std::sync::atomic::AtomicBool,
}

/// A request waiting for the answer to its proposal: where the answer goes (with when it was
/// sent), and when the proposal was handed to the order driver.
struct Waiter {
    answer: oneshot::Sender<(ManagerResponse, Instant)>,
    proposed: Instant,
}

/// Indexes of [`REPLICA_STAGES`].
mod stage {
    pub const DECIDE: usize = 0;
    pub const PROPOSE: usize = 1;
    pub const ORDER: usize = 2;
    pub const APPLY: usize = 3;
    pub const SYNC: usize = 4;
    pub const WAKE: usize = 5;
    pub const TOTAL: usize = 6;
}

/// Reads ([`crate::command::is_read`]) a replica answered from its own store, and those it
/// ordered instead, since it started (logged with its [`Counters`]).
#[derive(Debug, Default)]
struct ReadCounts {
    local: AtomicU64,
    ordered: AtomicU64,
}

impl ReadCounts {
    /// Local and ordered so far.
    fn get(&self) -> (u64, u64) {
        let local = self.local.load(Ordering::Relaxed);
        (local, self.ordered.load(Ordering::Relaxed))
    }
}

/// The order's settings for manager replicas: a view change within about half a second of a
/// replica's death (the target is service back within 1 s), and packets of up to
/// 9000 bytes so that a request with the longest path fits one message.
pub fn order_config() -> tessera_order::Config {
    tessera_order::Config {
        mtu_bytes: 9000,
        heartbeat_interval_us: 20_000,
        suspect_after_us: 250_000,
        view_change_timeout_us: 400_000,
        retransmit_after_us: 10_000,
        // Local reads stay linearizable at a replica cut off before it suspects anyone
        // (`Replica::caught_up_to_now`).
        read_leases: true,
        ..tessera_order::Config::default()
    }
}

/// The cluster id replicas created together agree on: derived from the cluster secret, since
/// each creates its own store.
pub fn replicated_cluster_id(secret: &Secret) -> u64 {
    let derived = tessera_auth::replicated_access_key(&secret.replica_key(), &[0xc1; 32]);
    u64::from_le_bytes(derived.0[..8].try_into().expect("8 bytes")).max(1)
}

/// Everything a replica needs besides its manager.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// This replica's id, 1-based, its position in `peers`.
    pub id: u16,
    /// Every replica's address, by id.
    pub peers: Vec<SocketAddr>,
    /// The order's settings ([`order_config`]).
    pub order: tessera_order::Config,
    /// Largest piece of a peer's store to ask for at once when catching up (at most
    /// [`SNAPSHOT_PIECE_BYTES_MAX`]; tests ask for less to cross many pieces).
    pub catch_up_piece_bytes: u32,
    /// A replica being added to a running group (`tessera manager add`): it starts as an
    /// added order node (`Start::Added`) and takes a peer's store once it is a member.
    pub join: bool,
}

impl ReplicaConfig {
    /// Checks the id and the number of replicas.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        if self.peers.is_empty() || self.peers.len() > REPLICAS_MAX {
            return Err(ReplicaError::Count(self.peers.len()));
        }
        if self.id == 0 || usize::from(self.id) > self.peers.len() {
            return Err(ReplicaError::Id {
                id: self.id,
                peers: self.peers.len(),
            });
        }
        Ok(())
    }

    /// This replica's address.
    pub fn addr(&self) -> SocketAddr {
        self.peers[usize::from(self.id) - 1]
    }
}

/// Seconds since 2025-01-01 UTC, the least incarnation of a start now: a replica whose
/// directory was wiped (its incarnation file with it) still starts above every incarnation
/// it had, so its peers take it for a new process, never for the old one with its promises.
fn clock_incarnation() -> u32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    u32::try_from(now.saturating_sub(1_735_689_600)).unwrap_or(u32::MAX)
}

/// The incarnation of this start: above the last, kept in `dir/replica.incarnation`, and
/// at least [`clock_incarnation`].
fn next_incarnation(dir: &Path) -> Result<u32, ReplicaError> {
    let path = dir.join("replica.incarnation");
    let failed = |error| ReplicaError::Incarnation {
        path: path.clone(),
        error,
    };
    let last = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().unwrap_or(0),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
        Err(error) => return Err(failed(error)),
    };
    let next = last.saturating_add(1).max(clock_incarnation());
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, next.to_string()).map_err(failed)?;
    std::fs::File::open(&tmp)
        .and_then(|file| file.sync_all())
        .map_err(failed)?;
    std::fs::rename(&tmp, &path).map_err(failed)?;
    Ok(next)
}

/// An admin connection to peers (replicas hold the cluster secret).
fn admin_transport(secret: &Secret) -> Arc<TcpTransport> {
    let credential = Credential {
        claim: Claim::Admin,
        key: secret.admin_key(),
    };
    let config = TcpConfig {
        connect_timeout: PEER_TIMEOUT,
        request_timeout: PEER_TIMEOUT,
    };
    Arc::new(TcpTransport::with_credential(config, Some(credential)))
}

/// Whether a majority of the replicas are members of a view now without this one: then this
/// one rejoins (as a restarted node: it must not count for a majority, having forgotten the
/// order). Otherwise the group is starting, and it starts with it: a joining node needs a
/// majority that holds state to let it in.
async fn group_is_running(others: &[(u16, SocketAddr)], secret: &Secret) -> bool {
    let transport = admin_transport(secret);
    let group = others.len() + 1; // This replica is a member.
    let majority = group / 2 + 1;
    let mut members = 0;
    for &(_, peer) in others {
        let answer = tessera_transport::call::<_, ManagerResponse>(
            &transport,
            peer,
            &ManagerRequest::Replica,
            Bytes::new(),
        )
        .await;
        if let Ok((ManagerResponse::Replica(status), _)) = answer {
            if status.role == "leader" || status.role == "follower" {
                members += 1;
            }
        }
    }
    members >= majority
}

/// Starts replica `config.id` over `served`: its applier thread decides how to join the
/// order (see the module doc), starts the order node and applies; until then the replica
/// answers `Replica` and `Snapshot` and refuses the rest.
pub(crate) async fn start(
    config: ReplicaConfig,
    dir: &Path,
    manager_config: ManagerConfig,
    served: Arc<Mutex<Served>>,
    secret: &Secret,
) -> Result<Arc<Replica>, ReplicaError> {
    config.validate()?;
    let addr = config.addr();
    let order_failed = |detail: String| ReplicaError::Order { addr, detail };
    let incarnation = next_incarnation(dir)?;
    let socket = UdpSocket::bind(addr).map_err(|e| order_failed(e.to_string()))?;
    // The servers the group knows are presumed in their stored state for one heartbeat
    // timeout, rather than down until their heartbeats come through the order.
    if let Served::Running(manager) = &mut *served.lock().unwrap() {
        manager.presume_live(Instant::now());
    }
    let (stored, group) = match &*served.lock().unwrap() {
        Served::Running(manager) => (
            manager
                .order_position()
                .map_err(|e| order_failed(format!("the store's order position: {e}")))?,
            manager
                .replica_group()
                .map_err(|e| order_failed(format!("the store's replica group: {e}")))?,
        ),
        Served::NoStore(_) => (OrderPosition::default(), None),
    };
    let group = group.unwrap_or_else(|| ReplicaGroup::initial(&config.peers));
    if !config.join && !group.contains(config.id) {
        return Err(ReplicaError::Removed(config.id));
    }
    let mut core = ReplicaCore::new(
        config.id,
        incarnation,
        stored,
        config.order.message_bytes_max(),
        manager_config.heartbeat_timeout,
        Instant::now(),
    );
    core.set_group(group);
    let replica = Arc::new(Replica {
        id: config.id,
        peers: config.peers.clone(),
        handle: Mutex::new(None),
        core: Mutex::new(core),
        waiters: Mutex::new(HashMap::new()),
        outgoing: Mutex::new(()),
        catch_up_piece_bytes: config.catch_up_piece_bytes,
        reads: ReadCounts::default(),
        stages: StageClock::new(&REPLICA_STAGES),
        readable: tokio::sync::watch::channel(OrderPosition::default()).0,
        #[cfg(test)]
        applier_paused: std::sync::atomic::AtomicBool::new(false),
    });
    let applier = Applier {
        replica: replica.clone(),
        served,
        dir: dir.to_path_buf(),
        manager_config,
        secret: secret.clone(),
        runtime: tokio::runtime::Handle::current(),
        once_marks: Mutex::new(OnceMarks::default()),
    };
    std::thread::Builder::new()
        .name(format!("replica-{}", config.id))
        .spawn(move || {
            let id = applier.replica.id;
            let run = std::panic::AssertUnwindSafe(|| {
                let events = applier.begin(&config, socket);
                applier.run(events);
            });
            // A replica that cannot apply must not go on answering from a stale state: it
            // dies, and restarts through catch-up.
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!("replica {id}: the applier failed; stopping the replica");
                std::process::abort();
            }
        })
        .map_err(|e| order_failed(e.to_string()))?;
    Ok(replica)
}

/// Whether a request is answered from the replica's own state rather than ordered.
pub fn is_local(request: &ManagerRequest) -> bool {
    matches!(
        request,
        ManagerRequest::Status
            | ManagerRequest::KeyList
            | ManagerRequest::StorageKeys
            | ManagerRequest::Replica
            | ManagerRequest::ReplicaGroup
            | ManagerRequest::Snapshot { .. }
            | ManagerRequest::Reserve { .. }
            | ManagerRequest::RenewReservation { .. }
            | ManagerRequest::ReleaseReservation { .. }
    )
}

impl Replica {
    /// This replica's state for `tessera status`.
    pub(crate) fn status(&self) -> ReplicaStatus {
        self.core.lock().unwrap().status()
    }

    /// The other members of the group and their addresses (from the store, else `--peers`).
    fn others(&self) -> Vec<(u16, SocketAddr)> {
        let group = self.core.lock().unwrap().group().clone();
        let address = |id: u16| {
            let stored = group.addresses.get(&id).and_then(|addr| addr.parse().ok());
            stored.or_else(|| self.peers.get(usize::from(id) - 1).copied())
        };
        group
            .member_ids()
            .into_iter()
            .filter(|&id| id != self.id)
            .filter_map(|id| Some((id, address(id)?)))
            .collect()
    }

    /// The group as this replica applied it, for `ReplicaGroup`.
    pub(crate) fn group_answer(&self) -> ManagerResponse {
        let core = self.core.lock().unwrap();
        ManagerResponse::ReplicaGroup {
            epoch: core.group().epoch,
            members: core.group().members(),
        }
    }

    /// Where it stands in the order.
    fn position(&self) -> OrderPosition {
        self.core.lock().unwrap().position()
    }

    /// Answers a read on `connection` from this replica's own store, if the connection is
    /// synced in the current view (see the module doc); `None`: order it.
    pub(crate) fn read_locally(
        &self,
        connection: ConnectionId,
        served: &Mutex<Served>,
        request: &ManagerRequest,
    ) -> Option<ManagerResponse> {
        let answer = if self.core.lock().unwrap().reads_locally(connection, request) {
            match &mut *served.lock().unwrap() {
                Served::Running(manager) => {
                    crate::replica_core::local_answer(manager, request, Instant::now())
                }
                Served::NoStore(_) => None,
            }
        } else {
            None
        };
        let counted = match answer {
            Some(_) => &self.reads.local,
            None => &self.reads.ordered,
        };
        counted.fetch_add(1, Ordering::Relaxed);
        answer
    }

    /// Reads answered locally and ordered so far (tests).
    #[cfg(test)]
    pub(crate) fn reads_counted(&self) -> (u64, u64) {
        self.reads.get()
    }

    /// Counts a read ordered without asking the store (none to answer locally).
    pub(crate) fn count_ordered_read(&self) {
        self.reads.ordered.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a read of `request` on `connection` would be answered locally now.
    pub(crate) fn may_read_locally(
        &self,
        connection: ConnectionId,
        request: &ManagerRequest,
    ) -> bool {
        self.core.lock().unwrap().reads_locally(connection, request)
    }

    /// Waits until local reads see every change any replica may have acknowledged before
    /// this call: true once this replica has applied (and synced) its log up to where the
    /// log ended when the call came; false if that takes longer than
    /// [`READ_BARRIER_WAIT_MAX`] or the order was not running (order the read then).
    ///
    /// Why that suffices: in the fast path a position is UTO-delivered only once every
    /// member acknowledged a log holding it, and this replica stores its log's end before
    /// any ACK of it leaves ([`Handle::log_end`]); a delivered position is never revoked,
    /// so it lies below the end read here. Without the wait a synced connection read
    /// whatever this replica had applied: a change acknowledged by another replica a
    /// moment before (a column that came to owe a stripe, a file's new size) could be
    /// missing, and a client that learned of it from another one acted on the old state
    /// (the integrity section of the README).
    ///
    /// And only under the order's read lease ([`Handle::has_read_lease`], checked before
    /// the log end is read): a replica cut off from the others keeps its view until it
    /// suspects them, while they may have moved on without it and acknowledged changes it
    /// will never apply in time. The lease runs three quarters of the suspicion timeout
    /// from this replica's latest proposal that every other member acknowledged, and no
    /// node enters a view that leaves out a member it heard from within the suspicion
    /// timeout (`tessera_order`'s "Read leases"); a replica that proposed nothing lately
    /// orders the read, which renews it.
    pub(crate) async fn caught_up_to_now(&self) -> bool {
        let end = {
            let handle = self.handle.lock().unwrap();
            let leased = handle.as_ref().filter(|handle| handle.has_read_lease());
            let Some(end) = leased.map(Handle::log_end) else {
                return false;
            };
            end
        };
        let epoch = self.position().epoch;
        let reached = move |at: &OrderPosition| at.epoch == epoch && at.next >= end;
        let mut readable = self.readable.subscribe();
        if reached(&readable.borrow_and_update()) {
            return true;
        }
        let waited = tokio::time::timeout(READ_BARRIER_WAIT_MAX, readable.wait_for(reached));
        let caught_up = matches!(waited.await, Ok(Ok(_)));
        caught_up
    }

    /// Publishes where local reads stand ([`Replica::readable`]): called by the applier
    /// between events, when everything it applied is synced.
    fn publish_readable(&self) {
        let here = self.position();
        self.readable.send_if_modified(|at| {
            let moved = *at != here;
            *at = here;
            moved
        });
    }

    /// Orders `request` that came on `connection` and waits for the answer; an answer other
    /// than a refusal syncs the connection, a refusal unsyncs it.
    pub(crate) async fn order_from(
        &self,
        connection: ConnectionId,
        served: &Arc<Mutex<Served>>,
        request: ManagerRequest,
    ) -> ManagerResponse {
        let answer = self.order(served, request).await;
        self.core.lock().unwrap().answered(connection, &answer);
        answer
    }

    /// Enters a connection that opened, not synced.
    pub(crate) fn opened(&self, connection: ConnectionId) {
        self.core.lock().unwrap().opened(connection);
    }

    /// Forgets a connection that closed.
    pub(crate) fn closed(&self, connection: ConnectionId) {
        self.core.lock().unwrap().closed(connection);
    }

    /// Why requests cannot be ordered here now, if they cannot.
    fn refusal(&self) -> Option<ManagerError> {
        self.core.lock().unwrap().refusal()
    }

    /// Leaves the order and refuses every request from now on, saying `why`; requests
    /// waiting for their answer here are told to try another replica.
    pub(crate) fn stop(&self, why: String) {
        tracing::error!("replica {}: stopping: {why}", self.id);
        self.core.lock().unwrap().stop(why.clone());
        if let Some(handle) = self.handle.lock().unwrap().take() {
            let _ = handle.stop();
        }
        for (_, waiter) in self.waiters.lock().unwrap().drain() {
            let refused = ManagerError::Unordered(format!("replica {} stopped: {why}", self.id));
            let _ = waiter
                .answer
                .send((ManagerResponse::Error(refused), Instant::now()));
        }
    }

    /// Gives the order driver the address of every replica an applied `AddReplica` recorded.
    fn tell_driver_addresses(&self) {
        if self.handle.lock().unwrap().is_none() {
            return; // Kept until the driver runs (it starts with the stored addresses).
        }
        let learned = self.core.lock().unwrap().take_learned();
        let handle = self.handle.lock().unwrap();
        let Some(handle) = &*handle else {
            return; // Stopped meanwhile.
        };
        for (id, addr) in learned {
            let Ok(addr) = addr.parse::<SocketAddr>() else {
                continue;
            };
            if let Err(error) = handle.set_peer(NodeId(id - 1), addr) {
                tracing::warn!("replica {}: replica {id} at {addr}: {error}", self.id);
            }
        }
    }

    /// Where the time of the ordered requests answered here went, so far.
    pub(crate) fn stage_times(&self) -> StageTimes {
        self.stages.times()
    }

    /// Broadcasts `command`; the receiver gets the answer (and when it was sent) once this
    /// replica applied it.
    fn propose(
        &self,
        command: Command,
    ) -> Result<oneshot::Receiver<(ManagerResponse, Instant)>, ManagerError> {
        let (ticket, proposal) = self.core.lock().unwrap().proposal(command)?;
        let (answer, waiting) = oneshot::channel();
        let waiter = Waiter {
            answer,
            proposed: Instant::now(),
        };
        self.waiters.lock().unwrap().insert(ticket, waiter);
        let proposed = match &*self.handle.lock().unwrap() {
            Some(handle) => handle.propose(proposal),
            None => Err(tessera_order_udp::DriverError::Stopped),
        };
        if let Err(error) = proposed {
            self.waiters.lock().unwrap().remove(&ticket);
            return Err(ManagerError::Unordered(error.to_string()));
        }
        Ok(waiting)
    }

    /// Orders `request` (decided by `served`'s manager) and waits for this replica's answer.
    pub(crate) async fn order(
        &self,
        served: &Arc<Mutex<Served>>,
        request: ManagerRequest,
    ) -> ManagerResponse {
        let began = Instant::now();
        if let Some(refused) = self.refusal() {
            return ManagerResponse::Error(refused);
        }
        let (decision, known) = match &*served.lock().unwrap() {
            Served::Running(manager) => (manager.decide(&request), manager.known_servers()),
            Served::NoStore(path) => return crate::refuse_without_store(path, &request),
        };
        let young = (self.core.lock().unwrap()).young_placement(&decision, known, Instant::now());
        if let Some(refused) = young {
            return ManagerResponse::Error(refused);
        }
        let decided = Instant::now();
        let waiting = match self.propose(Command::Request { request, decision }) {
            Ok(waiting) => waiting,
            Err(error) => return ManagerResponse::Error(error),
        };
        let proposed = Instant::now();
        let Ok(Ok((answer, sent))) = tokio::time::timeout(ORDER_TIMEOUT, waiting).await else {
            return ManagerResponse::Error(not_ordered());
        };
        let stages = &self.stages;
        stages.add(stage::DECIDE, decided - began);
        stages.add(stage::PROPOSE, proposed - decided);
        stages.add(stage::WAKE, sent.elapsed());
        stages.add(stage::TOTAL, began.elapsed());
        answer
    }

    /// Adds replica `id` at `addr` to the group, or removes it (`addr` empty), and answers
    /// with the group once this replica applied the change (see [`crate::group`]): an
    /// addition orders [`Command::AddReplica`] first, so that every replica knows where the
    /// new one listens before the order's change makes it a member. A change already made
    /// is answered at once.
    pub(crate) async fn change_group(&self, id: u16, addr: Option<String>) -> ManagerResponse {
        if let Some(refused) = self.refusal() {
            return ManagerResponse::Error(refused);
        }
        let refuse = |why: String| ManagerResponse::Error(ManagerError::Layout(why));
        if id == 0 || usize::from(id) > tessera_order::GROUP_NODES_MAX {
            return refuse(format!("replica id {id} is not in 1..=64"));
        }
        let adding = addr.is_some();
        let (member, members) = {
            let core = self.core.lock().unwrap();
            (core.group().contains(id), core.group().member_ids().len())
        };
        if member == adding {
            return self.group_answer();
        }
        if !adding && members == 1 {
            return refuse(format!("replica {id} is the group's last member"));
        }
        if let Some(addr) = addr {
            if addr.parse::<SocketAddr>().is_err() {
                return refuse(format!("bad replica address '{addr}'"));
            }
            let recorded = match self.propose(Command::AddReplica { id, addr }) {
                Ok(waiting) => tokio::time::timeout(ORDER_TIMEOUT, waiting).await,
                Err(error) => return ManagerResponse::Error(error),
            };
            match recorded {
                Ok(Ok((ManagerResponse::Done, _))) => {}
                Ok(Ok((other, _))) => return other,
                _ => return ManagerResponse::Error(not_ordered()),
            }
        }
        let role = tessera_order::Role {
            sender: adding,
            receiver: adding,
        };
        let proposed = match &*self.handle.lock().unwrap() {
            Some(handle) => handle.propose_group_change(NodeId(id - 1), role),
            None => Err(tessera_order_udp::DriverError::Stopped),
        };
        if let Err(error) = proposed {
            return ManagerResponse::Error(ManagerError::Unordered(error.to_string()));
        }
        // The change is applied in order by the applier; a change of another that took the
        // same epoch leaves this one ignored, and the caller asks again.
        let began = Instant::now();
        while began.elapsed() < ORDER_TIMEOUT {
            if self.core.lock().unwrap().group().contains(id) == adding {
                return self.group_answer();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ManagerResponse::Error(not_ordered())
    }

    /// A piece of a copy of the store and the position the copy stands at (see the module
    /// doc): with `at` empty a new copy is made first.
    pub(crate) fn snapshot_piece(
        &self,
        served: &Mutex<Served>,
        dir: &Path,
        at: Option<u64>,
        offset: u64,
        max_bytes: u32,
    ) -> Result<(u64, u64, Vec<u8>), ManagerError> {
        // A starting replica's store stands still: peers starting with it may copy it.
        let core = self.core.lock().unwrap();
        let busy = core.is_catching_up() || core.is_stopped();
        drop(core);
        if busy {
            return Err(ManagerError::Unordered(format!(
                "replica {} is catching up from its peers",
                self.id
            )));
        }
        let position = match at {
            Some(position) => position,
            None => self.copy_store(served, dir)?,
        };
        let failed = |e: std::io::Error| {
            ManagerError::Unordered(format!(
                "replica {}: the copy of its store at position {position}: {e} (ask for a new \
                 copy)",
                self.id
            ))
        };
        let mut file = std::fs::File::open(outgoing_path(dir, position)).map_err(failed)?;
        let total = file.metadata().map_err(failed)?.len();
        let length = u64::from(max_bytes)
            .min(SNAPSHOT_PIECE_BYTES_MAX)
            .min(total.saturating_sub(offset));
        let mut piece = vec![0; length as usize];
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut piece))
            .map_err(failed)?;
        Ok((position, total, piece))
    }

    /// Copies the store as it stands into `manager.redb.outgoing-<position>` (a read
    /// transaction: the applier goes on meanwhile) and returns the position.
    fn copy_store(&self, served: &Mutex<Served>, dir: &Path) -> Result<u64, ManagerError> {
        let _one_at_a_time = self.outgoing.lock().unwrap();
        let served = served.lock().unwrap();
        let Served::Running(manager) = &*served else {
            return Err(ManagerError::Unordered("no store".into()));
        };
        // The position is read under the manager's lock, with the copy's read transaction.
        let position = self.position().next;
        let path = outgoing_path(dir, position);
        if !path.exists() {
            let tmp = dir.join("manager.redb.outgoing.tmp");
            let _ = std::fs::remove_file(&tmp);
            crate::replica_core::copy_store(manager, &tmp)?;
            std::fs::rename(&tmp, &path).map_err(|e| ManagerError::Store(e.to_string()))?;
        }
        drop(served);
        prune_outgoing(dir, position);
        Ok(position)
    }
}

/// The order driver's address of every node up to the highest replica id known: the
/// group's (stored) addresses, else `--peers`; an id with neither gets the discard port
/// (no node of the group has it).
fn driver_peers(group: &ReplicaGroup, peers: &[SocketAddr]) -> Vec<SocketAddr> {
    let highest = group.addresses.keys().copied().max().unwrap_or(0);
    let count = usize::from(highest).max(peers.len());
    (1..=count)
        .map(|id| {
            let stored = group.addresses.get(&(id as u16));
            stored
                .and_then(|addr| addr.parse().ok())
                .or_else(|| peers.get(id - 1).copied())
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9)))
        })
        .collect()
}

/// The refusal of a request not ordered within [`ORDER_TIMEOUT`].
fn not_ordered() -> ManagerError {
    ManagerError::Unordered(format!(
        "not ordered within {} ms (no majority of replicas, or a view change)",
        ORDER_TIMEOUT.as_millis()
    ))
}

/// Where the copy of the store at `position` is kept for peers.
fn outgoing_path(dir: &Path, position: u64) -> PathBuf {
    dir.join(format!("manager.redb.outgoing-{position}"))
}

/// Removes the copies for peers older than the one at `newest` and the one before it (a peer
/// may still be reading that one).
fn prune_outgoing(dir: &Path, newest: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut positions: Vec<u64> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?
                .strip_prefix("manager.redb.outgoing-")?
                .parse()
                .ok()
        })
        .filter(|&position| position != newest)
        .collect();
    positions.sort_unstable();
    positions.pop();
    for position in positions {
        let _ = std::fs::remove_file(outgoing_path(dir, position));
    }
}

/// What an applier remembers to propose [`Command::ExpireOnce`] (see `command.rs`): where
/// the order stood at moments of its own monotonic clock, one every expiry time /
/// [`ONCE_MARKS_MAX`], the newest cutoff at least one expiry time old, and its last proposal.
/// Public so that the whole-cluster simulator (`tessera-sim`) runs this code, not a copy.
#[derive(Default)]
pub struct OnceMarks {
    marks: VecDeque<(Instant, OrderPosition)>,
    due: Option<OrderPosition>,
    proposed: Option<(Instant, OrderPosition)>,
}

impl OnceMarks {
    /// Marks where the order stands `now` if the last mark is old enough, and moves the
    /// cutoff to the newest mark one `expiry` old; the cutoff to propose now, if any (a new
    /// one, or the last again while records remain beyond a command's bound).
    pub fn tick(
        &mut self,
        now: Instant,
        here: OrderPosition,
        expiry: Duration,
        backlog: bool,
    ) -> Option<OrderPosition> {
        let interval = expiry / ONCE_MARKS_MAX;
        let last = self.marks.back().map(|&(at, _)| at);
        if last.is_none_or(|at| now.saturating_duration_since(at) >= interval) {
            self.marks.push_back((now, here));
        }
        while let Some(&(at, position)) = self.marks.front() {
            if now.saturating_duration_since(at) < expiry {
                break;
            }
            self.due = Some(position);
            self.marks.pop_front();
        }
        let due = self.due?;
        let propose = match self.proposed {
            None => true,
            Some((_, proposed)) if due > proposed => true,
            Some((at, _)) => backlog && now.saturating_duration_since(at) >= ONCE_EXPIRY_AGAIN,
        };
        propose.then(|| {
            self.proposed = Some((now, due));
            due
        })
    }

    /// What a replica that does not lead does: it keeps marking, so that it knows the past
    /// if it comes to lead, and forgets any proposal of its own.
    pub fn follow(&mut self, now: Instant, here: OrderPosition, expiry: Duration) {
        self.tick(now, here, expiry, false);
        self.proposed = None;
    }
}

/// The delivery `first` and every delivery already waiting after it, at most
/// [`BATCH_DELIVERIES_MAX`]; another event that is not a preliminary delivery (or its
/// revocation: they change nothing here) ends the batch and is `held` for later.
fn gather(
    first: (u64, Bytes),
    events: &tessera_order_udp::Events,
    held: &mut Option<Event>,
) -> Vec<(u64, Bytes)> {
    // The order reports each message twice, PO then UTO, and with the PO reports of later
    // messages between the UTO ones: ended by those, batches stopped at one or two
    // deliveries.
    let mut batch = vec![first];
    while batch.len() < BATCH_DELIVERIES_MAX {
        match events.try_recv() {
            Ok(Event::Deliver {
                position, message, ..
            }) => batch.push((position, message)),
            Ok(Event::Optimistic { .. } | Event::Revoked { .. }) => {}
            Ok(other) => {
                *held = Some(other);
                break;
            }
            Err(_) => break,
        }
    }
    batch
}

/// What makes the applied batches durable and answers them.
struct Syncer {
    replica: Arc<Replica>,
    served: Arc<Mutex<Served>>,
}

impl Syncer {
    /// Syncs `joined` (without the manager's lock or the core's), then answers the requests
    /// waiting for it; `timings`: per batch joined, its answers, when the applier took it and
    /// when it was applied. A store that fails to sync stops the replica.
    fn sync_and_answer(&self, mut joined: Applied, timings: &[(usize, Instant, Instant)]) {
        joined.sync();
        let synced_at = Instant::now();
        let answers = joined.finish(self.served.lock().unwrap().manager());
        let answers = match answers {
            Ok(answers) => answers,
            Err(why) => return self.replica.stop(why),
        };
        if self.replica.core.lock().unwrap().is_stopped() {
            return; // Its waiters were told to try another replica.
        }
        self.replica.tell_driver_addresses();
        let each = timings.iter().flat_map(|&(count, taken, applied_at)| {
            std::iter::repeat_n((taken, applied_at), count)
        });
        let (mut waiters, stages) = (self.replica.waiters.lock().unwrap(), &self.replica.stages);
        for ((ticket, answer), (taken, applied_at)) in answers.into_iter().zip(each) {
            if let Some(waiter) = waiters.remove(&ticket) {
                stages.add(
                    stage::ORDER,
                    taken.saturating_duration_since(waiter.proposed),
                );
                stages.add(stage::APPLY, applied_at - taken);
                stages.add(stage::SYNC, synced_at - applied_at);
                let _ = waiter.answer.send((answer, Instant::now()));
            }
        }
    }
}

/// When the applier last logged its counters, and what it logged.
type Logged = (Instant, (Counters, (u64, u64)));

/// The thread that applies deliveries in order, catches up, and proposes lease expiries.
struct Applier {
    replica: Arc<Replica>,
    served: Arc<Mutex<Served>>,
    dir: PathBuf,
    manager_config: ManagerConfig,
    secret: Secret,
    runtime: tokio::runtime::Handle,
    once_marks: Mutex<OnceMarks>,
}

impl Applier {
    /// Joins the order: as a restarted node if a majority of the replicas run a view now,
    /// else with every replica, from the most advanced store (see the module doc).
    fn begin(&self, config: &ReplicaConfig, socket: UdpSocket) -> tessera_order_udp::Events {
        let start = if config.join {
            Start::Added
        } else if self
            .runtime
            .block_on(group_is_running(&self.replica.others(), &self.secret))
            || !self.start_with_everyone()
        {
            Start::Restarted
        } else {
            Start::Initial
        };
        // The group the store records (a whole-group start begins it again at epoch 0).
        let group = self.replica.core.lock().unwrap().group().clone();
        tracing::info!(
            "replica {} of group {:?} (incarnation {}): {}",
            config.id,
            group.member_ids(),
            self.replica.core.lock().unwrap().incarnation(),
            match start {
                Start::Initial => "starting with the group",
                Start::Restarted => "rejoining the running group",
                Start::Added => "joining the group as a new member",
            }
        );
        let driver = DriverConfig {
            config: config.order.clone(),
            group: group.order_group(),
            node: NodeId(config.id - 1),
            incarnation: self.replica.core.lock().unwrap().incarnation(),
            start,
            seed: rand::random(),
            peers: driver_peers(&group, &config.peers),
            broadcast: Broadcast::Unicast,
        };
        let mut handle = tessera_order_udp::spawn_keyed(driver, socket, self.secret.replica_key())
            .expect("the order node starts");
        let events = handle.take_events();
        *self.replica.handle.lock().unwrap() = Some(handle);
        self.replica.core.lock().unwrap().began(start);
        events
    }

    /// Waits until every replica is starting too, takes the most advanced store among them
    /// (by [`OrderPosition`]) if this one's is behind, and, once every replica stands there,
    /// begins the next epoch at position 0. A replica already in that next epoch started
    /// from the same store and counts as ready. Returns false, having begun nothing, if a
    /// majority of the others turn out to be members of a running view after all (asked
    /// while they were changing view, they were not): this one then rejoins as restarted
    /// (it waited forever for them to start, seen in CI with a wiped replica).
    fn start_with_everyone(&self) -> bool {
        let transport = admin_transport(&self.secret);
        loop {
            let mine = self.replica.position();
            let peers = self.peer_statuses(&transport);
            // A peer running the next epoch started it once every replica, this one
            // included, stood where this one stands still: this one starts too, whoever
            // answers now.
            // One still `starting` but standing in the next epoch has begun it (it records
            // the next epoch before its order node runs): taking its store as the most
            // advanced instead left this one a whole epoch behind, waiting forever (seen in
            // `every_replica_killed_at_once_restarts_without_loss`).
            let next_runs = peers.iter().any(|(_, status)| {
                status
                    .as_ref()
                    .is_some_and(|status| status.epoch == mine.epoch + 1)
            });
            if next_runs {
                self.begin_epoch(mine.epoch + 1);
                return true;
            }
            let members = peers
                .iter()
                .filter(|(_, status)| {
                    status
                        .as_ref()
                        .is_some_and(|s| s.role == "leader" || s.role == "follower")
                })
                .count();
            let group = peers.len() + 1; // This replica is a member.
            if members > group / 2 {
                return false;
            }
            if peers.iter().all(|(_, status)| status.is_some()) {
                let peers: Vec<_> = peers
                    .into_iter()
                    .map(|(addr, status)| (addr, status.expect("all answered")))
                    .collect();
                let stands = |status: &ReplicaStatus| OrderPosition {
                    epoch: status.epoch,
                    next: status.applied,
                };
                let starting = |status: &ReplicaStatus| status.role == "starting";
                let ahead = peers
                    .iter()
                    .filter(|(_, status)| starting(status) && stands(status) > mine)
                    .max_by_key(|(_, status)| stands(status));
                if let Some((addr, status)) = ahead {
                    self.take_store(&transport, *addr, stands(status));
                    continue;
                }
                let ready = peers
                    .iter()
                    .all(|(_, status)| starting(status) && stands(status) == mine);
                if ready {
                    self.begin_epoch(mine.epoch + 1);
                    return true;
                }
            }
            std::thread::sleep(CATCH_UP_PAUSE);
        }
    }

    /// Every peer's status, `None` for those that did not answer.
    fn peer_statuses(
        &self,
        transport: &Arc<TcpTransport>,
    ) -> Vec<(SocketAddr, Option<ReplicaStatus>)> {
        let ask = |addr: SocketAddr| {
            let call = tessera_transport::call::<_, ManagerResponse>(
                transport,
                addr,
                &ManagerRequest::Replica,
                Bytes::new(),
            );
            match self.runtime.block_on(call) {
                Ok((ManagerResponse::Replica(status), _)) => Some(status),
                _ => None,
            }
        };
        let others = self.replica.others();
        others
            .into_iter()
            .map(|(_, addr)| (addr, ask(addr)))
            .collect()
    }

    /// Installs the store of the starting peer at `addr`, which stands at `target`.
    fn take_store(&self, transport: &Arc<TcpTransport>, addr: SocketAddr, target: OrderPosition) {
        let fetched = self.fetch(transport, addr, target.next);
        match fetched.and_then(|fetched| Ok((fetched, self.install_fetched(fetched)?))) {
            Ok((Some((at, bytes, _)), true)) => tracing::info!(
                "replica {}: starts from {addr}'s store, the most advanced ({bytes} bytes, \
                 epoch {} position {at})",
                self.replica.id,
                target.epoch
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!("replica {}: {error}", self.replica.id),
        }
    }

    /// Installs what [`Applier::fetch`] fetched, if it did; whether it did.
    fn install_fetched(&self, fetched: Option<(u64, u64, u32)>) -> Result<bool, String> {
        match fetched {
            Some((at, _, _)) => self.install(at).map(|()| true),
            None => Ok(false),
        }
    }

    /// Begins `epoch` at position 0, durably, before the order node starts; the order counts
    /// group changes from 0 again, so the group (the same members) is recorded at epoch 0.
    fn begin_epoch(&self, epoch: u64) {
        let position = OrderPosition { epoch, next: 0 };
        let mut core = self.replica.core.lock().unwrap();
        let group = ReplicaGroup {
            epoch: 0,
            ..core.group().clone()
        };
        if let Served::Running(manager) = &mut *self.served.lock().unwrap() {
            manager.set_order_position(position);
            (manager.record_replica_group(&group)).expect("the store commits the new epoch");
        }
        core.begin_epoch(epoch);
        core.set_group(group);
    }

    /// Applies the order's events until the replica stops.
    fn run(self, events: tessera_order_udp::Events) {
        let syncer = Syncer {
            replica: self.replica.clone(),
            served: self.served.clone(),
        };
        self.apply_events(&events, &syncer);
    }

    fn apply_events(&self, events: &tessera_order_udp::Events, syncer: &Syncer) {
        let (mut held, mut ticked) = (None, Instant::now());
        let mut logged: Logged = (Instant::now(), Default::default());
        loop {
            if self.replica.core.lock().unwrap().is_stopped() {
                return;
            }
            // Deliveries that never pause must not hold expiries back.
            if ticked.elapsed() >= APPLIER_TICK {
                ticked = Instant::now();
                self.propose_expiries();
                self.propose_once_expiry();
                logged = self.log_counters(logged);
            }
            // Everything applied so far is synced (a batch syncs before the next event).
            self.replica.publish_readable();
            #[cfg(test)]
            while self.replica.applier_paused.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let event = match held.take() {
                Some(event) => event,
                None => match events.recv_timeout(APPLIER_TICK) {
                    Ok(event) => event,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
            };
            match event {
                Event::Deliver {
                    position, message, ..
                } => {
                    let batch = gather((position, message), events, &mut held);
                    self.apply_batch(&batch, Instant::now(), syncer);
                }
                // A preliminary delivery, or its revocation, changes nothing here: a replica
                // applies in UTO order only.
                Event::Optimistic { .. } | Event::Revoked { .. } => {}
                event => self.on_event(event),
            }
        }
    }

    fn on_event(&self, event: Event) {
        if let Event::GroupChange {
            position, change, ..
        } = event
        {
            return self.apply_group_change(position, &change);
        }
        let catch_up = self.replica.core.lock().unwrap().on_event(&event);
        match event {
            Event::View { view, leader, .. } => tracing::info!(
                "replica {}: view {view}, leader {}",
                self.replica.id,
                leader.0 + 1
            ),
            Event::Suspected { node } => tracing::warn!(
                "replica {}: suspects replica {}",
                self.replica.id,
                node.0 + 1
            ),
            Event::Removed => self.leave(),
            _ => {}
        }
        if let Some(position) = catch_up {
            self.catch_up(position);
        }
    }

    /// Applies a batch of deliveries (`taken`: when the applier took it), syncs the store
    /// once, then answers the requests waiting here for it. The sync runs without the
    /// manager's lock or the core's, so that requests are decided and read locally
    /// meanwhile (reads see the store as it stood before the batch: see the module doc). A
    /// store that fails stops the replica, the batch neither synced nor answered (its
    /// waiters are told to try another replica).
    fn apply_batch(&self, batch: &[(u64, Bytes)], taken: Instant, syncer: &Syncer) {
        let applied = {
            let mut served = self.served.lock().unwrap();
            let mut core = self.replica.core.lock().unwrap();
            core.apply_unsynced(served.manager(), batch, Instant::now())
        };
        match applied {
            Ok(applied) => {
                let timing = (applied.answer_count(), taken, Instant::now());
                syncer.sync_and_answer(applied, &[timing]);
            }
            // It cannot commit what the others commit: going on would answer from a store
            // that drifted from theirs. It stops; the others carry on.
            Err(why) => self.replica.stop(why),
        }
    }

    /// Applies the order's group change delivered at `position` to the store (see
    /// [`crate::group`]); a store that fails stops the replica.
    fn apply_group_change(&self, position: u64, change: &tessera_order::GroupChange) {
        let mut served = self.served.lock().unwrap();
        let applied = (self.replica.core.lock().unwrap()).apply_group_change(
            served.manager(),
            position,
            change,
        );
        drop(served);
        match applied {
            Ok(true) => tracing::info!(
                "replica {}: position {position}: the group is now {:?}",
                self.replica.id,
                self.replica.core.lock().unwrap().group().member_ids()
            ),
            Ok(false) => {}
            Err(why) => self.replica.stop(why),
        }
    }

    /// Removed from the group: refuses every request at once, and stops its order node once
    /// a majority of the new group is normal in a later view (stopped at once, it may be the
    /// only one holding the change while a just-added member holds nothing: see "Total
    /// order" in the README, operators).
    fn leave(&self) {
        let view = self.replica.core.lock().unwrap().status().view;
        tracing::warn!("replica {}: removed from the group", self.replica.id);
        let transport = admin_transport(&self.secret);
        loop {
            let others = self.replica.others();
            let running = others
                .iter()
                .filter(|&&(_, addr)| {
                    let call = tessera_transport::call::<_, ManagerResponse>(
                        &transport,
                        addr,
                        &ManagerRequest::Replica,
                        Bytes::new(),
                    );
                    matches!(self.runtime.block_on(call), Ok((ManagerResponse::Replica(status), _))
                        if (status.role == "leader" || status.role == "follower")
                            && status.view > view)
                })
                .count();
            if running > others.len() / 2 {
                break;
            }
            std::thread::sleep(CATCH_UP_PAUSE);
        }
        self.replica.stop("removed from the group".into());
    }

    /// Logs the replica's [`Counters`], its [`ReadCounts`] and its store's synced commits
    /// (target `tessera_manager::counters`, at debug) at most every [`COUNTERS_EVERY`] and
    /// only when they changed since `logged`; when and what it logged last.
    fn log_counters(&self, logged: Logged) -> Logged {
        let counted = (
            self.replica.core.lock().unwrap().counters(),
            self.replica.reads.get(),
        );
        if counted == logged.1 || logged.0.elapsed() < COUNTERS_EVERY {
            return logged;
        }
        let synced = match &*self.served.lock().unwrap() {
            Served::Running(manager) => manager.synced_commits(),
            Served::NoStore(_) => 0,
        };
        let (counters, (reads_local, reads_ordered)) = counted;
        tracing::debug!(
            target: "tessera_manager::counters",
            "replica {}: batches {} deliveries {} batch_sizes(1,2-3,4-7,8-15,16+) {:?} \
             synced_commits {synced} reads_local {reads_local} reads_ordered {reads_ordered} \
             cpu_ms {} ordered {} mean_us({})",
            self.replica.id,
            counters.batches,
            counters.deliveries,
            counters.batch_sizes,
            crate::daemon::process_cpu_ms(),
            self.replica.stages.times().requests(),
            self.replica.stages.times(),
        );
        (Instant::now(), counted)
    }

    /// Proposes the removal of every pending file whose lease ran out here.
    fn propose_expiries(&self) {
        let expired = match &mut *self.served.lock().unwrap() {
            Served::Running(manager) => manager.expired_pending(Instant::now()),
            Served::NoStore(_) => return,
        };
        for file in expired {
            if self.replica.refusal().is_some() {
                return;
            }
            if self.replica.core.lock().unwrap().propose_expiry(file) {
                // The answer is nobody's: the waiter is dropped when it comes.
                let _ = self.replica.propose(Command::ExpirePending { file });
            }
        }
    }

    /// Proposes [`Command::ExpireOnce`] when its cutoff moved (or records remain), if this
    /// replica leads the view: one proposer is enough, and a new leader has its own marks.
    fn propose_once_expiry(&self) {
        let here = self.replica.position();
        let backlog = match &*self.served.lock().unwrap() {
            Served::Running(manager) => manager.once_expiry_backlog(),
            Served::NoStore(_) => return,
        };
        let expiry = self.manager_config.once_expiry;
        let mut marks = self.once_marks.lock().unwrap();
        let leads = self.replica.core.lock().unwrap().leads();
        if !leads {
            marks.follow(Instant::now(), here, expiry);
            return;
        }
        if let Some(before) = marks.tick(Instant::now(), here, expiry, backlog) {
            // The answer is nobody's: the waiter is dropped when it comes.
            let _ = self.replica.propose(Command::ExpireOnce { before });
        }
    }

    /// Installs a peer's store that stands at `position` or later.
    fn catch_up(&self, position: u64) {
        self.replica.core.lock().unwrap().set_catching_up(true);
        tracing::info!(
            "replica {}: delivers from position {position}; fetching a peer's store",
            self.replica.id
        );
        let transport = admin_transport(&self.secret);
        loop {
            for (id, peer) in self.replica.others() {
                let began = Instant::now();
                let (at, bytes, pieces) = match self.fetch(&transport, peer, position) {
                    Ok(Some(fetched)) => fetched,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::warn!("replica {}: {error}", self.replica.id);
                        continue;
                    }
                };
                match self.install(at) {
                    Ok(()) => {
                        tracing::info!(
                            "replica {}: caught up from replica {id} at position {at} ({bytes} \
                             bytes in {pieces} pieces, {} ms)",
                            self.replica.id,
                            began.elapsed().as_millis()
                        );
                        self.replica.core.lock().unwrap().set_catching_up(false);
                        return;
                    }
                    Err(error) => tracing::error!("replica {}: {error}", self.replica.id),
                }
            }
            std::thread::sleep(CATCH_UP_PAUSE);
        }
    }

    /// Fetches `peer`'s store, piece by piece, into `manager.redb.incoming`, if it stands at
    /// `needed` or later: its position, length and the number of pieces.
    fn fetch(
        &self,
        transport: &Arc<TcpTransport>,
        peer: SocketAddr,
        needed: u64,
    ) -> Result<Option<(u64, u64, u32)>, String> {
        let ask = |at: Option<u64>, offset: u64| {
            let request = ManagerRequest::Snapshot {
                at,
                offset,
                max_bytes: self.replica.catch_up_piece_bytes,
            };
            let answer = self
                .runtime
                .block_on(tessera_transport::call::<_, ManagerResponse>(
                    transport,
                    peer,
                    &request,
                    Bytes::new(),
                ));
            match answer {
                Ok((
                    ManagerResponse::Snapshot {
                        position,
                        total_bytes,
                        offset: at_offset,
                    },
                    piece,
                )) if at_offset == offset => Ok((position, total_bytes, piece)),
                Ok((other, _)) => Err(format!("{peer} answered a copy request with {other:?}")),
                Err(error) => Err(format!("copy of {peer}'s store: {error}")),
            }
        };
        let (position, total, first) = ask(None, 0)?;
        if position < needed {
            return Ok(None);
        }
        let incoming = self.dir.join(INCOMING_FILE_NAME);
        let write_failed = |e: std::io::Error| format!("{}: {e}", incoming.display());
        let mut file = std::fs::File::create(&incoming).map_err(write_failed)?;
        file.write_all(&first).map_err(write_failed)?;
        let (mut offset, mut pieces) = (first.len() as u64, 1);
        while offset < total {
            let (at, length, piece) = ask(Some(position), offset)?;
            if at != position || length != total || piece.is_empty() {
                return Err(format!("{peer} sent a piece of another copy"));
            }
            file.write_all(&piece).map_err(write_failed)?;
            offset += piece.len() as u64;
            pieces += 1;
        }
        if offset != total {
            return Err(format!("{peer} sent {offset} bytes of a {total}-byte copy"));
        }
        file.sync_all().map_err(write_failed)?;
        Ok(Some((position, total, pieces)))
    }

    /// Replaces this replica's store with the fetched copy, standing at `position`.
    fn install(&self, position: u64) -> Result<(), String> {
        let path = self.dir.join(crate::store::DB_FILE_NAME);
        let incoming = self.dir.join(INCOMING_FILE_NAME);
        let mut served = self.served.lock().unwrap();
        // Close the old store before its file is replaced.
        *served = Served::NoStore(path);
        let (mut manager, at) = crate::replica_core::open_installed(
            &self.dir,
            &incoming,
            position,
            self.manager_config,
            self.secret.replica_key(),
        )?;
        let group = manager
            .replica_group()
            .map_err(|e| format!("the copied store's replica group: {e}"))?
            .unwrap_or_else(|| ReplicaGroup::initial(&self.replica.peers));
        let now = Instant::now();
        manager.presume_live(now);
        *served = Served::Running(Box::new(manager));
        let mut core = self.replica.core.lock().unwrap();
        core.install_copy(group, at, now);
        drop(core);
        drop(served);
        self.replica.tell_driver_addresses();
        Ok(())
    }
}

#[cfg(test)]
mod once_marks_tests {
    use super::*;

    /// The `ExpireOnce` cutoff is where the order stood one expiry time ago (within a mark
    /// interval), proposed once when it moves, and again at most every second while records
    /// remain; the marks kept stay bounded.
    #[test]
    fn the_cutoff_is_where_the_order_stood_one_expiry_ago() {
        let expiry = Duration::from_secs(160);
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let stood = |next| OrderPosition { epoch: 1, next };
        let mut marks = OnceMarks::default();
        for second in 0..160 {
            let due = marks.tick(at(second), stood(second * 10), expiry, false);
            assert_eq!(due, None, "at {second} s");
        }
        assert_eq!(
            marks.tick(at(160), stood(1600), expiry, false),
            Some(stood(0))
        );
        assert_eq!(marks.tick(at(160), stood(1600), expiry, true), None);
        assert_eq!(
            marks.tick(at(161), stood(1610), expiry, true),
            Some(stood(0))
        );
        assert_eq!(marks.tick(at(165), stood(1650), expiry, false), None);
        assert_eq!(
            marks.tick(at(170), stood(1700), expiry, false),
            Some(stood(100))
        );
        assert!(marks.marks.len() <= ONCE_MARKS_MAX as usize + 1);
    }
}
