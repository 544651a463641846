//! Scenario tests of the endpoint's memory budgets (issue 15) over the seeded simulator:
//! peers that start messages and never finish them hold at most the reassembly budget (of
//! their address, and in all), a reassembly that stalls is given up with its session, an
//! honest peer's transfer completes alongside, and a peer that never takes its answers
//! cannot make the endpoint queue more than the send budgets. Every failure prints the seed.

use bytes::Bytes;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tessera_datagram::packet::{Packet, PacketKind};
use tessera_datagram::sim::{addr, Sim};
use tessera_datagram::{Config, Event, MemoryConfig, Micros, SendError, SessionId};

const MESSAGE_MAX: usize = 1 << 20;

/// A DATA packet of `session` at `seq`: a fragment of a message of `message_len` bytes that
/// the sender never finishes (or, with `last`, a whole message of its payload).
fn fragment(session: u64, seq: u32, first: bool, last: bool, message_len: u32) -> Vec<u8> {
    let payload = if last { message_len as usize } else { 1000 };
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
