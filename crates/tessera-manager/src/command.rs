//! The manager's changes as commands of a replicated state machine.
//!
//! A replicated manager is several [`Manager`]s, each over its own store, that apply the same
//! [`Command`]s in the same order (the uniform total order of `tessera-order`). For their
//! stores to stay identical, applying a command must depend on nothing but the command and
//! the store: no clock, no randomness, no local judgement. The manager had three such inputs,
//! and each is settled here once:
//!
//! - **Where a new file goes** depends on which servers are live, a judgement of the clock.
//!   The replica that receives the request judges (its own liveness table) and puts the
//!   servers in the command ([`Decision::placement`]); every replica places the file there.
//! - **A new access key** is drawn at random. The proposing replica draws an id and a seed
//!   ([`Decision::key`]); every replica derives the secret from the seed and the replicas'
//!   key ([`tessera_auth::replicated_access_key`]), so the secret itself never crosses the
//!   network, only the seed, which is useless without the cluster secret.
//! - **A pending file's lease** runs on a clock. Each replica keeps its own deadlines (set
//!   when it applies the create or a renewal, so within a scheduling delay of the others'),
//!   and the first whose deadline passes proposes [`Command::ExpirePending`]; every replica
//!   removes the file when it applies that command, at the same point of the order.
//!
//! **Liveness stays local and out of the replicated state.** Heartbeats are ordered like any
//! request, so that every replica hears every server, but each replica times them with its
//! own clock and keeps the result in memory (as a single manager always did): it is advisory
//! (a server's state in answers), it must not be replayed after a restart (a server silent
//! now is down now, whatever the log says), and where it matters to the stored state
//! (placement) the proposer's judgement is ordered with the command. Proposing liveness
//! judgements instead would put timer noise into the order for nothing.
//!
//! **At most once.** A client of several replicas wraps each change in
//! [`ManagerRequest::Once`] (its random id and a sequence number). Applying it stores the
//! answer under the client's id (table `once`, in the same store), and a retry of the same
//! number, sent to another replica after a failover, is answered from there instead of being
//! applied again. The answers to each client's latest [`ONCE_WINDOW`] numbers are kept, so
//! that a client may have many requests in flight (they are ordered in any order); a
//! request numbered below that window is refused ([`ManagerError::Superseded`]).
//! The record of a create, a size change or a file's sync (a small put's three changes)
//! is written in the request's own commit: the request's one write leaves its transaction
//! open, the record is added once the answer is known, and the two commit together (nothing
//! reads the store in between, and a failed request writes its record apart). That halves a
//! replica's commits for them and leaves the store a record committed apart leaves (tested).
//!
//! **Expiry of those answers.** Every client process that ever changed something has its
//! records, so the table is emptied of idle clients by an ordered command, like a lease:
//! applying a `Once` request stamps its client with the order position it was applied at
//! (tables `once_clients`, and `once_idle` by position), and [`Command::ExpireOnce`]
//! `{ before }` removes every record of each client last stamped at or before `before`
//! (at most about [`ONCE_EXPIRED_RECORDS_MAX`] records per command). The position is what
//! the proposing replica had applied [`crate::ManagerConfig::once_expiry`] ago by its own
//! monotonic clock (`replica.rs`), so no clock enters the store: a client's retry within that
//! time of its last change (a failover takes seconds) is still answered from the table, and
//! a retry later than that is applied again.

use crate::store::Failure;
use crate::Manager;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;
use tessera_wire::{FileId, ManagerError, ManagerRequest, ManagerResponse, ServerId};

/// Version of a [`Proposal`]'s encoding (2: [`Command::ExpireOnce`]; 3:
/// [`Command::AddReplica`]).
pub const PROPOSAL_VERSION: u8 = 3;
/// Version of a record of the `once` table.
const ONCE_RECORD_VERSION: u8 = 1;

/// `once`: (client id, sequence) -> (version, answer), postcard; per client, the answers to
/// its latest [`ONCE_WINDOW`] sequence numbers.
pub(crate) const ONCE: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("once");
/// `once_clients`: client id -> (epoch, next position) of the last `Once` request of the
/// client applied (see the module doc).
pub(crate) const ONCE_CLIENTS: TableDefinition<u64, (u64, u64)> =
    TableDefinition::new("once_clients");
/// `once_idle`: (epoch, next position, client) -> (), the same stamps in order: the clients
/// idle longest first.
pub(crate) const ONCE_IDLE: TableDefinition<(u64, u64, u64), ()> =
    TableDefinition::new("once_idle");
/// Records one [`Command::ExpireOnce`] removes at most, beyond the last client's (a client
/// has at most [`ONCE_WINDOW`]): the rest wait for the next command.
pub const ONCE_EXPIRED_RECORDS_MAX: usize = 8192;
/// Answers kept per client: a client may have this many changes in flight at once, and a
/// retry must come before this many later changes of its client are applied.
pub const ONCE_WINDOW: u64 = 1024;

/// Key in `meta` of the order epoch a replica's store stands in (see [`OrderPosition`]).
const KEY_ORDER_EPOCH: &str = "order_epoch";
/// Key in `meta` of the next order position of that epoch the store would apply.
const KEY_ORDER_NEXT: &str = "order_next";

/// Where a replica's store stands in the order, written with every commit so that it is as
/// durable as the changes: the group's order restarts from position 0 whenever every replica
/// starts at once (a new `epoch`), and then the replicas compare these to start from the most
/// advanced store (`replica.rs`). Commands that change nothing commit nothing, so `next` may
/// lag the commands applied by such commands only, which left the store as it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OrderPosition {
    /// How many times the whole group started.
    pub epoch: u64,
    /// The next position of that epoch's order.
    pub next: u64,
}

impl OrderPosition {
    pub(crate) fn write(
        self,
        meta: &mut redb::Table<'_, &'static str, u64>,
    ) -> Result<(), Failure> {
        meta.insert(KEY_ORDER_EPOCH, self.epoch)?;
        meta.insert(KEY_ORDER_NEXT, self.next)?;
        Ok(())
    }
}

/// What the proposing replica decided for a request, so that every replica applies it alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The live servers, in id order, that a new file may be placed on.
    pub placement: Option<Vec<ServerId>>,
    /// A new access key's id and the seed its secret derives from.
    pub key: Option<(u64, [u8; 32])>,
}

/// One change to the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A request of a client, server or the admin, as one replica received it.
    Request {
        /// The request.
        request: ManagerRequest,
        /// What the receiving replica decided for it.
        decision: Decision,
    },
    /// A pending file's lease ran out at the proposing replica: remove it if still pending.
    ExpirePending {
        /// The file.
        file: FileId,
    },
    /// Remove the `once` records of every client whose last `Once` request was applied at
    /// or before `before` (see the module doc).
    ExpireOnce {
        /// What the proposing replica had applied one expiry time ago.
        before: OrderPosition,
    },
    /// Replica `id` listens at `addr`: recorded (and given to every replica's order driver)
    /// before the order's group change that makes it a member (`crate::group`).
    AddReplica {
        /// The replica.
        id: u16,
        /// Its address.
        addr: String,
    },
}

/// Whether a `Once` request's record may join the request's own commit: the request makes
/// one write and reads nothing of the store after it, so that leaving that write's
/// transaction open until the record is added changes nothing it answers. (The small put's
/// three changes; others keep a commit of their own for their record.)
fn folds_record(request: &ManagerRequest) -> bool {
    matches!(
        request,
        ManagerRequest::Create { .. }
            | ManagerRequest::SetSize { .. }
            | ManagerRequest::SyncFile { .. }
    )
}

/// Whether `command` may be applied, inside a batch, in the write transaction that the
/// batch's earlier commands left open (one commit per batch, not one per command): a `Once`
/// request whose record folds into its commit ([`folds_record`]), whose refusals all come
/// before its first write (so a refusal leaves that transaction as the earlier commands left
/// it: a `Create` that replaces a file removes the old one first, so it does not share), and
/// whose reads of the store all go through that transaction (its own writes' and
/// [`Manager::once`]'s look-up of the record). Any other command first commits the open one.
fn shares_batch_txn(command: &Command) -> bool {
    let Command::Request {
        request: ManagerRequest::Once { request, .. },
        ..
    } = command
    else {
        return false;
    };
    folds_record(request)
        && !matches!(**request, ManagerRequest::Create { replace: true, .. })
        && !batch_txn_apart()
        && !records_apart()
}

#[cfg(test)]
thread_local! {
    /// Tests: every `once` record gets a commit of its own, as before records joined their
    /// request's commit (to compare the two).
    pub(crate) static RECORDS_APART: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
thread_local! {
    /// Tests: every command of a batch gets a commit of its own (and its record's), as
    /// before a batch's requests shared one transaction (to compare the two).
    pub(crate) static BATCH_TXN_APART: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// Whether every command of a batch gets a commit of its own ([`BATCH_TXN_APART`], tests).
fn batch_txn_apart() -> bool {
    #[cfg(test)]
    return BATCH_TXN_APART.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// Whether every `once` record gets a commit of its own ([`RECORDS_APART`], tests only).
fn records_apart() -> bool {
    #[cfg(test)]
    return RECORDS_APART.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// Stamps `client` with the order position a `Once` request of its is applied at, replacing
/// its earlier stamp.
fn stamp_client(
    txn: &redb::WriteTransaction,
    client: u64,
    stamp: OrderPosition,
) -> Result<(), Failure> {
    let mut clients = txn.open_table(ONCE_CLIENTS)?;
    let mut idle = txn.open_table(ONCE_IDLE)?;
    let earlier = clients.insert(client, (stamp.epoch, stamp.next))?;
    if let Some((epoch, next)) = earlier.map(|earlier| earlier.value()) {
        idle.remove((epoch, next, client))?;
    }
    idle.insert((stamp.epoch, stamp.next, client), ())?;
    Ok(())
}

/// The answer `table` keeps for `(client, sequence)`, and the client's latest sequence kept.
fn find_once(
    table: &impl ReadableTable<(u64, u64), &'static [u8]>,
    client: u64,
    sequence: u64,
) -> Result<(Option<ManagerResponse>, Option<u64>), Failure> {
    let latest = table
        .range((client, 0)..=(client, u64::MAX))?
        .next_back()
        .transpose()?
        .map(|(key, _)| key.value().1);
    let Some(record) = table.get((client, sequence))? else {
        return Ok((None, latest));
    };
    let (version, answer): (u8, ManagerResponse) = postcard::from_bytes(record.value())?;
    if version != ONCE_RECORD_VERSION {
        return Err(Failure::UnknownFormat(version.into()));
    }
    Ok((Some(answer), latest))
}

/// Whether `request` (or the request a `Once` wraps) only reads the replicated state, so
/// that a replica may answer it from its own store (`replica.rs` says when it may).
pub fn is_read(request: &ManagerRequest) -> bool {
    use tessera_wire::NamespaceRequest as N;
    match request {
        ManagerRequest::Once { request, .. } => {
            !matches!(**request, ManagerRequest::Once { .. }) && is_read(request)
        }
        ManagerRequest::Lookup { .. }
        | ManagerRequest::LookupId { .. }
        | ManagerRequest::List { .. }
        | ManagerRequest::FilesOnServer { .. }
        | ManagerRequest::Orphans { .. }
        | ManagerRequest::Namespace(N::ListDir { .. } | N::Entry { .. }) => true,
        _ => false,
    }
}

/// A command as it is broadcast in total order, with who proposed it and the ticket its
/// answer waits under there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// [`PROPOSAL_VERSION`].
    pub version: u8,
    /// The proposing replica's id.
    pub origin: u16,
    /// Its incarnation (a restarted replica's tickets start again).
    pub incarnation: u32,
    /// The number its answer waits under at the proposer.
    pub ticket: u64,
    /// The command.
    pub command: Command,
}

impl Proposal {
    /// The bytes to broadcast.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a proposal encodes")
    }

    /// A proposal from broadcast bytes.
    pub fn decode(bytes: &[u8]) -> Result<Proposal, ProposalError> {
        let proposal: Proposal = postcard::from_bytes(bytes).map_err(ProposalError::Decode)?;
        if proposal.version != PROPOSAL_VERSION {
            return Err(ProposalError::Version(proposal.version));
        }
        Ok(proposal)
    }
}

/// Why broadcast bytes are not a proposal.
#[derive(Debug, thiserror::Error)]
pub enum ProposalError {
    /// Not a valid encoding.
    #[error("undecodable proposal: {0}")]
    Decode(postcard::Error),
    /// Another version.
    #[error("proposal version {0}, this build reads {PROPOSAL_VERSION}")]
    Version(u8),
}

/// An answer as the `once` table keeps it: without the columns of a file's view, which
/// carry the liveness of its servers as the applying replica judges it on its own clock.
/// Kept, they made the replicas' stores differ (the simulator's checker found it: a retry's
/// record with a server up at one replica and down at another); a retry gets the columns of
/// the replica that answers it, as a first answer does.
fn replicated_form(mut answer: ManagerResponse) -> ManagerResponse {
    if let ManagerResponse::File(view) | ManagerResponse::Pending { view, .. } = &mut answer {
        view.columns.clear();
    }
    answer
}

/// What a replica's local reads see while its applier applies and syncs batches
/// (`replica.rs`'s module doc says why): the store as it stood when it was last durable,
/// pinned by a read transaction from [`Manager::begin_batch`] until no batch is being
/// applied or waits for its sync ([`Manager::batches_synced`] moves it forward to what a
/// sync covered while later batches are still unsynced). Commits applied meanwhile are
/// visible to every other read of the store (the apply path must see what it changed), so
/// the pinned transaction is used only while a local read is answered.
#[derive(Default)]
pub(crate) struct DurableReads {
    /// The store as it stood when it was last durable, while a batch is being applied or
    /// waits for its sync.
    pinned: Option<Arc<redb::ReadTransaction>>,
    /// Batches begun and not yet synced (or finished owing no sync).
    unsynced: usize,
    /// Set while [`Manager::answer_read`] answers.
    answering: bool,
}

impl DurableReads {
    /// Whether a local read is answered from the pinned store now.
    pub(crate) fn pinned(&self) -> bool {
        self.answering && self.pinned.is_some()
    }

    /// `count` batches are durable, or finished owing no sync, with the store `covered`
    /// durable: unpinned if no other batch is being applied or synced, else pinned at
    /// `covered` if given.
    fn done(&mut self, count: usize, covered: Option<Arc<redb::ReadTransaction>>) {
        // Fewer only after a batch was abandoned (the replica stops, and reads no more).
        self.unsynced = self.unsynced.saturating_sub(count);
        if self.unsynced == 0 {
            self.pinned = None;
        } else if let Some(covered) = covered {
            self.pinned = Some(covered);
        }
    }
}

/// How a sync went ([`BatchSync::run_covering`]), and the store it made durable.
pub type Synced = (Result<(), ManagerError>, Option<Arc<redb::ReadTransaction>>);

/// The one sync a batch owes ([`Manager::finish_batch`]): the durable commit of the write
/// transaction the batch's last requests share (`txn`), or else a durable empty commit; a
/// durable commit makes every earlier commit of the batch durable. It needs only the
/// database, so a replica runs it without holding the manager's lock. One that holds the
/// batch's transaction must run before the next batch begins (no other write can begin
/// until it commits; [`Manager::begin_batch`] refuses to).
pub struct BatchSync {
    db: Arc<redb::Database>,
    /// The batch's open transaction, committed durably by the sync.
    txn: Option<redb::WriteTransaction>,
    /// Set while a sync holding a transaction has not run (shared with the manager).
    holds_txn: Arc<std::sync::atomic::AtomicBool>,
    /// Tests: the sync fails as a full disk would.
    #[cfg(test)]
    fail: bool,
}

impl BatchSync {
    /// Syncs the store (an fsync), and returns the store as it stood just before (what the
    /// sync made durable, for [`Manager::batches_synced`]; `None` if it could not be read).
    pub fn run_covering(self) -> Synced {
        let db = self.db.clone();
        if self.txn.is_some() {
            // No write can come between its commit and this read (none can begin before).
            let synced = self.run();
            return (synced, db.begin_read().ok().map(Arc::new));
        }
        let covered = db.begin_read().ok().map(Arc::new);
        (self.run(), covered)
    }

    /// Syncs the store (an fsync).
    pub fn run(mut self) -> Result<(), ManagerError> {
        let failed = |error: &dyn std::fmt::Display| ManagerError::Store(error.to_string());
        let txn = self.txn.take();
        let synced = (|| {
            #[cfg(test)]
            if self.fail {
                return Err(failed(&std::io::Error::from_raw_os_error(28))); // ENOSPC
            }
            let mut txn = match txn {
                Some(txn) => txn,
                None => self.db.begin_write().map_err(|e| failed(&e))?,
            };
            txn.set_durability(redb::Durability::Immediate)
                .map_err(|e| failed(&e))?;
            txn.commit().map_err(|e| failed(&e))
        })();
        self.holds_txn
            .store(false, std::sync::atomic::Ordering::Release);
        synced
    }
}

impl Drop for BatchSync {
    /// A sync dropped unrun (its batch abandoned) aborts the transaction it holds, and so
    /// no longer holds one.
    fn drop(&mut self) {
        if self.txn.take().is_some() {
            self.holds_txn
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

impl Manager {
    /// Makes this manager one replica of several (see the module doc): pending files expire
    /// only by [`Command::ExpirePending`], and access keys derive from `replica_key`.
    pub fn set_replicated(&mut self, replica_key: tessera_auth::Key) {
        self.replica_key = Some(replica_key);
    }

    /// What this replica decides for `request` before proposing it: the servers a new file
    /// may go on (its own liveness judgement), a new key's id and seed.
    pub fn decide(&self, request: &ManagerRequest) -> Decision {
        match request {
            ManagerRequest::Once { request, .. } => self.decide(request),
            ManagerRequest::Create { .. } | ManagerRequest::CreatePending { .. } => Decision {
                placement: Some(self.live_servers()),
                key: None,
            },
            ManagerRequest::KeyCreate { .. } => Decision {
                placement: None,
                key: Some(rand::random()),
            },
            _ => Decision::default(),
        }
    }

    /// Applies one ordered command at local time `now` (which only feeds this replica's own
    /// liveness and lease clocks, never the store).
    pub fn apply(&mut self, command: Command, now: Instant) -> ManagerResponse {
        if !shares_batch_txn(&command) {
            if let Err(failure) = self.commit_batch_txn() {
                return ManagerResponse::Error(failure.into());
            }
        }
        match command {
            Command::Request { request, decision } => {
                self.decision = decision;
                let answer = self.handle(request, now);
                self.decision = Decision::default();
                answer
            }
            Command::ExpirePending { file } => {
                self.expire_pending(file);
                ManagerResponse::Done
            }
            Command::ExpireOnce { before } => match self.expire_once(before) {
                Ok(_) => ManagerResponse::Done,
                Err(failure) => ManagerResponse::Error(failure.into()),
            },
            Command::AddReplica { id, addr } => match self.record_replica_addr(id, &addr) {
                Ok(()) => ManagerResponse::Done,
                Err(failure) => ManagerResponse::Error(failure.into()),
            },
        }
    }

    /// Begins applying a delivered batch: from now until [`Manager::end_batch`] (or
    /// [`Manager::finish_batch`]), commits are not synced one by one, and local reads
    /// ([`Manager::answer_read`]) see the store as it stands now, durable (every earlier
    /// batch was synced), until the batch's sync ends; if an earlier batch still waits for
    /// its sync, they go on seeing what they saw (the store before that one). An error says
    /// the store failed.
    pub fn begin_batch(&mut self) -> Result<(), ManagerError> {
        assert!(
            !self
                .sync_holds_txn
                .load(std::sync::atomic::Ordering::Acquire),
            "a batch began before the last one's sync, which holds its transaction, ran"
        );
        self.sync_deferred = true;
        self.sync_owed = false;
        if self.durable_reads.pinned.is_none() {
            let pinned = self.db.begin_read().map_err(|error| {
                ManagerError::Store(format!("a read of the store before the batch: {error}"))
            })?;
            self.durable_reads.pinned = Some(Arc::new(pinned));
        }
        self.durable_reads.unsynced += 1;
        Ok(())
    }

    /// Ends the batch with one synced commit, if any commit of the batch asked for a sync:
    /// everything the batch changed is then on disk, and its answers may go out. A store
    /// failure is returned.
    pub fn end_batch(&mut self) -> Result<(), ManagerError> {
        match self.finish_batch()? {
            Some(sync) => {
                let synced = sync.run();
                self.batch_synced(synced)
            }
            None => Ok(()),
        }
    }

    /// Ends applying a batch: the sync it owes, if it owes one, to be run without the
    /// manager (by a replica, outside the manager's lock) and then given to
    /// [`Manager::batch_synced`]; until then local reads still see the store as it stood
    /// before the batch. The sync records no position of its own: the store stays where its
    /// last change put it (where batches end is each replica's own timing, so a position
    /// written there made replicas that applied the same commands differ: the simulator's
    /// seed 18).
    pub fn finish_batch(&mut self) -> Result<Option<BatchSync>, ManagerError> {
        self.sync_deferred = false;
        if !std::mem::take(&mut self.sync_owed) {
            self.commit_batch_txn()?;
            self.durable_reads.done(1, None);
            return Ok(None);
        }
        if let Err(lost) = self.check_store() {
            self.held = None;
            return Err(lost);
        }
        // The batch's open transaction is committed by the sync itself: one commit, durable.
        let txn = self.held.take().map(|(txn, _)| txn);
        let holds_txn = self.sync_holds_txn.clone();
        holds_txn.store(txn.is_some(), std::sync::atomic::Ordering::Release);
        Ok(Some(BatchSync {
            db: self.db.clone(),
            txn,
            holds_txn,
            #[cfg(test)]
            fail: self.fail_commits,
        }))
    }

    /// The batch's sync ran, with `synced`: local reads see the store as it stands now (if
    /// no later batch is being applied or synced).
    pub fn batch_synced(&mut self, synced: Result<(), ManagerError>) -> Result<(), ManagerError> {
        self.batches_synced(1, synced, None)
    }

    /// One sync ran, with `synced`, for `count` batches that owed one (applied one after
    /// another, the sync after the last; a durable commit makes every earlier commit
    /// durable), and made the store `covered` durable (as it stood when the sync began). Local
    /// reads see the store as it stands now if no later batch is being applied or waits for
    /// its sync, else `covered` (a later pin than before, never an earlier one).
    pub fn batches_synced(
        &mut self,
        count: usize,
        synced: Result<(), ManagerError>,
        covered: Option<Arc<redb::ReadTransaction>>,
    ) -> Result<(), ManagerError> {
        match synced {
            Ok(()) => {
                self.durable_reads.done(count, covered);
                self.synced_commits += 1;
            }
            // The replica stops: nothing is read locally any more.
            Err(_) => self.abandon_batch(),
        }
        synced
    }

    /// Leaves a batch that failed without syncing it: a replica that cannot apply a command
    /// must not record a position past it.
    pub fn abandon_batch(&mut self) {
        // Dropped, the batch's open transaction commits nothing.
        self.held = None;
        self.hold_commit = false;
        self.sync_deferred = false;
        self.sync_owed = false;
        self.durable_reads.pinned = None;
        self.durable_reads.unsynced = 0;
    }

    /// A read transaction for a request that only reads: the store as it stood before the
    /// batch whose sync is owed, while [`Manager::answer_read`] answers and one is owed; the
    /// store as it stands otherwise (the apply path always reads what it changed).
    pub(crate) fn read_txn(&self) -> Result<Arc<redb::ReadTransaction>, redb::TransactionError> {
        match (&self.durable_reads.pinned, self.durable_reads.answering) {
            (Some(pinned), true) => Ok(pinned.clone()),
            _ => Ok(Arc::new(self.db.begin_read()?)),
        }
    }

    /// Commits synced to disk since the store was opened.
    pub fn synced_commits(&self) -> u64 {
        self.synced_commits
    }

    /// The durability a commit gets: inside a batch, a sync is owed instead of done.
    pub(crate) fn deferred(&mut self, durability: redb::Durability) -> redb::Durability {
        if self.sync_deferred && matches!(durability, redb::Durability::Immediate) {
            self.sync_owed = true;
            redb::Durability::None
        } else {
            durability
        }
    }

    /// Answers `request` from this replica's own state if it only reads it; `None` if it
    /// must be ordered: not a read, or a lookup by id of a pending file (that renews the
    /// file's lease, which every replica keeps). A `Once` read is answered without a record
    /// in the `once` table: applying a read again after a retry changes nothing.
    pub(crate) fn answer_read(
        &mut self,
        request: &ManagerRequest,
        now: Instant,
    ) -> Option<ManagerResponse> {
        if !is_read(request) {
            return None;
        }
        match request {
            ManagerRequest::Once { request, .. } => self.answer_read(request, now),
            ManagerRequest::LookupId { file } if self.is_pending(*file) => None,
            request => {
                self.durable_reads.answering = true;
                let answer = self.handle(request.clone(), now);
                self.durable_reads.answering = false;
                Some(answer)
            }
        }
    }

    /// The id and secret of a new access key: as the proposer decided (the secret derived
    /// from its seed), else drawn here.
    pub(crate) fn drawn_key(&self) -> (u64, [u8; 32]) {
        match (self.decision.key, &self.replica_key) {
            (Some((id, seed)), Some(replica)) => {
                (id, tessera_auth::replicated_access_key(replica, &seed).0)
            }
            (Some(drawn), None) => drawn,
            (None, _) => rand::random(),
        }
    }

    /// Applies `request` once for `(client, sequence)`, or answers a retry from the table.
    pub(crate) fn once(
        &mut self,
        client: u64,
        sequence: u64,
        request: ManagerRequest,
        now: Instant,
    ) -> Result<ManagerResponse, Failure> {
        if matches!(request, ManagerRequest::Once { .. }) {
            return Err(ManagerError::Layout("a Once request inside another".into()).into());
        }
        let (kept, latest) = self.read_once(client, sequence)?;
        if let Some(answer) = kept {
            return Ok(self.with_local_columns(answer));
        }
        if let Some(latest) =
            latest.filter(|&latest| sequence.saturating_add(ONCE_WINDOW) <= latest)
        {
            return Err(ManagerError::Superseded {
                client,
                sequence,
                latest,
            }
            .into());
        }
        // The record goes into the request's own commit when the request makes exactly one
        // write and reads nothing after it (see `folds_record`): one commit, not two.
        self.hold_commit = self.replica_key.is_some() && folds_record(&request) && !records_apart();
        let answer = self.handle(request, now);
        self.hold_commit = false;
        let held = self.held.take();
        let kept = replicated_form(answer.clone());
        // An encoding failure must not drop a held transaction silently: it fails the write.
        let record = postcard::to_allocvec(&(ONCE_RECORD_VERSION, &kept));
        let floor = latest
            .unwrap_or(0)
            .max(sequence)
            .saturating_sub(ONCE_WINDOW);
        let stamp = self.order_position;
        // Not synced by itself: the next durable commit carries it. A replica that crashes
        // before then catches up from a peer's store, which has it (see replica.rs).
        let write = |txn: &redb::WriteTransaction| -> Result<(), Failure> {
            if let Some(stamp) = stamp {
                stamp_client(txn, client, stamp)?;
            }
            let record = record
                .as_ref()
                .map_err(|error| Failure::Codec(error.clone()))?;
            let mut table = txn.open_table(ONCE)?;
            table.insert((client, sequence), record.as_slice())?;
            let stale = table
                .range((client, 0)..=(client, floor))?
                .map(|entry| entry.map(|(key, _)| key.value()))
                .collect::<Result<Vec<_>, _>>()?;
            for key in stale {
                table.remove(key)?;
            }
            Ok(())
        };
        match held {
            // Inside a batch the transaction stays open for the batch's next requests.
            Some(held) if self.sync_deferred => self.add_to_held(held, write)?,
            Some(held) => self.commit_held(held, write)?,
            None => self.write_with(redb::Durability::None, |change| write(change.txn))?,
        }
        Ok(answer)
    }

    /// A kept answer with this replica's own view of its file's servers put back (see
    /// [`replicated_form`]).
    fn with_local_columns(&self, mut answer: ManagerResponse) -> ManagerResponse {
        if let ManagerResponse::File(view) | ManagerResponse::Pending { view, .. } = &mut answer {
            view.columns = view
                .meta
                .servers
                .iter()
                .map(|&server| self.server_status(server))
                .collect();
        }
        answer
    }

    /// Removes the `once` records of the clients idle since `before` (see the module doc),
    /// at most about [`ONCE_EXPIRED_RECORDS_MAX`]; how many it removed. Whether some remain
    /// is kept for [`Manager::once_expiry_backlog`].
    pub(crate) fn expire_once(&mut self, before: OrderPosition) -> Result<usize, Failure> {
        let (removed, backlog) = self.write(|change| {
            let mut idle = change.txn.open_table(ONCE_IDLE)?;
            let mut clients = change.txn.open_table(ONCE_CLIENTS)?;
            let mut once = change.txn.open_table(ONCE)?;
            let mut removed = 0;
            loop {
                let oldest = idle.first()?.map(|(key, _)| key.value());
                let Some((epoch, next, client)) = oldest else {
                    return Ok((removed, false));
                };
                if (epoch, next) > (before.epoch, before.next) {
                    return Ok((removed, false));
                }
                if removed >= ONCE_EXPIRED_RECORDS_MAX {
                    return Ok((removed, true));
                }
                idle.remove((epoch, next, client))?;
                clients.remove(client)?;
                let records = once
                    .range((client, 0)..=(client, u64::MAX))?
                    .map(|entry| entry.map(|(key, _)| key.value()))
                    .collect::<Result<Vec<_>, _>>()?;
                removed += records.len();
                for key in records {
                    once.remove(key)?;
                }
            }
        })?;
        self.once_expiry_backlog = backlog;
        Ok(removed)
    }

    /// Whether the last [`Command::ExpireOnce`] applied left records it should have removed
    /// (it stopped at its bound): its proposer proposes it again.
    pub fn once_expiry_backlog(&self) -> bool {
        self.once_expiry_backlog
    }

    /// The answer kept for `(client, sequence)`, and the client's latest sequence kept.
    /// (Through the batch's open transaction if there is one: it holds the batch's earlier
    /// records.)
    fn read_once(
        &self,
        client: u64,
        sequence: u64,
    ) -> Result<(Option<ManagerResponse>, Option<u64>), Failure> {
        if let Some((txn, _)) = &self.held {
            return find_once(&txn.open_table(ONCE)?, client, sequence);
        }
        let txn = self.db.begin_read()?;
        match txn.open_table(ONCE) {
            Ok(table) => find_once(&table, client, sequence),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok((None, None)),
            Err(error) => Err(Failure::Store(error.into())),
        }
    }

    /// Commits the transaction a batch's earlier commands left open, if any (not synced:
    /// the batch's sync covers it). A failure is the store's.
    pub(crate) fn commit_batch_txn(&mut self) -> Result<(), Failure> {
        match self.held.take() {
            Some(held) => self.commit_held(held, |_| Ok(())),
            None => Ok(()),
        }
    }

    /// Where the store stands in the order (zero for a store no replica applied to).
    pub fn order_position(&self) -> Result<OrderPosition, ManagerError> {
        let read = || -> Result<OrderPosition, Failure> {
            let txn = self.db.begin_read()?;
            let meta = txn.open_table(crate::store::META)?;
            let value = |key| -> Result<u64, Failure> {
                Ok(meta.get(key)?.map(|value| value.value()).unwrap_or(0))
            };
            Ok(OrderPosition {
                epoch: value(KEY_ORDER_EPOCH)?,
                next: value(KEY_ORDER_NEXT)?,
            })
        };
        read().map_err(ManagerError::from)
    }

    /// Sets where the store stands in the order; the next commit writes it.
    pub fn set_order_position(&mut self, position: OrderPosition) {
        self.order_position = Some(position);
    }

    /// Every record of the store as text, table by table, in key order: two replicas that
    /// applied the same commands print the same (tests compare them).
    pub fn state_dump(&self) -> Vec<String> {
        crate::store::dump(&self.db).expect("the store reads")
    }
}

#[cfg(test)]
mod apply_cost {
    use super::*;
    use crate::ManagerConfig;
    use std::time::Instant;
    use tessera_layout::Scheme;
    use tessera_wire::LayoutRequest;

    /// CPU time (user and system, ms) this thread has used so far.
    fn thread_cpu_ms() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields = after_name.split_whitespace().skip(11).take(2);
        fields.filter_map(|f| f.parse::<u64>().ok()).sum::<u64>() * 10
    }

    /// A replica's application of `puts` small puts (`Create`, grow-only `SetSize`,
    /// `SyncFile`, each wrapped in `Once` if `once`), the first two in one batch and the
    /// third in another, each batch synced once as the applier does: CPU ms per put.
    fn apply_puts(manager: &mut Manager, puts: u64, once: bool, first: &mut u64) -> f64 {
        let now = Instant::now();
        let layout = LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 65536,
            width: Some(3),
        };
        let began = thread_cpu_ms();
        let apply = |manager: &mut Manager, request: ManagerRequest, placement, sequence| {
            let request = match once {
                true => ManagerRequest::Once {
                    client: 7,
                    sequence,
                    request: Box::new(request),
                },
                false => request,
            };
            manager.set_order_position(OrderPosition {
                epoch: 1,
                next: sequence,
            });
            let decision = Decision {
                placement,
                key: None,
            };
            let answer = manager.apply(Command::Request { request, decision }, now);
            assert!(!matches!(answer, ManagerResponse::Error(_)), "{answer:?}");
            answer
        };
        let sync = |manager: &mut Manager| {
            if let Some(sync) = manager.finish_batch().unwrap() {
                let (synced, covered) = sync.run_covering();
                manager.batches_synced(1, synced, covered).unwrap();
            }
        };
        for n in *first..*first + puts {
            let create = ManagerRequest::Create {
                path: format!("/bench/{n}"),
                layout: layout.clone(),
                replace: false,
            };
            manager.begin_batch().unwrap();
            let placement = Some(vec![1, 2, 3]);
            let ManagerResponse::File(view) = apply(manager, create, placement, 3 * n + 1) else {
                panic!("not a file")
            };
            let file = view.meta.id;
            let grow = ManagerRequest::SetSize {
                file,
                size: 4096,
                grow_only: true,
            };
            apply(manager, grow, None, 3 * n + 2);
            sync(manager);
            manager.begin_batch().unwrap();
            apply(
                manager,
                ManagerRequest::SyncFile { file, size: 4096 },
                None,
                3 * n + 3,
            );
            sync(manager);
        }
        *first += puts;
        (thread_cpu_ms() - began) as f64 / puts as f64
    }

    #[test]
    #[ignore = "a measurement: cargo test -p tessera-manager --lib apply_cost -- --ignored --nocapture"]
    fn small_put_apply_cost_at_a_replica() {
        let dir = tempfile::tempdir().unwrap();
        let config = ManagerConfig {
            cluster_id: Some(0x5eed),
            ..ManagerConfig::default()
        };
        let mut manager = Manager::open(dir.path(), config).unwrap();
        manager.set_replicated(tessera_auth::Secret::from_bytes([9; 32]).replica_key());
        for port in 0..3 {
            let addr = format!("127.0.0.1:{port}");
            let register = ManagerRequest::Register {
                server: None,
                addr,
                incarnation: 1,
                cluster: None,
            };
            manager.handle(register, Instant::now());
        }
        let mut first = 0;
        let puts = 400;
        for round in 0..4 {
            let plain = apply_puts(&mut manager, puts, false, &mut first);
            let folded = apply_puts(&mut manager, puts, true, &mut first);
            RECORDS_APART.with(|apart| apart.set(true));
            let apart = apply_puts(&mut manager, puts, true, &mut first);
            RECORDS_APART.with(|apart| apart.set(false));
            BATCH_TXN_APART.with(|apart| apart.set(true));
            let per_command = apply_puts(&mut manager, puts, true, &mut first);
            BATCH_TXN_APART.with(|apart| apart.set(false));
            println!("round {round}: CPU ms per small put: plain {plain:.3}, once (one transaction per batch) {folded:.3}, once (a commit per request, record in it) {per_command:.3}, once (record apart) {apart:.3}");
        }
    }
}
