//! The sans-IO core of a manager replica: what [`crate::replica`]'s daemon and the
//! simulator (`tessera-sim`'s replicated manager) share.
//!
//! It owns where the replica stands in the order (epoch and next position), its role (view,
//! leader, starting, catching up, stopped), the numbering and encoding of its proposals, the
//! application of UTO deliveries to a [`Manager`] in position order with the answers owed to
//! its own proposals, and the table of *synced* connections that decides which reads are
//! answered locally (see [`crate::replica`]'s module doc for the rules). It must never do
//! I/O: no sockets, threads or clock; time comes in as `now`, deliveries and order events
//! as arguments, and the caller drives the order node, waits for answers, and moves store
//! files ([`copy_store`], [`open_installed`]) when a replica catches up.

use crate::command::{is_read, BatchSync, Command, Decision, OrderPosition, Proposal, Synced};
use crate::group::ReplicaGroup;
use crate::Manager;
use bytes::Bytes;
use redb::ReadableDatabase;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tessera_order::{Event, GroupChange, NodeId, Start};
use tessera_transport::ConnectionId;
use tessera_wire::{ManagerError, ManagerRequest, ManagerResponse, ReplicaStatus};

/// Where this replica stands, as `tessera status` shows it.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// The last view it was a normal member of.
    view: u64,
    /// That view's leader.
    leader: Option<NodeId>,
    /// A member of `view` and not suspecting anyone since.
    normal: bool,
    /// Waiting for a peer's store before it can apply.
    catching_up: bool,
    /// Not yet in the order: deciding how to start, or waiting for every replica to start
    /// the group again.
    starting: bool,
    /// Why the replica stopped, once it did: it left the order and refuses every request.
    stopped: Option<String>,
    /// Removed from the group ([`Event::Removed`]): it refuses every request, and its
    /// order node runs on until the new group runs (then `stopped` is set too).
    removed: bool,
}

/// Counts of what a replica applied since it started: what the throughput measurement
/// (`metadata_throughput_one_and_three_managers`) prints, cheap enough to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Batches of deliveries applied ([`ReplicaCore::apply_batch`]), each synced once.
    pub batches: u64,
    /// Deliveries in them.
    pub deliveries: u64,
    /// Batches by size: 1, 2-3, 4-7, 8-15, 16 and more deliveries.
    pub batch_sizes: [u64; 5],
}

impl Counters {
    /// Counts one batch of `deliveries`.
    fn batch(&mut self, deliveries: usize) {
        self.batches += 1;
        self.deliveries += deliveries as u64;
        let bucket = (usize::BITS - deliveries.max(1).leading_zeros() - 1) as usize;
        self.batch_sizes[bucket.min(4)] += 1;
    }
}

/// The stages of an ordered request at a replica, as [`StageClock`] sums them: deciding (the
/// refusal check, the manager's lock, placement), proposing (encoding, the hand-off to the
/// order driver), ordering (from the hand-off until the applier took the delivery: UTO
/// delivery and the applier's queue), applying the batch it came in (the locks and every
/// commit of the batch), syncing that batch, waking the request once answered, and the
/// whole.
pub const REPLICA_STAGES: [&str; 7] = [
    "decide", "propose", "order", "apply", "sync", "wake", "total",
];
/// The stages of a request at a single manager: waiting for a blocking thread, for the
/// manager's lock, handling it (its commit and sync included), waking the request once
/// answered, and the whole.
pub const SINGLE_STAGES: [&str; 5] = ["queue", "lock", "handle", "wake", "total"];

/// Time spent in each stage of a daemon's requests, summed since it started: a few relaxed
/// atomic additions per request, cheap enough to keep on (the throughput measurements print
/// it). Each stage counts its own requests, since some stages are timed at the applier and
/// some at the request.
#[derive(Debug)]
pub struct StageClock {
    names: &'static [&'static str],
    /// Per stage: requests timed, then microseconds summed.
    sums: Vec<(AtomicU64, AtomicU64)>,
}

impl StageClock {
    /// A clock of the stages `names`.
    pub fn new(names: &'static [&'static str]) -> StageClock {
        let sums = names.iter().map(|_| Default::default()).collect();
        StageClock { names, sums }
    }

    /// Adds one request's `elapsed` in stage `stage` (an index of the names).
    pub fn add(&self, stage: usize, elapsed: Duration) {
        let (count, sum) = &self.sums[stage];
        count.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        sum.fetch_add(us, Ordering::Relaxed);
    }

    /// The sums so far.
    pub fn times(&self) -> StageTimes {
        let sums = self.sums.iter();
        let sums =
            sums.map(|(count, sum)| (count.load(Ordering::Relaxed), sum.load(Ordering::Relaxed)));
        StageTimes {
            names: self.names,
            sums: sums.collect(),
        }
    }
}

/// What a [`StageClock`] summed: per stage, requests and microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageTimes {
    /// The stages' names.
    pub names: &'static [&'static str],
    /// Per stage, the requests timed and the microseconds they spent in it.
    pub sums: Vec<(u64, u64)>,
}

impl StageTimes {
    /// What was summed since `earlier` (of the same clock).
    pub fn since(&self, earlier: &StageTimes) -> StageTimes {
        let sums = self.sums.iter().zip(&earlier.sums);
        let sums = sums.map(|(&(count, sum), &(before, before_sum))| {
            (count.saturating_sub(before), sum.saturating_sub(before_sum))
        });
        StageTimes {
            names: self.names,
            sums: sums.collect(),
        }
    }

    /// Requests timed in the last stage (the whole).
    pub fn requests(&self) -> u64 {
        self.sums.last().map_or(0, |&(count, _)| count)
    }
}

impl std::fmt::Display for StageTimes {
    /// Each stage's mean in microseconds: `decide 12 propose 30 ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, &(count, sum))) in self.names.iter().zip(&self.sums).enumerate() {
            let separator = if i == 0 { "" } else { " " };
            write!(
                f,
                "{separator}{name} {}",
                sum.checked_div(count).unwrap_or(0)
            )?;
        }
        Ok(())
    }
}

/// A batch applied but not yet answered ([`ReplicaCore::apply_unsynced`]): its answers wait
/// for the one sync it may owe, which [`Applied::sync`] runs without the manager (a daemon
/// runs it outside the manager's lock, so that requests are decided and read meanwhile).
///
/// Batches applied one after another may be [joined](Applied::join) and synced once, since
/// a durable commit makes every earlier commit durable: group commit across batches, for a
/// daemon that applies the next batch while the last one syncs. Only after a batch whose
/// sync holds no transaction, though: a batch of small puts leaves its one transaction to
/// its sync to commit, and no later batch can begin before that
/// ([`crate::command::BatchSync`]).
#[must_use = "a batch's answers go out only once it is synced"]
pub struct Applied {
    answers: Vec<(u64, ManagerResponse)>,
    sync: Option<BatchSync>,
    /// Batches in it that owe a sync.
    owed: usize,
    /// How the sync went, and the store it made durable.
    synced: Option<Synced>,
    /// The first and last positions of the batch.
    positions: (u64, u64),
}

impl Applied {
    /// Adds the batch applied after this one (neither synced yet): one sync, the later
    /// batch's, then makes both durable.
    pub fn join(&mut self, later: Applied) {
        assert!(
            self.synced.is_none() && later.synced.is_none(),
            "batches are joined before their sync"
        );
        assert!(
            later.positions.0 > self.positions.1,
            "batches join in order"
        );
        self.answers.extend(later.answers);
        if later.sync.is_some() {
            self.sync = later.sync;
        }
        self.owed += later.owed;
        self.positions.1 = later.positions.1;
    }

    /// The answers it holds (its replica's proposals among its deliveries).
    pub fn answer_count(&self) -> usize {
        self.answers.len()
    }

    /// Runs the sync the batch owes, if it owes one (an fsync; no lock needed).
    pub fn sync(&mut self) {
        self.synced = self.sync.take().map(BatchSync::run_covering);
    }

    /// Tells `manager` how its sync went (its local reads see the batch from now on): the
    /// tickets and answers of this replica's proposals, or why the store failed (the replica
    /// must stop).
    pub fn finish(
        self,
        manager: Option<&mut Manager>,
    ) -> Result<Vec<(u64, ManagerResponse)>, String> {
        assert!(
            self.sync.is_none(),
            "a batch's sync runs before its answers go out"
        );
        let synced = match (self.synced, manager) {
            (None, _) => return Ok(self.answers),
            (Some((synced, covered)), Some(manager)) => {
                manager.batches_synced(self.owed, synced, covered)
            }
            (Some((synced, _)), None) => synced,
        };
        let (first, last) = self.positions;
        synced.map(|()| self.answers).map_err(|error| {
            format!("positions {first}..={last}: its store failed to sync: {error}")
        })
    }
}

/// The replica's state besides its store and its order node (module doc).
#[derive(Debug)]
pub struct ReplicaCore {
    /// This replica's id (1-based).
    id: u16,
    incarnation: u32,
    /// The next order position to apply.
    next_position: u64,
    /// The group's epoch that position is of.
    epoch: u64,
    next_ticket: u64,
    progress: Progress,
    /// Pending files whose expiry this replica proposed already.
    expiry_proposed: BTreeSet<u64>,
    message_bytes_max: usize,
    /// When this replica's liveness table began (its start, or the install of a peer's
    /// store): younger than a heartbeat timeout, it may not have heard every live server.
    live_since: Instant,
    heartbeat_timeout: Duration,
    /// Every open connection, with the view it was synced in if it is synced.
    synced: HashMap<ConnectionId, Option<u64>>,
    /// The replica group as applied (`crate::group`): set by the caller at the start, then
    /// changed by the group changes applied.
    group: ReplicaGroup,
    /// Replicas whose address an applied [`Command::AddReplica`] recorded, for the caller to
    /// give its order driver.
    learned: Vec<(u16, String)>,
    counters: Counters,
}

impl ReplicaCore {
    /// Replica `id` in `incarnation`, its store standing at `stored`, starting (not yet in
    /// the order) at `now`; proposals of at most `message_bytes_max` bytes.
    pub fn new(
        id: u16,
        incarnation: u32,
        stored: OrderPosition,
        message_bytes_max: usize,
        heartbeat_timeout: Duration,
        now: Instant,
    ) -> ReplicaCore {
        ReplicaCore {
            id,
            incarnation,
            next_position: stored.next,
            epoch: stored.epoch,
            next_ticket: 0,
            progress: Progress {
                starting: true,
                ..Progress::default()
            },
            expiry_proposed: BTreeSet::new(),
            message_bytes_max,
            live_since: now,
            heartbeat_timeout,
            synced: HashMap::new(),
            group: ReplicaGroup::default(),
            learned: Vec::new(),
            counters: Counters::default(),
        }
    }

    /// What it applied and how it answered reads so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The replica group as applied.
    pub fn group(&self) -> &ReplicaGroup {
        &self.group
    }

    /// Sets the group the store records (or the initial one of `--peers`), at the start and
    /// when a peer's store is installed.
    pub fn set_group(&mut self, group: ReplicaGroup) {
        self.group = group;
    }

    /// Queues every address `group` records for the order driver (see [`Self::take_learned`]).
    fn learn_addresses(&mut self, group: &ReplicaGroup) {
        let addresses = group.addresses.iter();
        self.learned
            .extend(addresses.map(|(&id, addr)| (id, addr.clone())));
    }

    /// Addresses of replicas recorded since the last call ([`Command::AddReplica`], or a
    /// copied store's group: [`Self::learn_addresses`]).
    pub fn take_learned(&mut self) -> Vec<(u16, String)> {
        std::mem::take(&mut self.learned)
    }

    /// Whether it was removed from the group.
    pub fn is_removed(&self) -> bool {
        self.progress.removed
    }

    /// This replica's id (1-based).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// This start's incarnation.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Where this replica stands: the epoch and the next position to apply.
    pub fn position(&self) -> OrderPosition {
        OrderPosition {
            epoch: self.epoch,
            next: self.next_position,
        }
    }

    /// This replica's state for `tessera status`.
    pub fn status(&self) -> ReplicaStatus {
        let progress = &self.progress;
        let role = if progress.removed {
            if progress.stopped.is_some() {
                "removed"
            } else {
                "leaving"
            }
        } else if progress.stopped.is_some() {
            "stopped"
        } else if progress.starting {
            "starting"
        } else if progress.catching_up {
            "catching-up"
        } else if !progress.normal {
            "view-change"
        } else if progress.leader == Some(NodeId(self.id - 1)) {
            "leader"
        } else {
            "follower"
        };
        ReplicaStatus {
            id: self.id,
            role: role.to_string(),
            view: progress.view,
            applied: self.next_position,
            epoch: self.epoch,
        }
    }

    /// The view this replica is a normal member of now, applying as it comes; `None` while
    /// it suspects a peer, catches up, starts or stopped.
    pub fn member_view(&self) -> Option<u64> {
        let progress = &self.progress;
        let member = progress.normal
            && !progress.removed
            && !progress.catching_up
            && !progress.starting
            && progress.stopped.is_none();
        member.then_some(progress.view)
    }

    /// Whether this replica leads the view it is a normal member of.
    pub fn leads(&self) -> bool {
        self.member_view().is_some() && self.progress.leader == Some(NodeId(self.id - 1))
    }

    /// Whether it waits for a peer's store.
    pub fn is_catching_up(&self) -> bool {
        self.progress.catching_up
    }

    /// Whether it stopped (left the order for good in this incarnation).
    pub fn is_stopped(&self) -> bool {
        self.progress.stopped.is_some()
    }

    /// Why requests cannot be ordered here now, if they cannot.
    pub fn refusal(&self) -> Option<ManagerError> {
        let progress = &self.progress;
        if progress.removed {
            return Some(ManagerError::Unordered(format!(
                "replica {} was removed from the group",
                self.id
            )));
        }
        if let Some(why) = &progress.stopped {
            return Some(ManagerError::Unordered(format!(
                "replica {} stopped: {why}",
                self.id
            )));
        }
        if progress.starting {
            return Some(ManagerError::Unordered(format!(
                "replica {} is starting",
                self.id
            )));
        }
        progress.catching_up.then(|| {
            ManagerError::Unordered(format!("replica {} is catching up from its peers", self.id))
        })
    }

    /// The order node began as `start`: a restarted or added one catches up before it
    /// applies.
    pub fn began(&mut self, start: Start) {
        self.progress.catching_up = matches!(start, Start::Restarted | Start::Added);
        self.progress.starting = false;
    }

    /// Sets whether it waits for a peer's store.
    pub fn set_catching_up(&mut self, catching_up: bool) {
        self.progress.catching_up = catching_up;
    }

    /// Stands at `epoch`'s position 0 (the whole group begins that epoch).
    pub fn begin_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.next_position = 0;
    }

    /// Leaves the order: refuses every request from now on, saying `why`.
    pub fn stop(&mut self, why: String) {
        self.progress.stopped = Some(why);
    }

    /// Enters a connection that opened, not synced.
    pub fn opened(&mut self, connection: ConnectionId) {
        self.synced.insert(connection, None);
    }

    /// Forgets a connection that closed.
    pub fn closed(&mut self, connection: ConnectionId) {
        self.synced.remove(&connection);
    }

    /// Whether `request` on `connection` may be answered from the replica's own store: a
    /// read, on a connection synced in the view this replica is a normal member of.
    pub fn reads_locally(&self, connection: ConnectionId, request: &ManagerRequest) -> bool {
        let Some(view) = self.member_view() else {
            return false;
        };
        is_read(request) && self.synced.get(&connection) == Some(&Some(view))
    }

    /// An ordered request on `connection` was answered with `answer`: anything but a refusal
    /// syncs the connection (in the view it is a member of now), a refusal unsyncs it.
    pub fn answered(&mut self, connection: ConnectionId, answer: &ManagerResponse) {
        let refused = matches!(answer, ManagerResponse::Error(ManagerError::Unordered(_)));
        let view = self.member_view().filter(|_| !refused);
        if let Some(synced) = self.synced.get_mut(&connection) {
            *synced = view;
        }
    }

    /// A proposal of `command` from this replica: its ticket and bytes.
    pub fn proposal(&mut self, command: Command) -> Result<(u64, Bytes), ManagerError> {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let proposal = Proposal {
            version: crate::command::PROPOSAL_VERSION,
            origin: self.id,
            incarnation: self.incarnation,
            ticket,
            command,
        }
        .encode();
        if proposal.len() > self.message_bytes_max {
            return Err(ManagerError::Layout(format!(
                "request of {} bytes; a replicated manager orders at most {}",
                proposal.len(),
                self.message_bytes_max
            )));
        }
        Ok((ticket, Bytes::from(proposal)))
    }

    /// Refuses to place a file on fewer than the `known` servers while this replica's
    /// liveness table is younger than a heartbeat timeout (it restarted or caught up lately
    /// and may not have heard every live server yet): the client tries another replica.
    pub fn young_placement(
        &self,
        decision: &Decision,
        known: usize,
        now: Instant,
    ) -> Option<ManagerError> {
        let placement = decision.placement.as_ref()?;
        let age = now.saturating_duration_since(self.live_since);
        (placement.len() < known && age < self.heartbeat_timeout).then(|| {
            ManagerError::Unordered(format!(
                "replica {} has heard the servers for only {} ms",
                self.id,
                age.as_millis()
            ))
        })
    }

    /// Takes an order event other than a delivery: the position to catch up from (a peer's
    /// store standing there or later), if this replica must.
    pub fn on_event(&mut self, event: &Event) -> Option<u64> {
        match event {
            Event::View { view, leader, .. } => {
                self.progress.view = *view;
                self.progress.leader = Some(*leader);
                self.progress.normal = true;
                None
            }
            Event::Suspected { .. } => {
                self.progress.normal = false;
                None
            }
            &Event::Joined { position } | &Event::Gap { to: position, .. } => {
                // A restarted replica takes a peer's store even when it joins at the start
                // of the order: its own may be older than the group's.
                let restarted = self.progress.catching_up;
                (restarted || position > self.next_position).then_some(position)
            }
            Event::Removed => {
                self.progress.removed = true;
                None
            }
            // Group changes are applied in position order by `apply_group_change`.
            Event::Deliver { .. }
            | Event::Optimistic { .. }
            | Event::Revoked { .. }
            | Event::GroupChange { .. }
            | Event::Group(_) => None,
        }
    }

    /// A peer's store standing at `position` (of the epoch it records) was installed at `now`.
    pub fn installed(&mut self, position: OrderPosition, now: Instant) {
        self.epoch = position.epoch;
        self.next_position = position.next;
        self.live_since = now;
    }

    /// A peer's store that records `group` and stands at `position` was installed at `now`:
    /// the group is the copy's, and every address it records is queued for the order driver
    /// ([`Self::take_learned`]). The copy may record replicas added after the driver
    /// started, whose `AddReplica` this replica never applied itself: without their
    /// addresses its driver could not reach them once a group change makes them members.
    pub fn install_copy(&mut self, group: ReplicaGroup, position: OrderPosition, now: Instant) {
        self.installed(position, now);
        self.learn_addresses(&group);
        self.group = group;
    }

    /// Applies the order's group change delivered at `position` to `manager`'s store (if it
    /// takes effect: the order's rule, `crate::group`), committed with the position (synced);
    /// whether it took effect. An error says the store failed: the replica must stop.
    pub fn apply_group_change(
        &mut self,
        manager: Option<&mut Manager>,
        position: u64,
        change: &GroupChange,
    ) -> Result<bool, String> {
        if position < self.next_position {
            return Ok(false); // Already in the store copied from a peer.
        }
        assert_eq!(position, self.next_position, "deliveries skipped positions");
        self.next_position = position + 1;
        let Some(group) = self.group.apply(change) else {
            return Ok(false);
        };
        if let Some(manager) = manager {
            manager.set_order_position(OrderPosition {
                epoch: self.epoch,
                next: position + 1,
            });
            if let Err(error) = manager.record_replica_group(&group) {
                return Err(format!("position {position}: its store failed: {error}"));
            }
        }
        self.group = group;
        Ok(true)
    }

    /// Whether this replica should propose the expiry of pending `file` (not yet proposed).
    pub fn propose_expiry(&mut self, file: u64) -> bool {
        self.expiry_proposed.insert(file)
    }

    /// Applies a batch of deliveries to `manager` (`None`: the store is closed) at `now`,
    /// syncing once at the end: the tickets and answers of this replica's proposals among
    /// them. An error says the store failed: the batch is neither synced nor to be answered,
    /// and the replica must stop. ([`ReplicaCore::apply_unsynced`] and [`Applied`] are the
    /// same in steps, for a caller that syncs without holding the manager.)
    pub fn apply_batch(
        &mut self,
        mut manager: Option<&mut Manager>,
        batch: &[(u64, Bytes)],
        now: Instant,
    ) -> Result<Vec<(u64, ManagerResponse)>, String> {
        let mut applied = self.apply_unsynced(manager.as_deref_mut(), batch, now)?;
        applied.sync();
        applied.finish(manager)
    }

    /// Applies a batch of deliveries to `manager` (`None`: the store is closed) at `now`
    /// without syncing it: what the batch still owes ([`Applied`]). Until
    /// [`Applied::finish`], the manager's local reads see the store as it stood before the
    /// batch. An error says the store failed: the batch is neither synced nor to be
    /// answered, and the replica must stop.
    pub fn apply_unsynced(
        &mut self,
        mut manager: Option<&mut Manager>,
        batch: &[(u64, Bytes)],
        now: Instant,
    ) -> Result<Applied, String> {
        assert!(!batch.is_empty(), "a batch has a delivery");
        let positions = (batch[0].0, batch[batch.len() - 1].0);
        let sync_failed = |error: ManagerError| {
            let (first, last) = positions;
            format!("positions {first}..={last}: its store failed to sync: {error}")
        };
        if let Some(manager) = manager.as_deref_mut() {
            manager.begin_batch().map_err(sync_failed)?;
        }
        self.counters.batch(batch.len());
        let mut answers = Vec::with_capacity(batch.len());
        for (position, message) in batch {
            match self.apply_one(manager.as_deref_mut(), *position, message, now) {
                Ok(answer) => answers.extend(answer),
                Err(why) => {
                    if let Some(manager) = manager {
                        manager.abandon_batch();
                    }
                    return Err(why);
                }
            }
        }
        let sync = match manager {
            Some(manager) => manager.finish_batch().map_err(sync_failed)?,
            None => None,
        };
        Ok(Applied {
            answers,
            owed: usize::from(sync.is_some()),
            sync,
            synced: None,
            positions,
        })
    }

    /// Applies the delivery at `position` (not synced yet): the ticket and answer of this
    /// replica's proposal, if it is one; an error if the store failed.
    fn apply_one(
        &mut self,
        manager: Option<&mut Manager>,
        position: u64,
        message: &[u8],
        now: Instant,
    ) -> Result<Option<(u64, ManagerResponse)>, String> {
        if position < self.next_position {
            return Ok(None); // Already in the store copied from a peer.
        }
        assert_eq!(position, self.next_position, "deliveries skipped positions");
        let proposal = Proposal::decode(message);
        let answer = match (&proposal, manager) {
            (Ok(proposal), Some(manager)) => {
                manager.set_order_position(OrderPosition {
                    epoch: self.epoch,
                    next: position + 1,
                });
                let answer = manager.apply(proposal.command.clone(), now);
                if let Some(failure) = manager.take_store_failure() {
                    return Err(format!("position {position}: its store failed: {failure}"));
                }
                Some(answer)
            }
            (Err(error), _) => {
                tracing::error!("replica {}: position {position}: {error}", self.id);
                None
            }
            (Ok(_), None) => None,
        };
        self.next_position = position + 1;
        let (Ok(proposal), Some(answer)) = (proposal, answer) else {
            return Ok(None);
        };
        match &proposal.command {
            Command::ExpirePending { file } => {
                self.expiry_proposed.remove(file);
            }
            Command::AddReplica { id, addr } => {
                self.group.addresses.insert(*id, addr.clone());
                self.learned.push((*id, addr.clone()));
            }
            _ => {}
        }
        let mine = proposal.origin == self.id && proposal.incarnation == self.incarnation;
        Ok(mine.then_some((proposal.ticket, answer)))
    }
}

/// Answers a read from `manager`'s own store at `now`, unless it must be ordered (not a
/// read, a lookup by id of a pending file, or an answer "not found": absence is always asked
/// through the order).
pub fn local_answer(
    manager: &mut Manager,
    request: &ManagerRequest,
    now: Instant,
) -> Option<ManagerResponse> {
    let answer = manager.answer_read(request, now)?;
    let absent = matches!(answer, ManagerResponse::Error(ManagerError::NotFound(_)));
    (!absent).then_some(answer)
}

/// Copies every table of `manager`'s store, as one read transaction sees it, into a new
/// store file at `to` (what a replica sends a peer that catches up).
pub fn copy_store(manager: &Manager, to: &Path) -> Result<(), ManagerError> {
    let txn = manager
        .db
        .begin_read()
        .map_err(|e| ManagerError::Store(e.to_string()))?;
    crate::store::copy_tables(&txn, to).map_err(ManagerError::from)
}

/// Makes the store copy at `incoming` the store of the replica in `dir` (whose manager must
/// be closed), standing at `position`, and opens it as a replica's: the manager and the
/// position (with the epoch the copy records).
pub fn open_installed(
    dir: &Path,
    incoming: &Path,
    position: u64,
    config: crate::ManagerConfig,
    replica_key: tessera_auth::Key,
) -> Result<(Manager, OrderPosition), String> {
    let path = dir.join(crate::store::DB_FILE_NAME);
    let written =
        std::fs::rename(incoming, &path).and_then(|()| std::fs::File::open(dir)?.sync_all());
    written.map_err(|e| format!("cannot install the copied store: {e}"))?;
    let mut manager = Manager::open_existing(dir, config)
        .map_err(|e| format!("cannot open the copied store: {e}"))?;
    manager.set_replicated(replica_key);
    let stored = manager
        .order_position()
        .map_err(|e| format!("the copied store's order position: {e}"))?;
    let at = OrderPosition {
        epoch: stored.epoch,
        next: position,
    };
    manager.set_order_position(at);
    Ok((manager, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_counted_by_size() {
        let mut counters = Counters::default();
        for size in [1, 2, 3, 4, 7, 8, 15, 16, 256] {
            counters.batch(size);
        }
        assert_eq!(counters.batch_sizes, [1, 2, 2, 2, 2]);
        assert_eq!((counters.batches, counters.deliveries), (9, 312));
    }
}
