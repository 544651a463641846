//! A UDP driver for [`tessera_order::Node`]: one thread per node runs the state machine over
//! a UDP socket, with the real clock.
//!
//! This crate owns only the I/O: the socket, the clock, and the channels to the
//! application. A broadcast ([`Destination::All`]) is sent by unicast fan-out, one datagram
//! to every node of the group, this one included (a node receives its own messages through
//! the network, as everyone's). On one LAN switch that gives no shared sequencer link, so
//! receivers' preliminary orders differ more often and the leader's order takes over more;
//! the paper's two-switch topology with multicast (a TX interface into switch A, an RX
//! interface out of switch B, `../shared/notes/two-switch-sequencer.md`) is future work, as
//! are `sendmmsg`/`recvmmsg` batching and carrying view-change messages larger than one
//! datagram over a `tessera-datagram` session: a packet over [`DATAGRAM_BYTES_MAX`] is
//! counted in [`DriverStats::oversized`] and not sent.
//!
//! ```no_run
//! use bytes::Bytes;
//! use std::net::UdpSocket;
//! use tessera_order::{Config, Event, Group, NodeId, Start};
//! use tessera_order_udp::{spawn, DriverConfig};
//!
//! let addrs = vec!["10.0.0.1:7100".parse().unwrap(), "10.0.0.2:7100".parse().unwrap()];
//! let socket = UdpSocket::bind(addrs[0]).unwrap();
//! let driver = DriverConfig {
//!     config: Config::default(),
//!     group: Group::all_to_all(2),
//!     node: NodeId(0),
//!     incarnation: 0,
//!     start: Start::Initial,
//!     seed: 1,
//!     peers: addrs,
//! };
//! let handle = spawn(driver, socket).unwrap();
//! handle.propose(Bytes::from_static(b"lock block 7")).unwrap();
//! while let Ok(event) = handle.events().recv() {
//!     if let Event::Deliver { position, message, .. } = event {
//!         println!("{position}: {message:?}");
//!         break;
//!     }
//! }
//! handle.stop().unwrap();
//! ```

use bytes::Bytes;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tessera_order::{Config, Destination, Event, Group, Micros, Node, NodeId, Start, Stats};

/// Largest UDP payload over IPv4.
pub const DATAGRAM_BYTES_MAX: usize = 65_507;
/// Longest the driver sleeps in `recv` before it looks at new proposals and the stop flag.
pub const POLL_US_MAX: u64 = 1_000;
/// Proposals waiting in the driver while the node's own send queue is full.
pub const BACKLOG_MAX: usize = 1 << 16;

/// Everything a node's driver needs.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The protocol's settings.
    pub config: Config,
    /// The group.
    pub group: Group,
    /// This node.
    pub node: NodeId,
    /// Its incarnation (higher after every restart; the caller keeps it).
    pub incarnation: u32,
    /// A member of view 0, or restarted.
    pub start: Start,
    /// Seed of the node's randomness.
    pub seed: u64,
    /// The address of every node of the group, by node id.
    pub peers: Vec<SocketAddr>,
}

/// Why the driver could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// `peers` does not list one address per node of the group.
    #[error("{peers} peer addresses for a group of {nodes} nodes")]
    Peers {
        /// Addresses given.
        peers: usize,
        /// Nodes in the group.
        nodes: usize,
    },
    /// The protocol's config is invalid.
    #[error("invalid config: {0}")]
    Config(#[from] tessera_order::ConfigError),
    /// A socket call failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The driver thread is gone (it panicked or stopped).
    #[error("the driver thread stopped")]
    Stopped,
    /// More than [`BACKLOG_MAX`] proposals wait.
    #[error("backlog full")]
    BacklogFull,
}

/// What the driver counted besides the node's [`Stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Packets over [`DATAGRAM_BYTES_MAX`], not sent.
    pub oversized: u64,
    /// Sends the kernel refused (a full buffer, a peer's port closed).
    pub send_errors: u64,
}

/// A running node.
pub struct Handle {
    proposals: mpsc::SyncSender<Bytes>,
    events: mpsc::Receiver<Event>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(Stats, DriverStats), DriverError>>,
}

impl Handle {
    /// Broadcasts `message` in total order (it waits in the driver while the node's queue is
    /// full).
    pub fn propose(&self, message: Bytes) -> Result<(), DriverError> {
        self.proposals
            .try_send(message)
            .map_err(|error| match error {
                mpsc::TrySendError::Full(_) => DriverError::BacklogFull,
                mpsc::TrySendError::Disconnected(_) => DriverError::Stopped,
            })
    }

    /// The node's events: deliveries (PO and UTO), views, joins, suspicions.
    pub fn events(&self) -> &mpsc::Receiver<Event> {
        &self.events
    }

    /// Stops the thread; what the node and the driver counted.
    pub fn stop(self) -> Result<(Stats, DriverStats), DriverError> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| DriverError::Stopped)?
    }
}

/// Starts a node on `socket` (bound to its address in `driver.peers`).
pub fn spawn(driver: DriverConfig, socket: UdpSocket) -> Result<Handle, DriverError> {
    if driver.peers.len() != driver.group.roles.len() {
        return Err(DriverError::Peers {
            peers: driver.peers.len(),
            nodes: driver.group.roles.len(),
        });
    }
    driver.config.validate()?;
    let (proposals, proposals_rx) = mpsc::sync_channel(BACKLOG_MAX);
    let (events_tx, events) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("order-{}", driver.node.0))
        .spawn(move || {
            let mut runner = Runner::new(driver, socket, proposals_rx, events_tx);
            runner.run(&flag)
        })?;
    Ok(Handle {
        proposals,
        events,
        stop,
        thread,
    })
}

struct Runner {
    node: Node,
    socket: UdpSocket,
    peers: Vec<SocketAddr>,
    origin: Instant,
    proposals: mpsc::Receiver<Bytes>,
    backlog: Option<Bytes>,
    events: mpsc::Sender<Event>,
    stats: DriverStats,
}

impl Runner {
    fn new(
        driver: DriverConfig,
        socket: UdpSocket,
        proposals: mpsc::Receiver<Bytes>,
        events: mpsc::Sender<Event>,
    ) -> Runner {
        let node = Node::new(
            driver.config,
            driver.group,
            driver.node,
            driver.incarnation,
            driver.start,
            driver.seed,
            0,
        );
        Runner {
            node,
            socket,
            peers: driver.peers,
            origin: Instant::now(),
            proposals,
            backlog: None,
            events,
            stats: DriverStats::default(),
        }
    }

    fn now(&self) -> Micros {
        self.origin.elapsed().as_micros() as Micros
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<(Stats, DriverStats), DriverError> {
        let mut buffer = vec![0u8; DATAGRAM_BYTES_MAX];
        while !stop.load(Ordering::Relaxed) {
            self.take_proposals();
            self.flush()?;
            let now = self.now();
            let deadline = self.node.poll_timeout().unwrap_or(now + POLL_US_MAX);
            let wait = deadline.saturating_sub(now).clamp(1, POLL_US_MAX);
            self.socket
                .set_read_timeout(Some(Duration::from_micros(wait)))?;
            match self.socket.recv_from(&mut buffer) {
                Ok((len, _)) => {
                    self.stats.datagrams_received += 1;
                    let now = self.now();
                    self.node.handle_packet(&buffer[..len], now);
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                // A peer's closed port answers with ICMP, which Linux reports on the next recv.
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(error) => return Err(error.into()),
            }
            let now = self.now();
            if self.node.poll_timeout().is_some_and(|at| at <= now) {
                self.node.handle_timeout(now);
            }
        }
        Ok((self.node.stats().clone(), self.stats.clone()))
    }

    /// Hands the node what the application proposed, as far as its queue takes.
    fn take_proposals(&mut self) {
        let now = self.now();
        loop {
            let Some(message) = self
                .backlog
                .take()
                .or_else(|| self.proposals.try_recv().ok())
            else {
                return;
            };
            match self.node.propose(message.clone(), now) {
                Ok(()) => {}
                Err(tessera_order::ProposeError::QueueFull) => {
                    self.backlog = Some(message);
                    return;
                }
                // Refused for good (too large, not a sender): dropped, as the node says why
                // only to a direct caller.
                Err(_) => {}
            }
        }
    }

    /// Sends every packet the node has and hands every event to the application.
    fn flush(&mut self) -> Result<(), DriverError> {
        let now = self.now();
        while let Some(transmit) = self.node.poll_transmit(now) {
            if transmit.contents.len() > DATAGRAM_BYTES_MAX {
                self.stats.oversized += 1;
                continue;
            }
            let targets: Vec<SocketAddr> = match transmit.destination {
                Destination::All => self.peers.clone(),
                Destination::Node(node) => vec![self.peers[node.0 as usize]],
            };
            for target in targets {
                match self.socket.send_to(&transmit.contents, target) {
                    Ok(_) => self.stats.datagrams_sent += 1,
                    Err(_) => self.stats.send_errors += 1,
                }
            }
        }
        while let Some(event) = self.node.poll_event() {
            // The application may have dropped its receiver; the node goes on regardless.
            let _ = self.events.send(event);
        }
        Ok(())
    }
}
