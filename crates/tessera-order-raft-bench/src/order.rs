//! Three tessera-order nodes on 127.0.0.1 over tessera-order-udp (unicast fan-out), each
//! proposing a share of a closed-loop load.

use crate::Latencies;
use anyhow::Result;
use bytes::Bytes;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tessera_order::{Config, Event, Group, NodeId, Start};
use tessera_order_udp::{spawn, Broadcast, DriverConfig, Handle};

/// Bytes at the start of each message: the proposer's clock, microseconds since the origin.
pub const STAMP_BYTES: usize = 8;

/// Runs `nodes` nodes with `outstanding` messages in flight in all (spread over the nodes)
/// for `seconds`: messages UTO-delivered per second at the slowest node, and the latency
/// from proposal to UTO delivery of each node's own messages at that node.
pub fn closed_loop(
    nodes: usize,
    message_bytes: usize,
    outstanding: usize,
    seconds: f64,
) -> Result<(f64, Latencies)> {
    let sockets: Vec<UdpSocket> = (0..nodes).map(|_| socket()).collect::<Result<_>>()?;
    let peers: Vec<SocketAddr> = sockets
        .iter()
        .map(UdpSocket::local_addr)
        .collect::<Result<_, _>>()?;
    let origin = Instant::now();
    let deadline = origin + Duration::from_secs_f64(seconds);
    let mut apps = Vec::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        let driver = DriverConfig {
            // The lab's settings (`Config::jumbo`): 9000-byte packing, as loopback's MTU is
            // 64 KiB and a 1500-byte packet holds one 1 KiB message; a 20 us ACK delay, the
            // UTO latency's floor at low load (openraft answers at once); and suspicion at
            // 500 ms, since a node starved of a shared CPU can be silent for tens of
            // milliseconds and a needless view change stalls delivery (the protocol works at
            // 80 ms: `tessera-order-udp`'s loopback test).
            config: Config::jumbo(),
            group: Group::all_to_all(nodes),
            node: NodeId(i as u16),
            incarnation: 0,
            start: Start::Initial,
            seed: i as u64 + 1,
            peers: peers.clone(),
            broadcast: Broadcast::Unicast,
        };
        let handle = spawn(driver, socket)?;
        // Node i keeps its share of the outstanding messages; the first nodes take the rest.
        let share = outstanding / nodes + usize::from(i < outstanding % nodes);
        apps.push(std::thread::spawn(move || {
            let result = application(&handle, i, message_bytes, share as u64, origin, deadline);
            if let Ok((stats, driver)) = handle.stop() {
                if std::env::var_os("TESSERA_BENCH_VERBOSE").is_some() {
                    eprintln!("node {i}: {stats:?} {driver:?}");
                }
            }
            result
        }));
    }
    let mut delivered = Vec::new();
    let mut latencies = Vec::new();
    for app in apps {
        let (count, mut us) = app.join().expect("application thread")?;
        delivered.push(count);
        latencies.append(&mut us);
    }
    let slowest = delivered.into_iter().min().unwrap_or(0) as f64 / seconds;
    Ok((slowest, Latencies::of(latencies)))
}

/// A UDP socket on 127.0.0.1 with 4 MiB kernel buffers (the default 208 KiB overflows
/// under a closed-loop load, and every loss costs a NACK round).
fn socket() -> Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_recv_buffer_size(tessera_order_udp::SOCKET_BUFFER_BYTES)?;
    socket.set_send_buffer_size(tessera_order_udp::SOCKET_BUFFER_BYTES)?;
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
    Ok(socket.into())
}

/// Proposes to keep `share` own messages undelivered; counts every UTO delivery and times
/// its own.
fn application(
    handle: &Handle,
    node: usize,
    message_bytes: usize,
    share: u64,
    origin: Instant,
    deadline: Instant,
) -> Result<(u64, Vec<f64>)> {
    let (mut proposed, mut own, mut delivered) = (0u64, 0u64, 0u64);
    let mut latencies_us = Vec::new();
    let mut message = vec![0u8; message_bytes];
    while Instant::now() < deadline {
        while proposed < own + share {
            let stamp = origin.elapsed().as_micros() as u64;
            message[..STAMP_BYTES].copy_from_slice(&stamp.to_be_bytes());
            handle.propose(Bytes::copy_from_slice(&message))?;
            proposed += 1;
        }
        let Ok(mut event) = handle.events().recv_timeout(Duration::from_millis(1)) else {
            continue;
        };
        loop {
            if let Event::Deliver { id, message, .. } = event {
                delivered += 1;
                if id.sender.node.0 as usize == node {
                    own += 1;
                    let stamp = u64::from_be_bytes(message[..8].try_into().expect("stamp"));
                    latencies_us.push(origin.elapsed().as_micros() as f64 - stamp as f64);
                }
            }
            match handle.events().try_recv() {
                Ok(next) => event = next,
                Err(_) => break,
            }
        }
    }
    Ok((delivered, latencies_us))
}
