//! A deterministic simulator of the paper's two-switch topology, for [`Node`]s.
//!
//! Every packet a node sends crosses its TX link into switch A, then the one link from A to
//! B (the *sequencer*: a FIFO queue serializing at `trunk_rate_bits_per_s`), then fans out
//! through switch B over each node's RX link (a packet for one node goes the same way and
//! is delivered to that node only). Loss can strike on a TX link, on the trunk or on an RX
//! link; rarely an RX link delays a packet past later ones (reordering, to show that safety
//! does not depend on FIFO) or delivers it twice. Nodes crash (losing everything) and restart with a higher
//! incarnation; nodes are cut off (partitions). Virtual time jumps from one event to the
//! next. Until `faults_until_us` the faults run; then the network heals, crashed nodes
//! restart, and the run goes on until everything settles or `deadline_us`.
//!
//! Everything is drawn from the seed: [`run`] with the same seed and scenario replays the
//! same run, and [`Scenario::random`] derives a scenario from a seed, so one number names a
//! failing run.
//!
//! ```
//! use tessera_order::{check, sim};
//!
//! let scenario = sim::Scenario::random(7);
//! let outcome = sim::run(7, &scenario);
//! check::check(&outcome.history).expect("UTO1-4 and FIFO hold");
//! ```

use crate::check::{History, Process};
use crate::{
    Config, Event, Group, GroupChange, GroupRecord, Micros, Node, NodeId, Role, SenderId, Start,
    Transmit,
};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Which faults strike, and how often, until `faults_until_us`.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Probability that a packet is lost on its sender's TX link (all receivers miss it).
    pub loss_tx: f64,
    /// Probability that a packet is lost on the trunk.
    pub loss_trunk: f64,
    /// Probability that one receiver misses a packet (on its RX link).
    pub loss_rx: f64,
    /// The nodes whose RX links `loss_rx` strikes (bit `i`: node `i`); the others miss
    /// nothing there. `u64::MAX`: every node.
    pub loss_rx_nodes: u64,
    /// Probability that a packet is delayed on an RX link past later ones.
    pub reorder: f64,
    /// Probability that an RX link delivers a packet twice.
    pub duplicate: f64,
    /// Mean time between crashes; `None`: no crash.
    pub crash_every_us: Option<Micros>,
    /// Longest a crashed node stays down.
    pub down_us_max: Micros,
    /// Mean time between partitions (a node cut off); `None`: none.
    pub partition_every_us: Option<Micros>,
    /// Longest a partition lasts.
    pub partition_us_max: Micros,
}

impl Faults {
    /// No fault at all.
    pub fn none() -> Faults {
        Faults {
            loss_tx: 0.0,
            loss_trunk: 0.0,
            loss_rx: 0.0,
            loss_rx_nodes: u64::MAX,
            reorder: 0.0,
            duplicate: 0.0,
            crash_every_us: None,
            down_us_max: 0,
            partition_every_us: None,
            partition_us_max: 0,
        }
    }
}

/// A run's setting: the group, the workload, the network and the faults.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The group.
    pub group: Group,
    /// Every node's config.
    pub config: Config,
    /// Messages each sender proposes (if up at the time).
    pub messages_per_sender: usize,
    /// Largest message, bytes (each at least 8).
    pub message_bytes_max: usize,
    /// Smallest message, bytes (at least 8; sizes are uniform between the two).
    pub message_bytes_min: usize,
    /// Proposals are spread over `0..propose_until_us`.
    pub propose_until_us: Micros,
    /// The faults.
    pub faults: Faults,
    /// Faults stop here; the network heals and crashed nodes restart.
    pub faults_until_us: Micros,
    /// The run ends here at the latest.
    pub deadline_us: Micros,
    /// One-way delay of each link.
    pub link_delay_us: Micros,
    /// The sequencer link's rate.
    pub trunk_rate_bits_per_s: u64,
    /// Extra delay of a reordered packet, at most.
    pub reorder_delay_us_max: Micros,
    /// Bytes that may wait in the sequencer link's queue; a packet arriving to a fuller
    /// queue is dropped (drop-tail, as the lab's `tbf` on the trunk does). `None`: no
    /// bound (the queue only delays).
    pub trunk_queue_bytes_max: Option<u64>,
    /// Crashes at given times, `(at, node, down for)`, besides the random ones; they obey
    /// the same limit (never a majority of receivers out) and stop at `faults_until_us`.
    pub scripted_crashes: Vec<(Micros, NodeId, Micros)>,
    /// Node ids past the group's that may be added (as senders and receivers).
    pub spare_nodes: usize,
    /// Mean time between group changes (a spare node added, or a receiver removed: at
    /// most one change under way), until `faults_until_us`; `None`: the group stays.
    pub change_every_us: Option<Micros>,
    /// One node whose RX link delays every packet by this much more (FIFO kept): a
    /// receiver behind the others, as a CPU-starved one in the lab is, its socket buffer
    /// the queue. `None`: none.
    pub slow_receiver: Option<(NodeId, Micros)>,
}

impl Scenario {
    /// A clean 3-node all-to-all run.
    pub fn clean(nodes: usize) -> Scenario {
        Scenario {
            group: Group::all_to_all(nodes),
            config: Config::default(),
            messages_per_sender: 50,
            message_bytes_max: 64,
            message_bytes_min: 8,
            propose_until_us: 20_000,
            faults: Faults::none(),
            faults_until_us: 0,
            deadline_us: 2_000_000,
            link_delay_us: 10,
            trunk_rate_bits_per_s: 1_000_000_000,
            reorder_delay_us_max: 200,
            trunk_queue_bytes_max: None,
            slow_receiver: None,
            scripted_crashes: Vec::new(),
            spare_nodes: 0,
            change_every_us: None,
        }
    }

    /// A scenario drawn from `seed`: 2-5 nodes all-to-all or disjoint, random windows,
    /// thresholds and MTU, loss everywhere, reordering, crashes and partitions.
    pub fn random(seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(crate::log::mix(seed ^ 0x5CE4_A210));
        let group = if rng.gen_bool(0.7) {
            Group::all_to_all(rng.gen_range(2..=5))
        } else {
            Group::disjoint(rng.gen_range(1..=3), rng.gen_range(1..=4))
        };
        let mut config = Config {
            mtu_bytes: if rng.gen_bool(0.5) { 1500 } else { 9000 },
            aggregate: rng.gen_bool(0.8),
            window_packets: rng.gen_range(2..=64),
            ack_every_messages: rng.gen_range(1..=8),
            ack_delay_us: rng.gen_range(10..=200),
            retransmit_after_us: rng.gen_range(500..=3_000),
            heartbeat_interval_us: 1_000,
            suspect_after_us: rng.gen_range(4_000..=12_000),
            view_change_timeout_us: rng.gen_range(5_000..=20_000),
            log_retain_entries: if rng.gen_bool(0.3) {
                rng.gen_range(0..=32)
            } else {
                Config::default().log_retain_entries
            },
            ..Config::default()
        };
        let mut chance = |p: f64, max: f64| {
            if rng.gen_bool(p) {
                rng.gen_range(0.0..max)
            } else {
                0.0
            }
        };
        let faults = Faults {
            loss_tx: chance(0.5, 0.05),
            loss_trunk: chance(0.3, 0.02),
            loss_rx: chance(0.5, 0.05),
            loss_rx_nodes: u64::MAX,
            reorder: chance(0.3, 0.02),
            duplicate: chance(0.2, 0.02),
            crash_every_us: rng.gen_bool(0.4).then(|| rng.gen_range(10_000..=80_000)),
            down_us_max: rng.gen_range(1_000..=60_000),
            partition_every_us: rng.gen_bool(0.4).then(|| rng.gen_range(10_000..=80_000)),
            partition_us_max: rng.gen_range(1_000..=40_000),
        };
        // Drawn last, so that the draws above (and every earlier seed's scenario) stay: small
        // ENTRIES packets in a third of the seeds make repairs span several packets.
        let messages_per_sender = rng.gen_range(1..=40);
        let message_bytes_max = rng.gen_range(8..=200);
        let propose_until_us = rng.gen_range(1_000..=100_000);
        let faults_until_us = rng.gen_range(20_000..=150_000);
        let link_delay_us = rng.gen_range(5..=50);
        if rng.gen_bool(0.3) {
            config.repair_bytes_max = rng.gen_range(100..=2_000);
        }
        // Group changes from a generator of their own, so that every draw above (and the
        // scenarios of seeds before them) stays: in a third of the all-to-all runs, nodes
        // are added and removed while the faults strike.
        let mut changes = StdRng::seed_from_u64(crate::log::mix(seed ^ 0x6E0B_E75C));
        let all_to_all = group.roles.iter().all(|role| role.sender && role.receiver);
        let (spare_nodes, change_every_us) = if all_to_all && changes.gen_bool(0.35) {
            (
                changes.gen_range(1..=2),
                Some(changes.gen_range(5_000..=40_000)),
            )
        } else {
            (0, None)
        };
        Scenario {
            group,
            config,
            messages_per_sender,
            message_bytes_max,
            message_bytes_min: 8,
            propose_until_us,
            faults,
            faults_until_us,
            deadline_us: 3_000_000,
            link_delay_us,
            trunk_rate_bits_per_s: 1_000_000_000,
            reorder_delay_us_max: 300,
            trunk_queue_bytes_max: None,
            slow_receiver: None,
            scripted_crashes: Vec::new(),
            spare_nodes,
            change_every_us,
        }
    }
}

/// What the network and the faults did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Packets nodes sent.
    pub sent: u64,
    /// Packets handed to nodes.
    pub delivered: u64,
    /// Packets lost at random.
    pub lost: u64,
    /// Packets delayed past later ones.
    pub reordered: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Packets dropped at a cut-off or down node.
    pub cut: u64,
    /// Crashes.
    pub crashes: u64,
    /// Partitions.
    pub partitions: u64,
    /// View changes started, summed over nodes.
    pub view_changes: u64,
    /// Bytes that crossed the sequencer link, by packet kind (index: the kind byte).
    pub trunk_bytes_by_kind: [u64; 8],
    /// Packets that crossed the sequencer link, by packet kind (as `trunk_bytes_by_kind`;
    /// kinds past 7 count at 7). Each is one datagram at every receiver: a proxy of the
    /// CPU the lab spends, which the simulated time does not count.
    pub trunk_packets_by_kind: [u64; 8],
    /// Time the sequencer link spent serializing packets, nanoseconds.
    pub trunk_busy_ns: u64,
    /// Packets dropped because the sequencer link's queue was full
    /// ([`Scenario::trunk_queue_bytes_max`]); not counted in `lost`.
    pub trunk_queue_drops: u64,
    /// Packets longer than one UDP datagram ([`DATAGRAM_BYTES_MAX`]), dropped as a UDP
    /// driver must.
    pub oversized: u64,
    /// Group changes proposed (again, if one was not delivered in time), and delivered
    /// with effect: nodes added, nodes removed.
    pub changes_proposed: u64,
    /// See `changes_proposed`.
    pub nodes_added: u64,
    /// See `changes_proposed`.
    pub nodes_removed: u64,
    /// With read leases: moments a node held one (checked at the end of every step).
    pub leased_checks: u64,
    /// With read leases: moments a node held one while another node had delivered past
    /// its log's end (a read under the lease could miss an acknowledged change).
    pub lease_violations: u64,
}

/// Largest UDP payload over IPv4: longer packets cannot be sent, here as over UDP.
pub const DATAGRAM_BYTES_MAX: usize = 65_507;

/// A finished run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed that replays it.
    pub seed: u64,
    /// Every proposal and delivery, for [`crate::check::check`].
    pub history: History,
    /// What the network did.
    pub stats: NetworkStats,
    /// Virtual time at the end.
    pub end_us: Micros,
    /// Everything settled before the deadline (every correct node delivered the same).
    pub settled_early: bool,
    /// What each node's last incarnation counted.
    pub node_stats: Vec<crate::Stats>,
    /// Each node's state at the end, one line each.
    pub node_summaries: Vec<String>,
    /// Virtual time of the last UTO delivery at any node (the end of a closed run's work,
    /// for throughput in simulated time).
    pub last_delivery_us: Micros,
}

/// Steps without virtual time advancing after which a run is declared a livelock.
pub const STEPS_AT_ONE_TIME_MAX: u64 = 100_000;

struct Host {
    /// In the group (or being added): it runs, crashes and restarts.
    active: bool,
    node: Option<Node>,
    incarnation: u32,
    process: usize,
    down_until: Option<Micros>,
    cut_until: Micros,
    view_changes_before: u64,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    seed: u64,
    rng: StdRng,
    now: Micros,
    hosts: Vec<Host>,
    queue: BTreeMap<(Micros, u64), (usize, Vec<u8>)>,
    scheduled: u64,
    trunk_free_ns: u128,
    proposals: Vec<(Micros, usize)>,
    next_crash: Option<Micros>,
    next_partition: Option<Micros>,
    healed: bool,
    history: History,
    stats: NetworkStats,
    last_delivery_us: Micros,
    /// The group after every change delivered so far (by any node).
    group: GroupRecord,
    /// The change under way, and when it was last proposed.
    change: Option<(GroupChange, Micros)>,
    /// Removed nodes still running, with the epoch that removed them: stopped once a
    /// majority of the new group runs it (as an operator stops a removed process once the
    /// change took effect; stopped at once, a removed member that alone delivered its
    /// removal could leave the old group without a majority holding state).
    retiring: Vec<(usize, u32)>,
    next_change: Option<Micros>,
}

/// A change not delivered this long after it was proposed is proposed again (its proposer
/// may have crashed).
const CHANGE_RETRY_US: Micros = 30_000;

/// Every node of `group` as a member of view 0 (`Start::Initial`, incarnation 0), each
/// seeded by its number: the cluster of a test or example that runs the nodes itself.
pub fn initial_nodes(config: &Config, group: &Group) -> Vec<Node> {
    (0..group.roles.len())
        .map(|i| {
            let id = NodeId(i as u16);
            Node::new(
                config.clone(),
                group.clone(),
                id,
                0,
                Start::Initial,
                i as u64,
                0,
            )
        })
        .collect()
}

/// Runs `scenario` with `seed`.
pub fn run(seed: u64, scenario: &Scenario) -> Outcome {
    let mut sim = Sim::new(seed, scenario);
    let settled_early = sim.run();
    sim.history.settled = true;
    for host in &sim.hosts {
        if let Some(node) = &host.node {
            sim.stats.view_changes += node.stats().view_changes;
        }
        sim.stats.view_changes += host.view_changes_before;
    }
    let node_stats = sim
        .hosts
        .iter()
        .map(|host| {
            host.node
                .as_ref()
                .map(|node| node.stats().clone())
                .unwrap_or_default()
        })
        .collect();
    let node_summaries = sim
        .hosts
        .iter()
        .map(|host| host.node.as_ref().map_or("down".to_string(), Node::summary))
        .collect();
    Outcome {
        seed,
        node_stats,
        node_summaries,
        history: sim.history,
        stats: sim.stats,
        end_us: sim.now,
        last_delivery_us: sim.last_delivery_us,
        settled_early,
    }
}

fn node_seed(seed: u64, host: usize, incarnation: u32) -> u64 {
    crate::log::mix(seed ^ crate::log::mix(host as u64 + 1) ^ u64::from(incarnation) << 40)
}

impl<'a> Sim<'a> {
    fn new(seed: u64, scenario: &'a Scenario) -> Sim<'a> {
        let mut rng = StdRng::seed_from_u64(crate::log::mix(seed));
        let mut proposals = Vec::new();
        for (i, role) in scenario.group.roles.iter().enumerate() {
            if role.sender {
                for _ in 0..scenario.messages_per_sender {
                    proposals.push((rng.gen_range(0..=scenario.propose_until_us), i));
                }
            }
        }
        proposals.sort_unstable_by(|a, b| b.cmp(a));
        let mut sim = Sim {
            scenario,
            seed,
            rng,
            now: 0,
            hosts: Vec::new(),
            queue: BTreeMap::new(),
            scheduled: 0,
            trunk_free_ns: 0,
            proposals,
            next_crash: None,
            next_partition: None,
            healed: false,
            history: History::default(),
            stats: NetworkStats::default(),
            last_delivery_us: 0,
            group: GroupRecord::initial(&scenario.group),
            change: None,
            retiring: Vec::new(),
            next_change: None,
        };
        sim.next_crash = sim.draw(scenario.faults.crash_every_us);
        sim.next_partition = sim.draw(scenario.faults.partition_every_us);
        sim.next_change = sim.draw(scenario.change_every_us);
        let nodes = scenario.group.roles.len();
        for i in 0..nodes + scenario.spare_nodes {
            sim.hosts.push(Host {
                active: i < nodes,
                node: None,
                incarnation: 0,
                process: 0,
                down_until: None,
                cut_until: 0,
                view_changes_before: 0,
            });
            if i < nodes {
                sim.boot(i, Start::Initial);
            }
        }
        sim
    }

    /// A node's role in the group as it stands.
    fn role(&self, host: usize) -> Role {
        let bit = 1u64 << host;
        Role {
            sender: self.group.senders & bit != 0,
            receiver: self.group.receivers & bit != 0,
        }
    }

    fn draw(&mut self, every: Option<Micros>) -> Option<Micros> {
        every.map(|mean| self.now + self.rng.gen_range(1..=2 * mean))
    }

    fn boot(&mut self, host: usize, start: Start) {
        let id = NodeId(host as u16);
        let incarnation = self.hosts[host].incarnation;
        let node = Node::new(
            self.scenario.config.clone(),
            self.scenario.group.clone(),
            id,
            incarnation,
            start,
            node_seed(self.seed, host, incarnation),
            self.now,
        );
        // A node being added counts as a receiver: it must deliver once it is one.
        let adding = self
            .change
            .is_some_and(|(change, _)| change.node == id && change.role.receiver);
        let receiver = self.role(host).receiver || adding;
        self.history.processes.push(Process {
            node: id,
            incarnation,
            receiver,
            ..Process::default()
        });
        let entry = &mut self.hosts[host];
        entry.process = self.history.processes.len() - 1;
        entry.node = Some(node);
        entry.down_until = None;
        self.flush(host);
    }

    /// Runs to the deadline or until settled; whether it settled.
    fn run(&mut self) -> bool {
        let mut settle_check = 0;
        let mut steps_now = 0;
        loop {
            if !self.healed && self.now >= self.scenario.faults_until_us {
                self.heal();
            }
            if self.healed && self.now >= settle_check {
                settle_check = self.now + 1_000;
                if self.settled() {
                    return true;
                }
            }
            let Some(next) = self.next_time() else {
                return self.settled();
            };
            if next > self.scenario.deadline_us {
                return false;
            }
            steps_now = if next == self.now { steps_now + 1 } else { 0 };
            assert!(
                steps_now < STEPS_AT_ONE_TIME_MAX,
                "livelock at {next} µs (seed {})",
                self.seed
            );
            self.now = next;
            self.step();
        }
    }

    fn next_time(&self) -> Option<Micros> {
        let mut next = self.queue.keys().next().map(|&(at, _)| at);
        let mut consider = |at: Option<Micros>| {
            if let Some(at) = at {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        };
        for host in &self.hosts {
            consider(host.node.as_ref().and_then(Node::poll_timeout));
            consider(host.down_until);
        }
        consider(self.proposals.last().map(|p| p.0));
        consider(self.change.map(|(_, at)| at + CHANGE_RETRY_US));
        if !self.healed {
            consider(self.next_crash);
            consider(self.next_partition);
            consider(self.next_change);
            consider(
                self.scenario
                    .scripted_crashes
                    .iter()
                    .map(|c| c.0)
                    .filter(|&at| at > self.now)
                    .min(),
            );
            consider(Some(self.scenario.faults_until_us));
        }
        next.map(|at| at.max(self.now))
    }

    fn step(&mut self) {
        let now = self.now;
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (host, bytes) = entry.remove();
            self.arrive(host, &bytes);
        }
        for host in 0..self.hosts.len() {
            if self.hosts[host].active && self.hosts[host].down_until.is_some_and(|at| at <= now) {
                self.hosts[host].incarnation += 1;
                self.boot(host, Start::Restarted);
            }
            let due = self.hosts[host]
                .node
                .as_ref()
                .and_then(Node::poll_timeout)
                .is_some_and(|at| at <= now);
            if due {
                self.hosts[host]
                    .node
                    .as_mut()
                    .expect("up")
                    .handle_timeout(now);
                self.flush(host);
            }
        }
        while self.proposals.last().is_some_and(|p| p.0 <= now) {
            let (_, host) = self.proposals.pop().expect("last exists");
            self.propose(host);
        }
        if !self.retiring.is_empty() {
            self.retire();
        }
        if self.scenario.config.read_leases {
            self.check_leases();
        }
        if self
            .change
            .is_some_and(|(_, at)| now >= at + CHANGE_RETRY_US)
        {
            self.propose_change();
        }
        if !self.healed {
            self.faults();
            if self.next_change.is_some_and(|at| at <= now) {
                self.next_change = self.draw(self.scenario.change_every_us);
                self.start_change();
            }
        }
    }

    /// Every node that holds a read lease now has a log that reaches past every position
    /// any node delivered (see `node/lease.rs`); counted, not asserted.
    fn check_leases(&mut self) {
        let nodes = || self.hosts.iter().filter_map(|host| host.node.as_ref());
        let delivered = nodes().map(Node::delivered).max().unwrap_or(0);
        let now = self.now;
        let leased: Vec<u64> = nodes()
            .filter(|node| node.read_lease_ends().is_some_and(|end| now < end))
            .map(Node::log_end)
            .collect();
        self.stats.leased_checks += leased.len() as u64;
        let short = leased.iter().filter(|&&end| delivered > end).count();
        self.stats.lease_violations += short as u64;
    }

    fn propose(&mut self, host: usize) {
        let incarnation = self.hosts[host].incarnation;
        let Some(node) = self.hosts[host].node.as_mut() else {
            return;
        };
        let sender = SenderId {
            node: NodeId(host as u16),
            incarnation,
        };
        let index = self.history.proposals.get(&sender).map_or(0, Vec::len) as u32;
        let max = self.scenario.message_bytes_max.max(8);
        let len = self
            .rng
            .gen_range(self.scenario.message_bytes_min.clamp(8, max)..=max);
        let mut message = vec![0u8; len];
        message[..2].copy_from_slice(&(host as u16).to_be_bytes());
        message[2..4].copy_from_slice(&(incarnation as u16).to_be_bytes());
        message[4..8].copy_from_slice(&index.to_be_bytes());
        self.rng.fill(&mut message[8..]);
        let message = Bytes::from(message);
        if node.propose(message.clone(), self.now).is_ok() {
            self.history
                .proposals
                .entry(sender)
                .or_default()
                .push(message);
        }
        self.flush(host);
    }

    fn arrive(&mut self, host: usize, bytes: &[u8]) {
        let cut = self.hosts[host].cut_until > self.now;
        let Some(node) = self.hosts[host].node.as_mut().filter(|_| !cut) else {
            self.stats.cut += 1;
            return;
        };
        self.stats.delivered += 1;
        node.handle_packet(bytes, self.now);
        self.flush(host);
    }

    /// Drains a node's outputs: packets into the network, events into the history.
    fn flush(&mut self, host: usize) {
        let now = self.now;
        let process = self.hosts[host].process;
        let Some(node) = self.hosts[host].node.as_mut() else {
            return;
        };
        let mut transmits = Vec::new();
        let mut changes = Vec::new();
        while let Some(transmit) = node.poll_transmit(now) {
            transmits.push(transmit);
        }
        let process = &mut self.history.processes[process];
        while let Some(event) = node.poll_event() {
            match event {
                Event::Deliver {
                    position,
                    id,
                    message,
                } => {
                    process.deliveries.push((position, id, message));
                    self.last_delivery_us = now;
                }
                Event::Joined { position } => {
                    process.joined_at.get_or_insert(position);
                }
                Event::Gap { from, to } => process.gaps.push((from, to)),
                Event::GroupChange {
                    position,
                    id,
                    change,
                    message,
                } => {
                    process.deliveries.push((position, id, message));
                    changes.push(change);
                }
                _ => {}
            }
        }
        for transmit in transmits {
            self.send(host, transmit);
        }
        for change in changes {
            self.group_changed(change);
        }
    }

    /// A group change was delivered: the first delivery of the next epoch's change makes
    /// the group; a removed node is stopped (its operator's part).
    fn group_changed(&mut self, change: GroupChange) {
        let Some(next) = self.group.apply(&change) else {
            return;
        };
        self.group = next;
        if self
            .change
            .is_some_and(|(pending, _)| pending.node == change.node)
        {
            self.change = None;
        }
        let host = usize::from(change.node.0);
        if change.role.receiver {
            self.stats.nodes_added += 1;
            return;
        }
        self.stats.nodes_removed += 1;
        self.retiring.push((host, change.epoch));
    }

    /// Stops the removed nodes whose removal a majority of the new group runs.
    fn retire(&mut self) {
        let receivers = self.group.receivers;
        let running = |sim: &Sim<'_>, epoch: u32| {
            let normal = (0..sim.hosts.len())
                .filter(|&host| receivers & 1 << host != 0)
                .filter(|&host| {
                    sim.hosts[host].node.as_ref().is_some_and(|node| {
                        node.status() == crate::Status::Normal && node.group_record().epoch >= epoch
                    })
                })
                .count();
            normal > receivers.count_ones() as usize / 2
        };
        let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|&(_, epoch)| running(self, epoch));
        self.retiring = left;
        for (host, _) in done {
            let entry = &mut self.hosts[host];
            entry.active = false;
            entry.down_until = None;
            if let Some(node) = entry.node.take() {
                entry.view_changes_before += node.stats().view_changes;
                self.history.processes[entry.process].crashed = true;
            }
        }
    }

    /// Starts a group change, if none is under way: adds a spare node (booted now, as an
    /// operator starts the process and then adds it) or removes a receiver, whichever keeps
    /// a majority of every group concerned holding state.
    fn start_change(&mut self) {
        if self.change.is_some() || !self.retiring.is_empty() {
            return;
        }
        let receivers = self.group.receivers;
        let spare: Vec<usize> = (0..self.hosts.len())
            .filter(|&host| !self.hosts[host].active && receivers & 1 << host == 0)
            .collect();
        let add = !spare.is_empty() && (receivers.count_ones() < 3 || self.rng.gen_bool(0.5));
        let (host, role) = if add {
            let host = spare[self.rng.gen_range(0..spare.len())];
            let both = Role {
                sender: true,
                receiver: true,
            };
            (host, both)
        } else {
            let members = crate::node::members_of(receivers);
            if members.len() <= 2 {
                return;
            }
            let host = members[self.rng.gen_range(0..members.len())].0 as usize;
            let none = Role {
                sender: false,
                receiver: false,
            };
            (host, none)
        };
        let bit = 1u64 << host;
        let next = if add {
            receivers | bit
        } else {
            receivers & !bit
        };
        // The added node counts as out (it is not up yet, and will hold nothing); a removed
        // one is not in `next`.
        let out_next = self.receivers_out(next);
        if out_next > (next.count_ones() as usize - 1) / 2 {
            return;
        }
        let change = GroupChange {
            epoch: self.group.epoch + 1,
            node: NodeId(host as u16),
            role,
        };
        self.change = Some((change, self.now));
        if add {
            self.hosts[host].active = true;
            self.hosts[host].incarnation += 1;
            self.boot(host, Start::Added);
        }
        self.propose_change();
    }

    /// Proposes the change under way through a node of the group that is up.
    fn propose_change(&mut self) {
        let Some((change, _)) = self.change else {
            return;
        };
        self.change = Some((change, self.now));
        let senders: Vec<usize> = (0..self.hosts.len())
            .filter(|&host| self.role(host).sender && self.hosts[host].node.is_some())
            .collect();
        if senders.is_empty() {
            return;
        }
        let host = senders[self.rng.gen_range(0..senders.len())];
        let incarnation = self.hosts[host].incarnation;
        let node = self.hosts[host].node.as_mut().expect("up");
        let Ok(proposed) = node.propose_group_change(change.node, change.role, self.now) else {
            return;
        };
        self.stats.changes_proposed += 1;
        let sender = SenderId {
            node: NodeId(host as u16),
            incarnation,
        };
        self.history
            .proposals
            .entry(sender)
            .or_default()
            .push(proposed.encode());
        self.flush(host);
    }

    /// TX link, the sequencer link (FIFO), then switch B fans out over the RX links.
    fn send(&mut self, host: usize, transmit: Transmit) {
        self.stats.sent += 1;
        if transmit.contents.len() > DATAGRAM_BYTES_MAX {
            self.stats.oversized += 1;
            return;
        }
        let faults = if self.healed {
            Faults::none()
        } else {
            self.scenario.faults.clone()
        };
        if self.hosts[host].cut_until > self.now || self.rng.gen_bool(faults.loss_tx) {
            self.stats.lost += 1;
            return;
        }
        let delay = self.scenario.link_delay_us;
        let at_switch_ns = u128::from(self.now + delay) * 1_000;
        let bits = (transmit.contents.len() as u128 + 28) * 8;
        let rate = u128::from(self.scenario.trunk_rate_bits_per_s);
        let serialize_ns = bits * 1_000_000_000 / rate;
        if let Some(queue_bytes_max) = self.scenario.trunk_queue_bytes_max {
            let waiting_bits =
                self.trunk_free_ns.saturating_sub(at_switch_ns) * rate / 1_000_000_000;
            if waiting_bits + bits > u128::from(queue_bytes_max) * 8 {
                self.stats.trunk_queue_drops += 1;
                return;
            }
        }
        self.trunk_free_ns = self.trunk_free_ns.max(at_switch_ns) + serialize_ns;
        let kind = usize::from(transmit.contents.get(3).copied().unwrap_or(0)).min(7);
        self.stats.trunk_bytes_by_kind[kind] += transmit.contents.len() as u64;
        self.stats.trunk_packets_by_kind[kind] += 1;
        self.stats.trunk_busy_ns += serialize_ns as u64;
        if self.rng.gen_bool(faults.loss_trunk) {
            self.stats.lost += 1;
            return;
        }
        let at_b = (self.trunk_free_ns / 1_000) as Micros + delay;
        let destinations: Vec<usize> = match transmit.destination {
            crate::Destination::All => (0..self.hosts.len()).collect(),
            crate::Destination::Node(node) => vec![node.0 as usize],
        };
        for destination in destinations {
            // Drawn for every destination, so that a set of nodes leaves the others' draws.
            let lost = self.rng.gen_bool(faults.loss_rx);
            if lost && faults.loss_rx_nodes & 1 << destination != 0 {
                self.stats.lost += 1;
                continue;
            }
            let mut at = at_b + delay;
            if let Some((slow, extra)) = self.scenario.slow_receiver {
                if usize::from(slow.0) == destination {
                    at += extra;
                }
            }
            if self.rng.gen_bool(faults.reorder) {
                self.stats.reordered += 1;
                at += self.rng.gen_range(1..=self.scenario.reorder_delay_us_max);
            }
            let copies = if self.rng.gen_bool(faults.duplicate) {
                self.stats.duplicated += 1;
                2
            } else {
                1
            };
            for copy in 0..copies {
                self.scheduled += 1;
                let at = at + copy * self.rng.gen_range(0..=self.scenario.reorder_delay_us_max);
                let packet = (destination, transmit.contents.clone());
                self.queue.insert((at, self.scheduled), packet);
            }
        }
    }

    /// Receivers of `receivers` (a bit set) out of the count of those holding state:
    /// down, or restarted and not yet in a view. At most a minority of every group a view
    /// change may count (the current one, the one before, the one a change under way
    /// makes) may be, or a view change could forget a delivery.
    fn receivers_out(&self, receivers: u64) -> usize {
        self.hosts
            .iter()
            .enumerate()
            .filter(|(i, _)| receivers & 1 << i != 0)
            .filter(|(_, host)| host.node.as_ref().is_none_or(Node::is_fresh))
            .count()
    }

    /// Whether one more receiver out (`host`, about to crash) leaves a majority of every
    /// group concerned holding state.
    fn may_crash(&self, host: usize) -> bool {
        let mut groups = vec![self.group.receivers, self.group.previous_receivers];
        if let Some((change, _)) = self.change {
            groups.extend(self.group.apply(&change).map(|next| next.receivers));
        }
        groups.into_iter().all(|receivers| {
            let out = self.receivers_out(receivers) + usize::from(receivers & 1 << host != 0);
            out <= (receivers.count_ones() as usize - 1) / 2
        })
    }

    fn faults(&mut self) {
        let now = self.now;
        for &(at, node, down) in &self.scenario.scripted_crashes {
            let host = node.0 as usize;
            let allowed = self.may_crash(host);
            if at == now && allowed && self.hosts[host].node.is_some() {
                self.crash(host);
                self.hosts[host].down_until = Some(now + down.max(1));
            }
        }
        if self.next_crash.is_some_and(|at| at <= now) {
            self.next_crash = self.draw(self.scenario.faults.crash_every_us);
            let host = self.rng.gen_range(0..self.hosts.len());
            let allowed = self.may_crash(host);
            if allowed && self.hosts[host].node.is_some() {
                self.crash(host);
            }
        }
        if self.next_partition.is_some_and(|at| at <= now) {
            self.next_partition = self.draw(self.scenario.faults.partition_every_us);
            let host = self.rng.gen_range(0..self.hosts.len());
            let until = now
                + self
                    .rng
                    .gen_range(1..=self.scenario.faults.partition_us_max.max(1));
            self.hosts[host].cut_until = until;
            self.stats.partitions += 1;
        }
    }

    fn crash(&mut self, host: usize) {
        let down = self
            .rng
            .gen_range(1..=self.scenario.faults.down_us_max.max(1));
        let entry = &mut self.hosts[host];
        let node = entry.node.take().expect("up");
        entry.view_changes_before += node.stats().view_changes;
        entry.down_until = Some(self.now + down);
        self.history.processes[entry.process].crashed = true;
        self.stats.crashes += 1;
    }

    /// Faults stop: links heal, crashed nodes come back.
    fn heal(&mut self) {
        self.healed = true;
        for host in 0..self.hosts.len() {
            self.hosts[host].cut_until = 0;
            if self.hosts[host].active && self.hosts[host].node.is_none() {
                self.hosts[host].incarnation += 1;
                self.boot(host, Start::Restarted);
            }
        }
    }

    /// Every proposal made, every own message acked, every receiver a normal member of one
    /// view with the same deliveries.
    fn settled(&self) -> bool {
        if !self.proposals.is_empty() || self.change.is_some() || !self.retiring.is_empty() {
            return false;
        }
        let mut delivered = None;
        for (i, host) in self.hosts.iter().enumerate() {
            if !host.active {
                continue;
            }
            let Some(node) = &host.node else {
                return false;
            };
            if node.unacked() > 0 {
                return false;
            }
            if self.role(i).receiver {
                if node.status() != crate::Status::Normal || node.delivered() != node.log_end() {
                    return false;
                }
                let mine = (node.view(), node.delivered());
                if *delivered.get_or_insert(mine) != mine {
                    return false;
                }
            }
        }
        true
    }
}
