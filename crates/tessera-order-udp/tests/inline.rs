//! Applications on the driver's thread ([`spawn_inline`]): each node proposes from its
//! turns, closed loop, and records its deliveries in the calls; every node delivers the
//! same order, each sender's messages in the order it proposed them, with loss.

use bytes::Bytes;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_order::{Config, Event, MsgId};
use tessera_order_udp::{spawn_inline, Application, Control, DriverConfig, Loss};

/// Proposes `total` messages, at most `outstanding` of them not yet delivered, and keeps
/// every UTO delivery.
struct Closed {
    node: u8,
    total: u32,
    outstanding: u32,
    proposed: u32,
    own_delivered: u32,
    delivered: Vec<(u64, MsgId, Bytes)>,
    done: Arc<AtomicUsize>,
    expected: usize,
    optimistic: usize,
}

impl Closed {
    fn propose(&mut self, node: &mut Control<'_>) {
        while self.proposed < self.total && self.proposed < self.own_delivered + self.outstanding {
            let message: Vec<u8> = [self.node]
                .into_iter()
                .chain(self.proposed.to_be_bytes())
                .collect();
            if node.propose(Bytes::from(message)).is_err() {
                return;
            }
            self.proposed += 1;
        }
    }
}

impl Application for Closed {
    fn turn(&mut self, node: &mut Control<'_>) -> Option<Duration> {
        self.propose(node);
        None
    }

    fn event(&mut self, event: Event, node: &mut Control<'_>) {
        match event {
            Event::Optimistic { .. } => self.optimistic += 1,
            Event::Deliver {
                position,
                id,
                message,
            } => {
                if id.sender.node.0 == u16::from(self.node) {
                    self.own_delivered += 1;
                }
                self.delivered.push((position, id, message));
                if self.delivered.len() == self.expected {
                    self.done.fetch_add(1, Ordering::SeqCst);
                }
                self.propose(node);
            }
            _ => {}
        }
    }
}

#[test]
fn inline_applications_deliver_one_order_with_loss() {
    let nodes = 3;
    let total = 400u32;
    let sockets: Vec<UdpSocket> = (0..nodes)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let driver = DriverConfig::all_to_all(i, nodes, Config::default(), peers.clone());
            let loss = Loss {
                send: 0.02,
                receive: 0.02,
                seed: 5 + i as u64,
            };
            let app = Closed {
                node: i as u8,
                total,
                outstanding: 50,
                proposed: 0,
                own_delivered: 0,
                delivered: Vec::new(),
                done: done.clone(),
                expected: nodes * total as usize,
                optimistic: 0,
            };
            let send = socket.try_clone().unwrap();
            spawn_inline(driver, send, socket, loss, app).unwrap()
        })
        .collect();
    let began = Instant::now();
    while done.load(Ordering::SeqCst) < nodes {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "{} of {nodes} nodes delivered everything before the timeout",
            done.load(Ordering::SeqCst)
        );
        assert!(handles.iter().all(|h| !h.is_finished()), "a driver stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let apps: Vec<Closed> = handles
        .into_iter()
        .map(|handle| {
            let (stats, _, app) = handle.stop().unwrap();
            assert_eq!(stats.delivered, u64::from(total) * nodes as u64);
            app
        })
        .collect();
    for app in &apps[1..] {
        assert_eq!(app.delivered, apps[0].delivered);
    }
    let mut next = vec![0u32; nodes];
    for (position, (at, id, message)) in apps[0].delivered.iter().enumerate() {
        assert_eq!(*at, position as u64);
        let sender = usize::from(message[0]);
        assert_eq!(sender, usize::from(id.sender.node.0));
        // FIFO: a sender's messages in the order it proposed them.
        assert_eq!(
            u32::from_be_bytes(message[1..5].try_into().unwrap()),
            next[sender]
        );
        next[sender] += 1;
    }
    assert!(apps.iter().all(|app| app.optimistic > 0), "no PO delivery");
}
