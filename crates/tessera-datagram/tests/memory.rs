//! Scenario tests of the endpoint's memory budgets (issue 15) over the seeded simulator:
//! peers that start messages and never finish them hold at most the reassembly budget (of
//! their address, and in all), a reassembly that stalls is given up with its session, an
//! honest peer's transfer completes alongside, messages the application has not taken yet
//! hold the same budget, packets held past a gap hold at most theirs (however many sessions
//! send them), and a peer that never takes its answers cannot make the endpoint queue more
//! than the send budgets. Every failure prints the seed.

use bytes::Bytes;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tessera_datagram::packet::{Packet, PacketKind};
use tessera_datagram::sim::{addr, LinkConfig, Sim};
use tessera_datagram::{Config, Event, MemoryConfig, Micros, SendError, SessionId};

const MESSAGE_MAX: usize = 1 << 20;

/// A DATA packet of `session` at `seq`: a fragment of a message of `message_len` bytes that
/// the sender never finishes (or, with `last`, a whole message of its payload).
fn fragment(session: u64, seq: u32, first: bool, last: bool, message_len: u32) -> Vec<u8> {
    let payload = if last { message_len as usize } else { 1000 };
    packet(session, seq, first, last, message_len, payload)
}

/// A DATA packet of `session` at `seq` with `payload` bytes of payload.
fn packet(
    session: u64,
    seq: u32,
    first: bool,
    last: bool,
    message_len: u32,
    payload: usize,
) -> Vec<u8> {
    Packet {
        kind: PacketKind::Data,
        first,
        last,
        probe: false,
        session,
        seq,
        ack: 0,
        window: 256,
        timestamp: 0,
        echo: 0,
        message_len,
        ack_delay: 0,
        queue: 0,
        payload: Bytes::from(vec![0x5a; payload]),
    }
    .encode()
}

/// Hostile source `index`: an address outside the simulator's hosts.
fn hostile(index: u32) -> SocketAddr {
    let ip = Ipv4Addr::new(10, 9, (index >> 8) as u8, index as u8);
    SocketAddr::new(IpAddr::V4(ip), 40_000 + index as u16)
}

fn budgets() -> Config {
    Config {
        message_bytes_max: MESSAGE_MAX,
        memory: MemoryConfig {
            reassembly_bytes_max: 4 * MESSAGE_MAX,
            reassembly_bytes_per_source_max: MESSAGE_MAX,
            reassembly_stall_us: 300_000,
            ..MemoryConfig::default()
        },
        ..Config::default()
    }
}

/// The client sends `count` messages of `len` bytes, one at a time, and the server echoes
/// each; runs `hostile` at every step and checks the server's reassembly bytes against
/// `limit` throughout. Returns the virtual time taken; panics if not done by `deadline_us`.
fn echo_transfer(
    sim: &mut Sim,
    (client, server): (SocketAddr, SocketAddr),
    (count, len): (u32, usize),
    limit: usize,
    mut hostile: impl FnMut(&mut Sim),
    deadline_us: Micros,
) -> Micros {
    let start = sim.now();
    let session = sim.endpoint(client).connect(server, start);
    let (mut sent, mut answered) = (0, 0);
    let seed = sim.seed();
    sim.run_until(start + deadline_us, |sim| {
        hostile(sim);
        let now = sim.now();
        let held = sim.endpoint(server).reassembly_bytes();
        assert!(held <= limit, "seed {seed}: {held} bytes reassembling");
        if sent == answered && sent < count {
            let message = Bytes::from(vec![sent as u8; len]);
            sim.endpoint(client).send(session, message, now).unwrap();
            sent += 1;
        }
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message {
                session, message, ..
            } = event
            {
                sim.endpoint(server).send(session, message, now).unwrap();
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            match event {
                Event::Message { message, .. } => {
                    assert_eq!(message.len(), len, "seed {seed}");
                    answered += 1;
                }
                other => panic!("seed {seed}: client: unexpected {other:?}"),
            }
        }
        answered == count
    })
    .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
    sim.now() - start
}

/// A simulator with a client and a server, both with the test's budgets.
fn client_and_server(seed: u64) -> (Sim, SocketAddr, SocketAddr) {
    let mut sim = Sim::new(seed);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(server, budgets());
    sim.add_endpoint(client, budgets());
    (sim, client, server)
}

/// `source` opens `session` at `server` with the first fragment of a message of the largest
/// size, which it never continues.
fn start_largest(sim: &mut Sim, source: SocketAddr, server: SocketAddr, session: u64) {
    let opening = fragment(session, 0, true, false, MESSAGE_MAX as u32);
    sim.inject(source, server, opening);
}

/// Hostile sources each open sessions and start a message of the largest size on each,
/// never continuing: 3 sources of 8 sessions would reserve 24 MiB; they get 1 MiB each (one
/// message per source), and the client from its own address is served alongside.
#[test]
fn partial_messages_from_hostile_sources_hold_at_most_their_budget() {
    let (mut sim, client, server) = client_and_server(201);
    let mut next_session = 0x0bad_0000_u64;
    let mut started = 0;
    let attack = |sim: &mut Sim| {
        // A new round of first fragments every 10 ms, as stalled ones are given up.
        if sim.now() / 10_000 >= started {
            started = sim.now() / 10_000 + 1;
            for source in 0..3 {
                for _ in 0..8 {
                    next_session += 1;
                    start_largest(sim, hostile(source), server, next_session);
                }
            }
        }
        sim.wake_at(started * 10_000);
    };
    let limit = 4 * MESSAGE_MAX;
    let pair = (client, server);
    let alone = echo_transfer(&mut sim, pair, (8, 600_000), limit, |_| {}, 3_000_000);
    let took = echo_transfer(&mut sim, pair, (8, 600_000), limit, attack, 3_000_000);
    let stats = sim.endpoint(server).stats();
    println!(
        "8 echoes of 600 kB: {alone} µs alone, {took} µs under the attack; {} first \
         fragments dropped, {} reassemblies given up",
        stats.dropped_reassembly_budget, stats.reassemblies_stalled
    );
    assert!(stats.dropped_reassembly_budget > 0, "{stats:?}");
    assert!(took <= 2 * alone + 5_000, "{took} µs vs {alone} µs");
    assert!(sim.endpoint(server).reassembly_bytes() <= 3 * MESSAGE_MAX + 600_000);
}

/// With more hostile sources than the total budget has room for, the total holds, and the
/// client gets in as stalled reassemblies are given up.
#[test]
fn the_total_reassembly_budget_holds_against_many_sources() {
    let (mut sim, client, server) = client_and_server(202);
    let mut next_session = 0x0bad_0000_u64;
    let mut injected = false;
    let attack = |sim: &mut Sim| {
        if !injected {
            injected = true;
            for source in 0..16 {
                next_session += 1;
                start_largest(sim, hostile(source), server, next_session);
            }
        }
    };
    let limit = 4 * MESSAGE_MAX;
    let took = echo_transfer(
        &mut sim,
        (client, server),
        (4, 600_000),
        limit,
        attack,
        5_000_000,
    );
    let stats = sim.endpoint(server).stats();
    println!(
        "4 echoes of 600 kB behind 16 MiB of stalled reservations: {took} µs; {} first \
         fragments dropped, {} half-open sessions evicted, {} reassemblies given up",
        stats.dropped_reassembly_budget, stats.half_open_evicted, stats.reassemblies_stalled
    );
    assert!(stats.dropped_reassembly_budget >= 12, "{stats:?}");
}

/// An established session that starts a message and sends no more of it is given up after
/// the stall timeout, and its reservation with it.
#[test]
fn a_stalled_reassembly_is_given_up_with_its_session() {
    let mut sim = Sim::new(203);
    let server = addr(2);
    sim.add_endpoint(server, budgets());
    let source = hostile(1);
    // A whole one-packet message establishes the session; then a message that stalls.
    sim.inject(source, server, fragment(0x77, 0, true, true, 100));
    sim.inject(source, server, fragment(0x77, 1, true, false, 500_000));
    sim.run_for(1_000);
    while sim.endpoint(server).poll_event().is_some() {}
    assert_eq!(sim.endpoint(server).reassembly_bytes(), 500_000);
    sim.run_for(250_000);
    assert_eq!(sim.endpoint(server).reassembly_bytes(), 500_000);
    sim.run_for(100_000);
    assert_eq!(sim.endpoint(server).reassembly_bytes(), 0);
    let stats = sim.endpoint(server).stats();
    assert_eq!(stats.reassemblies_stalled, 1, "{stats:?}");
    assert_eq!(sim.endpoint(server).session_count(), 0);
}

/// The session a one-packet request from `source` opened at `server`.
fn requested(sim: &mut Sim, source: SocketAddr, server: SocketAddr, session: u64) -> SessionId {
    sim.inject(source, server, fragment(session, 0, true, true, 10));
    sim.run_for(1_000);
    loop {
        match sim.endpoint(server).poll_event() {
            Some(Event::Message { session, .. }) => break session,
            Some(_) => continue,
            None => panic!("the request was not delivered"),
        }
    }
}

/// Peers that send requests and never acknowledge the answers: the endpoint queues at most
/// the per-session count and the endpoint-wide bytes, refusing (and counting) the rest.
#[test]
fn answers_for_peers_that_take_none_are_bounded() {
    let mut sim = Sim::new(204);
    let server = addr(2);
    let config = Config {
        message_bytes_max: MESSAGE_MAX,
        memory: MemoryConfig {
            send_queue_bytes_max: 1 << 20,
            send_queue_messages_per_session_max: 16,
            ..MemoryConfig::default()
        },
        ..Config::default()
    };
    sim.add_endpoint(server, config);
    let first = requested(&mut sim, hostile(2), server, 0x78);
    let now = sim.now();
    let mut refused = 0;
    for _ in 0..100 {
        match sim
            .endpoint(server)
            .send(first, Bytes::from(vec![1; 10]), now)
        {
            Ok(()) => {}
            Err(SendError::QueueFull { .. }) => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(refused, 84, "16 small answers queued, the rest refused");
    let second = requested(&mut sim, hostile(3), server, 0x79);
    let now = sim.now();
    let endpoint = sim.endpoint(server);
    endpoint
        .send(second, Bytes::from(vec![2; 900_000]), now)
        .expect("fits the endpoint's budget");
    let over = endpoint.send(second, Bytes::from(vec![3; 200_000]), now);
    assert!(matches!(over, Err(SendError::QueueFull { .. })), "{over:?}");
    assert_eq!(endpoint.stats().sends_refused_queue_full, 85);
    assert!(endpoint.send_queued_bytes() <= 1 << 20);
}

/// Out-of-order budgets of 4 MiB in all and 1 MiB per source, held 300 ms at most.
fn out_of_order_budgets() -> Config {
    let mut config = budgets();
    config.memory.out_of_order_bytes_max = 4 << 20;
    config.memory.out_of_order_bytes_per_source_max = 1 << 20;
    config.memory.out_of_order_hold_us = 300_000;
    config
}

/// The packets a peer that sends only past a gap sends on `session`: 2 to 100 (1 never
/// comes), of 60,000 bytes each, 5.9 MB per session.
fn past_the_gap(sim: &mut Sim, source: SocketAddr, server: SocketAddr, session: u64) {
    for seq in 2..=100 {
        let contents = packet(session, seq, false, false, 0, 60_000);
        sim.inject(source, server, contents);
    }
}

/// 8 hostile addresses open 16 sessions each and send only packets past a gap on each, again
/// every 10 ms (5.9 MB per session, 760 MB in all if held), while a client echoes 8 messages
/// over a link that loses 2% of its packets (so it needs packets kept past its own gaps).
/// The server holds at most 4 MiB of such packets in all and 1 MiB per address at every
/// step, and the client's echoes complete.
#[test]
fn packets_past_a_gap_from_many_sessions_hold_at_most_their_budget() {
    let seed = 205;
    let run = |attacked: bool| {
        let mut sim = Sim::new(seed);
        let (client, server) = (addr(1), addr(2));
        sim.add_endpoint(server, out_of_order_budgets());
        sim.add_endpoint(client, out_of_order_budgets());
        let lossy = LinkConfig {
            loss: 0.02,
            ..LinkConfig::default()
        };
        sim.set_links_between(client, server, lossy);
        let sessions: Vec<(SocketAddr, u64)> = (0..8)
            .flat_map(|source| {
                (0..16).map(move |n| (hostile(source), 0x0bad_0000 + (source as u64) * 100 + n))
            })
            .collect();
        let (mut opened, mut next_round) = (false, 1_000);
        let (mut held_max, mut source_max) = (0, 0);
        let attack = |sim: &mut Sim| {
            if !attacked {
                return;
            }
            if !opened {
                opened = true;
                for &(source, session) in &sessions {
                    sim.inject(source, server, fragment(session, 0, true, true, 10));
                }
            }
            if sim.now() >= next_round {
                next_round = sim.now() + 10_000;
                for &(source, session) in &sessions {
                    past_the_gap(sim, source, server, session);
                }
            }
            sim.wake_at(next_round);
            let endpoint = sim.endpoint_ref(server);
            let held = endpoint.out_of_order_bytes();
            assert!(held <= 4 << 20, "seed {seed}: {held} bytes held past gaps");
            held_max = held_max.max(held);
            for source in 0..8 {
                let (_, of_source) = endpoint.held_bytes_of(hostile(source).ip());
                assert!(
                    of_source <= 1 << 20,
                    "seed {seed}: {of_source} bytes of one source"
                );
                source_max = source_max.max(of_source);
            }
        };
        let took = echo_transfer(
            &mut sim,
            (client, server),
            (8, 600_000),
            4 << 20,
            attack,
            5_000_000,
        );
        let stats = sim.endpoint(server).stats();
        (took, stats, held_max, source_max)
    };
    let (alone, _, _, _) = run(false);
    let (took, stats, held_max, source_max) = run(true);
    println!(
        "8 echoes of 600 kB, 2% loss: {alone} µs alone, {took} µs with 128 hostile sessions \
         sending past a gap; held at most {held_max} bytes ({source_max} of one source); \
         {} packets held, {} dropped over the budget, {} expired",
        stats.held_out_of_order, stats.dropped_out_of_order_budget, stats.out_of_order_expired
    );
    assert!(
        held_max > 3 << 20,
        "the attack filled the budget: {held_max}"
    );
    assert!(stats.dropped_out_of_order_budget > 10_000, "{stats:?}");
    assert!(took <= 3 * alone + 20_000, "{took} µs vs {alone} µs");
}

/// A peer that sends only past a gap and then goes quiet holds its packets for
/// `out_of_order_hold_us`, not for good; the session stays.
#[test]
fn packets_past_a_gap_that_never_fills_are_dropped_after_the_hold_time() {
    let mut sim = Sim::new(206);
    let server = addr(2);
    sim.add_endpoint(server, out_of_order_budgets());
    let source = hostile(1);
    sim.inject(source, server, fragment(0x99, 0, true, true, 10));
    sim.run_for(1_000);
    while sim.endpoint(server).poll_event().is_some() {}
    past_the_gap(&mut sim, source, server, 0x99);
    sim.run_for(1_000);
    let held = sim.endpoint(server).out_of_order_bytes();
    assert_eq!(
        held,
        17 * (60_000 + tessera_datagram::HELD_PACKET_OVERHEAD_BYTES)
    );
    assert_eq!(sim.endpoint(server).held_bytes_of(source.ip()), (0, held));
    sim.run_for(250_000);
    assert_eq!(sim.endpoint(server).out_of_order_bytes(), held);
    sim.run_for(100_000);
    assert_eq!(sim.endpoint(server).out_of_order_bytes(), 0);
    let stats = sim.endpoint(server).stats();
    assert_eq!(stats.out_of_order_expired, 17, "{stats:?}");
    assert_eq!(stats.dropped_out_of_order_budget, 82, "{stats:?}");
    assert_eq!(sim.endpoint(server).session_count(), 1);
}

/// Messages delivered and not yet taken by the application hold the message budget: with
/// the application away for 200 ms, 8 sessions of one client each send a message of
/// 300 kB; 3 fit the 1 MiB of the client's address, the others' first fragments are
/// dropped unacknowledged. Once the application takes what waits, every message arrives
/// whole and in order.
#[test]
fn messages_the_application_has_not_taken_hold_the_message_budget() {
    let seed = 207;
    let mut sim = Sim::new(seed);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(server, budgets());
    sim.add_endpoint(client, budgets());
    let now = sim.now();
    let sessions: Vec<SessionId> = (0..8)
        .map(|n| {
            let session = sim.endpoint(client).connect(server, now);
            let message = Bytes::from(vec![n as u8; 300_000]);
            sim.endpoint(client).send(session, message, now).unwrap();
            session
        })
        .collect();
    let mut held_max = 0;
    let away_until = sim.now() + 200_000;
    let _ = sim.run_until(away_until, |sim| {
        let held = sim.endpoint_ref(server).reassembly_bytes();
        assert!(held <= 1 << 20, "seed {seed}: {held} bytes held");
        held_max = held_max.max(held);
        false
    });
    assert_eq!(held_max, 900_000, "3 messages of 300 kB fit 1 MiB");
    let dropped = sim.endpoint(server).stats().dropped_reassembly_budget;
    assert!(dropped > 0, "seed {seed}");
    let mut received = std::collections::BTreeMap::new();
    sim.run_until(away_until + 2_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message, .. } = event {
                assert!(
                    message.iter().all(|&byte| byte == message[0]),
                    "seed {seed}"
                );
                assert_eq!(message.len(), 300_000, "seed {seed}");
                received.insert(message[0], ());
            }
        }
        received.len() == sessions.len()
    })
    .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
    assert_eq!(sim.endpoint(server).reassembly_bytes(), 0);
    println!(
        "8 messages of 300 kB, application away 200 ms: at most {held_max} bytes held, {dropped} \
         first fragments dropped meanwhile, all delivered {} µs later",
        sim.now() - away_until
    );
}

/// One address holds at most `sessions_per_source_max` sessions, established ones included:
/// past it, its newcomers are dropped while another address still opens sessions.
#[test]
fn one_address_holds_at_most_its_share_of_sessions() {
    let mut sim = Sim::new(208);
    let server = addr(2);
    let config = Config {
        sessions_per_source_max: 8,
        ..Config::default()
    };
    sim.add_endpoint(server, config);
    for n in 0..20 {
        // A whole one-packet message each: every session is established.
        sim.inject(hostile(1), server, fragment(0x100 + n, 0, true, true, 10));
    }
    sim.run_for(1_000);
    while sim.endpoint(server).poll_event().is_some() {}
    assert_eq!(sim.endpoint(server).session_count(), 8);
    let stats = sim.endpoint(server).stats();
    assert_eq!(stats.dropped_sessions_source_full, 12, "{stats:?}");
    sim.inject(hostile(2), server, fragment(0x200, 0, true, true, 10));
    sim.run_for(1_000);
    assert_eq!(sim.endpoint(server).session_count(), 9);
}
