//! Scenario tests over the simulator, named after the sections of the paper they check.

use tessera_order::sim::{self, Faults, Scenario};
use tessera_order::{check, Config, Group, NodeId};

fn run_checked(seed: u64, scenario: &Scenario) -> sim::Outcome {
    let outcome = sim::run(seed, scenario);
    if let Err(violations) = check::check(&outcome.history) {
        panic!("seed {seed}: {violations:#?}");
    }
    assert!(
        outcome.settled_early,
        "seed {seed} did not settle: {:?}",
        outcome.stats
    );
    outcome
}

fn total(outcome: &sim::Outcome, field: fn(&tessera_order::Stats) -> u64) -> u64 {
    outcome.node_stats.iter().map(field).sum()
}

/// Section 3.1: without loss every node delivers every message, the PO is never revised, and
/// nobody waits for the leader (no ENTRIES, no view change, no retransmission).
#[test]
fn s3_1_clean_network_needs_no_leader() {
    let scenario = Scenario::clean(5);
    let outcome = run_checked(1, &scenario);
    for process in &outcome.history.processes {
        assert_eq!(process.deliveries.len(), 5 * 50);
    }
    assert_eq!(total(&outcome, |s| s.repairs_sent), 0);
    assert_eq!(total(&outcome, |s| s.positions_replaced), 0);
    assert_eq!(total(&outcome, |s| s.retransmitted), 0);
    assert_eq!(outcome.stats.view_changes, 0);
}

/// Section 3.2.1: messages deferred by the window are packed into MTU-sized packets; with
/// aggregation off each goes alone.
#[test]
fn s3_2_1_deferred_messages_are_packed() {
    let mut scenario = Scenario::clean(3);
    scenario.messages_per_sender = 300;
    scenario.propose_until_us = 0; // every message at once: most wait for the window
                                   // Proposed one by one, the first messages go alone while the window is open; the rest
                                   // wait for it and are packed.
    scenario.config = Config {
        window_packets: 4,
        ..Config::default()
    };
    let packed = run_checked(2, &scenario);
    scenario.config.aggregate = false;
    let alone = run_checked(2, &scenario);
    let data = |o: &sim::Outcome| total(o, |s| s.messages_sent);
    assert_eq!(data(&packed), 900);
    assert_eq!(data(&alone), 900);
    let packets = |o: &sim::Outcome| total(o, |s| s.data_packets_sent);
    // Messages of 8-64 bytes, 1472-byte packets: dozens a packet when packed.
    assert_eq!(packets(&alone), 900);
    assert!(
        packets(&packed) * 10 < 900 && packets(&packed) >= 12,
        "{} packets",
        packets(&packed)
    );
}

/// Section 3.2.2: jumbo frames hold more messages per packet than 1500-byte ones.
#[test]
fn s3_2_2_jumbo_frames_carry_more() {
    let mut scenario = Scenario::clean(3);
    scenario.messages_per_sender = 600;
    scenario.propose_until_us = 0;
    scenario.config.window_packets = 512;
    let standard = run_checked(3, &scenario);
    scenario.config.mtu_bytes = 9000;
    let jumbo = run_checked(3, &scenario);
    let packets = |o: &sim::Outcome| total(o, |s| s.data_packets_sent);
    assert!(
        packets(&jumbo) < packets(&standard),
        "{} vs {}",
        packets(&jumbo),
        packets(&standard)
    );
}

/// Table 4's two cases: loss at the senders' side (everyone misses the same packet) keeps
/// the PO identical; loss at the receivers' side makes POs differ and the leader's order
/// take over. Both deliver everything in one order.
#[test]
fn table_4_sender_side_loss_keeps_the_po() {
    let mut scenario = Scenario::clean(4);
    scenario.faults = Faults {
        loss_tx: 0.05,
        ..Faults::none()
    };
    scenario.faults_until_us = 1_000_000;
    scenario.deadline_us = 5_000_000;
    let outcome = run_checked(4, &scenario);
    assert!(total(&outcome, |s| s.retransmitted) > 0);
    assert_eq!(outcome.stats.view_changes, 0);
    // Every receiver missed the same packets: their POs never differed.
    assert_eq!(total(&outcome, |s| s.positions_replaced), 0);
    assert_eq!(total(&outcome, |s| s.repairs_sent), 0);

    scenario.faults = Faults {
        loss_rx: 0.05,
        ..Faults::none()
    };
    let outcome = run_checked(4, &scenario);
    assert!(total(&outcome, |s| s.nacks_sent) > 0);
    assert!(
        total(&outcome, |s| s.repairs_sent) > 0,
        "receivers' POs never disagreed"
    );
    assert!(total(&outcome, |s| s.positions_replaced) > 0);
}

/// Sections 3.4.1-3.4.2: the leader crashes; the others suspect it, agree on a new view,
/// resume the fast path, and the restarted node joins and delivers from where it joined.
#[test]
fn s3_4_leader_crash_changes_view_and_the_node_rejoins() {
    let mut scenario = Scenario::clean(3);
    scenario.messages_per_sender = 200;
    scenario.propose_until_us = 100_000;
    scenario.faults_until_us = 200_000;
    scenario.scripted_crashes = vec![(30_000, NodeId(0), 50_000)];
    let outcome = run_checked(5, &scenario);
    assert!(outcome.stats.view_changes >= 2, "{:?}", outcome.stats);
    let restarted = outcome
        .history
        .processes
        .iter()
        .find(|p| p.node == NodeId(0) && p.incarnation == 1)
        .expect("node 0 restarted");
    assert!(restarted.joined_at.unwrap() > 0);
    assert!(outcome.history.processes[0].crashed);
    // The survivors delivered everything the correct senders proposed, crash or not.
    let survivors = outcome.history.processes.iter().filter(|p| !p.crashed);
    for process in survivors {
        assert!(!process.deliveries.is_empty());
    }
}

/// Section 4.3.2's shape: disjoint senders and receivers.
#[test]
fn s4_3_2_disjoint_senders_and_receivers() {
    let mut scenario = Scenario::clean(1);
    scenario.group = Group::disjoint(2, 3);
    scenario.faults = Faults {
        loss_rx: 0.02,
        loss_tx: 0.02,
        ..Faults::none()
    };
    scenario.faults_until_us = 50_000;
    let outcome = run_checked(6, &scenario);
    for process in outcome.history.processes.iter().filter(|p| p.receiver) {
        assert_eq!(process.deliveries.len(), 100);
    }
}

/// The same seed replays the same run.
#[test]
fn a_seed_replays_exactly() {
    let scenario = Scenario::random(42);
    let a = sim::run(42, &scenario);
    let b = sim::run(42, &scenario);
    assert_eq!(a.stats, b.stats);
    assert_eq!(a.end_us, b.end_us);
    let deliveries = |o: &sim::Outcome| {
        o.history
            .processes
            .iter()
            .map(|p| p.deliveries.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(deliveries(&a), deliveries(&b));
}

/// Section 3: "our algorithm makes use of [FIFO] for performance optimization but does not
/// require it for the algorithm correctness". A third of all packets overtaken on the RX
/// links, and duplicates: the receivers' POs differ all the time, the leader's order takes
/// over, and every seed still delivers one order.
#[test]
fn s3_safety_does_not_depend_on_fifo() {
    for seed in 0..20 {
        let mut scenario = Scenario::clean(4);
        scenario.faults = Faults {
            reorder: 0.3,
            duplicate: 0.05,
            loss_rx: 0.01,
            ..Faults::none()
        };
        scenario.reorder_delay_us_max = 500;
        scenario.faults_until_us = 100_000;
        let outcome = run_checked(seed, &scenario);
        assert!(total(&outcome, |s| s.positions_replaced) > 0, "seed {seed}");
        assert!(outcome.stats.reordered > 100 && outcome.stats.duplicated > 0);
    }
}
