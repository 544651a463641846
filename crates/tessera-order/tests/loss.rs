//! Loss recovery speed (the thesis's table 4, issue 16's target): under 1% and 5% of packets
//! lost at the receivers or at the senders, every history keeps UTO1-UTO4 and FIFO, and a
//! closed run moves its messages in simulated time at a stated share of the no-loss run's
//! throughput. Simulated time is deterministic: the ratios are exact for a seed.

use tessera_order::sim::{self, Faults, Scenario};
use tessera_order::{check, Config, Group};

/// The lab's setting (`tessera-lab`'s `protocol_config` with 9000-byte packing): a long
/// retransmission timeout, so that recovery must come from NACKs and the leader's repairs,
/// paced by the round trip, not from the timeout.
fn lab_like(nodes: usize) -> Scenario {
    let mut scenario = Scenario::clean(nodes);
    scenario.group = Group::all_to_all(nodes);
    scenario.config = Config::jumbo();
    // Every message offered at once: the window, not the offer, paces the senders.
    scenario.messages_per_sender = 4_000;
    scenario.message_bytes_max = 1_024;
    scenario.propose_until_us = 0;
    scenario.faults_until_us = 2_000_000;
    scenario.deadline_us = 10_000_000;
    scenario
}

/// Messages UTO-delivered at every node per simulated second, after checking the history.
fn throughput(seed: u64, scenario: &Scenario) -> (f64, sim::Outcome) {
    let outcome = sim::run(seed, scenario);
    if let Err(violations) = check::check(&outcome.history) {
        panic!("seed {seed}: {violations:#?}");
    }
    assert!(
        outcome.settled_early,
        "seed {seed} did not settle: {:?}\n{}",
        outcome.stats,
        outcome.node_summaries.join("\n")
    );
    let messages = proposed(&outcome) as usize;
    for process in &outcome.history.processes {
        assert_eq!(process.deliveries.len(), messages, "seed {seed}");
    }
    let rate = messages as f64 * 1e6 / outcome.last_delivery_us as f64;
    (rate, outcome)
}

/// Messages proposed in a run (each delivered at every node, once it settled).
fn proposed(outcome: &sim::Outcome) -> u64 {
    outcome
        .history
        .proposals
        .values()
        .map(Vec::len)
        .sum::<usize>() as u64
}

fn total(outcome: &sim::Outcome, field: fn(&tessera_order::Stats) -> u64) -> u64 {
    outcome.node_stats.iter().map(field).sum()
}

/// Runs `seeds` with `faults` and without: the worst and the mean ratio of throughputs.
fn ratios(nodes: usize, faults: &Faults, seeds: std::ops::Range<u64>) -> (f64, f64) {
    let (mut worst, mut sum, count) = (f64::MAX, 0.0, seeds.end - seeds.start);
    for seed in seeds {
        let (base, base_outcome) = throughput(seed, &lab_like(nodes));
        println!(
            "  without loss: trunk busy {:.3} of {} us; DATA {} ACK {}",
            base_outcome.stats.trunk_busy_ns as f64 / 1e3 / base_outcome.last_delivery_us as f64,
            base_outcome.last_delivery_us,
            base_outcome.stats.trunk_bytes_by_kind[1],
            base_outcome.stats.trunk_bytes_by_kind[2],
        );
        let mut lossy = lab_like(nodes);
        lossy.faults = faults.clone();
        let (rate, outcome) = throughput(seed, &lossy);
        println!(
            "{nodes} nodes, seed {seed}: {rate:.0} of {base:.0} msg/s = {:.3}; lost {}, NACKs \
             {}, retransmitted {}, repairs {}, positions replaced {}",
            rate / base,
            outcome.stats.lost,
            total(&outcome, |s| s.nacks_sent),
            total(&outcome, |s| s.retransmitted),
            total(&outcome, |s| s.repairs_sent),
            total(&outcome, |s| s.positions_replaced),
        );
        println!(
            "  trunk busy {:.3} of {} us; window full {:?} us; bytes payload missing {}; repair entries {} payloads {}; DATA {} ACK {} NACK {} ENTRIES {}",
            outcome.stats.trunk_busy_ns as f64 / 1e3 / outcome.last_delivery_us as f64,
            outcome.last_delivery_us,
            outcome.node_stats.iter().map(|s| s.window_full_us).collect::<Vec<_>>(),
            total(&outcome, |s| s.repair_bytes_missing),
            total(&outcome, |s| s.repair_entries),
            total(&outcome, |s| s.repair_payloads),
            outcome.stats.trunk_bytes_by_kind[1],
            outcome.stats.trunk_bytes_by_kind[2],
            outcome.stats.trunk_bytes_by_kind[3],
            outcome.stats.trunk_bytes_by_kind[5],
        );
        worst = worst.min(rate / base);
        sum += rate / base;
    }
    let mean = sum / count as f64;
    println!("{faults:?}: worst {worst:.3}, mean {mean:.3} of the no-loss throughput");
    (worst, mean)
}

fn at_receivers(loss: f64) -> Faults {
    Faults {
        loss_rx: loss,
        ..Faults::none()
    }
}

fn at_senders(loss: f64) -> Faults {
    Faults {
        loss_tx: loss,
        ..Faults::none()
    }
}

#[test]
fn table_4_one_percent_at_the_receivers() {
    let (worst, mean) = ratios(3, &at_receivers(0.01), 0..24);
    // The target on every seed: 1% lost at the receivers costs at most 10%.
    // Measured over seeds 0..24: worst 0.911, mean 0.962 (before receivers paused after a
    // loss: worst 0.929 (seed 13), mean 0.951); over 0..96: worst
    // 0.923, mean 0.953. Before the leader paced its repairs by the trip as the queue is
    // now (at a burst's start repairs were judged unanswered before an answer could
    // return, and resent with every message's bytes): 0.917, 0.946. Before a burst's last
    // ACK went again after two round trips through an empty queue instead of two loaded
    // ones (the network idled ~3 ms at the end of the run): 0.882 (seed 6), 0.942 (before
    // the round trip fell by halves, gaps were NACKed again on their own schedule, held
    // counts were NACKed, ACKs compared again after a repair and repeated while members
    // lag: 0.890, 0.927 over seeds 0..8; before a fresh ACK went twice: 0.804, 0.900;
    // before ENTRIES of identities, the window on held messages and arrival-order replay:
    // 0.294, 0.340; before round-trip pacing: 0.205, 0.238).
    assert!(
        worst >= 0.90 && mean >= 0.93,
        "worst {worst:.3}, mean {mean:.3}"
    );
}

/// The lab's 5 nodes: every DATA packet is lost at some receiver five times as often as at
/// one, so the logs diverge and the leader repairs more.
#[test]
fn table_4_one_percent_at_the_receivers_five_nodes() {
    let (worst, mean) = ratios(5, &at_receivers(0.01), 0..24);
    // Measured: worst 0.904, mean 0.925. The ratio fell from worst 0.957, mean 0.973 (the
    // repeat of a fresh ACK already waiting 2 trips + 20 us) when
    // ACKs began to wait a share of the queue under load, since the no-loss runs gained
    // more (mean 205,646 -> 221,872 msg/s) than the lossy ones (200,119 -> 205,272; worst
    // seed 196,013 -> 199,571): fewer ACK bytes give the link to DATA when nothing is
    // lost, less so when loss recovery sets the pace. Earlier: worst 0.949 (seed 7), mean
    // 0.968; before a receiver paused its log after a loss: 0.910 (seed 3), 0.927; before
    // repairs were paced by the trip as the queue is now: 0.815 (seed 19), 0.917.
    // Since a sender halves its window when an own packet does not come back, and a NACK
    // is answered only once a round trip: worst 0.899, mean 0.925 (the worst seed 0.005
    // lower; the lab's trunk queue is what the change is for).
    assert!(
        worst >= 0.89 && mean >= 0.92,
        "worst {worst:.3}, mean {mean:.3}"
    );
}

/// The cost of a loss at 5 nodes: positions of some receiver's log replaced by the leader's
/// order (each set aside, appended again and reported again as PO). A receiver that goes
/// on appending past a lost message has every position up to the repair's arrival
/// replaced; one that pauses once it learns of the loss (`sent` in ACKs, a gap, the
/// leader's conflicting ACK) only those between the message's place and the pause.
#[test]
fn a_loss_replaces_only_the_positions_before_the_pause() {
    let (mut replaced, mut messages, mut pauses, mut checks) = (0, 0, 0, 0);
    for seed in 0..8 {
        let mut lossy = lab_like(5);
        lossy.faults = at_receivers(0.01);
        let (_, outcome) = throughput(seed, &lossy);
        replaced += total(&outcome, |s| s.positions_replaced);
        pauses += total(&outcome, |s| s.pauses);
        checks += total(&outcome, |s| s.pause_checks);
        messages += proposed(&outcome);
    }
    let per_message = replaced as f64 / messages as f64;
    println!(
        "{replaced} positions replaced for {messages} messages ({per_message:.2} each), \
         {pauses} pauses, {checks} checks of what paused members hold"
    );
    // Measured: 6,189 checks (8.0 a pause). Before a member paused by the leader's
    // conflicting ACK stopped checking at every arrival: 110,458 (143 a pause), each a sort
    // and a hash chain over everything held, which doubled the nodes' CPU per message under
    // this loss (the simulator's own CPU: 61 against 31 us a message without loss; now 35).
    assert!(checks <= 20 * pauses, "{checks} checks for {pauses} pauses");
    // Measured: 355,184 positions for 160,000 messages (2.22 each), 771 pauses. Before the
    // pause: 705,191 (4.41 each); the 4,000 messages per sender are offered at once.
    assert!(
        per_message <= 3.0,
        "{per_message:.2} positions replaced per message"
    );
}

#[test]
fn table_4_five_percent_at_the_receivers() {
    let (worst, mean) = ratios(3, &at_receivers(0.05), 0..8);
    // Measured: worst 0.827, mean 0.845 (before receivers paused after a loss: 0.812,
    // 0.834; before repairs were paced by the trip as the queue
    // is now: 0.795, 0.825; before the changes of the 1% test: 0.719, 0.768;
    // before a fresh ACK went twice: 0.708, 0.753; before: 0.174, 0.202; 0.085, 0.107).
    assert!(
        worst >= 0.75 && mean >= 0.8,
        "worst {worst:.3}, mean {mean:.3}"
    );
}

#[test]
fn table_4_one_percent_at_the_senders() {
    let (worst, mean) = ratios(3, &at_senders(0.01), 0..8);
    // Measured: worst 0.992, mean 0.996 (before repairs were paced by the trip as the queue
    // is now: 0.995, 0.998; before the changes of the 1% test: 0.961, 0.994,
    // a run whose last DATA packet was lost at its sender and resent once its heartbeat
    // came back; before a fresh ACK went twice: 0.902, 0.987; before: 0.994, 0.998;
    // 0.369, 0.637).
    assert!(
        worst >= 0.95 && mean >= 0.98,
        "worst {worst:.3}, mean {mean:.3}"
    );
}

#[test]
fn table_4_five_percent_at_the_senders() {
    let (worst, mean) = ratios(3, &at_senders(0.05), 0..8);
    // Measured: worst 0.972, mean 0.977. A packet lost at its sender looks to it like one
    // dropped by a full sequencer queue, and it halves its window (one in twenty here);
    // before that: worst 0.980, mean 0.987 (before repairs were paced by the trip as the
    // queue is now: 0.962, 0.989; before the changes of the 1% test: 0.996, 0.998;
    // before a fresh ACK went twice: 0.990, 0.997; before: 0.195, 0.280; 0.142, 0.189).
    assert!(
        worst >= 0.95 && mean >= 0.97,
        "worst {worst:.3}, mean {mean:.3}"
    );
}

/// Against a repair storm: a member that crashed and is not yet suspected answers no repair;
/// the leader's repairs to it back off from two round trips to the retransmission timeout
/// instead of going out every laggard check (a heartbeat interval apart), and the group
/// still keeps UTO and settles once the member is suspected and the view changes.
#[test]
fn repairs_to_a_silent_member_back_off() {
    let mut scenario = lab_like(3);
    scenario.messages_per_sender = 500;
    scenario.propose_until_us = 20_000;
    scenario.faults_until_us = 1_000_000;
    scenario.deadline_us = 5_000_000;
    // Node 2 (not the leader of view 0) is down from 10 ms for 400 ms; suspected at 500 ms.
    scenario.scripted_crashes = vec![(10_000, tessera_order::NodeId(2), 400_000)];
    let outcome = sim::run(11, &scenario);
    if let Err(violations) = check::check(&outcome.history) {
        panic!("{violations:#?}");
    }
    assert!(outcome.settled_early, "{:?}", outcome.stats);
    let leader_repairs = outcome.node_stats[0].repairs_sent;
    println!("leader sent {leader_repairs} ENTRIES packets");
    // Measured: 15 packets; 78 without the back-off.
    assert!(leader_repairs <= 30, "{leader_repairs} ENTRIES packets");
}

/// Packets per message delivered, by kind, and positions replaced: what a loss costs in
/// work, which the simulated time does not count but the lab's shared CPUs do (every
/// datagram is a wake-up and a copy at each receiver). Run with `--ignored --nocapture`.
#[test]
#[ignore = "a report, not a check"]
fn work_per_message_five_nodes() {
    let kinds = ["-", "DATA", "ACK", "NACK", "HB", "ENTRIES", "DVC", "SV"];
    for faults in [Faults::none(), at_receivers(0.01)] {
        let (mut packets, mut messages) = ([0u64; 8], 0u64);
        let (mut replaced, mut pauses, mut timed_out, mut retransmitted) = (0, 0, 0, 0);
        let cpu_before = process_cpu_s();
        for seed in 0..8 {
            let mut scenario = lab_like(5);
            scenario.faults = faults.clone();
            let (_, outcome) = throughput(seed, &scenario);
            for (sum, n) in packets.iter_mut().zip(outcome.stats.trunk_packets_by_kind) {
                *sum += n;
            }
            replaced += total(&outcome, |s| s.positions_replaced);
            pauses += total(&outcome, |s| s.pauses);
            timed_out += total(&outcome, |s| s.pauses_timed_out);
            retransmitted += total(&outcome, |s| s.retransmitted);
            messages += proposed(&outcome);
        }
        let cpu_us_per_message = (process_cpu_s() - cpu_before) * 1e6 / messages as f64;
        let per = |n: u64| n as f64 / messages as f64;
        let by_kind: Vec<String> = (1..8)
            .map(|k| format!("{} {:.4}", kinds[k], per(packets[k])))
            .collect();
        println!(
            "{faults:?}\n  packets per message: all {:.4}; {}\n  positions replaced {:.3}, \
             pauses {pauses} ({timed_out} timed out), retransmitted {:.4} per message; \
             simulation CPU {cpu_us_per_message:.1} us per message",
            per(packets.iter().sum()),
            by_kind.join(", "),
            per(replaced),
            per(retransmitted),
        );
    }
}

/// CPU seconds this process used so far (user and system, from `/proc/self/stat`; 0 where
/// it cannot be read): the simulated nodes' work, all on this thread.
fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the line, in clock ticks (100 a second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|field| field.parse().ok())
        .collect();
    fields.iter().sum::<f64>() / 100.0
}

/// The lab's queue of the sequencer link: `tbf` on the trunk holds 128 frames of 1,514
/// bytes (`--buffer 128p`, "switch port buffer 193792 bytes" in its testbed line).
const LAB_TRUNK_QUEUE_BYTES: u64 = 128 * 1_514;

/// What a 5-node run of 1 KiB messages moved over the sequencer link (seeds 0..4).
struct LinkShare {
    /// Payload UTO-delivered, as a share of the link's rate.
    payload: f64,
    /// Packets dropped by a full trunk queue.
    queue_drops: u64,
    /// Messages sent again.
    retransmitted: u64,
}

/// Large messages (issue 16: >= 0.9 of the link in UTO order): 5 nodes, every message
/// 1,024 bytes, no loss, the sequencer link's queue bounded by `queue_bytes_max`. What the
/// link carried, by kind, against the payload UTO-delivered, and the messages a DATA packet
/// held: the share of the link the protocol can give at most, before any CPU cost
/// (`--nocapture` prints it).
fn large_messages_link_share(config: Config, queue_bytes_max: Option<u64>) -> LinkShare {
    let kinds = ["-", "DATA", "ACK", "NACK", "HB", "ENTRIES", "DVC", "SV"];
    let (mut bytes, mut packets, mut payload, mut seconds) = ([0u64; 8], [0u64; 8], 0u64, 0.0);
    let (mut queue_drops, mut retransmitted, mut window_cuts) = (0, 0, 0);
    let cpu_before = process_cpu_s();
    let mut messages = 0;
    for seed in 0..4 {
        let mut scenario = lab_like(5);
        scenario.config = config.clone();
        scenario.message_bytes_min = 1_024;
        scenario.trunk_queue_bytes_max = queue_bytes_max;
        let (_, outcome) = throughput(seed, &scenario);
        for k in 0..8 {
            bytes[k] += outcome.stats.trunk_bytes_by_kind[k];
            packets[k] += outcome.stats.trunk_packets_by_kind[k];
        }
        queue_drops += outcome.stats.trunk_queue_drops;
        retransmitted += total(&outcome, |s| s.retransmitted);
        window_cuts += total(&outcome, |s| s.window_cuts);
        messages += proposed(&outcome);
        payload += proposed(&outcome) * 1_024;
        seconds += outcome.last_delivery_us as f64 / 1e6;
    }
    let cpu_us_per_message = (process_cpu_s() - cpu_before) * 1e6 / messages as f64;
    let link = |b: u64, p: u64| (b + 28 * p) as f64 * 8.0 / seconds / 1e9;
    let by_kind: Vec<String> = (1..8)
        .filter(|&k| packets[k] > 0)
        .map(|k| format!("{} {:.4}", kinds[k], link(bytes[k], packets[k])))
        .collect();
    let share = payload as f64 * 8.0 / seconds / 1e9;
    println!(
        "queue {queue_bytes_max:?} B: payload UTO-delivered: {share:.4} of the link; link busy by \
         kind: {}; messages per DATA packet {:.2}, DATA packet bytes mean {:.0}; ACK packets per \
         DATA {:.2}, mean bytes {:.0}; trunk queue drops {queue_drops}, retransmitted \
         {retransmitted}, window cuts {window_cuts}; simulation CPU {cpu_us_per_message:.1} us per message",
        by_kind.join(", "),
        messages as f64 / packets[1] as f64,
        bytes[1] as f64 / packets[1] as f64,
        packets[2] as f64 / packets[1] as f64,
        bytes[2] as f64 / packets[2].max(1) as f64,
    );
    LinkShare {
        payload: share,
        queue_drops,
        retransmitted,
    }
}

#[test]
fn large_messages_link_share_five_nodes() {
    // Measured (seeds 0..4): 0.939 of the link, 1.72 ACK packets per DATA packet. Before
    // ACKs waited a share of the queue under load: 0.861, 5.44 (every receiver ACKed
    // every jumbo packet, 12% of the link).
    let share = large_messages_link_share(Config::jumbo(), None);
    assert_eq!(share.queue_drops, 0);
    assert!(
        share.payload >= 0.92,
        "payload {:.3} of the link",
        share.payload
    );
}

/// The same with the lab's finite queue on the sequencer link: five senders' windows of
/// 16 jumbo packets (720 KB) overflow its 194 KB, every frame dropped there is missed by
/// every receiver and costs a retransmission and a pause everywhere. Senders halve their
/// window when an own packet does not come back (`Config::window_packets_min`); with a
/// fixed window (the floor at the window) the link carries far less payload.
#[test]
fn large_messages_link_share_five_nodes_lab_queue() {
    let adaptive = large_messages_link_share(Config::jumbo(), Some(LAB_TRUNK_QUEUE_BYTES));
    let fixed = Config {
        window_packets_min: Config::jumbo().window_packets,
        ..Config::jumbo()
    };
    let fixed = large_messages_link_share(fixed, Some(LAB_TRUNK_QUEUE_BYTES));
    println!(
        "adaptive window: {:.3} of the link, {} queue drops, {} retransmitted; fixed: {:.3}, \
         {}, {}",
        adaptive.payload,
        adaptive.queue_drops,
        adaptive.retransmitted,
        fixed.payload,
        fixed.queue_drops,
        fixed.retransmitted
    );
    assert!(adaptive.payload >= 0.89, "adaptive {:.3}", adaptive.payload);
    assert!(
        adaptive.queue_drops * 4 < fixed.queue_drops,
        "drops {} against {}",
        adaptive.queue_drops,
        fixed.queue_drops
    );
}

/// Section 3.4.2 when the leader itself loses messages: 1% of the packets lost at one
/// node's RX link only, the leader's (node 0, view 0) against a member's (node 1). The
/// members learn of a message the leader missed only from the leader's ACK, and the
/// leader's order (ENTRIES) replaces what they appended meanwhile; every history keeps
/// UTO1-4 and FIFO (checked in `throughput`), no view changes, and what it costs is
/// printed beside a member's loss.
#[test]
fn the_members_follow_the_leader_after_its_loss() {
    let mut rows = Vec::new();
    for (name, lossy_node) in [("leader", 0), ("member", 1)] {
        let (mut ratio_worst, mut ratio_sum, mut replaced, mut repairs, mut messages) =
            (f64::MAX, 0.0, 0, 0, 0);
        let seeds = 0..6;
        for seed in seeds.clone() {
            let (base, _) = throughput(seed, &lab_like(5));
            let mut lossy = lab_like(5);
            lossy.faults = Faults {
                loss_rx_nodes: 1 << lossy_node,
                ..at_receivers(0.01)
            };
            let (rate, outcome) = throughput(seed, &lossy);
            assert_eq!(outcome.stats.view_changes, 0, "{name} seed {seed}");
            ratio_worst = ratio_worst.min(rate / base);
            ratio_sum += rate / base;
            replaced += total(&outcome, |s| s.positions_replaced);
            repairs += total(&outcome, |s| s.repairs_sent);
            messages += proposed(&outcome);
        }
        let per_message = replaced as f64 / messages as f64;
        let mean = ratio_sum / seeds.count() as f64;
        println!(
            "1% lost at the {name}: worst {ratio_worst:.3}, mean {mean:.3} of no loss; \
             {per_message:.3} positions replaced per message, {repairs} repairs"
        );
        rows.push((ratio_worst, per_message, repairs));
    }
    // Measured (seeds 0..6): the leader's loss worst 0.967, mean 0.974 of no loss, 1.85
    // positions replaced per message, 179 repairs; a member's 0.961, 0.973, 0.45, 46. The
    // members' repair works and costs about what a member's loss does in time; it replaces
    // four times the positions (what they appended before the leader's ACK told them),
    // which is CPU in the lab, not time here.
    let [(leader_worst, leader_replaced, leader_repairs), _] = rows[..] else {
        unreachable!("two rows")
    };
    assert!(
        leader_repairs > 0,
        "the leader's loss was repaired by its order"
    );
    assert!(
        leader_worst >= 0.93,
        "leader's loss: worst {leader_worst:.3}"
    );
    assert!(
        leader_replaced <= 3.0,
        "{leader_replaced:.2} positions replaced per message"
    );
}

/// A receiver behind the others by more than the retransmission timeout (80 ms more on its
/// RX link against the lab's 50 ms timeout; in the lab, a CPU-starved node's socket buffer)
/// but losing nothing: almost nothing goes again on the timeout, which stretches to twice
/// the time members take to hold a sender's messages, and backs off. Before, every window of the senders went
/// again every round (the lab's 64-byte closed loops: 40,000-140,000 messages a run, each
/// a duplicate at every receiver).
#[test]
fn a_slow_receiver_is_no_loss() {
    use tessera_order::NodeId;
    for seed in 0..3 {
        let mut scenario = lab_like(3);
        scenario.slow_receiver = Some((NodeId(2), 80_000));
        let (_, outcome) = throughput(seed, &scenario);
        let timeout = total(&outcome, |s| s.retransmitted_timeout);
        let duplicates = total(&outcome, |s| s.duplicates);
        println!("seed {seed}: {timeout} sent again on timeout, {duplicates} duplicates");
        // The first packets go before any member's hold was timed (then the timeout
        // backs off); before, every message went again, 12,000 of 12,000 on seed 0.
        assert!(
            timeout <= 120,
            "seed {seed}: {timeout} of 12,000, none lost"
        );
        assert_eq!(outcome.stats.lost, 0);
    }
}
