//! The driver's CPU cost per ordered message on 127.0.0.1: `nodes` all-to-all nodes
//! (default 5) over unicast fan-out, 64-byte messages, 9000-byte packets, every node
//! proposing `messages` (default 100,000) as fast as its backlog takes them. Prints the
//! time until every node delivered every message, the rate at the slowest node, and the
//! CPU time of the whole process (all nodes' threads, the kernel's UDP work included) per
//! million messages delivered at every node.
//!
//! Usage: `cargo run --release -p tessera-order-udp --example udp_cost [NODES] [MESSAGES]`.

use bytes::Bytes;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tessera_order::{Config, Event};
use tessera_order_udp::{spawn, DriverConfig, DriverError};

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(5, |n| n.parse().expect("NODES"));
    let per_node: usize = args
        .next()
        .map_or(100_000, |n| n.parse().expect("MESSAGES"));
    let config = Config {
        suspect_after_us: 2_000_000,
        view_change_timeout_us: 500_000,
        ..Config::jumbo()
    };
    let sockets: Vec<UdpSocket> = (0..nodes)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let peers: Vec<SocketAddr> = sockets
        .iter()
        .map(|s| s.local_addr().expect("addr"))
        .collect();
    let mut handles: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let driver = DriverConfig::all_to_all(i, nodes, config.clone(), peers.clone());
            spawn(driver, socket).expect("spawn")
        })
        .collect();
    let target = per_node * nodes;
    let counters: Vec<_> = handles
        .iter_mut()
        .map(|handle| {
            let events = handle.take_events();
            std::thread::spawn(move || {
                let mut delivered = 0;
                while delivered < target {
                    match events.recv_timeout(Duration::from_secs(30)) {
                        Ok(Event::Deliver { .. }) => delivered += 1,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                (delivered, Instant::now())
            })
        })
        .collect();
    let (started, cpu_before) = (Instant::now(), cpu_seconds());
    let message = Bytes::from(vec![7u8; 64]);
    let mut proposed = vec![0; nodes];
    while proposed.iter().any(|&count| count < per_node) {
        for (i, handle) in handles.iter().enumerate() {
            while proposed[i] < per_node {
                match handle.propose(message.clone()) {
                    Ok(()) => proposed[i] += 1,
                    Err(DriverError::BacklogFull) => break,
                    Err(error) => panic!("propose: {error}"),
                }
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let ends: Vec<_> = counters
        .into_iter()
        .map(|t| t.join().expect("counter"))
        .collect();
    let cpu = cpu_seconds() - cpu_before;
    let last = ends.iter().map(|(_, at)| *at).max().expect("nodes");
    let seconds = last.duration_since(started).as_secs_f64();
    let delivered = ends.iter().map(|(count, _)| *count).min().expect("nodes");
    let sent: u64 = handles
        .into_iter()
        .map(|handle| handle.stop().expect("stop").1.datagrams_sent)
        .sum();
    println!(
        "{nodes} nodes over 127.0.0.1: {delivered} of {target} messages delivered at the slowest \
         in {seconds:.2} s = {:.0} msg/s; {cpu:.2} CPU seconds = {:.2} core-seconds per million \
         delivered at every node; {sent} datagrams sent",
        delivered as f64 / seconds,
        cpu * 1e6 / delivered as f64,
    );
}

/// User and system CPU time of this process so far (`/proc/self/stat`, in clock ticks of
/// 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let user: u64 = fields[11].parse().expect("utime");
    let system: u64 = fields[12].parse().expect("stime");
    (user + system) as f64 / 100.0
}
