//! A UDP driver for [`tessera_order::Node`]: one thread per node runs the state machine over
//! a UDP socket, with the real clock.
//!
//! This crate owns only the I/O: the sockets, the clock, and the channels to the
//! application. A broadcast ([`Destination::All`]) goes one of two ways ([`Broadcast`]):
//! - **unicast fan-out**, one datagram to every node of the group, this one included (a node
//!   receives its own messages through the network, as everyone's). On one LAN switch that
//!   gives no shared sequencer link, so receivers' preliminary orders differ more often and
//!   the leader's order takes over more;
//! - **multicast** in the paper's two-switch topology: one datagram to a group address, sent
//!   on the node's TX interface (into switch A) and received on its RX interface (out of
//!   switch B), so that every copy crosses the one link between the switches
//!   (`../shared/notes/two-switch-sequencer.md`). [`two_switch_sockets`] makes the two sockets:
//!   the sending one bound to the TX interface with multicast loopback off, the receiving one
//!   bound to the RX interface and joined to the group.
//!
//! The driver drains up to [`RECEIVE_BATCH_MAX`] waiting datagrams before it polls the node
//! for packets to send, so that one ACK answers a burst of DATA (ACK aggregation does the
//! rest). Not yet: `sendmmsg`/`recvmmsg`, and carrying view-change messages larger than one
//! datagram over a `tessera-datagram` session: a packet over [`DATAGRAM_BYTES_MAX`] is
//! counted in [`DriverStats::oversized`] and not sent.
//!
//! ```no_run
//! use bytes::Bytes;
//! use std::net::UdpSocket;
//! use tessera_order::{Config, Event, Group, NodeId, Start};
//! use tessera_order_udp::{spawn, Broadcast, DriverConfig};
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
//!     broadcast: Broadcast::Unicast,
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
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
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
/// Datagrams taken off the socket before the node is polled for what to send.
pub const RECEIVE_BATCH_MAX: usize = 64;
/// Kernel buffer of each socket [`two_switch_sockets`] makes.
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// How a packet for every node leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broadcast {
    /// One datagram to each address of [`DriverConfig::peers`].
    Unicast,
    /// One datagram to this multicast group (the receiving socket must have joined it).
    Multicast(SocketAddrV4),
}

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
    /// The address of every node of the group, by node id (where its receiving socket
    /// listens): packets for one node go there.
    pub peers: Vec<SocketAddr>,
    /// How packets for every node go.
    pub broadcast: Broadcast,
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

/// Starts a node on `socket` (bound to its address in `driver.peers`), which it sends and
/// receives on.
pub fn spawn(driver: DriverConfig, socket: UdpSocket) -> Result<Handle, DriverError> {
    let send = socket.try_clone()?;
    spawn_split(driver, send, socket)
}

/// Starts a node that sends on `send` and receives on `receive` (bound to its address in
/// `driver.peers`): the two-switch topology's TX and RX interfaces.
pub fn spawn_split(
    driver: DriverConfig,
    send: UdpSocket,
    receive: UdpSocket,
) -> Result<Handle, DriverError> {
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
            let mut runner = Runner::new(driver, send, receive, proposals_rx, events_tx);
            runner.run(&flag)
        })?;
    Ok(Handle {
        proposals,
        events,
        stop,
        thread,
    })
}

/// The two sockets of a node in the two-switch topology: `tx` sends (bound to `tx_addr` on
/// interface `tx_device`, multicast out of it, without looping its own datagrams back), `rx`
/// receives (bound to port `group.port()` on interface `rx_device`, joined to `group` on
/// `rx_addr`). Needs the routes of the notes: the group routed out of `tx_device`.
pub fn two_switch_sockets(
    tx_addr: Ipv4Addr,
    tx_device: &str,
    rx_addr: Ipv4Addr,
    rx_device: &str,
    group: SocketAddrV4,
) -> Result<(UdpSocket, UdpSocket), DriverError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let new = || -> io::Result<Socket> {
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_send_buffer_size(SOCKET_BUFFER_BYTES)?;
        socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES)?;
        Ok(socket)
    };
    let tx = new()?;
    tx.bind_device(Some(tx_device.as_bytes()))?;
    tx.bind(&SocketAddrV4::new(tx_addr, 0).into())?;
    tx.set_multicast_if_v4(&tx_addr)?;
    tx.set_multicast_loop_v4(false)?;
    tx.set_multicast_ttl_v4(1)?;
    let rx = new()?;
    rx.set_reuse_address(true)?;
    rx.bind_device(Some(rx_device.as_bytes()))?;
    rx.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, group.port()).into())?;
    rx.join_multicast_v4(group.ip(), &rx_addr)?;
    Ok((tx.into(), rx.into()))
}

struct Runner {
    node: Node,
    send: UdpSocket,
    receive: UdpSocket,
    peers: Vec<SocketAddr>,
    broadcast: Broadcast,
    origin: Instant,
    proposals: mpsc::Receiver<Bytes>,
    backlog: Option<Bytes>,
    events: mpsc::Sender<Event>,
    stats: DriverStats,
}

impl Runner {
    fn new(
        driver: DriverConfig,
        send: UdpSocket,
        receive: UdpSocket,
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
            send,
            receive,
            peers: driver.peers,
            broadcast: driver.broadcast,
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
        let mut timeout_set = None;
        while !stop.load(Ordering::Relaxed) {
            self.take_proposals();
            self.flush()?;
            let now = self.now();
            let deadline = self.node.poll_timeout().unwrap_or(now + POLL_US_MAX);
            let wait = deadline.saturating_sub(now).clamp(1, POLL_US_MAX);
            // Setting the timeout is a system call; a timeout within 50 us of the last one
            // set will do.
            if timeout_set.is_none_or(|set: u64| set.abs_diff(wait) > 50) {
                self.receive
                    .set_read_timeout(Some(Duration::from_micros(wait)))?;
                timeout_set = Some(wait);
            }
            match self.receive.recv_from(&mut buffer) {
                Ok((len, _)) => {
                    self.stats.datagrams_received += 1;
                    let now = self.now();
                    self.node.handle_packet(&buffer[..len], now);
                    self.drain(&mut buffer)?;
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

    /// Hands the node the datagrams already waiting, up to [`RECEIVE_BATCH_MAX`], without
    /// blocking.
    fn drain(&mut self, buffer: &mut [u8]) -> Result<(), DriverError> {
        for _ in 1..RECEIVE_BATCH_MAX {
            // SAFETY: the buffer is valid for writes of its length for the call, and the
            // descriptor is the receiving socket's, open while `self` lives.
            let len = unsafe {
                libc::recv(
                    self.receive.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if len < 0 {
                let error = io::Error::last_os_error();
                return match error.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused => Ok(()),
                    _ => Err(error.into()),
                };
            }
            self.stats.datagrams_received += 1;
            let now = self.now();
            self.node.handle_packet(&buffer[..len as usize], now);
        }
        Ok(())
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
            let targets: Vec<SocketAddr> = match (transmit.destination, self.broadcast) {
                (Destination::All, Broadcast::Unicast) => self.peers.clone(),
                (Destination::All, Broadcast::Multicast(group)) => vec![group.into()],
                (Destination::Node(node), _) => vec![self.peers[node.0 as usize]],
            };
            for target in targets {
                match self.send.send_to(&transmit.contents, target) {
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
