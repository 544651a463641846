//! Nodes on 127.0.0.1 over real UDP sockets: every node delivers the same messages in the
//! same order; when one node stops, the others change view and go on.

use bytes::Bytes;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tessera_order::{Config, Event, MsgId, NodeId};
use tessera_order_udp::{spawn, spawn_split_lossy, DriverConfig, Handle, Loss};

fn start(nodes: usize) -> Vec<Handle> {
    start_lossy(nodes, None)
}

/// Node `i`'s driver settings in an all-to-all group of `nodes` over unicast to `peers`.
fn driver(i: usize, nodes: usize, config: Config, peers: &[SocketAddr]) -> DriverConfig {
    DriverConfig::all_to_all(i, nodes, config, peers.to_vec())
}

/// `nodes` nodes; with `loss`, each drops datagrams as it says (seeded by the node).
fn start_lossy(nodes: usize, loss: Option<Loss>) -> Vec<Handle> {
    let sockets: Vec<UdpSocket> = (0..nodes)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let driver = driver(i, nodes, Config::default(), &peers);
            match loss {
                None => spawn(driver, socket).unwrap(),
                Some(loss) => {
                    let send = socket.try_clone().unwrap();
                    let loss = Loss {
                        seed: loss.seed + i as u64,
                        ..loss
                    };
                    spawn_split_lossy(driver, send, socket, loss).unwrap()
                }
            }
        })
        .collect()
}

/// UTO deliveries from `handle` until `count` of them, or panics after `timeout`.
fn deliveries(handle: &Handle, count: usize, timeout: Duration) -> Vec<(u64, MsgId, Bytes)> {
    let began = Instant::now();
    let mut out = Vec::new();
    while out.len() < count {
        let left = timeout.saturating_sub(began.elapsed());
        assert!(
            !left.is_zero(),
            "{} of {count} delivered before the timeout",
            out.len()
        );
        if let Ok(Event::Deliver {
            position,
            id,
            message,
        }) = handle.events().recv_timeout(left)
        {
            out.push((position, id, message));
        }
    }
    out
}

#[test]
fn three_nodes_deliver_one_order_over_udp() {
    let handles = start(3);
    for round in 0..300u32 {
        for (i, handle) in handles.iter().enumerate() {
            let message: Vec<u8> = [i as u8].into_iter().chain(round.to_be_bytes()).collect();
            handle.propose(Bytes::from(message)).unwrap();
        }
    }
    let orders: Vec<_> = handles
        .iter()
        .map(|handle| deliveries(handle, 900, Duration::from_secs(60)))
        .collect();
    for order in &orders[1..] {
        assert_eq!(order, &orders[0]);
    }
    for (position, (at, id, message)) in orders[0].iter().enumerate() {
        assert_eq!(*at, position as u64);
        assert_eq!(message[0] as u16, id.sender.node.0);
        // FIFO: a sender's messages in the order it proposed them.
        assert_eq!(
            u32::from_be_bytes(message[1..5].try_into().unwrap()),
            id.seq as u32
        );
    }
    for handle in handles {
        let (stats, driver) = handle.stop().unwrap();
        assert_eq!(stats.delivered, 900);
        assert_eq!(driver.oversized, 0);
    }
}

/// Datagrams dropped on purpose at send and at receive (5% each): the protocol recovers
/// them and every node still delivers everything in one order.
#[test]
fn lossy_nodes_still_deliver_one_order() {
    let loss = Loss {
        send: 0.05,
        receive: 0.05,
        seed: 11,
    };
    let handles = start_lossy(3, Some(loss));
    for round in 0..200u32 {
        for handle in &handles {
            handle
                .propose(Bytes::from(round.to_be_bytes().to_vec()))
                .unwrap();
        }
    }
    let orders: Vec<_> = handles
        .iter()
        .map(|handle| deliveries(handle, 600, Duration::from_secs(60)))
        .collect();
    for order in &orders[1..] {
        assert_eq!(order, &orders[0]);
    }
    let mut dropped = 0;
    for handle in handles {
        let (stats, driver) = handle.stop().unwrap();
        assert_eq!(stats.delivered, 600);
        dropped += driver.dropped_at_send + driver.dropped_at_receive;
    }
    assert!(dropped > 0, "the hook dropped nothing");
}

#[test]
fn the_others_go_on_when_a_node_stops() {
    let mut handles = start(3);
    handles[0].propose(Bytes::from_static(b"before")).unwrap();
    for handle in &handles {
        assert_eq!(
            deliveries(handle, 1, Duration::from_secs(20))[0].2,
            &b"before"[..]
        );
    }
    // Node 0 leads view 0; without it the others must agree on a view of their own.
    handles.remove(0).stop().unwrap();
    handles[0].propose(Bytes::from_static(b"after")).unwrap();
    for handle in &handles {
        let after = deliveries(handle, 1, Duration::from_secs(20));
        assert_eq!(after[0].0, 1);
        assert_eq!(after[0].2, &b"after"[..]);
    }
    for handle in handles {
        let (stats, _) = handle.stop().unwrap();
        assert!(stats.view_changes >= 1);
    }
}

/// Keyed nodes: a group under one key delivers; a node under another key, and datagrams
/// without a MAC, are dropped before the protocol sees them.
#[test]
fn keyed_nodes_take_only_datagrams_macd_with_their_key() {
    let sockets: Vec<UdpSocket> = (0..3)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let group_key = tessera_auth::Key([7; 32]);
    let other_key = tessera_auth::Key([8; 32]);
    let handles: Vec<Handle> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let driver = driver(i, 3, Config::default(), &peers);
            // Node 2 holds the wrong key: the other two never hear it, nor it them.
            let key = if i == 2 { other_key } else { group_key };
            tessera_order_udp::spawn_keyed(driver, socket, key).unwrap()
        })
        .collect();
    let intruder = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..50 {
        intruder
            .send_to(b"not a packet of this group", peers[0])
            .unwrap();
    }
    handles[2]
        .propose(Bytes::from_static(b"from the wrong key"))
        .unwrap();
    // Nodes 0 and 1 are a majority: after suspecting node 2 they go on without it.
    handles[0].propose(Bytes::from_static(b"ordered")).unwrap();
    let delivered = deliveries(&handles[0], 1, Duration::from_secs(30));
    assert_eq!(delivered[0].2, Bytes::from_static(b"ordered"));
    assert_eq!(
        deliveries(&handles[1], 1, Duration::from_secs(30))[0].2,
        delivered[0].2
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut handles = handles;
    let wrong = handles.pop().unwrap().stop().unwrap().1;
    let (_, first) = handles.remove(0).stop().unwrap();
    assert!(
        first.unauthentic >= 50,
        "junk and wrong-key datagrams dropped: {first:?}"
    );
    assert!(
        wrong.unauthentic > 0,
        "the wrong-key node dropped the group's: {wrong:?}"
    );
}

/// A view change under load: three nodes keep thousands of 1 KiB messages proposed, node 0
/// (view 0's leader) stops while every window is full, and the other two suspect it after
/// 80 ms (not the lab's 500 ms) and change view. Their votes and the START-VIEW carry
/// hundreds of kilobytes of undelivered log: they go in parts of one datagram each, lost
/// parts (full socket buffers) are asked for again, and both deliver every message of
/// theirs in one order.
#[test]
fn a_view_change_under_load_sends_its_log_in_datagrams() {
    let sockets: Vec<UdpSocket> = (0..3)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let config = Config {
        suspect_after_us: 80_000,
        ..Config::jumbo()
    };
    let mut handles: Vec<Handle> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let driver = driver(i, 3, config.clone(), &peers);
            spawn(driver, socket).unwrap()
        })
        .collect();
    const PER_SENDER: u32 = 4_000;
    for round in 0..PER_SENDER {
        for (i, handle) in handles.iter().enumerate() {
            let mut message = vec![i as u8; 1_024];
            message[1..5].copy_from_slice(&round.to_be_bytes());
            handle.propose(Bytes::from(message)).unwrap();
        }
    }
    // Some delivered, most still queued: node 0 stops with the windows full.
    let before = deliveries(&handles[1], 300, Duration::from_secs(60));
    let (stopped, _) = handles.remove(0).stop().unwrap();
    let began = Instant::now();
    let mut orders = Vec::new();
    for (i, handle) in handles.iter().enumerate() {
        let mut order: Vec<(u64, MsgId)> = Vec::new();
        if i == 0 {
            order.extend(before.iter().map(|(position, id, _)| (*position, *id)));
        }
        let mut theirs = order
            .iter()
            .filter(|(_, id)| id.sender.node != NodeId(0))
            .count();
        while theirs < 2 * PER_SENDER as usize {
            let left = Duration::from_secs(60).saturating_sub(began.elapsed());
            if left.is_zero() {
                break;
            }
            if let Ok(Event::Deliver { position, id, .. }) = handle.events().recv_timeout(left) {
                theirs += usize::from(id.sender.node != NodeId(0));
                order.push((position, id));
            }
        }
        orders.push((order, theirs));
    }
    let mut parts = 0;
    for handle in handles {
        let (stats, driver) = handle.stop().unwrap();
        println!("{stats:?}\n{driver:?}");
        assert_eq!(driver.oversized, 0, "every packet fits a datagram");
        assert!(stats.view_changes >= 1);
        parts += stats.view_change_parts_sent;
    }
    println!("node 0 at its stop: {stopped:?}; {parts} view-change parts sent");
    let theirs: Vec<usize> = orders.iter().map(|(_, theirs)| *theirs).collect();
    assert_eq!(
        theirs,
        [2 * PER_SENDER as usize; 2],
        "node 1's and 2's messages delivered"
    );
    let orders: Vec<_> = orders.into_iter().map(|(order, _)| order).collect();
    let common = orders[0].len().min(orders[1].len());
    assert_eq!(orders[0][..common], orders[1][..common]);
    // A vote and a START-VIEW at least, each several datagrams long.
    assert!(parts >= 4, "{parts} view-change parts");
}
