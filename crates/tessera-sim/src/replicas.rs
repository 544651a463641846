//! A replicated manager inside the simulation: N replicas, each the order's sans-IO
//! [`Node`] and the manager's sans-IO [`ReplicaCore`] over its own [`Manager`] (a redb file
//! under the cluster's temporary directory), driven by the runtime's virtual clock, with an
//! in-memory network between them for the order's datagrams (seeded loss and delay,
//! partitions) and the simulator's [`MemNetwork`] for clients and servers.
//!
//! What runs is what the `tessera manager --id N --peers ...` daemon runs
//! ([`tessera_manager::replica`]): the same core decides what is read locally, numbers and
//! encodes proposals, applies UTO deliveries in batches and answers the proposer's requests,
//! with the same order configuration ([`order_config`]). What differs: the order's packets
//! cross this module's queue instead of UDP (no MAC: nobody forges them here); a replica
//! that catches up copies a peer's store directly ([`tessera_manager::replica_core::copy_store`],
//! at once, instead of pieces over TCP).
//!
//! A kill leaves the store file as the operating system holds it at that instant (a copy of
//! the file taken before the store is dropped, put back after): redb's header on disk is its
//! last synced commit's, so the store reopens there, and commits made without sync since are
//! lost, as after a kill -9 ([`SimReplicas::kill`]). The whole group may die at once and start
//! again ([`SimReplicas::kill_all`], [`SimReplicas::start_group`]) as the daemon starts it:
//! from the most advanced store, at the next epoch. The leader proposes `ExpireOnce` as the
//! daemon's applier does, from marks of where the order stood (the daemon's own
//! `OnceMarks`).
//!
//! **Membership** (issue 17 item 3): spare replicas beyond the initial group may be added
//! ([`SimReplicas::add`]: an empty store, an added order node that takes a peer's store
//! once it is a member) and members removed ([`SimReplicas::change_group`]: the daemon's two
//! steps, `AddReplica` then the order's group change, proposed at a running member); every
//! replica applies the change at its position with the daemon's `ReplicaCore`. A whole-group
//! start after a change is not simulated.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_manager::command::{is_read, Command, OrderPosition};
use tessera_manager::group::ReplicaGroup;
use tessera_manager::replica::{is_local, order_config, OnceMarks, ORDER_TIMEOUT};
use tessera_manager::replica_core::{copy_store, local_answer, open_installed, ReplicaCore};
use tessera_manager::{Manager, ManagerConfig};
use tessera_order::{Destination, Event, Node, NodeId, Role, Start};
use tessera_transport::{BoxFuture, ConnectionId, FrameHandler, MemNetwork};
use tessera_wire::{encode_message, ManagerError, ManagerRequest, ManagerResponse};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// Faults of the network between replicas.
#[derive(Debug, Clone, Copy)]
pub struct OrderFaults {
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Least and most one-way delay, in microseconds.
    pub delay_us: (u64, u64),
}

impl Default for OrderFaults {
    fn default() -> Self {
        OrderFaults {
            loss: 0.0,
            delay_us: (50, 300),
        }
    }
}

/// What the replicas did, for reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicaStats {
    /// Order datagrams sent, and lost (to faults, partitions or dead replicas).
    pub datagrams: u64,
    /// Of which lost.
    pub datagrams_lost: u64,
    /// Datagrams not sent: their replica's order driver had no address for the one it was
    /// for (see `Running::addressed`).
    pub datagrams_unaddressed: u64,
    /// Replica kills and restarts.
    pub kills: u64,
    /// Restarts.
    pub restarts: u64,
    /// Peer stores installed by restarted replicas.
    pub catch_ups: u64,
    /// Deliveries applied, summed over replicas.
    pub applied: u64,
    /// Times the whole group died at once and started again.
    pub group_restarts: u64,
    /// Kills whose replica's store reopened without some commits it had made (made without
    /// sync, lost with the process).
    pub unsynced_lost: u64,
    /// `ExpireOnce` commands applied, summed over replicas.
    pub once_expiries: u64,
    /// Group changes that took effect, summed over replicas.
    pub group_changes: u64,
    /// Spares started to be added to the group, and removals proposed.
    pub added: u64,
    /// Removals proposed.
    pub removed: u64,
}

/// One running replica: its order node, store and core.
struct Running {
    node: Node,
    /// `None` only while a peer's store is installed.
    manager: Option<Manager>,
    core: ReplicaCore,
    waiters: HashMap<u64, oneshot::Sender<ManagerResponse>>,
    /// Connections seen (the in-memory network does not announce them).
    connections: HashSet<ConnectionId>,
    /// The position a peer's store must stand at before this replica applies, if it waits.
    catch_up: Option<u64>,
    /// Events that came while it waits for a peer's store.
    held: VecDeque<Event>,
    /// When it last looked at pending files' leases.
    leases_checked: Instant,
    /// Where the order stood, for its `ExpireOnce` cutoff.
    once_marks: OnceMarks,
    /// The replicas (indices) whose address its order driver knows, as the daemon's: at
    /// boot the stored group's and every replica up to its own (a local cluster's
    /// `--peers`), then what the replica learns ([`ReplicaCore::take_learned`]). Datagrams
    /// to any other replica go nowhere.
    addressed: BTreeSet<usize>,
}

struct Replica {
    dir: PathBuf,
    incarnation: u32,
    running: Option<Box<Running>>,
}

/// A datagram in flight: arrival in µs, a sequence number (ties), the replica it goes to,
/// its bytes.
type Datagram = Reverse<(u64, u64, usize, Vec<u8>)>;

/// The group's state, behind one lock.
struct GroupState {
    replicas: Vec<Replica>,
    /// Datagrams in flight, earliest first.
    wire: BinaryHeap<Datagram>,
    sequence: u64,
    rng: StdRng,
    faults: OrderFaults,
    /// Replicas cut off from every other.
    cut: BTreeSet<usize>,
    base: Instant,
    config: ManagerConfig,
    key: tessera_auth::Key,
    seed: u64,
    stats: ReplicaStats,
    /// Stores that failed (a replica stopped): the checker wants none.
    failures: Vec<String>,
    /// The group of a store that records none: the first replicas, before any spare.
    initial: ReplicaGroup,
}

/// The replicas of a simulated replicated manager.
pub struct SimReplicas {
    group: Arc<Mutex<GroupState>>,
    wake: Arc<Notify>,
    network: Arc<MemNetwork>,
    addrs: Vec<SocketAddr>,
    driver: tokio::task::JoinHandle<()>,
}

/// The order's time: microseconds since the group began.
fn micros(base: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(base).as_micros() as u64
}

impl SimReplicas {
    /// `count` replicas with stores under `root`, serving at 10.0.0.1..=count:7000 on
    /// `network`, all started with the group (epoch 1).
    pub fn start(
        seed: u64,
        count: usize,
        root: &std::path::Path,
        config: ManagerConfig,
        network: Arc<MemNetwork>,
        faults: OrderFaults,
    ) -> SimReplicas {
        Self::start_with_spares(seed, count, 0, root, config, network, faults)
    }

    /// As [`SimReplicas::start`], with `spares` more replicas (ids past `count`) that are not
    /// started: [`SimReplicas::add`] adds one to the group.
    pub fn start_with_spares(
        seed: u64,
        count: usize,
        spares: usize,
        root: &std::path::Path,
        config: ManagerConfig,
        network: Arc<MemNetwork>,
        faults: OrderFaults,
    ) -> SimReplicas {
        let key = tessera_auth::Secret::from_bytes([seed as u8 | 1; 32]).replica_key();
        let addrs: Vec<SocketAddr> = (0..count + spares)
            .map(|i| SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000)))
            .collect();
        let initial = ReplicaGroup::initial(&addrs[..count]);
        let now = Instant::now();
        let replicas = (0..count + spares)
            .map(|i| Replica {
                dir: root.join(format!("manager-{}", i + 1)),
                incarnation: 1,
                running: None,
            })
            .collect();
        let group = GroupState {
            replicas,
            wire: BinaryHeap::new(),
            sequence: 0,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_0de5),
            faults,
            cut: BTreeSet::new(),
            base: now,
            config,
            key,
            seed,
            stats: ReplicaStats::default(),
            failures: Vec::new(),
            initial,
        };
        let group = Arc::new(Mutex::new(group));
        let wake = Arc::new(Notify::new());
        let driver = tokio::spawn(drive(group.clone(), wake.clone()));
        let replicas = SimReplicas {
            group,
            wake,
            network,
            addrs,
            driver,
        };
        for index in 0..count {
            replicas.boot(index, Start::Initial, 1);
        }
        replicas
    }

    /// Every replica's address, by id.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }

    /// Number of replicas.
    pub fn count(&self) -> usize {
        self.addrs.len()
    }

    /// Opens replica `index`'s store and starts it (`Initial`: with the group, at position 0
    /// of `epoch`), in the group its store records.
    fn boot(&self, index: usize, start: Start, epoch: u64) {
        let mut group = self.group.lock().unwrap();
        let group = &mut *group;
        let now = Instant::now();
        let replica = &mut group.replicas[index];
        std::fs::create_dir_all(&replica.dir).expect("replica directory");
        let mut manager = Manager::open(&replica.dir, group.config).expect("replica store");
        manager.set_replicated(group.key);
        let stored = manager.order_position().expect("order position");
        let order = order_config();
        let mut core = ReplicaCore::new(
            index as u16 + 1,
            replica.incarnation,
            stored,
            order.message_bytes_max(),
            group.config.heartbeat_timeout,
            now.into_std(),
        );
        let mut members = (manager.replica_group().expect("the stored group"))
            .unwrap_or_else(|| group.initial.clone());
        if start == Start::Initial {
            // The order counts group changes from 0 again (as the daemon's begin_epoch).
            members.epoch = 0;
            manager.set_order_position(OrderPosition { epoch, next: 0 });
            manager
                .record_replica_group(&members)
                .expect("the store commits the new epoch");
            core.begin_epoch(epoch);
        }
        let addressed = (members.addresses.keys())
            .map(|&id| usize::from(id) - 1)
            .chain(0..=index)
            .collect();
        core.set_group(members.clone());
        core.began(start);
        let node = Node::new(
            order,
            members.order_group(),
            NodeId(index as u16),
            replica.incarnation,
            start,
            group.seed ^ ((index as u64) << 32) ^ u64::from(replica.incarnation),
            micros(group.base, now),
        );
        replica.running = Some(Box::new(Running {
            node,
            manager: Some(manager),
            core,
            waiters: HashMap::new(),
            connections: HashSet::new(),
            catch_up: None,
            held: VecDeque::new(),
            leases_checked: now,
            once_marks: OnceMarks::default(),
            addressed,
        }));
        let host = ReplicaHost {
            group: self.group.clone(),
            wake: self.wake.clone(),
            index,
            incarnation: replica.incarnation,
        };
        self.network.listen(self.addrs[index], Arc::new(host));
        self.wake.notify_one();
    }

    /// The replica that leads the view, as the first running one that knows sees it.
    pub fn leader(&self) -> Option<usize> {
        let group = self.group.lock().unwrap();
        group
            .replicas
            .iter()
            .enumerate()
            .find_map(|(index, replica)| {
                let running = replica.running.as_ref()?;
                running.core.leads().then_some(index)
            })
    }

    /// Whether replica `index` runs as a normal member of a view (caught up, not suspecting
    /// anyone) and is not cut off: the order counts on it.
    pub fn is_healthy(&self, index: usize) -> bool {
        let group = self.group.lock().unwrap();
        let running = group.replicas[index].running.as_ref();
        !group.cut.contains(&index) && running.is_some_and(|r| r.core.member_view().is_some())
    }

    /// Whether replica `index` runs.
    pub fn is_running(&self, index: usize) -> bool {
        self.group.lock().unwrap().replicas[index].running.is_some()
    }

    /// Replica `index`'s process dies (kill -9): its order node, its waiting requests and
    /// its connections go; its store keeps what it committed with a sync, and loses the
    /// commits made without one since (see the module doc).
    pub fn kill(&self, index: usize) {
        let mut group = self.group.lock().unwrap();
        let dir = group.replicas[index].dir.clone();
        let Some(running) = group.replicas[index].running.take() else {
            return;
        };
        group.stats.kills += 1;
        let before = running.manager.as_ref().map(|manager| manager.state_dump());
        let store = dir.join(STORE_FILE_NAME);
        let left = dir.join("manager.redb.killed");
        // What the process leaves: the file as it is now, before redb's orderly close.
        let copied = std::fs::copy(&store, &left).is_ok();
        drop(running);
        if copied {
            std::fs::rename(&left, &store).expect("the killed store goes back");
            let reopened =
                Manager::open_existing(&dir, group.config).expect("a killed store opens");
            if before.is_some_and(|before| before != reopened.state_dump()) {
                group.stats.unsynced_lost += 1;
            }
        }
        drop(group);
        self.network.crash(self.addrs[index]);
    }

    /// Every replica dies at once (see [`SimReplicas::kill`]).
    pub fn kill_all(&self) {
        for index in 0..self.count() {
            self.kill(index);
        }
    }

    /// The whole group, every replica down, starts again as the daemon starts it: each store
    /// says where it stands in the order, those behind the most advanced take a copy of it,
    /// and all begin the next epoch at position 0 as new incarnations. The group is the one
    /// the most advanced store records: a replica removed from it (or a spare never added)
    /// stays down.
    pub fn start_group(&self) {
        let (dirs, config) = {
            let mut group = self.group.lock().unwrap();
            assert!(
                group.replicas.iter().all(|r| r.running.is_none()),
                "all down"
            );
            group.stats.group_restarts += 1;
            let dirs: Vec<PathBuf> = group.replicas.iter().map(|r| r.dir.clone()).collect();
            (dirs, group.config)
        };
        // A spare never started has no store.
        let stored = |dir: &PathBuf| -> Option<(OrderPosition, Option<ReplicaGroup>)> {
            let manager = Manager::open_existing(dir, config).ok()?;
            let position = manager.order_position().expect("its position");
            Some((position, manager.replica_group().expect("its group")))
        };
        let stands: Vec<_> = dirs.iter().map(stored).collect();
        let best = (0..dirs.len())
            .filter(|&i| stands[i].is_some())
            .max_by_key(|&i| (stands[i].as_ref().map(|s| s.0), Reverse(i)))
            .expect("a replica with a store");
        let (best_stands, best_group) = stands[best].clone().expect("a store");
        let initial = self.group.lock().unwrap().initial.clone();
        let members = best_group.unwrap_or(initial).member_ids();
        for id in members {
            let index = usize::from(id) - 1;
            if stands[index].as_ref().map(|s| s.0) < Some(best_stands) {
                std::fs::create_dir_all(&dirs[index]).expect("replica directory");
                let from = dirs[best].join(STORE_FILE_NAME);
                std::fs::copy(from, dirs[index].join(STORE_FILE_NAME)).expect("the store copies");
            }
            {
                let mut group = self.group.lock().unwrap();
                group.replicas[index].incarnation += 1;
                group.stats.restarts += 1;
            }
            self.boot(index, Start::Initial, best_stands.epoch + 1);
        }
    }

    /// The group as the most advanced running replica applied it: its members' indexes.
    pub fn members(&self) -> Vec<usize> {
        let group = self.group.lock().unwrap();
        let newest = (group.replicas.iter())
            .filter_map(|replica| replica.running.as_ref())
            .filter(|running| !running.core.is_catching_up())
            .max_by_key(|running| (running.core.position(), running.core.group().epoch));
        let members = newest.map_or_else(|| group.initial.clone(), |r| r.core.group().clone());
        let ids = members.member_ids();
        ids.into_iter().map(|id| usize::from(id) - 1).collect()
    }

    /// Whether replica `index` was told it is removed from the group.
    pub fn is_removed(&self, index: usize) -> bool {
        let group = self.group.lock().unwrap();
        let running = group.replicas[index].running.as_ref();
        running.is_some_and(|running| running.core.is_removed())
    }

    /// Proposes at running replica `via` (a normal member) the addition (`add`) or the
    /// removal of replica `index`, as the daemon's `change_group` does: an addition records
    /// the address first (`AddReplica`), then the order's group change follows in the same
    /// FIFO stream. Whether it was proposed (`via` runs and may propose).
    pub fn change_group(&self, via: usize, index: usize, add: bool) -> bool {
        let mut guard = self.group.lock().unwrap();
        let group = &mut *guard;
        let at = micros(group.base, Instant::now());
        let Some(running) = group.replicas[via].running.as_mut() else {
            return false;
        };
        if running.core.member_view().is_none() {
            return false;
        }
        if add {
            let command = Command::AddReplica {
                id: index as u16 + 1,
                addr: self.addrs[index].to_string(),
            };
            let Ok((_, proposal)) = running.core.proposal(command) else {
                return false;
            };
            if running.node.propose(proposal, at).is_err() {
                return false;
            }
        }
        let role = Role {
            sender: add,
            receiver: add,
        };
        let proposed = running
            .node
            .propose_group_change(NodeId(index as u16), role, at);
        if proposed.is_ok() && !add {
            group.stats.removed += 1;
        }
        drop(guard);
        self.wake.notify_one();
        proposed.is_ok()
    }

    /// Starts replica `index` as a new member: its directory wiped, an added order node (a
    /// new incarnation) that takes a peer's store once a group change makes it a member.
    pub fn add(&self, index: usize) {
        if self.is_running(index) {
            return;
        }
        {
            let mut group = self.group.lock().unwrap();
            let _ = std::fs::remove_dir_all(&group.replicas[index].dir);
            group.replicas[index].incarnation += 1;
            group.stats.added += 1;
        }
        self.boot(index, Start::Added, 0);
    }

    /// Replica `index` starts again from its store, as a restarted order node (a new
    /// incarnation), and catches up from a peer.
    pub fn restart(&self, index: usize) {
        if self.is_running(index) {
            return;
        }
        {
            let mut group = self.group.lock().unwrap();
            group.replicas[index].incarnation += 1;
            group.stats.restarts += 1;
        }
        self.boot(index, Start::Restarted, 0);
    }

    /// Cuts replica `index` off from the other replicas and from every client and server
    /// (`cut`), or heals it.
    pub fn partition(&self, index: usize, cut: bool) {
        let mut group = self.group.lock().unwrap();
        match cut {
            true => group.cut.insert(index),
            false => group.cut.remove(&index),
        };
        drop(group);
        self.network.partition(self.addrs[index], cut);
        self.wake.notify_one();
    }

    /// Heals every partition.
    pub fn heal(&self) {
        for index in 0..self.count() {
            self.partition(index, false);
        }
    }

    /// How long the replicas keep a client's `once` answers after its last change.
    pub fn once_expiry(&self) -> Duration {
        self.group.lock().unwrap().config.once_expiry
    }

    /// Sets the faults of the network between replicas.
    pub fn set_faults(&self, faults: OrderFaults) {
        self.group.lock().unwrap().faults = faults;
    }

    /// What the replicas did so far.
    pub fn stats(&self) -> ReplicaStats {
        self.group.lock().unwrap().stats
    }

    /// Stores that failed so far (each stopped its replica).
    pub fn failures(&self) -> Vec<String> {
        self.group.lock().unwrap().failures.clone()
    }

    /// Each replica's status line (`id role view applied`), `down` for one not running.
    pub fn describe(&self) -> String {
        let group = self.group.lock().unwrap();
        let lines: Vec<String> = group
            .replicas
            .iter()
            .enumerate()
            .map(|(index, replica)| match &replica.running {
                Some(running) => {
                    let status = running.core.status();
                    let waits = running
                        .catch_up
                        .map(|at| format!(", waits for a store at {at}"));
                    format!(
                        "{}: {} view {} (node {} {:?}) applied {} epoch {}{}",
                        index + 1,
                        status.role,
                        status.view,
                        running.node.view(),
                        running.node.status(),
                        status.applied,
                        running.core.position().epoch,
                        waits.unwrap_or_default()
                    )
                }
                None => format!("{}: down", index + 1),
            })
            .collect();
        lines.join(", ")
    }

    /// Runs `f` on the store of the first running replica that is not catching up.
    pub fn with_manager<T>(&self, f: impl FnOnce(&mut Manager) -> T) -> Option<T> {
        let mut group = self.group.lock().unwrap();
        let running = group
            .replicas
            .iter_mut()
            .filter_map(|replica| replica.running.as_mut())
            .find(|running| !running.core.is_catching_up())?;
        running.manager.as_mut().map(f)
    }

    /// The view each running replica's order node is in.
    pub fn views(&self) -> Vec<(usize, u64)> {
        let group = self.group.lock().unwrap();
        let replicas = group.replicas.iter().enumerate();
        replicas
            .filter_map(|(index, replica)| Some((index, replica.running.as_ref()?.node.view())))
            .collect()
    }

    /// Each running replica's applied position and store dump (every table, in key order).
    pub fn dumps(&self) -> Vec<(usize, u64, Vec<String>)> {
        let group = self.group.lock().unwrap();
        let running = group
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(index, replica)| {
                let running = replica.running.as_ref()?;
                let manager = running.manager.as_ref()?;
                Some((index, running.core.position().next, manager.state_dump()))
            });
        running.collect()
    }
}

impl Drop for SimReplicas {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Runs the replicas: delivers datagrams when they arrive, fires the nodes' timers, applies
/// deliveries, catches up restarted replicas, until the runtime ends.
async fn drive(group: Arc<Mutex<GroupState>>, wake: Arc<Notify>) {
    loop {
        let next = group.lock().unwrap().step(Instant::now());
        let sleep = tokio::time::sleep_until(next);
        tokio::select! {
            biased;
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}

/// Longest the driver sleeps when nothing is due (a restarted replica retries its catch-up
/// this often, as the daemon's `CATCH_UP_PAUSE`).
const IDLE_STEP: Duration = Duration::from_millis(100);
/// How often a replica looks at its pending files' leases (the daemon's applier tick).
const LEASE_TICK: Duration = Duration::from_millis(100);
/// The store's file in a replica's directory (`tessera_manager`'s own name for it).
const STORE_FILE_NAME: &str = "manager.redb";

impl GroupState {
    /// Does everything due at `now`; returns when to come back.
    fn step(&mut self, now: Instant) -> Instant {
        let at = micros(self.base, now);
        while let Some(Reverse((arrival, _, to, _))) = self.wire.peek() {
            if *arrival > at {
                break;
            }
            let to = *to;
            let Some(Reverse((_, _, _, bytes))) = self.wire.pop() else {
                break;
            };
            if let Some(running) = self.replicas[to].running.as_mut() {
                running.node.handle_packet(&bytes, at);
            }
        }
        for index in 0..self.replicas.len() {
            self.step_replica(index, now, at);
        }
        let mut next = now + IDLE_STEP;
        if let Some(Reverse((arrival, ..))) = self.wire.peek() {
            next = next.min(self.base + Duration::from_micros(*arrival));
        }
        for running in self.replicas.iter().filter_map(|r| r.running.as_ref()) {
            if let Some(deadline) = running.node.poll_timeout() {
                next = next.min(self.base + Duration::from_micros(deadline));
            }
        }
        next.max(now + Duration::from_micros(1))
    }

    /// Fires replica `index`'s timer if due, sends its datagrams, takes its events, proposes
    /// the expiry of leases that ended.
    fn step_replica(&mut self, index: usize, now: Instant, at: u64) {
        let Some(running) = self.replicas[index].running.as_mut() else {
            return;
        };
        if running
            .node
            .poll_timeout()
            .is_some_and(|deadline| deadline <= at)
        {
            running.node.handle_timeout(at);
        }
        let learned = running.core.take_learned();
        (running.addressed).extend(learned.iter().map(|&(id, _)| usize::from(id) - 1));
        let mut transmits = Vec::new();
        while let Some(transmit) = running.node.poll_transmit(at) {
            transmits.push(transmit);
        }
        let addressed = running.addressed.clone();
        while let Some(event) = running.node.poll_event() {
            running.held.push_back(event);
        }
        for transmit in transmits {
            let targets: Vec<usize> = match transmit.destination {
                Destination::All => (0..self.replicas.len()).collect(),
                Destination::Node(node) => vec![usize::from(node.0)],
            };
            for to in targets {
                if to != index && !addressed.contains(&to) {
                    self.stats.datagrams_unaddressed += 1;
                    continue;
                }
                self.send(index, to, transmit.contents.clone(), at);
            }
        }
        self.take_events(index, now);
        self.expire_leases(index, now, at);
    }

    /// Proposes `ExpireOnce` when its cutoff moved (or records remain), if replica `index`
    /// leads the view; the others keep marking (the daemon's `propose_once_expiry`).
    fn expire_once(&mut self, index: usize, now: Instant, at: u64) {
        let expiry = self.config.once_expiry;
        let running = self.replicas[index].running.as_mut().expect("running");
        let Some(manager) = running.manager.as_ref() else {
            return;
        };
        let (here, backlog) = (running.core.position(), manager.once_expiry_backlog());
        let marks = &mut running.once_marks;
        if !running.core.leads() {
            marks.follow(now.into_std(), here, expiry);
            return;
        }
        if let Some(before) = marks.tick(now.into_std(), here, expiry, backlog) {
            if let Ok((_, proposal)) = running.core.proposal(Command::ExpireOnce { before }) {
                let _ = running.node.propose(proposal, at);
            }
        }
    }

    /// Puts a datagram from `from` to `to` on the wire, unless the faults lose it.
    fn send(&mut self, from: usize, to: usize, bytes: Vec<u8>, at: u64) {
        self.stats.datagrams += 1;
        let cut = from != to && (self.cut.contains(&from) || self.cut.contains(&to));
        if cut || (from != to && self.rng.gen_bool(self.faults.loss)) {
            self.stats.datagrams_lost += 1;
            return;
        }
        let (least, most) = self.faults.delay_us;
        let delay = if from == to {
            least
        } else {
            self.rng.gen_range(least..=most.max(least))
        };
        self.sequence += 1;
        self.wire
            .push(Reverse((at + delay, self.sequence, to, bytes)));
    }

    /// Applies replica `index`'s events in order (deliveries batched as the daemon's applier
    /// takes them), unless it waits for a peer's store.
    fn take_events(&mut self, index: usize, now: Instant) {
        loop {
            let running = self.replicas[index].running.as_mut().expect("running");
            if let Some(position) = running.catch_up {
                if !self.catch_up(index, position, now) {
                    return;
                }
            }
            let running = self.replicas[index].running.as_mut().expect("running");
            let mut batch = Vec::new();
            while let Some(Event::Deliver {
                position, message, ..
            }) = running.held.front()
            {
                if batch.len() == tessera_manager::replica::BATCH_DELIVERIES_MAX {
                    break;
                }
                batch.push((*position, message.clone()));
                running.held.pop_front();
            }
            if !batch.is_empty() {
                self.apply(index, &batch, now);
                continue;
            }
            let Some(event) = running.held.pop_front() else {
                return;
            };
            if let Event::GroupChange {
                position, change, ..
            } = &event
            {
                let manager = running.manager.as_mut();
                match running.core.apply_group_change(manager, *position, change) {
                    Ok(changed) => self.stats.group_changes += u64::from(changed),
                    Err(why) => {
                        self.failures.push(format!("replica {}: {why}", index + 1));
                        running.core.stop(why);
                        running.waiters.clear();
                    }
                }
                continue;
            }
            running.catch_up = running.core.on_event(&event);
            if running.catch_up.is_some() {
                running.core.set_catching_up(true);
            }
        }
    }

    /// Applies a batch at replica `index` and answers its waiting requests.
    fn apply(&mut self, index: usize, batch: &[(u64, Bytes)], now: Instant) {
        let running = self.replicas[index].running.as_mut().expect("running");
        if running.core.is_stopped() {
            return;
        }
        self.stats.once_expiries += batch
            .iter()
            .filter(|(_, message)| {
                let proposal = tessera_manager::command::Proposal::decode(message);
                proposal.is_ok_and(|p| matches!(p.command, Command::ExpireOnce { .. }))
            })
            .count() as u64;
        let applied = running
            .core
            .apply_batch(running.manager.as_mut(), batch, now.into_std());
        self.stats.applied += batch.len() as u64;
        match applied {
            Ok(answers) => {
                for (ticket, answer) in answers {
                    if let Some(waiter) = running.waiters.remove(&ticket) {
                        let _ = waiter.send(answer);
                    }
                }
            }
            Err(why) => {
                self.failures.push(format!("replica {}: {why}", index + 1));
                running.core.stop(why);
                running.waiters.clear();
            }
        }
    }

    /// Installs at replica `index` the store of a peer that stands at `position` or later,
    /// if one can be reached; whether it did.
    fn catch_up(&mut self, index: usize, position: u64, now: Instant) -> bool {
        let dir = self.replicas[index].dir.clone();
        let incoming = dir.join("manager.redb.incoming");
        let peer = (0..self.replicas.len()).find(|&peer| {
            let reachable =
                peer != index && !self.cut.contains(&peer) && !self.cut.contains(&index);
            let ready = self.replicas[peer].running.as_ref().is_some_and(|running| {
                !running.core.is_catching_up()
                    && !running.core.is_stopped()
                    && running.core.position().next >= position
            });
            reachable && ready
        });
        let Some(peer) = peer else {
            return false;
        };
        let source = self.replicas[peer].running.as_ref().expect("running");
        let at = source.core.position().next;
        let _ = std::fs::remove_file(&incoming);
        copy_store(source.manager.as_ref().expect("a store"), &incoming).expect("store copy");
        let running = self.replicas[index].running.as_mut().expect("running");
        drop(running.manager.take());
        let (manager, stands) =
            open_installed(&dir, &incoming, at, self.config, self.key).expect("the copy installs");
        let members = manager.replica_group().expect("the copy's group");
        let members = members.unwrap_or_else(|| self.initial.clone());
        running.manager = Some(manager);
        running.core.install_copy(members, stands, now.into_std());
        running.core.set_catching_up(false);
        running.catch_up = None;
        self.stats.catch_ups += 1;
        true
    }

    /// Proposes the removal of pending files whose lease ran out at replica `index`, every
    /// [`LEASE_TICK`], as the daemon's applier does.
    fn expire_leases(&mut self, index: usize, now: Instant, at: u64) {
        let running = self.replicas[index].running.as_mut().expect("running");
        if now.saturating_duration_since(running.leases_checked) < LEASE_TICK {
            return;
        }
        running.leases_checked = now;
        self.expire_once(index, now, at);
        let running = self.replicas[index].running.as_mut().expect("running");
        let Some(manager) = running.manager.as_mut() else {
            return;
        };
        for file in manager.expired_pending(now.into_std()) {
            if running.core.refusal().is_some() {
                return;
            }
            if running.core.propose_expiry(file) {
                let command = Command::ExpirePending { file };
                if let Ok((_, proposal)) = running.core.proposal(command) {
                    let _ = running.node.propose(proposal, at);
                }
            }
        }
    }
}

/// Replica `index` as a daemon on the in-memory network (as `tessera_manager::daemon`'s
/// handler serves a replica: local requests, local reads on synced connections, the rest
/// ordered).
struct ReplicaHost {
    group: Arc<Mutex<GroupState>>,
    wake: Arc<Notify>,
    index: usize,
    incarnation: u32,
}

impl FrameHandler for ReplicaHost {
    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        _payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let Ok(request) = tessera_wire::decode_message::<ManagerRequest>(&message) else {
            return Box::pin(async { None });
        };
        let (group, wake) = (self.group.clone(), self.wake.clone());
        let (index, incarnation) = (self.index, self.incarnation);
        Box::pin(async move {
            let answer = serve(&group, &wake, index, incarnation, connection, request).await?;
            Some((Bytes::from(encode_message(&answer)), Bytes::new()))
        })
    }

    fn closed(&self, connection: ConnectionId) {
        let mut group = self.group.lock().unwrap();
        if let Some(running) = self.group_running(&mut group) {
            running.core.closed(connection);
            running.connections.remove(&connection);
        }
    }
}

impl ReplicaHost {
    fn group_running<'a>(&self, group: &'a mut GroupState) -> Option<&'a mut Running> {
        running_of(group, self.index, self.incarnation)
    }
}

/// Replica `index` if it still runs in `incarnation`.
fn running_of(group: &mut GroupState, index: usize, incarnation: u32) -> Option<&mut Running> {
    let replica = &mut group.replicas[index];
    if replica.incarnation != incarnation {
        return None;
    }
    replica.running.as_deref_mut()
}

/// What replica `index` answers `request` on `connection` (`None`: it died meanwhile).
async fn serve(
    group: &Mutex<GroupState>,
    wake: &Notify,
    index: usize,
    incarnation: u32,
    connection: ConnectionId,
    request: ManagerRequest,
) -> Option<ManagerResponse> {
    let waiting = {
        let mut guard = group.lock().unwrap();
        let at = micros(guard.base, Instant::now());
        let running = running_of(&mut guard, index, incarnation)?;
        if running.connections.insert(connection) {
            running.core.opened(connection);
        }
        let now = Instant::now().into_std();
        match request {
            ManagerRequest::Replica => {
                return Some(ManagerResponse::Replica(running.core.status()));
            }
            ManagerRequest::ReplicaGroup => {
                let group = running.core.group();
                let (epoch, members) = (group.epoch, group.members());
                return Some(ManagerResponse::ReplicaGroup { epoch, members });
            }
            ManagerRequest::Snapshot { .. } => {
                let refused = "the simulator's replicas copy stores directly".to_string();
                return Some(ManagerResponse::Error(ManagerError::Unordered(refused)));
            }
            request if is_local(&request) => {
                return running.manager.as_mut().map(|m| m.handle(request, now));
            }
            request => {
                if is_read(&request) && running.core.reads_locally(connection, &request) {
                    if let Some(answer) = running
                        .manager
                        .as_mut()
                        .and_then(|manager| local_answer(manager, &request, now))
                    {
                        return Some(answer);
                    }
                }
                match propose(running, request, now, at) {
                    Ok(waiting) => waiting,
                    Err(refused) => return Some(ManagerResponse::Error(refused)),
                }
            }
        }
    };
    wake.notify_one();
    let answer = match tokio::time::timeout(ORDER_TIMEOUT, waiting).await {
        Ok(Ok(answer)) => answer,
        _ => ManagerResponse::Error(ManagerError::Unordered(format!(
            "not ordered within {} ms",
            ORDER_TIMEOUT.as_millis()
        ))),
    };
    let mut guard = group.lock().unwrap();
    let running = running_of(&mut guard, index, incarnation)?;
    running.core.answered(connection, &answer);
    Some(answer)
}

/// Decides and proposes `request` at `running`: the receiver of its answer.
fn propose(
    running: &mut Running,
    request: ManagerRequest,
    now: std::time::Instant,
    at: u64,
) -> Result<oneshot::Receiver<ManagerResponse>, ManagerError> {
    if let Some(refused) = running.core.refusal() {
        return Err(refused);
    }
    let manager = running
        .manager
        .as_ref()
        .ok_or_else(|| ManagerError::Unordered("no store".into()))?;
    let (decision, known) = (manager.decide(&request), manager.known_servers());
    if let Some(refused) = running.core.young_placement(&decision, known, now) {
        return Err(refused);
    }
    let (ticket, proposal) = running
        .core
        .proposal(Command::Request { request, decision })?;
    running
        .node
        .propose(proposal, at)
        .map_err(|error| ManagerError::Unordered(error.to_string()))?;
    let (answer, waiting) = oneshot::channel();
    running.waiters.insert(ticket, answer);
    Ok(waiting)
}
