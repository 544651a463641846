//! The state machine's CPU cost per ordered message, without a network: `nodes` all-to-all
//! nodes (default 5), 64-byte messages, 9000-byte packets, every broadcast handed to every
//! node in one FIFO order (the sequencer link, lossless and instant). Prints the CPU time
//! of the whole loop (every node's work on one thread: encode, decode, append, ACKs,
//! delivery) per million messages delivered at every node.
//!
//! Usage: `cargo run --release -p tessera-order --example cost [NODES] [MESSAGES_PER_NODE]`.

use bytes::Bytes;
use std::time::Instant;
use tessera_order::sim::initial_nodes;
use tessera_order::{Config, Destination, Event, Group, Micros, NodeId};

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(5, |n| n.parse().expect("NODES"));
    let per_node: u64 = args
        .next()
        .map_or(200_000, |n| n.parse().expect("MESSAGES_PER_NODE"));
    let config = Config::jumbo();
    let mut cluster = initial_nodes(&config, &Group::all_to_all(nodes));
    let message = Bytes::from(vec![7u8; 64]);
    let (mut proposed, mut delivered) = (vec![0u64; nodes], vec![0u64; nodes]);
    let target = per_node * nodes as u64;
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let mut now: Micros = 0;
    let mut wire: Vec<(usize, Destination, Vec<u8>)> = Vec::new();
    while delivered.iter().any(|&count| count < target) {
        now += 10;
        for (i, node) in cluster.iter_mut().enumerate() {
            while proposed[i] < per_node && node.propose(message.clone(), now).is_ok() {
                proposed[i] += 1;
            }
            while let Some(transmit) = node.poll_transmit(now) {
                wire.push((i, transmit.destination, transmit.contents));
            }
        }
        for (_, destination, contents) in wire.drain(..) {
            for (j, node) in cluster.iter_mut().enumerate() {
                if destination == Destination::All
                    || destination == Destination::Node(NodeId(j as u16))
                {
                    node.handle_packet(&contents, now);
                }
            }
        }
        for (i, node) in cluster.iter_mut().enumerate() {
            if node.poll_timeout().is_some_and(|at| at <= now) {
                node.handle_timeout(now);
            }
            while let Some(event) = node.poll_event() {
                if matches!(event, Event::Deliver { .. }) {
                    delivered[i] += 1;
                }
            }
        }
        assert!(now < 1_000_000_000, "stalled: delivered {delivered:?}");
    }
    let wall = started.elapsed().as_secs_f64();
    let seconds = cpu_seconds() - cpu_before;
    let data: u64 = cluster
        .iter()
        .map(|node| node.stats().data_packets_sent)
        .sum();
    let acks: u64 = cluster
        .iter()
        .map(|node| node.stats().ack_packets_sent)
        .sum();
    println!(
        "{nodes} nodes, {target} messages delivered at each: {seconds:.2} CPU seconds \
         ({wall:.2} s wall), \
         {:.3} core-seconds per million messages delivered at every node \
         ({:.3} per node); DATA packets {data}, ACK packets {acks}",
        seconds * 1e6 / target as f64,
        seconds * 1e6 / target as f64 / nodes as f64,
    );
}

/// User and system CPU time of this process so far (`/proc/self/stat`, in clock ticks of
/// 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}
