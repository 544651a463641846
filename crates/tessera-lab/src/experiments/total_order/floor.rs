//! The machine's floor under the protocol's latencies: the protocol's two message patterns
//! with raw multicast datagrams and no protocol at all. Node 0 multicasts a small datagram
//! through the switches (the PO pattern: one DATA, every node woken to receive it, node 0
//! included, as the protocol's own broadcasts come back through the network); every node
//! that receives it multicasts an answer at once (the UTO pattern: every receiver's ACK to
//! every node), and a node holds the round once it has every node's answer. The 2-node
//! echo (`load::echo`) wakes one thread at a time; these wake every node's, as the
//! protocol does, on the same shared CPUs.

use super::load::percentile;
use super::net::{TwoSwitch, GROUP};
use crate::LabError;
use serde::Serialize;
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Medians of the raw patterns, microseconds from node 0's send.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Floor {
    /// Until a node received node 0's datagram (every node's sample).
    pub fan_out_us_median: f64,
    /// Until a node held every node's answer to it (every node's sample).
    pub all_answered_us_median: f64,
    /// Rounds sent.
    pub rounds: usize,
}

const PROBE: u8 = 0;
const ANSWER: u8 = 1;
/// Kind, round, stamp.
const DATAGRAM_BYTES: usize = 1 + 8 + 8;

/// Runs `rounds` rounds, one a millisecond (as a paced run's batches).
pub fn measure(network: &TwoSwitch, rounds: usize) -> Result<Floor, LabError> {
    let group = SocketAddrV4::new(*GROUP.ip(), GROUP.port() + 3);
    let nodes = network.nodes();
    let pairs = (0..nodes)
        .map(|node| super::load::sockets(network, node, group))
        .collect::<Result<Vec<_>, _>>()?;
    for (_, rx) in &pairs {
        rx.set_read_timeout(Some(Duration::from_millis(20)))
            .map_err(LabError::io("set a timeout"))?;
    }
    let origin = Instant::now();
    let stop = AtomicBool::new(false);
    let samples: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|scope| {
        let threads: Vec<_> = pairs
            .iter()
            .map(|(tx, rx)| {
                let stop = &stop;
                scope.spawn(move || listen(tx, rx, group, nodes, origin, stop))
            })
            .collect();
        let (tx0, _) = &pairs[0];
        for round in 0..rounds as u64 {
            std::thread::sleep(Duration::from_millis(1));
            let stamp = origin.elapsed().as_micros() as u64;
            let _ = tx0.send_to(&datagram(PROBE, round, stamp), group);
        }
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    });
    let mut fan_out: Vec<f64> = samples.iter().flat_map(|s| s.0.clone()).collect();
    let mut answered: Vec<f64> = samples.iter().flat_map(|s| s.1.clone()).collect();
    Ok(Floor {
        fan_out_us_median: percentile(&mut fan_out, 0.5),
        all_answered_us_median: percentile(&mut answered, 0.5),
        rounds,
    })
}

fn datagram(kind: u8, round: u64, stamp: u64) -> [u8; DATAGRAM_BYTES] {
    let mut bytes = [0u8; DATAGRAM_BYTES];
    bytes[0] = kind;
    bytes[1..9].copy_from_slice(&round.to_be_bytes());
    bytes[9..].copy_from_slice(&stamp.to_be_bytes());
    bytes
}

/// Kind, round and stamp of one of our datagrams; `None` for anything else.
fn parse(bytes: &[u8]) -> Option<(u8, u64, u64)> {
    if bytes.len() != DATAGRAM_BYTES {
        return None;
    }
    let round = u64::from_be_bytes(bytes[1..9].try_into().ok()?);
    let stamp = u64::from_be_bytes(bytes[9..17].try_into().ok()?);
    Some((bytes[0], round, stamp))
}

/// One node: answers every probe at once, times the probe's arrival and the round's last
/// answer.
fn listen(
    tx: &UdpSocket,
    rx: &UdpSocket,
    group: SocketAddrV4,
    nodes: usize,
    origin: Instant,
    stop: &AtomicBool,
) -> (Vec<f64>, Vec<f64>) {
    let mut answers = std::collections::HashMap::<u64, usize>::new();
    let (mut fan_out, mut answered) = (Vec::new(), Vec::new());
    let mut buffer = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = rx.recv(&mut buffer) else {
            continue;
        };
        let Some((kind, round, stamp)) = parse(&buffer[..n]) else {
            continue;
        };
        let now = origin.elapsed().as_micros() as f64;
        if kind == PROBE {
            fan_out.push(now - stamp as f64);
            let _ = tx.send_to(&datagram(ANSWER, round, stamp), group);
        } else {
            let count = answers.entry(round).or_insert(0);
            *count += 1;
            if *count == nodes {
                answered.push(now - stamp as f64);
                answers.remove(&round);
            }
        }
    }
    (fan_out, answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a node sends it reads back (a read past the round's bytes lost every sample of
    /// the first version), and nothing else of another length.
    #[test]
    fn a_datagram_reads_back() {
        let bytes = datagram(ANSWER, 7, 123_456);
        assert_eq!(parse(&bytes), Some((ANSWER, 7, 123_456)));
        let mut longer = [0u8; 64];
        longer[..DATAGRAM_BYTES].copy_from_slice(&bytes);
        assert_eq!(parse(&longer[..DATAGRAM_BYTES]), Some((ANSWER, 7, 123_456)));
        assert_eq!(parse(&longer), None);
    }
}
