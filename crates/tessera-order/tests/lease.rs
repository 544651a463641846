//! Read leases (`Config::read_leases`), step by step on a network that loses nothing but
//! what a partition cuts: a member cut off from the others keeps its view until it
//! suspects them, and meanwhile the others change view without it (one of them restarted,
//! so they change view at once rather than after the suspicion timeout) and deliver new
//! positions. While the cut-off member holds a lease, nothing may be delivered anywhere
//! past its log's end: an application that reads locally under the lease, after applying
//! its log to there, would otherwise answer from a state older than an acknowledged change.

use bytes::Bytes;
use tessera_order::{Config, Destination, Group, Micros, Node, NodeId, Start, Status};

const NODES: u16 = 5;
/// The member that is cut off.
const CUT: u16 = 4;
/// The member that restarts when the cut begins (not view 0's leader, node 0, which lets
/// it in at once).
const RESTARTED: u16 = 2;
const STEP_US: Micros = 100;

fn config() -> Config {
    Config {
        heartbeat_interval_us: 5_000,
        suspect_after_us: 50_000,
        // Half of it (what a leader waits for a voter heard lately) is below the lease's
        // 37.5 ms: without the entry rule the new view would start inside the lease.
        view_change_timeout_us: 40_000,
        read_leases: true,
        ..Config::default()
    }
}

struct Net {
    nodes: Vec<Node>,
    now: Micros,
    cut: bool,
}

impl Net {
    fn new() -> Net {
        let group = Group::all_to_all(usize::from(NODES));
        let nodes = (0..NODES)
            .map(|i| {
                Node::new(
                    config(),
                    group.clone(),
                    NodeId(i),
                    1,
                    Start::Initial,
                    7 + u64::from(i),
                    0,
                )
            })
            .collect();
        Net {
            nodes,
            now: 0,
            cut: false,
        }
    }

    fn blocked(&self, from: usize, to: usize) -> bool {
        self.cut && from != to && (from == usize::from(CUT) || to == usize::from(CUT))
    }

    /// One step: every packet sent reaches its destinations in the next step, unless cut.
    fn step(&mut self) {
        self.now += STEP_US;
        let now = self.now;
        let mut wire = Vec::new();
        for (from, node) in self.nodes.iter_mut().enumerate() {
            while let Some(transmit) = node.poll_transmit(now) {
                wire.push((from, transmit.destination, transmit.contents));
            }
        }
        for (from, destination, packet) in &wire {
            for to in 0..self.nodes.len() {
                let addressed = match destination {
                    Destination::All => true,
                    Destination::Node(node) => usize::from(node.0) == to,
                };
                if addressed && !self.blocked(*from, to) {
                    self.nodes[to].handle_packet(packet, now);
                }
            }
        }
        for node in &mut self.nodes {
            if node.poll_timeout().is_some_and(|at| at <= now) {
                node.handle_timeout(now);
            }
            while node.poll_event().is_some() {}
        }
    }

    fn propose(&mut self, node: u16) {
        let now = self.now;
        let message = Bytes::from(format!("{node}@{now}"));
        self.nodes[usize::from(node)]
            .propose(message, now)
            .expect("proposed");
    }

    /// The cut-off member's lease holds now.
    fn leased(&self) -> bool {
        let ends = self.nodes[usize::from(CUT)].read_lease_ends();
        ends.is_some_and(|ends| self.now < ends)
    }

    /// The most positions any other member delivered.
    fn delivered_elsewhere(&self) -> u64 {
        let others = self.nodes.iter().enumerate();
        let others = others.filter(|(i, _)| *i != usize::from(CUT));
        others.map(|(_, node)| node.delivered()).max().unwrap_or(0)
    }
}

#[test]
fn a_member_cut_off_holds_no_lease_once_the_others_deliver_without_it() {
    let mut net = Net::new();
    let mut leased_after_cut = 0u64;
    let mut checked = 0u64;
    // 100 ms of the cut-off member proposing every millisecond, then the cut and the
    // restart, then 300 ms of another member proposing.
    for step in 0..4_000u64 {
        if step == 1_000 {
            net.cut = true;
            let group = Group::all_to_all(usize::from(NODES));
            let id = NodeId(RESTARTED);
            net.nodes[usize::from(RESTARTED)] =
                Node::new(config(), group, id, 2, Start::Restarted, 99, net.now);
        }
        let proposer = if step < 1_000 { CUT } else { 1 };
        if step % 10 == 0 {
            net.propose(proposer);
        }
        net.step();
        if net.leased() {
            checked += 1;
            leased_after_cut += u64::from(net.cut);
            let end = net.nodes[usize::from(CUT)].log_end();
            assert!(
                net.delivered_elsewhere() <= end,
                "at {} us the cut-off member holds a lease at log end {end}, but another \
                 member delivered {} positions",
                net.now,
                net.delivered_elsewhere()
            );
        }
    }
    let cut_off = &net.nodes[usize::from(CUT)];
    assert!(
        checked > 500,
        "the member held a lease while it proposed ({checked} steps)"
    );
    assert!(
        leased_after_cut > 0,
        "the lease outlived the cut for a while (else this checks nothing)"
    );
    assert!(
        net.delivered_elsewhere() > cut_off.log_end(),
        "the others moved on: {} delivered, the cut-off member's log ends at {}",
        net.delivered_elsewhere(),
        cut_off.log_end()
    );
    assert_ne!(
        cut_off.status(),
        Status::Normal,
        "it suspected the others in the end"
    );
    assert!(cut_off.read_lease_ends().is_none());
}

/// Seeded runs of the simulator's random scenarios (loss, reordering, crashes, restarts,
/// partitions, group changes) with read leases on: every history keeps UTO1-4 and FIFO,
/// and at no moment does a node hold a lease while some node delivered past its log's end
/// (`TESSERA_ORDER_LEASE_SEEDS=N` runs N seeds; 300 by default).
#[test]
fn random_runs_with_read_leases_never_lease_a_stale_log() {
    use tessera_order::{check, sim};
    let seeds: u64 = std::env::var("TESSERA_ORDER_LEASE_SEEDS")
        .map(|value| value.parse().expect("a number of seeds"))
        .unwrap_or(300);
    let (mut leased, mut unsettled, mut view_changes) = (0, Vec::new(), 0);
    for seed in 0..seeds {
        let mut scenario = sim::Scenario::random(seed);
        scenario.config.read_leases = true;
        let outcome = sim::run(seed, &scenario);
        if let Err(violations) = check::check(&outcome.history) {
            panic!("seed {seed}: {violations:#?}");
        }
        assert_eq!(
            outcome.stats.lease_violations, 0,
            "seed {seed}: a node held a lease on a log some node had delivered past"
        );
        leased += outcome.stats.leased_checks;
        view_changes += outcome.stats.view_changes;
        if !outcome.settled_early {
            unsettled.push(seed);
        }
    }
    eprintln!(
        "{seeds} seeds with read leases: {leased} leased moments checked, {view_changes} view \
         changes, unsettled {unsettled:?}"
    );
    assert!(leased > 0, "some node held a lease");
    assert!(
        unsettled.is_empty(),
        "runs that did not settle: {unsettled:?}"
    );
}
