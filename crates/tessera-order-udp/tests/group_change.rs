//! Group changes over real UDP sockets on 127.0.0.1: three nodes add a fourth by an
//! ordered change (it joins by state transfer at the change and delivers what follows),
//! then remove one of the first three; the three left go on without it, in one order.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tessera_order::{Config, Event, Group, NodeId, Role, Start};
use tessera_order_udp::{spawn, Broadcast, DriverConfig, Handle};

const BOTH: Role = Role {
    sender: true,
    receiver: true,
};
const NONE: Role = Role {
    sender: false,
    receiver: false,
};
const TIMEOUT: Duration = Duration::from_secs(20);

/// What one node reported so far.
#[derive(Default)]
struct Seen {
    /// Position to message text, or to "change N" for a group change of epoch N.
    at: BTreeMap<u64, String>,
    joined: Option<u64>,
    epoch: u32,
}

impl Seen {
    fn take(&mut self, handle: &Handle) {
        while let Ok(event) = handle.events().try_recv() {
            match event {
                Event::Deliver {
                    position, message, ..
                } => {
                    let text = String::from_utf8(message.to_vec()).unwrap();
                    assert!(self.at.insert(position, text).is_none());
                }
                Event::GroupChange {
                    position, change, ..
                } => {
                    let text = format!("change {}", change.epoch);
                    assert!(self.at.insert(position, text).is_none());
                }
                Event::Joined { position } => self.joined = Some(position),
                Event::Group(record) => self.epoch = self.epoch.max(record.epoch),
                _ => {}
            }
        }
    }

    fn has(&self, text: &str) -> bool {
        self.at.values().any(|t| t == text)
    }
}

/// Waits until `done` holds for every node in `nodes`, taking their events.
fn wait_for(
    handles: &BTreeMap<u16, Handle>,
    seen: &mut BTreeMap<u16, Seen>,
    nodes: &[u16],
    what: &str,
    done: impl Fn(&Seen) -> bool,
) {
    let began = Instant::now();
    loop {
        for &node in nodes {
            seen.entry(node).or_default().take(&handles[&node]);
        }
        if nodes.iter().all(|node| done(&seen[node])) {
            return;
        }
        assert!(began.elapsed() < TIMEOUT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_node_is_added_and_another_removed_over_udp() {
    let sockets: Vec<UdpSocket> = (0..4)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let mut handles: BTreeMap<u16, Handle> = BTreeMap::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        // Node 3 is started by its operator before it is added: it knows only the group
        // of three, and the addresses of every node.
        let start = if i < 3 { Start::Initial } else { Start::Added };
        let driver = DriverConfig {
            config: Config::default(),
            group: Group::all_to_all(3),
            node: NodeId(i as u16),
            incarnation: 1,
            start,
            seed: i as u64,
            peers: peers.clone(),
            broadcast: Broadcast::Unicast,
        };
        handles.insert(i as u16, spawn(driver, socket).unwrap());
    }
    let mut seen: BTreeMap<u16, Seen> = BTreeMap::new();
    for round in 0..50 {
        handles[&(round % 3)]
            .propose(Bytes::from(format!("before {round}")))
            .unwrap();
    }
    wait_for(&handles, &mut seen, &[0, 1, 2], "the first messages", |s| {
        s.has("before 49")
    });
    handles[&1].propose_group_change(NodeId(3), BOTH).unwrap();
    wait_for(&handles, &mut seen, &[0, 1, 2, 3], "node 3 to join", |s| {
        s.epoch >= 1 && (s.joined.is_some() || s.has("change 1"))
    });
    for round in 0..60u16 {
        let from = round % 4;
        handles[&from]
            .propose(Bytes::from(format!("with four {round}")))
            .unwrap();
    }
    wait_for(
        &handles,
        &mut seen,
        &[0, 1, 2, 3],
        "the messages of four",
        |s| (56..60).all(|round| s.has(&format!("with four {round}"))),
    );
    handles[&2].propose_group_change(NodeId(0), NONE).unwrap();
    wait_for(&handles, &mut seen, &[1, 2, 3], "node 0's removal", |s| {
        s.epoch >= 2 && s.has("change 2")
    });
    handles.remove(&0).unwrap().stop().unwrap();
    for round in 0..60u16 {
        let from = 1 + round % 3;
        handles[&from]
            .propose(Bytes::from(format!("without 0 {round}")))
            .unwrap();
    }
    wait_for(
        &handles,
        &mut seen,
        &[1, 2, 3],
        "the messages without 0",
        |s| (0..60).all(|round| s.has(&format!("without 0 {round}"))),
    );
    // One order: every position a node delivered holds the same text everywhere, and each
    // node delivered every position from where it began.
    let mut order: BTreeMap<u64, String> = BTreeMap::new();
    for (node, s) in &seen {
        let from = s.joined.unwrap_or(0);
        let positions: Vec<u64> = s.at.keys().copied().collect();
        let expected: Vec<u64> = (from..from + positions.len() as u64).collect();
        assert_eq!(positions, expected, "node {node}");
        for (position, text) in &s.at {
            assert_eq!(order.entry(*position).or_insert(text.clone()), text);
        }
    }
    let joined = seen[&3].joined.expect("node 3 joined");
    let added_at = order
        .iter()
        .find(|(_, text)| *text == "change 1")
        .map(|(&position, _)| position)
        .expect("the add was delivered");
    assert!(
        joined <= added_at + 1,
        "joined at {joined}, added at {added_at}"
    );
    assert!(
        !seen[&3].has("before 0"),
        "node 3 joined after the first messages"
    );
    for (_, handle) in handles {
        handle.stop().unwrap();
    }
}
