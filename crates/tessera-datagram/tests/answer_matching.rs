//! Which expectation an arriving answer settles, under a receive budget.
//!
//! A client reading from a server also sends it small requests whose answers come first
//! (`lab radon --mirror`'s readers ask their server for its counters every 10 ms while
//! they read). An answer that settled the oldest expectation whatever its size took a
//! large read's expectation for a small answer: the session then expected too little, and
//! the last read's answer was granted one packet per round trip, seconds for a few MB,
//! until the client's request timeout sent the read again.

use bytes::Bytes;
use std::collections::BTreeMap;
use tessera_datagram::sim::{addr, BottleneckConfig, LinkConfig, Sim};
use tessera_datagram::{Config, Event, Micros};

/// Bytes of each read's answer.
const READ_BYTES: usize = 1 << 20;
/// Bytes of the small answer whose size the client does not announce (a counters list).
const SMALL_BYTES: usize = 4_000;
/// How long the server takes to read a block before it answers, µs (its disk).
const DISK_US: Micros = 5_000;

/// A client with a 20-packet receive budget behind a 200 Mbit/s port asks one server for
/// `reads` blocks of [`READ_BYTES`] at once and, just after, for a small answer of a size
/// it does not say, which the server answers at once while the reads wait for its disk.
/// Returns when each read's answer arrived, µs after it was asked.
fn reads_beside_a_small_answer(seed: u64, reads: usize) -> Vec<Micros> {
    let mut sim = Sim::new(seed);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(
        client,
        Config {
            receive_budget_packets: Some(20),
            ..Config::default()
        },
    );
    sim.add_endpoint(server, Config::default());
    // A busy host's round trip (the lab's readers' host wakes up to ms late).
    sim.set_default_link(LinkConfig {
        delay_us: 250,
        ..LinkConfig::default()
    });
    sim.set_bottleneck(
        client,
        BottleneckConfig {
            rate_bits_per_s: 200_000_000,
            buffer_bytes: 193_792,
        },
    );
    let session = sim.endpoint(client).connect(server, 0);
    let asked = sim.now();
    for i in 0..reads {
        let request = Bytes::from(vec![b'r', i as u8]);
        sim.endpoint(client)
            .request(session, request, Some(READ_BYTES), asked)
            .unwrap();
    }
    sim.endpoint(client)
        .request(session, Bytes::from_static(b"s"), None, asked)
        .unwrap();
    // Reads the server has taken, answered once its disk is done: (due, session, index).
    let mut disk: BTreeMap<(Micros, usize), tessera_datagram::SessionId> = BTreeMap::new();
    let mut arrived = Vec::new();
    let _ = sim.run_until(asked + 20_000_000, |sim| {
        let now = sim.now();
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message {
                session, message, ..
            } = event
            {
                if message[0] == b's' {
                    let small = Bytes::from(vec![b's'; SMALL_BYTES]);
                    sim.endpoint(server).send(session, small, now).unwrap();
                } else {
                    disk.insert((now + DISK_US, message[1] as usize), session);
                    sim.wake_at(now + DISK_US);
                }
            }
        }
        while let Some((&(due, index), &session)) = disk.iter().next() {
            if due > now {
                break;
            }
            disk.remove(&(due, index));
            let answer = Bytes::from(vec![b'r'; READ_BYTES]);
            sim.endpoint(server).send(session, answer, now).unwrap();
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message { message, .. } = event {
                if message.len() == READ_BYTES {
                    arrived.push(now - asked);
                }
            }
        }
        arrived.len() == reads
    });
    arrived
}

/// Each read's answer arrives at about the port's rate although a small answer of unknown
/// size overtook them all: the small answer settles its own expectation, not the oldest
/// read's. (Settling the oldest, the last read was granted a packet per round trip: it
/// arrived after 511 ms instead of 149 ms.)
#[test]
fn a_small_answer_that_overtakes_reads_does_not_take_their_grants() {
    let reads = 3;
    let arrived = reads_beside_a_small_answer(1, reads);
    eprintln!("reads arrived at {arrived:?} µs");
    assert_eq!(arrived.len(), reads, "reads missing");
    // Three 1 MiB answers take 133 ms at the port's payload rate, after the disk's 5 ms.
    let last = *arrived.last().expect("asserted above");
    assert!(
        last <= DISK_US + 165_000,
        "the last read arrived after {last} µs"
    );
}
