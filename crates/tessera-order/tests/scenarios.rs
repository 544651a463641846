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

/// A loaded all-to-all group: 5 senders, each proposing an 8-64 byte message every 2 us on
/// average (2.5 million messages/s offered to a 1 Gbit/s sequencer link: about its capacity).
fn loaded(aggregate: bool) -> Scenario {
    let mut scenario = Scenario::clean(5);
    scenario.messages_per_sender = 2_000;
    scenario.propose_until_us = 4_000;
    scenario.config = Config {
        window_packets: 8,
        aggregate,
        ..Config::default()
    };
    scenario
}

/// Sections 3.1 and 3.2.1 under load: packing deferred messages and piggybacking ACKs on
/// DATA make the group send fewer packets than messages, of every kind counted (DATA, ACK,
/// heartbeat, NACK); without packing each message costs a packet of its own and more. A
/// higher ACK threshold (ACK aggregation) cuts the ACKs that go alone.
#[test]
fn s3_2_1_under_load_a_node_sends_fewer_packets_than_messages() {
    let packed = run_checked(7, &loaded(true));
    let alone = run_checked(7, &loaded(false));
    let mut fewer_acks = loaded(true);
    fewer_acks.config.ack_every_messages = 64;
    let fewer_acks = run_checked(7, &fewer_acks);
    let messages = total(&packed, |s| s.messages_sent);
    assert_eq!(messages, 10_000);
    assert_eq!(total(&alone, |s| s.messages_sent), 10_000);
    let all_packets = total(&packed, |s| s.packets_sent);
    let data_packets = total(&packed, |s| s.data_packets_sent);
    let piggybacked = total(&packed, |s| s.acks_piggybacked);
    let ack_packets = total(&packed, |s| s.ack_packets_sent);
    println!(
        "packed: {all_packets} packets ({data_packets} DATA, {ack_packets} ACK, {piggybacked} \
         ACKs piggybacked) for {messages} messages; ACK threshold 64: {} packets ({} ACK); \
         alone: {} packets ({} DATA)",
        total(&fewer_acks, |s| s.packets_sent),
        total(&fewer_acks, |s| s.ack_packets_sent),
        total(&alone, |s| s.packets_sent),
        total(&alone, |s| s.data_packets_sent)
    );
    assert!(
        (all_packets as f64) < 0.5 * messages as f64,
        "{all_packets} packets for {messages} messages"
    );
    assert!(data_packets * 8 < messages, "{data_packets} DATA packets");
    // Every DATA packet of a node that receives carries its ACK.
    assert_eq!(piggybacked, data_packets);
    assert!(total(&fewer_acks, |s| s.ack_packets_sent) * 2 < ack_packets);
    assert!(total(&fewer_acks, |s| s.packets_sent) * 4 < messages);
    assert_eq!(total(&alone, |s| s.data_packets_sent), messages);
    assert!(total(&alone, |s| s.packets_sent) > messages);
    for outcome in [&packed, &fewer_acks, &alone] {
        for process in &outcome.history.processes {
            assert_eq!(process.deliveries.len(), 10_000);
        }
    }
}

/// Packing under load with faults: 60 seeds of loaded groups with aggregation (either MTU)
/// and loss, reordering, duplication, a crash and a partition each; every history keeps
/// UTO1-UTO4 and FIFO, and packets still carry several messages on average.
#[test]
fn s3_2_1_packing_under_load_and_faults_keeps_uto() {
    let (mut messages, mut data_packets) = (0, 0);
    for seed in 0..60 {
        let mut scenario = loaded(true);
        scenario.group = Group::all_to_all(3 + seed as usize % 3);
        scenario.messages_per_sender = 600;
        scenario.config.mtu_bytes = if seed % 2 == 0 { 1500 } else { 9000 };
        scenario.config.window_packets = 2 + (seed as u32 % 7) * 4;
        scenario.faults = Faults {
            loss_tx: 0.01,
            loss_rx: 0.01,
            loss_trunk: 0.005,
            reorder: 0.01,
            duplicate: 0.01,
            ..Faults::none()
        };
        scenario.faults_until_us = 60_000;
        scenario.deadline_us = 5_000_000;
        scenario.scripted_crashes = vec![(5_000 + seed * 300, NodeId(seed as u16 % 3), 20_000)];
        let outcome = sim::run(seed, &scenario);
        if let Err(violations) = check::check(&outcome.history) {
            panic!("seed {seed}: {violations:#?}");
        }
        assert!(
            outcome.settled_early,
            "seed {seed} did not settle: {:?}\n{}",
            outcome.stats,
            outcome.node_summaries.join("\n")
        );
        messages += total(&outcome, |s| s.messages_sent);
        data_packets += total(&outcome, |s| s.data_packets_sent);
    }
    // Measured: 39,503 DATA packets for 108,000 messages (2.7 a packet; above 4 while the
    // window waited for UTO delivery: it now frees once every member holds a message, an
    // ACK round sooner, so fewer messages wait to be packed at this offered load).
    assert!(data_packets * 2 < messages, "{data_packets} for {messages}");
}

/// Section 3.4.1 under load: the leader crashes while every sender's window is full of 1 KiB
/// messages, so the logs the view change carries are hundreds of kilobytes, far beyond one
/// datagram (the simulator drops a packet over 65,507 bytes, as UDP must). The votes and
/// the START-VIEW go in parts of at most `repair_bytes_max`; with loss at the receivers,
/// lost parts are asked for again. Suspicion comes at 50 ms, not the lab's 500 ms.
#[test]
fn s3_4_a_view_change_under_load_carries_a_log_of_many_datagrams() {
    for (seed, loss_rx) in [(1, 0.0), (2, 0.0), (3, 0.02), (4, 0.02), (5, 0.05)] {
        let mut scenario = Scenario::clean(3);
        scenario.config = Config {
            suspect_after_us: 50_000,
            view_change_timeout_us: 100_000,
            ..Config::jumbo()
        };
        scenario.messages_per_sender = 3_000;
        scenario.message_bytes_max = 1_024;
        scenario.propose_until_us = 0;
        scenario.faults = Faults {
            loss_rx,
            ..Faults::none()
        };
        scenario.faults_until_us = 1_000_000;
        scenario.deadline_us = 10_000_000;
        // Node 0 leads view 0; it goes down 10 ms in, the others' windows full.
        scenario.scripted_crashes = vec![(10_000, NodeId(0), 400_000)];
        let outcome = run_checked(seed, &scenario);
        let parts = total(&outcome, |s| s.view_change_parts_sent);
        let missing = total(&outcome, |s| s.missing_sent);
        println!(
            "seed {seed}, loss {loss_rx}: {} view changes, {parts} view-change parts, {missing} \
             MISSING, {} packets lost, bytes by kind {:?}",
            outcome.stats.view_changes, outcome.stats.lost, outcome.stats.trunk_bytes_by_kind
        );
        assert_eq!(outcome.stats.oversized, 0, "seed {seed}");
        assert!(outcome.stats.view_changes >= 2, "seed {seed}");
        // The votes alone were several datagrams long.
        let votes_bytes = outcome.stats.trunk_bytes_by_kind[6] as usize;
        assert!(
            votes_bytes > 2 * sim::DATAGRAM_BYTES_MAX && parts > outcome.stats.view_changes,
            "seed {seed}: {parts} parts, {votes_bytes} bytes of votes"
        );
        // Every message of the correct senders was delivered everywhere.
        let survivors = outcome.history.processes.iter().filter(|p| !p.crashed);
        for process in survivors.filter(|p| p.node != NodeId(0)) {
            assert!(process.deliveries.len() >= 6_000, "seed {seed}");
        }
    }
}

/// Section 3.4 with a member that fell behind: a view whose log begins past positions a
/// member had not delivered (no vote carried them: votes begin where their own view's
/// members had all delivered) is joined by fetching those positions, in parts, from a
/// member that retains them, not by a state transfer. Seeds of the random sweep where this
/// happens (3 and 5 nodes, default retention), once as drawn and once with parts of at most
/// 300 bytes (many per fetch).
#[test]
fn s3_4_a_member_behind_the_view_fetches_what_it_lacks() {
    let mut small_parts_sent = 0;
    for seed in [277, 992, 20] {
        for small_parts in [false, true] {
            let mut scenario = Scenario::random(seed);
            // Seeds of the sweep without its group changes (the kind byte every message
            // carries since packet version 5 moved the runs: 472 and 2452 of the first
            // choice no longer fall behind a view).
            scenario.change_every_us = None;
            scenario.spare_nodes = 0;
            if small_parts {
                scenario.config.repair_bytes_max = 300;
            }
            let outcome = run_checked(seed, &scenario);
            let gaps: usize = outcome.history.processes.iter().map(|p| p.gaps.len()).sum();
            let fetched = total(&outcome, |s| s.positions_fetched);
            let parts = total(&outcome, |s| s.fetch_parts_sent);
            println!("seed {seed} small parts {small_parts}: {fetched} positions fetched in {parts} parts, {gaps} gaps");
            assert_eq!(gaps, 0, "seed {seed}");
            if small_parts {
                small_parts_sent += parts;
            } else {
                assert!(fetched > 0, "seed {seed}");
            }
        }
    }
    // Seed 20 took the place of 230 when an idle receiver's ACK began to go as soon as the
    // ACK delay since its last one had passed (the histories moved; 230 no longer fell
    // behind a view). Measured: 24, 31 and 12 positions in 1, 4 and 12 parts; with
    // 300-byte parts, 0, 31 and 12 in 0, 10 and 12 parts.
    // Seed 992 took the place of 507 when an idle receiver began to ACK at once (the
    // histories moved; 507 no longer fell behind a view): 24, 48 and 16 positions; with
    // 300-byte parts, 0, 48 and 16 in 0, 14 and 12 parts.
    // Seed 277 took the place of 317 when senders began to halve their window on an own
    // packet lost (the histories moved; 317 no longer fell behind a view). Measured: 18,
    // 47 and 35 positions in 1 part each; with 300-byte parts, 24, 48 and 0 positions in
    // 10, 31 and 0 parts. Before that:
    // 44, 50 and 35 positions in 1, 2 and 1 parts; with 300-byte parts, 44, 0
    // and 0 positions in 15, 0 and 0 parts. (Seeds 419, 427 and 795 until ACKs waited a
    // share of the queue under load, which moved the histories: 58, 61 and 30 positions;
    // on the first choice of seeds, 472, 2452 and 419 before packet version 5: 94, 71 and
    // 58 positions where there had been 2, 2 and 1 gaps.)
    assert!(small_parts_sent >= 10, "{small_parts_sent} parts");
}
