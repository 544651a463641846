//! The replicated manager's checker (issue 17, item 6): per seed, clients change and read
//! metadata (create, small puts, stat, rename, remove, list) on a cluster whose manager is 3
//! or 5 [`SimReplicas`], while replicas are killed (the leader or not) and restarted and cut
//! off at random network calls, so inside every step of a change; then recovery and a check
//! that every replica holds the same store.
//!
//! **What is checked.** Each client works on its own names (`/cN-...`), one operation at a
//! time, so its history is sequential and, since linearizability is local (a history is
//! linearizable if the history of each object is), the whole history is linearizable if
//! each client's is, against a sequential model of its namespace (name to size). The
//! checker keeps the *set* of namespaces the model allows: an acknowledged operation (or a
//! definite refusal: "not found", "exists") must be the model's answer in at least one of
//! them, and leaves those that agree, stepped; an operation whose answer is unknown (the
//! client gave up after its rounds over the replicas) forks each state into "applied once"
//! and "not applied". Before the next operation such an unknown change is given time to
//! settle (partitions healed, 10 s of virtual time: a proposal either delivered or dropped
//! with its crashed sender), so it cannot take effect later. Hence: an acknowledged change
//! missing later, one applied twice (a retry after failover applied again: a create
//! answered "exists", a remove "not found", a stat of the wrong size), a read that misses
//! the client's own acknowledged write, all fail the run. After recovery (every replica
//! running, the network whole) every replica must stand at the same position with the same
//! store, table for table (where it records that it stands in the order included), and each
//! client's listing must be one its model allows. Then (one seed in four) the group idles
//! for longer than the `once` answers are kept: the leader's `ExpireOnce` must have emptied
//! the `once` tables, alike at every replica.
//!
//! Besides single kills and partitions, the fault injector now and then kills the whole group
//! at once and starts it again ([`SimReplicas::kill_all`], [`SimReplicas::start_group`]);
//! every kill loses the store's commits made without sync, so what an acknowledged change
//! must survive is the most advanced store's synced state.

use crate::cluster::SimCluster;
use crate::replicas::{OrderFaults, SimReplicas};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tessera_client::{Client, ClientError, LayoutRequest, Scheme};
use tessera_wire::ManagerError;

/// What a run explores.
#[derive(Debug, Clone)]
pub struct MetadataConfig {
    /// Manager replicas (3 or 5).
    pub replicas: usize,
    /// Clients working at once, each on its own names.
    pub clients: usize,
    /// Operations per client.
    pub operations: usize,
    /// Kill, restart and cut off replicas while the clients work.
    pub faults: bool,
    /// Faults of the network between replicas.
    pub order: OrderFaults,
    /// Spare replicas beyond `replicas`: with some, the fault injector also adds replicas
    /// to the group and removes members (issue 17 item 3), and kills the whole group only
    /// once the group changed (it must start again as the changed group).
    pub spares: usize,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            replicas: 3,
            clients: 2,
            operations: 30,
            faults: true,
            order: OrderFaults::default(),
            spares: 0,
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct MetadataReport {
    /// Operations whose answer was checked against the model (acknowledged or refused).
    pub checked: u64,
    /// Changes acknowledged.
    pub acknowledged_changes: u64,
    /// Operations whose outcome stayed unknown (the client gave up).
    pub unknown: u64,
    /// Replica kills, restarts, partitions.
    pub kills: u64,
    /// Restarts.
    pub restarts: u64,
    /// Partitions.
    pub partitions: u64,
    /// Peer stores installed by restarted replicas.
    pub catch_ups: u64,
    /// Times the whole group was killed and started again.
    pub group_restarts: u64,
    /// Kills that lost commits made without sync.
    pub unsynced_lost: u64,
    /// `ExpireOnce` commands applied, summed over replicas.
    pub once_expiries: u64,
    /// Order datagrams sent and lost.
    pub datagrams: u64,
    /// Of which lost.
    pub datagrams_lost: u64,
    /// Order datagrams not sent: the sender's driver had no address for the replica.
    pub datagrams_unaddressed: u64,
    /// The largest number of namespaces the model allowed at once.
    pub states_max: usize,
    /// Replica group changes that took effect, summed over replicas; spares started to be
    /// added, and removals proposed.
    pub group_changes: u64,
    /// Spares started to be added.
    pub added: u64,
    /// Removals proposed.
    pub removed: u64,
}

impl MetadataReport {
    /// Adds `other`'s counts to these (the larger `states_max`).
    pub fn absorb(&mut self, other: &MetadataReport) {
        self.checked += other.checked;
        self.acknowledged_changes += other.acknowledged_changes;
        self.unknown += other.unknown;
        self.kills += other.kills;
        self.restarts += other.restarts;
        self.partitions += other.partitions;
        self.catch_ups += other.catch_ups;
        self.group_restarts += other.group_restarts;
        self.unsynced_lost += other.unsynced_lost;
        self.once_expiries += other.once_expiries;
        self.datagrams += other.datagrams;
        self.datagrams_lost += other.datagrams_lost;
        self.datagrams_unaddressed += other.datagrams_unaddressed;
        self.states_max = self.states_max.max(other.states_max);
        self.group_changes += other.group_changes;
        self.added += other.added;
        self.removed += other.removed;
    }
}

impl std::fmt::Display for MetadataReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answers checked ({} changes acknowledged), {} unknown, {} replica kills, {} \
             restarts ({} catch-ups from a peer's store), {} whole-group kills, {} kills that \
             lost unsynced commits, {} ExpireOnce applied, {} partitions, {} of {} order \
             datagrams lost ({} not sent: no address), at most {} namespaces followed, {} spares started to be added, {} \
             removals proposed, {} group changes applied (summed over replicas)",
            self.checked,
            self.acknowledged_changes,
            self.unknown,
            self.kills,
            self.restarts,
            self.catch_ups,
            self.group_restarts,
            self.unsynced_lost,
            self.once_expiries,
            self.partitions,
            self.datagrams_lost,
            self.datagrams,
            self.datagrams_unaddressed,
            self.states_max,
            self.added,
            self.removed,
            self.group_changes,
        )
    }
}

/// Runs `seeds` seeds of `config` (or what the environment asks: see
/// [`crate::explore::seed_range`]) and panics with the first failure, its seed and trace;
/// what the runs did, summed, printed under `name`.
pub fn check_seeds(name: &str, config: &MetadataConfig, seeds: u64) -> MetadataReport {
    let (base, count) = crate::explore::seed_range(seeds);
    let started = std::time::Instant::now();
    let mut total = MetadataReport::default();
    for seed in base..base + count {
        match check_metadata(seed, config) {
            Ok(report) => total.absorb(&report),
            Err(failure) => panic!("{name}: {failure}"),
        }
    }
    eprintln!(
        "{name}: seeds {base}..{} passed in {:.1} s: {total}",
        base + count,
        started.elapsed().as_secs_f64()
    );
    total
}

/// A failed run: its seed and what went wrong, with the trace.
#[derive(Debug)]
pub struct MetadataFailure {
    /// The seed.
    pub seed: u64,
    /// What failed.
    pub what: String,
    /// The run's trace.
    pub trace: Vec<String>,
}

impl std::fmt::Display for MetadataFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.what)?;
        writeln!(f, "replay: TESSERA_SIM_SEED={}", self.seed)?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// One client's namespace: name to size (`None`: unknown, a put whose write may be partial).
type Namespace = BTreeMap<String, Option<u64>>;

/// An operation of the workload.
#[derive(Debug, Clone)]
enum Op {
    Create(String),
    /// Create, write `len` bytes, sync.
    Put(String, u64),
    Stat(String),
    Rename(String, String),
    Remove(String),
    List,
}

impl Op {
    fn changes(&self) -> bool {
        !matches!(self, Op::Stat(_) | Op::List)
    }
}

/// What a client saw.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Done,
    Size(u64),
    Listing(BTreeMap<String, u64>),
    /// A definite refusal: "not found" or "exists".
    Refused(&'static str),
    /// Any other error: the outcome is unknown.
    Unknown(String),
}

/// The model's answer to `op` in `state`, and the state after it.
fn step(state: &Namespace, op: &Op) -> (Expect, Namespace) {
    let mut next = state.clone();
    let expect = match op {
        Op::Create(name) | Op::Put(name, _) if state.contains_key(name) => {
            Expect::Refused("exists")
        }
        Op::Create(name) => {
            next.insert(name.clone(), Some(0));
            Expect::Done
        }
        Op::Put(name, len) => {
            next.insert(name.clone(), Some(*len));
            Expect::Done
        }
        Op::Stat(name) => match state.get(name) {
            Some(size) => Expect::Size(*size),
            None => Expect::Refused("not found"),
        },
        Op::Rename(from, to) => match state.get(from).copied() {
            None => Expect::Refused("not found"),
            Some(size) => {
                next.remove(from);
                next.insert(to.clone(), size);
                Expect::Done
            }
        },
        Op::Remove(name) => match next.remove(name) {
            Some(_) => Expect::Done,
            None => Expect::Refused("not found"),
        },
        Op::List => Expect::Listing(state.clone()),
    };
    (expect, next)
}

/// The states after `op` whose outcome is unknown: applied once or not at all (a put that
/// created its file may have written part of it).
fn unknown_step(state: &Namespace, op: &Op) -> Vec<Namespace> {
    let (expect, mut next) = step(state, op);
    if let (Op::Put(name, _), Expect::Done) = (op, &expect) {
        next.insert(name.clone(), None);
    }
    vec![state.clone(), next]
}

/// The model's answer.
#[derive(Debug)]
enum Expect {
    Done,
    Size(Option<u64>),
    Listing(Namespace),
    Refused(&'static str),
}

impl Expect {
    fn allows(&self, answer: &Answer) -> bool {
        match (self, answer) {
            (Expect::Done, Answer::Done) => true,
            (Expect::Size(size), Answer::Size(seen)) => size.is_none_or(|size| size == *seen),
            (Expect::Refused(why), Answer::Refused(seen)) => why == seen,
            (Expect::Listing(model), Answer::Listing(seen)) => {
                model.len() == seen.len()
                    && model.iter().all(|(name, size)| {
                        seen.get(name)
                            .is_some_and(|seen| size.is_none_or(|size| size == *seen))
                    })
            }
            _ => false,
        }
    }
}

/// Most namespaces the checker follows at once (unknown outcomes fork them).
const STATES_MAX: usize = 4096;

/// One client's checker: the namespaces its history allows.
struct Checker {
    states: BTreeSet<Namespace>,
    states_max: usize,
}

impl Checker {
    fn new() -> Checker {
        Checker {
            states: BTreeSet::from([Namespace::new()]),
            states_max: 1,
        }
    }

    /// Takes `answer` to `op`: an error if no allowed state gives it.
    fn take(&mut self, op: &Op, answer: &Answer) -> Result<(), String> {
        let next: BTreeSet<Namespace> = match answer {
            Answer::Unknown(_) => self
                .states
                .iter()
                .flat_map(|state| unknown_step(state, op))
                .collect(),
            answer => self
                .states
                .iter()
                .map(|state| step(state, op))
                .filter(|(expect, _)| expect.allows(answer))
                .map(|(_, next)| next)
                .collect(),
        };
        if next.is_empty() {
            let expected: Vec<String> = self
                .states
                .iter()
                .map(|state| format!("{:?}", step(state, op).0))
                .collect();
            return Err(format!(
                "{op:?} answered {answer:?}; the model allows only {}",
                expected.join(" or ")
            ));
        }
        assert!(next.len() <= STATES_MAX, "too many states to follow");
        self.states = next;
        self.states_max = self.states_max.max(self.states.len());
        Ok(())
    }
}

/// The small layout every file gets.
fn layout() -> LayoutRequest {
    LayoutRequest {
        scheme: Scheme::Raid1,
        stripe_unit: 4096,
        width: Some(2),
    }
}

/// What `client` answers to `op` on its names under `prefix`.
async fn perform(client: &Client, prefix: &str, op: &Op) -> Answer {
    let result: Result<Answer, ClientError> = async {
        match op {
            Op::Create(name) => client.create(name, layout()).await.map(|_| Answer::Done),
            Op::Put(name, len) => {
                let file = client.create(name, layout()).await?;
                let bytes = vec![0xa5; *len as usize];
                client.write_at(&file, 0, &bytes).await?;
                client.sync(&file).await?;
                Ok(Answer::Done)
            }
            Op::Stat(name) => client
                .stat(name)
                .await
                .map(|stat| Answer::Size(stat.meta.size)),
            Op::Rename(from, to) => client.rename(from, to).await.map(|()| Answer::Done),
            Op::Remove(name) => client.remove(name).await.map(|()| Answer::Done),
            Op::List => client.list(prefix).await.map(|files| {
                Answer::Listing(files.into_iter().map(|f| (f.path, f.size)).collect())
            }),
        }
    }
    .await;
    match result {
        Ok(answer) => answer,
        Err(ClientError::Metadata(ManagerError::NotFound(_))) => Answer::Refused("not found"),
        Err(ClientError::Metadata(ManagerError::Exists(_))) => Answer::Refused("exists"),
        Err(error) => Answer::Unknown(error.to_string()),
    }
}

/// A random operation on one of four names under `prefix`.
fn draw(rng: &mut StdRng, prefix: &str) -> Op {
    let kind = rng.gen_range(0..12);
    let mut name = || format!("{prefix}{}", rng.gen_range(0..4));
    match kind {
        0..=2 => Op::Create(name()),
        3..=4 => {
            let name = name();
            let len = rng.gen_range(1..3000);
            Op::Put(name, len)
        }
        5..=6 => Op::Stat(name()),
        7..=8 => {
            let from = name();
            Op::Rename(from, name())
        }
        9..=10 => Op::Remove(name()),
        _ => Op::List,
    }
}

/// Shared by the clients and the fault injector.
struct Shared {
    trace: std::sync::Mutex<Vec<String>>,
}

/// One client's run: its operations, checked as they go.
async fn client_run(
    cluster: Arc<SimCluster>,
    index: usize,
    seed: u64,
    operations: usize,
    shared: Arc<Shared>,
) -> Result<(Checker, u64, u64, u64), String> {
    let mut rng = StdRng::seed_from_u64(seed ^ ((index as u64 + 1) * 0x9e37_79b9));
    let prefix = format!("/c{index}-");
    let client = cluster.client();
    let mut checker = Checker::new();
    let (mut checked, mut acknowledged, mut unknown) = (0, 0, 0);
    for _ in 0..operations {
        let op = draw(&mut rng, &prefix);
        let answer = perform(&client, &prefix, &op).await;
        let line = format!("client {index}: {op:?} -> {answer:?}");
        shared.trace.lock().unwrap().push(line);
        if let Answer::Unknown(_) = answer {
            unknown += 1;
            if op.changes() {
                // Let an unknown change settle: delivered, or dropped with its sender.
                if let Some(replicas) = cluster.replicas() {
                    replicas.heal();
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        } else {
            checked += 1;
            acknowledged += u64::from(op.changes() && answer == Answer::Done);
        }
        checker.take(&op, &answer)?;
    }
    Ok((checker, checked, acknowledged, unknown))
}

/// One fault draw in this many, with every replica up and joined, kills the whole group.
const GROUP_KILL_ODDS: u32 = 25;

/// Kills, restarts and cuts off replicas at random network calls until `done`, never more
/// than a minority at once, and now and then the whole group: returns the partitions made.
async fn inject_faults(
    cluster: Arc<SimCluster>,
    seed: u64,
    done: Arc<std::sync::atomic::AtomicBool>,
    shared: Arc<Shared>,
) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    let replicas = cluster.replicas().expect("replicated");
    let membership = replicas.count() > replicas.members().len();
    let mut partitions = 0;
    let mut cut: BTreeSet<usize> = BTreeSet::new();
    // With spares, the whole group is killed only after a change of it.
    let mut changed = false;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let calls = cluster.network.stats().calls + rng.gen_range(1..12);
        let reached = cluster.network.calls_reached(calls);
        let _ = tokio::time::timeout(Duration::from_secs(2), reached).await;
        tokio::time::sleep(Duration::from_micros(rng.gen_range(0..2000))).await;
        // Faults touch the group's members only (spares are added and removed below).
        let members = replicas.members();
        let minority = (members.len() - 1) / 2;
        let down: Vec<usize> = (members.iter().copied())
            .filter(|&i| !replicas.is_running(i))
            .collect();
        // A replica restarted counts as faulty until it is a member again: the order is
        // safe while a majority keeps its memory, and live while a majority answers.
        let faulty = (members.iter())
            .filter(|&&i| !replicas.is_healthy(i))
            .count();
        let undo = !down.is_empty() || !cut.is_empty();
        let action = rng.gen_range(0..10);
        if membership && !undo && faulty == 0 && rng.gen_range(0..MEMBERSHIP_ODDS) == 0 {
            let what = change_membership(replicas, &members, &mut rng).await;
            shared.trace.lock().unwrap().push(what);
            changed = true;
            continue;
        }
        let whole = !membership || (changed && faulty == 0);
        if whole && !undo && rng.gen_range(0..GROUP_KILL_ODDS) == 0 {
            let what = format!("every replica killed ({})", replicas.describe());
            shared.trace.lock().unwrap().push(what);
            replicas.kill_all();
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..500))).await;
            replicas.start_group();
            shared
                .trace
                .lock()
                .unwrap()
                .push("the group started again".into());
            continue;
        }
        let what = if undo && (faulty >= minority || action < 5) {
            match (down.first(), cut.first().copied()) {
                (Some(&index), _) => {
                    replicas.restart(index);
                    format!("replica {} restarted", index + 1)
                }
                (None, Some(index)) => {
                    replicas.partition(index, false);
                    cut.remove(&index);
                    format!("replica {} healed", index + 1)
                }
                (None, None) => unreachable!("a fault to undo"),
            }
        } else if faulty < minority {
            let index = match (action < 4, replicas.leader()) {
                (true, Some(leader)) => leader,
                _ => members[rng.gen_range(0..members.len())],
            };
            if action < 7 {
                replicas.kill(index);
                format!("replica {} killed ({})", index + 1, replicas.describe())
            } else {
                replicas.partition(index, true);
                cut.insert(index);
                partitions += 1;
                format!("replica {} cut off", index + 1)
            }
        } else {
            continue;
        };
        shared.trace.lock().unwrap().push(what);
    }
    partitions
}

/// One draw in this many, with every member healthy and spares configured, changes the
/// group instead of injecting a fault.
const MEMBERSHIP_ODDS: u32 = 4;

/// Adds a spare to the group (`members` has fewer than every replica) or removes a member
/// (at least 3 stay), through a normal member, and waits until the change is applied and
/// the new group runs: then a removed replica is killed (a removed node is stopped only
/// once a majority of the new group runs the change). What happened, for the trace.
async fn change_membership(replicas: &SimReplicas, members: &[usize], rng: &mut StdRng) -> String {
    let spares: Vec<usize> = (0..replicas.count())
        .filter(|i| !members.contains(i) && !replicas.is_running(*i))
        .collect();
    let add = !spares.is_empty() && (members.len() <= 3 || rng.gen_bool(0.5));
    let index = match add {
        true => spares[rng.gen_range(0..spares.len())],
        false => members[rng.gen_range(0..members.len())],
    };
    let via = (members.iter().copied()).find(|&m| m != index && replicas.is_healthy(m));
    let Some(via) = via else {
        return "no member to propose a change".into();
    };
    if add {
        replicas.add(index);
    }
    if !replicas.change_group(via, index, add) {
        if add {
            replicas.kill(index);
        }
        return format!("replica {} could not propose a change", via + 1);
    }
    let verb = if add { "added" } else { "removed" };
    // The change is applied within a view change; a lost race (another change took the
    // epoch) leaves the group as it was, and the spare is stopped again.
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = replicas.members();
        if now.contains(&index) != add {
            continue;
        }
        if add {
            return format!(
                "replica {} {verb} by {} ({})",
                index + 1,
                via + 1,
                replicas.describe()
            );
        }
        let healthy = now.iter().filter(|&&m| replicas.is_healthy(m)).count();
        if healthy > now.len() / 2 {
            replicas.kill(index);
            return format!(
                "replica {} {verb} by {} and stopped ({})",
                index + 1,
                via + 1,
                replicas.describe()
            );
        }
    }
    if add && !replicas.members().contains(&index) {
        replicas.kill(index);
        return format!(
            "replica {}'s addition was not applied in 2 s: stopped",
            index + 1
        );
    }
    format!(
        "replica {} {verb} by {}, the new group not running in 2 s",
        index + 1,
        via + 1
    )
}

/// Runs one seed on a fresh virtual runtime.
pub fn check_metadata(
    seed: u64,
    config: &MetadataConfig,
) -> Result<MetadataReport, MetadataFailure> {
    let shared = Arc::new(Shared {
        trace: std::sync::Mutex::new(Vec::new()),
    });
    let result = crate::run_virtual(run(seed, config.clone(), shared.clone()));
    let trace = shared.trace.lock().unwrap().clone();
    result.map_err(|what| MetadataFailure { seed, what, trace })
}

async fn run(
    seed: u64,
    config: MetadataConfig,
    shared: Arc<Shared>,
) -> Result<MetadataReport, String> {
    let cluster = SimCluster::start_replicated_with_spares(
        seed,
        4,
        config.replicas,
        config.spares,
        config.order,
    )
    .await;
    let cluster = Arc::new(cluster);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let injector = config.faults.then(|| {
        tokio::spawn(inject_faults(
            cluster.clone(),
            seed,
            done.clone(),
            shared.clone(),
        ))
    });
    let clients: Vec<_> = (0..config.clients)
        .map(|index| {
            tokio::spawn(client_run(
                cluster.clone(),
                index,
                seed,
                config.operations,
                shared.clone(),
            ))
        })
        .collect();
    let mut report = MetadataReport::default();
    let mut checkers = Vec::new();
    let mut failed = None;
    for client in clients {
        match client.await.expect("client task") {
            Ok((checker, checked, acknowledged, unknown)) => {
                report.checked += checked;
                report.acknowledged_changes += acknowledged;
                report.unknown += unknown;
                report.states_max = report.states_max.max(checker.states_max);
                checkers.push(checker);
            }
            Err(what) => failed = failed.or(Some(what)),
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(injector) = injector {
        report.partitions = injector.await.expect("fault injector");
    }
    if let Some(what) = failed {
        return Err(what);
    }
    let replicas = cluster.replicas().expect("replicated");
    recover(replicas).await?;
    check_final(&cluster, &mut checkers).await?;
    if seed.is_multiple_of(ONCE_EXPIRY_CHECKED_EVERY) {
        check_once_expired(replicas).await?;
    }
    let stats = replicas.stats();
    report.kills = stats.kills;
    report.restarts = stats.restarts;
    report.catch_ups = stats.catch_ups;
    report.group_restarts = stats.group_restarts;
    report.unsynced_lost = stats.unsynced_lost;
    report.once_expiries = stats.once_expiries;
    report.group_changes = stats.group_changes;
    report.added = stats.added;
    report.removed = stats.removed;
    report.datagrams = stats.datagrams;
    report.datagrams_lost = stats.datagrams_lost;
    report.datagrams_unaddressed = stats.datagrams_unaddressed;
    let failures = replicas.failures();
    if !failures.is_empty() {
        return Err(format!("replica stores failed: {failures:?}"));
    }
    Ok(report)
}

/// Heals the network, restarts every replica, and waits until all stand at the same
/// position with the same store.
async fn recover(replicas: &SimReplicas) -> Result<(), String> {
    replicas.heal();
    let mut last = Vec::new();
    for _ in 0..300 {
        // The members as the most advanced store has them, each round: a removal still in
        // flight when the recovery began takes effect meanwhile (seed 1474 of five
        // replicas once restarted a member whose removal then applied: down when removed,
        // it asked to join for ever and never stood where the others did).
        let members = replicas.members();
        // A replica removed whose new group did not run in time is stopped now.
        for index in (0..replicas.count()).filter(|index| !members.contains(index)) {
            replicas.kill(index);
        }
        for &index in &members {
            replicas.restart(index);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Where a store records that it stands in the order is compared too: it once
        // recorded where the last batch of deliveries ended, which is each replica's own
        // timing (seed 18: 92 at one replica, 96 at another, both applied to 492).
        let dumps = replicas.dumps();
        let same = dumps.len() == members.len()
            && dumps
                .windows(2)
                .all(|pair| pair[0].1 == pair[1].1 && pair[0].2 == pair[1].2);
        if same {
            return views_settle(replicas).await;
        }
        last = dumps;
    }
    let positions: Vec<String> = last
        .iter()
        .map(|(index, position, dump)| {
            format!(
                "replica {}: position {position}, {} records",
                index + 1,
                dump.len()
            )
        })
        .collect();
    let first_difference = last.windows(2).find_map(|pair| {
        let (a, b) = (&pair[0].2, &pair[1].2);
        a.iter()
            .zip(b.iter())
            .find(|(x, y)| x != y)
            .map(|(x, y)| format!("{x} / {y}"))
    });
    Err(format!(
        "replicas do not converge after recovery ({}): {}; first difference: {first_difference:?}",
        replicas.describe(),
        positions.join("; ")
    ))
}

/// With the network healed and every member running and in step, the group must settle in
/// a view: views changing on and on mean some member cannot hear another (they once did,
/// a view every 250 ms, when a replica that caught up by copying a store had no address
/// for a member the copy added). One or two changes are allowed: a replica restarted by
/// the recovery may still be let in, and a lost heartbeat may start one.
async fn views_settle(replicas: &SimReplicas) -> Result<(), String> {
    let before = replicas.views();
    tokio::time::sleep(VIEWS_SETTLED).await;
    let after = replicas.views();
    let changes = after
        .iter()
        .map(|&(index, view)| {
            let was = before
                .iter()
                .find(|&&(i, _)| i == index)
                .map_or(0, |&(_, v)| v);
            view.saturating_sub(was)
        })
        .max()
        .unwrap_or(0);
    if changes <= VIEW_CHANGES_SETTLING_MAX {
        return Ok(());
    }
    Err(format!(
        "the healed group changed view {changes} times in {} s after recovery: {before:?} then \
         {after:?} ({})",
        VIEWS_SETTLED.as_secs(),
        replicas.describe()
    ))
}

/// How long the healed group is watched (twelve suspicion timeouts).
const VIEWS_SETTLED: Duration = Duration::from_secs(3);

/// View changes allowed meanwhile.
const VIEW_CHANGES_SETTLING_MAX: u64 = 2;

/// One seed in this many ends with [`check_once_expired`]: its idle time (longer than a
/// client retries) costs more than the rest of the run.
const ONCE_EXPIRY_CHECKED_EVERY: u64 = 4;

/// Idles for longer than the `once` answers are kept (every client is idle now): the
/// leader's `ExpireOnce` must empty every replica's `once` tables, and the stores must stay
/// identical.
async fn check_once_expired(replicas: &SimReplicas) -> Result<(), String> {
    let expiry = replicas.once_expiry();
    tokio::time::sleep(expiry + expiry / 4).await;
    recover(replicas).await?;
    for (index, _, dump) in replicas.dumps() {
        let left = dump.iter().filter(|line| line.starts_with("once")).count();
        if left > 0 {
            return Err(format!(
                "replica {}: {left} once records left {} s after every client went idle",
                index + 1,
                (expiry + expiry / 4).as_secs()
            ));
        }
    }
    Ok(())
}

/// Every client's names, listed by a new client after recovery, must be a namespace its
/// model allows.
async fn check_final(cluster: &SimCluster, checkers: &mut [Checker]) -> Result<(), String> {
    let client = cluster.client();
    for (index, checker) in checkers.iter_mut().enumerate() {
        let prefix = format!("/c{index}-");
        let answer = perform(&client, &prefix, &Op::List).await;
        if let Answer::Unknown(why) = &answer {
            return Err(format!("client {index}'s final listing failed: {why}"));
        }
        checker
            .take(&Op::List, &answer)
            .map_err(|what| format!("after recovery, client {index}: {what}"))?;
    }
    Ok(())
}
