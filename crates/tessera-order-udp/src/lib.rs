//! A UDP driver for [`tessera_order::Node`]: one thread per node runs the state machine over
//! a UDP socket, with the real clock.
//!
//! This crate owns only the I/O: the sockets, the clock, and the channels to the
//! application, or the calls into it where it runs on the driver's thread ([`spawn_inline`],
//! [`Application`]: no hand-off between threads per message). A broadcast ([`Destination::All`]) goes one of two ways ([`Broadcast`]):
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
//! The driver takes up to [`RECEIVE_BATCH_MAX`] waiting datagrams in one `recvmmsg` before it
//! polls the node for packets to send, so that one ACK answers a burst of DATA (ACK
//! aggregation does the rest), and sends what the node has, the copies of a unicast fan-out
//! included, in `sendmmsg` calls of up to [`SEND_BATCH_MAX`] datagrams. For experiments, [`spawn_split_lossy`] drops datagrams on purpose ([`Loss`]: a
//! seeded share at send, before the kernel sees them, and at receive, before the node does),
//! the total-order thesis's artificial loss (its table 4). The protocol keeps every packet
//! within one datagram with its default `repair_bytes_max` (view-change messages go in
//! parts); a packet over [`DATAGRAM_BYTES_MAX`] (a larger setting) is counted in
//! [`DriverStats::oversized`] and not sent.
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

mod batch;
mod events;
mod inline;

pub use inline::{spawn_inline, Application, Control, InlineHandle};

use bytes::Bytes;
use events::EventSender;
pub use events::Events;
use socket2::SockAddr;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tessera_auth::{packet_tag, Key, PACKET_TAG_BYTES};
use tessera_order::{
    Config, Destination, Group, Micros, Node, NodeId, ProposeError, Role, Start, Stats,
};

/// Largest UDP payload over IPv4.
pub const DATAGRAM_BYTES_MAX: usize = 65_507;
/// Longest the driver sleeps before it looks at the stop flag.
pub const POLL_US_MAX: u64 = 1_000;
/// Proposals waiting in the driver while the node's own send queue is full.
pub const BACKLOG_MAX: usize = 1 << 16;
/// Datagrams taken off the socket (one `recvmmsg`) before the node is polled for what to
/// send.
pub const RECEIVE_BATCH_MAX: usize = 64;
/// Datagrams per `sendmmsg` call.
pub const SEND_BATCH_MAX: usize = 64;
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
    /// listens): packets for one node go there. It may go on past the group, with nodes
    /// that group changes may add; a unicast broadcast goes to the nodes of the groups the
    /// node knows (and to itself).
    pub peers: Vec<SocketAddr>,
    /// How packets for every node go.
    pub broadcast: Broadcast,
}

impl DriverConfig {
    /// Node `node` of a fresh all-to-all group of `nodes` over unicast, at incarnation 0,
    /// seeded with its id: the plain setup of tests and examples on one host.
    pub fn all_to_all(node: usize, nodes: usize, config: Config, peers: Vec<SocketAddr>) -> Self {
        DriverConfig {
            config,
            group: Group::all_to_all(nodes),
            node: NodeId(node as u16),
            incarnation: 0,
            start: Start::Initial,
            seed: node as u64,
            peers,
            broadcast: Broadcast::Unicast,
        }
    }
}

/// Why the driver could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// `peers` does not list an address for every node of the group.
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
    /// A [`Loss`] probability outside 0..=1.
    #[error("loss probabilities must be within 0..=1: {0:?}")]
    Loss(Loss),
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
    /// Datagrams dropped because their MAC did not match the group's key (keyed drivers).
    pub unauthentic: u64,
    /// Datagrams dropped on purpose before sending ([`Loss::send`]).
    pub dropped_at_send: u64,
    /// Datagrams dropped on purpose after receiving ([`Loss::receive`]).
    pub dropped_at_receive: u64,
}

/// Artificial loss for experiments: each datagram is dropped with these probabilities,
/// drawn from a generator seeded by `seed` (the same seed drops the same datagrams of the
/// same sequence). A datagram dropped at send reaches nobody (one multicast datagram: every
/// receiver misses it alike); at receive, only this node misses it. Off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Loss {
    /// Probability that a datagram this node sends is dropped before the kernel sees it.
    pub send: f64,
    /// Probability that a datagram this node receives is dropped before the node sees it.
    pub receive: f64,
    /// Seed of the drops.
    pub seed: u64,
}

impl Loss {
    /// No loss.
    pub const NONE: Loss = Loss {
        send: 0.0,
        receive: 0.0,
        seed: 0,
    };

    fn valid(&self) -> bool {
        (0.0..=1.0).contains(&self.send) && (0.0..=1.0).contains(&self.receive)
    }
}

/// Decides the drops of a [`Loss`]: splitmix64, so that the driver needs no crate for it.
#[derive(Debug)]
struct Dropper {
    loss: Loss,
    state: u64,
}

impl Dropper {
    fn new(loss: Loss) -> Dropper {
        Dropper {
            loss,
            state: loss.seed,
        }
    }

    /// Whether to drop the next datagram, with probability `p` (no draw when `p` is 0).
    fn draw(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits as a uniform number in [0, 1).
        ((z >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn at_send(&mut self) -> bool {
        self.draw(self.loss.send)
    }

    fn at_receive(&mut self) -> bool {
        self.draw(self.loss.receive)
    }
}

/// Wakes the driver from its wait when the application proposes: an eventfd it polls with
/// its socket, written only while the driver says it is about to sleep (one system call
/// per wakeup, not per message).
struct Wakeup {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Wakeup {
    fn new() -> io::Result<Wakeup> {
        // SAFETY: eventfd has no memory preconditions; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Wakeup {
            // SAFETY: fd is a fresh descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
        })
    }

    /// Called after a proposal is queued.
    fn wake(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to the eventfd we own. A failure
            // (the counter saturated) still leaves the driver awake.
            unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Empties the counter after a wakeup.
    fn clear(&self) {
        let mut counter = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from the eventfd we own; it is
        // non-blocking, so an empty counter just fails.
        unsafe { libc::read(self.fd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
    }
}

/// What the application asks the node to broadcast.
enum Proposal {
    Message(Bytes),
    Change(NodeId, Role),
    /// Not a proposal: where a node listens from now on (one a change will add).
    Peer(NodeId, SocketAddr),
}

/// A node's read lease as its driver last stored it, on the driver's clock (microseconds
/// since `origin`): the application reads it without the node.
struct StoredLease {
    origin: Instant,
    /// Until when (exclusive) the lease runs; 0: none.
    ends_us: AtomicU64,
}

impl StoredLease {
    fn new() -> StoredLease {
        StoredLease {
            origin: Instant::now(),
            ends_us: AtomicU64::new(0),
        }
    }

    fn store(&self, ends: Option<Micros>) {
        self.ends_us.store(ends.unwrap_or(0), Ordering::SeqCst);
    }

    fn holds(&self) -> bool {
        let now = self.origin.elapsed().as_micros() as Micros;
        now < self.ends_us.load(Ordering::SeqCst)
    }
}

/// A running node.
pub struct Handle {
    proposals: mpsc::SyncSender<Proposal>,
    events: Events,
    stop: Arc<AtomicBool>,
    wakeup: Arc<Wakeup>,
    /// The node's log end, as the driver last stored it ([`Handle::log_end`]).
    log_end: Arc<AtomicU64>,
    /// The node's read lease ([`Handle::has_read_lease`]).
    lease: Arc<StoredLease>,
    thread: JoinHandle<Result<(Stats, DriverStats), DriverError>>,
}

impl Handle {
    /// The end of the node's log (its preliminary order), stored by the driver before each
    /// round of sends: every ACK this node has sent names a length at most this. So every
    /// position that any member UTO-delivered before this call (in the fast path, which
    /// needs this node's ACK) lies below it: an application that waits until it has
    /// applied up to here has applied everything acknowledged anywhere before it asked (a
    /// replica's barrier for linearizable local reads).
    pub fn log_end(&self) -> u64 {
        self.log_end.load(Ordering::SeqCst)
    }

    /// Whether the node holds a read lease now ([`Node::read_lease_ends`], with
    /// [`tessera_order::Config::read_leases`]): while it does, reads answered from the
    /// application's state applied up to [`Handle::log_end`] (taken after this call) miss
    /// no change acknowledged anywhere before the call; without one, order the read.
    pub fn has_read_lease(&self) -> bool {
        self.lease.holds()
    }

    /// Broadcasts `message` in total order (it waits in the driver while the node's queue is
    /// full).
    pub fn propose(&self, message: Bytes) -> Result<(), DriverError> {
        self.send_proposal(Proposal::Message(message))
    }

    /// Broadcasts a group change in total order ([`Node::propose_group_change`]): from where
    /// it is delivered, `node` (an index of [`DriverConfig::peers`]) has `role`. A change
    /// the node refuses (no such node id, no receiver left) is dropped; the delivery
    /// ([`Event::GroupChange`]) and the node's group ([`Event::Group`]) tell what happened.
    pub fn propose_group_change(&self, node: NodeId, role: Role) -> Result<(), DriverError> {
        self.send_proposal(Proposal::Change(node, role))
    }

    /// Sends to `node` at `addr` from now on ([`DriverConfig::peers`] extended or changed):
    /// the address of a node a group change is about to add. Ids past the list are filled
    /// with `addr` until set.
    pub fn set_peer(&self, node: NodeId, addr: SocketAddr) -> Result<(), DriverError> {
        if usize::from(node.0) >= tessera_order::GROUP_NODES_MAX {
            return Err(DriverError::Peers {
                peers: usize::from(node.0) + 1,
                nodes: tessera_order::GROUP_NODES_MAX,
            });
        }
        self.send_proposal(Proposal::Peer(node, addr))
    }

    fn send_proposal(&self, proposal: Proposal) -> Result<(), DriverError> {
        self.proposals
            .try_send(proposal)
            .map_err(|error| match error {
                mpsc::TrySendError::Full(_) => DriverError::BacklogFull,
                mpsc::TrySendError::Disconnected(_) => DriverError::Stopped,
            })?;
        self.wakeup.wake();
        Ok(())
    }

    /// The node's events: deliveries (PO and UTO), views, joins, suspicions.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Takes the node's events for a thread of their own; [`Handle::events`] is empty after.
    pub fn take_events(&mut self) -> Events {
        std::mem::take(&mut self.events)
    }

    /// Stops the thread; what the node and the driver counted.
    pub fn stop(self) -> Result<(Stats, DriverStats), DriverError> {
        self.stop.store(true, Ordering::SeqCst);
        self.wakeup.wake();
        self.thread.join().map_err(|_| DriverError::Stopped)?
    }
}

/// Starts a node on `socket` (bound to its address in `driver.peers`), which it sends and
/// receives on.
pub fn spawn(driver: DriverConfig, socket: UdpSocket) -> Result<Handle, DriverError> {
    let send = socket.try_clone()?;
    spawn_split(driver, send, socket)
}

/// As [`spawn`], but every datagram carries a MAC under `key` (keyed BLAKE3, the last
/// [`PACKET_TAG_BYTES`] bytes), and a datagram whose MAC does not match is dropped before the
/// node sees it ([`DriverStats::unauthentic`]): only holders of the key take part in the order.
/// Replay of a group member's old datagrams is left to the protocol, which drops duplicates
/// and packets of earlier incarnations.
pub fn spawn_keyed(
    driver: DriverConfig,
    socket: UdpSocket,
    key: Key,
) -> Result<Handle, DriverError> {
    let send = socket.try_clone()?;
    spawn_inner(driver, send, socket, Some(key), Loss::NONE)
}

/// Starts a node that sends on `send` and receives on `receive` (bound to its address in
/// `driver.peers`): the two-switch topology's TX and RX interfaces.
pub fn spawn_split(
    driver: DriverConfig,
    send: UdpSocket,
    receive: UdpSocket,
) -> Result<Handle, DriverError> {
    spawn_inner(driver, send, receive, None, Loss::NONE)
}

/// As [`spawn_split`], dropping datagrams on purpose as `loss` says (experiments only).
pub fn spawn_split_lossy(
    driver: DriverConfig,
    send: UdpSocket,
    receive: UdpSocket,
    loss: Loss,
) -> Result<Handle, DriverError> {
    spawn_inner(driver, send, receive, None, loss)
}

fn spawn_inner(
    driver: DriverConfig,
    send: UdpSocket,
    receive: UdpSocket,
    key: Option<Key>,
    loss: Loss,
) -> Result<Handle, DriverError> {
    validate(&driver, loss)?;
    let (proposals, proposals_rx) = mpsc::sync_channel(BACKLOG_MAX);
    let (events_tx, events) = events::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let wakeup = Arc::new(Wakeup::new()?);
    let woken = wakeup.clone();
    let log_end = Arc::new(AtomicU64::new(0));
    let stored = log_end.clone();
    let lease = Arc::new(StoredLease::new());
    let lease_stored = lease.clone();
    let thread = std::thread::Builder::new()
        .name(format!("order-{}", driver.node.0))
        .spawn(move || {
            set_timer_slack();
            let mut runner = Runner::new(driver, send, receive, proposals_rx, events_tx, woken);
            runner.log_end = stored;
            runner.origin = lease_stored.origin;
            runner.lease = lease_stored;
            runner.key = key;
            runner.dropper = Dropper::new(loss);
            runner.run(&flag, None)
        })?;
    Ok(Handle {
        proposals,
        events,
        stop,
        wakeup,
        log_end,
        lease,
        thread,
    })
}

/// Refuses a loss outside 0..=1, too few or too many peers, an invalid config.
fn validate(driver: &DriverConfig, loss: Loss) -> Result<(), DriverError> {
    if !loss.valid() {
        return Err(DriverError::Loss(loss));
    }
    if driver.peers.len() < driver.group.roles.len() || driver.peers.len() > 64 {
        return Err(DriverError::Peers {
            peers: driver.peers.len(),
            nodes: driver.group.roles.len(),
        });
    }
    driver.config.validate()?;
    Ok(())
}

/// Timer slack of the driver thread, nanoseconds. Linux lets a sleep of a thread with the
/// default slack (50 us) end up to 50 us late so that wakeups coalesce; the node's timers
/// are tens of microseconds (the ACK delay, 20 us in the lab), so every ACK that waited
/// for its timer went out up to 70 us after the DATA it answered.
pub const TIMER_SLACK_NS: u64 = 1_000;

/// Sets this thread's timer slack to [`TIMER_SLACK_NS`]; where that fails the default
/// stays (later timers, nothing else).
fn set_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS as libc::c_ulong) };
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
    peers: Vec<SockAddr>,
    /// The nodes a unicast broadcast goes to (a bit each), and their addresses.
    fan_out: (Option<u64>, Vec<SockAddr>),
    /// The multicast group, if broadcasts go there.
    group: Option<SockAddr>,
    origin: Instant,
    proposals: mpsc::Receiver<Proposal>,
    backlog: Option<Proposal>,
    events: EventSender,
    /// An empty event queue taken back from the node (it had no events), for the next
    /// hand-over.
    spare_events: Option<events::Batch>,
    wakeup: Arc<Wakeup>,
    /// Where the node's log ends, stored before each round of sends ([`Handle::log_end`]).
    log_end: Arc<AtomicU64>,
    /// Until when the node's read lease runs, stored with the log end.
    lease: Arc<StoredLease>,
    stats: DriverStats,
    /// The group's MAC key, if datagrams are authenticated.
    key: Option<Key>,
    /// Artificial loss (none unless asked for).
    dropper: Dropper,
    /// How long to poll without sleeping before each wait ([`Application::spin`]).
    spin_us: u64,
}

impl Runner {
    fn new(
        driver: DriverConfig,
        send: UdpSocket,
        receive: UdpSocket,
        proposals: mpsc::Receiver<Proposal>,
        events: EventSender,
        wakeup: Arc<Wakeup>,
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
            peers: driver.peers.into_iter().map(SockAddr::from).collect(),
            fan_out: (None, Vec::new()),
            group: match driver.broadcast {
                Broadcast::Unicast => None,
                Broadcast::Multicast(group) => Some(SocketAddr::from(group).into()),
            },
            origin: Instant::now(),
            proposals,
            backlog: None,
            events,
            spare_events: None,
            wakeup,
            log_end: Arc::new(AtomicU64::new(0)),
            lease: Arc::new(StoredLease::new()),
            stats: DriverStats::default(),
            key: None,
            dropper: Dropper::new(Loss::NONE),
            spin_us: 0,
        }
    }

    /// A runner for an inline application ([`spawn_inline`]): no proposals come by channel
    /// and no events go by one.
    fn start(
        driver: DriverConfig,
        send: UdpSocket,
        receive: UdpSocket,
        loss: Loss,
    ) -> Result<Runner, DriverError> {
        validate(&driver, loss)?;
        let wakeup = Arc::new(Wakeup::new()?);
        let proposals = mpsc::sync_channel(1).1;
        let events = events::channel().0;
        let mut runner = Runner::new(driver, send, receive, proposals, events, wakeup);
        runner.dropper = Dropper::new(loss);
        Ok(runner)
    }

    fn now(&self) -> Micros {
        self.origin.elapsed().as_micros() as Micros
    }

    /// The inline application's turn: the longest it lets the driver sleep.
    fn turn(&mut self, app: &mut Option<&mut dyn Application>) -> Option<std::time::Duration> {
        let app = app.as_mut()?;
        let now = self.now();
        app.turn(&mut Control {
            node: &mut self.node,
            now,
        })
    }

    fn run(
        &mut self,
        stop: &AtomicBool,
        mut app: Option<&mut dyn Application>,
    ) -> Result<(Stats, DriverStats), DriverError> {
        // Touched only as far as datagrams fill it: the kernel maps zeroed pages lazily.
        let mut buffers = vec![0u8; RECEIVE_BATCH_MAX * DATAGRAM_BYTES_MAX];
        let mut lengths = Vec::with_capacity(RECEIVE_BATCH_MAX);
        while !stop.load(Ordering::SeqCst) {
            self.take_proposals();
            let sleep_max = self.turn(&mut app);
            self.flush(&mut app);
            if self.wait(sleep_max)? {
                self.drain(&mut buffers, &mut lengths)?;
            }
            let now = self.now();
            if self.node.poll_timeout().is_some_and(|at| at <= now) {
                self.node.handle_timeout(now);
            }
        }
        Ok((self.node.stats().clone(), self.stats.clone()))
    }

    /// Sleeps until a datagram arrives, the application proposes, or the node's timeout
    /// (at most [`POLL_US_MAX`]); whether a datagram is waiting. `ppoll` times to the
    /// microsecond: a socket's receive timeout counts in scheduler ticks (4-10 ms), which
    /// made every ACK delay and every idle proposal a tick late.
    fn wait(&mut self, sleep_max: Option<std::time::Duration>) -> Result<bool, DriverError> {
        self.wakeup.sleeping.store(true, Ordering::SeqCst);
        // A proposal queued before the flag was set would not wake us: look once more. (A
        // backlog already held waits for the node's queue, which only packets and timeouts
        // free, so it is no reason to stay awake.)
        if self.backlog.is_none() {
            if let Ok(message) = self.proposals.try_recv() {
                self.backlog = Some(message);
                self.wakeup.sleeping.store(false, Ordering::SeqCst);
                return Ok(false);
            }
        }
        let now = self.now();
        let deadline = self.node.poll_timeout().unwrap_or(now + POLL_US_MAX);
        let app_us = sleep_max.map_or(POLL_US_MAX, |d| d.as_micros() as u64);
        let wait_us = deadline.saturating_sub(now).min(POLL_US_MAX).min(app_us);
        let mut fds = [
            libc::pollfd {
                fd: self.receive.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wakeup.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Spinning first (an inline application's choice): a datagram that comes within
        // `spin_us` finds the thread awake rather than asleep.
        let spin_us = self.spin_us.min(wait_us);
        let mut ready = 0;
        if spin_us > 0 {
            let until = now + spin_us;
            loop {
                ready = poll_fds(&mut fds, 0);
                if ready != 0 || self.now() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if ready == 0 {
            ready = poll_fds(&mut fds, wait_us - spin_us);
        }
        self.wakeup.sleeping.store(false, Ordering::SeqCst);
        if ready < 0 {
            let error = io::Error::last_os_error();
            return match error.kind() {
                io::ErrorKind::Interrupted => Ok(false),
                _ => Err(error.into()),
            };
        }
        if fds[1].revents != 0 {
            self.wakeup.clear();
        }
        Ok(fds[0].revents != 0)
    }

    /// Hands the node the datagrams already waiting, up to [`RECEIVE_BATCH_MAX`] taken in
    /// one call, without blocking.
    fn drain(&mut self, buffers: &mut [u8], lengths: &mut Vec<usize>) -> Result<(), DriverError> {
        let fd = self.receive.as_raw_fd();
        if let Err(error) = batch::receive(fd, buffers, DATAGRAM_BYTES_MAX, lengths) {
            return match error.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused => Ok(()),
                _ => Err(error.into()),
            };
        }
        for (i, &len) in lengths.iter().enumerate() {
            let at = i * DATAGRAM_BYTES_MAX;
            self.take_datagram(&buffers[at..at + len]);
        }
        Ok(())
    }

    /// One datagram received: dropped on purpose, refused for its MAC, or handed to the node.
    fn take_datagram(&mut self, datagram: &[u8]) {
        self.stats.datagrams_received += 1;
        if self.dropper.at_receive() {
            self.stats.dropped_at_receive += 1;
            return;
        }
        let mut packet = datagram;
        if let Some(key) = &self.key {
            let Some(body) = datagram.len().checked_sub(PACKET_TAG_BYTES) else {
                self.stats.unauthentic += 1;
                return;
            };
            if !tags_equal(&packet_tag(key, &datagram[..body]), &datagram[body..]) {
                self.stats.unauthentic += 1;
                return;
            }
            packet = &datagram[..body];
        }
        let now = self.now();
        self.node.handle_packet(packet, now);
    }

    /// Hands the node what the application proposed, as far as its queue takes.
    fn take_proposals(&mut self) {
        let now = self.now();
        loop {
            let Some(proposal) = self
                .backlog
                .take()
                .or_else(|| self.proposals.try_recv().ok())
            else {
                return;
            };
            let result = match &proposal {
                Proposal::Message(message) => self.node.propose(message.clone(), now),
                Proposal::Change(node, role) => {
                    self.node.propose_group_change(*node, *role, now).map(drop)
                }
                Proposal::Peer(node, addr) => {
                    let index = usize::from(node.0);
                    if self.peers.len() <= index {
                        self.peers.resize(index + 1, SockAddr::from(*addr));
                    }
                    self.peers[index] = SockAddr::from(*addr);
                    self.fan_out = (None, Vec::new());
                    Ok(())
                }
            };
            match result {
                Ok(()) => {}
                Err(ProposeError::QueueFull) => {
                    self.backlog = Some(proposal);
                    return;
                }
                // Refused for good (too large, not a sender): dropped, as the node says why
                // only to a direct caller.
                Err(_) => {}
            }
        }
    }

    /// Sends every packet the node has, in batches, and hands every event to the
    /// application; again while an inline application's answers to the events make more.
    fn flush(&mut self, app: &mut Option<&mut dyn Application>) {
        loop {
            self.send_packets();
            let Some(app) = app else {
                self.hand_over_events();
                return;
            };
            let now = self.now();
            let mut any = false;
            while let Some(event) = self.node.poll_event() {
                any = true;
                let mut control = Control {
                    node: &mut self.node,
                    now,
                };
                app.event(event, &mut control);
            }
            if !any {
                return;
            }
        }
    }

    /// Hands the node's events to the application's thread as one batch: the node's queue
    /// itself, which the node refills from a queue the application emptied and sent back.
    fn hand_over_events(&mut self) {
        let spare = self
            .spare_events
            .take()
            .unwrap_or_else(|| self.events.spare());
        let batch = self.node.take_events(spare);
        if batch.is_empty() {
            self.spare_events = Some(batch);
        } else {
            self.events.send(batch);
        }
    }

    /// Sends every packet the node has, in batches.
    fn send_packets(&mut self) {
        // Before any ACK leaves: the ACKs sent name lengths at most this.
        self.log_end.store(self.node.log_end(), Ordering::SeqCst);
        self.lease.store(self.node.read_lease_ends());
        let now = self.now();
        let mut packets = Vec::new();
        while let Some(mut transmit) = self.node.poll_transmit(now) {
            if let Some(key) = &self.key {
                let tag = packet_tag(key, &transmit.contents);
                transmit.contents.extend_from_slice(&tag);
            }
            if transmit.contents.len() > DATAGRAM_BYTES_MAX {
                self.stats.oversized += 1;
                continue;
            }
            packets.push(transmit);
        }
        if packets.is_empty() {
            return;
        }
        let mut datagrams: Vec<(&[u8], &SockAddr)> = Vec::new();
        self.update_fan_out();
        let members = &self.fan_out.1;
        for transmit in &packets {
            let targets: &[SockAddr] = match (transmit.destination, &self.group) {
                (Destination::All, None) => members,
                (Destination::All, Some(group)) => std::slice::from_ref(group),
                (Destination::Node(node), _) => match self.peers.get(usize::from(node.0)) {
                    Some(peer) => std::slice::from_ref(peer),
                    None => &[],
                },
            };
            for target in targets {
                if self.dropper.at_send() {
                    self.stats.dropped_at_send += 1;
                    continue;
                }
                datagrams.push((&transmit.contents, target));
            }
        }
        let (sent, refused) = batch::send(self.send.as_raw_fd(), &datagrams, SEND_BATCH_MAX);
        self.stats.datagrams_sent += sent;
        self.stats.send_errors += refused;
    }
}

impl Runner {
    /// The addresses a unicast broadcast goes to: this node and every node of the groups
    /// it knows (its view's, the newest, and the receivers before them), not a removed one
    /// nor one not yet added. Computed again when the node's groups change.
    fn update_fan_out(&mut self) {
        let records = [self.node.group_record(), self.node.known_group()];
        let mut nodes = 1u64 << self.node.id().0;
        for record in records {
            nodes |= record.senders | record.receivers | record.previous_receivers;
        }
        if self.fan_out.0 == Some(nodes) {
            return;
        }
        let addresses = (0..self.peers.len())
            .filter(|&i| nodes & 1 << i != 0)
            .map(|i| self.peers[i].clone())
            .collect();
        self.fan_out = (Some(nodes), addresses);
    }
}

/// `ppoll` on `fds` for at most `wait_us`: what it returned.
fn poll_fds(fds: &mut [libc::pollfd; 2], wait_us: u64) -> libc::c_int {
    let timeout = libc::timespec {
        tv_sec: (wait_us / 1_000_000) as libc::time_t,
        tv_nsec: ((wait_us % 1_000_000) * 1_000) as libc::c_long,
    };
    // SAFETY: fds and timeout are live for the call; the descriptors are open.
    unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &timeout, std::ptr::null()) }
}

/// Compares two MACs in time independent of where they differ.
fn tags_equal(ours: &[u8], theirs: &[u8]) -> bool {
    ours.len() == theirs.len() && ours.iter().zip(theirs).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_about_the_share_asked_and_none_when_off() {
        let mut off = Dropper::new(Loss::NONE);
        assert!((0..10_000).all(|_| !off.at_send() && !off.at_receive()));
        let loss = Loss {
            send: 0.01,
            receive: 0.2,
            seed: 7,
        };
        let mut dropper = Dropper::new(loss);
        let sent = (0..100_000).filter(|_| dropper.at_send()).count();
        let received = (0..100_000).filter(|_| dropper.at_receive()).count();
        assert!((800..1_200).contains(&sent), "{sent} of 100,000 at 1%");
        assert!((19_000..21_000).contains(&received), "{received} at 20%");
        // Seeded: the same seed drops the same datagrams.
        let mut again = Dropper::new(loss);
        let mut first = Dropper::new(loss);
        assert!((0..1_000).all(|_| again.at_send() == first.at_send()));
    }

    #[test]
    fn refuses_probabilities_outside_zero_to_one() {
        for (send, receive) in [(-0.1, 0.0), (0.0, 1.5), (f64::NAN, 0.0)] {
            assert!(!Loss {
                send,
                receive,
                seed: 0
            }
            .valid());
        }
        assert!(Loss {
            send: 1.0,
            receive: 0.0,
            seed: 0
        }
        .valid());
    }
}
