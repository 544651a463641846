//! The datagram transport: `tessera-datagram`'s protocol core driven over a real UDP socket.
//!
//! One I/O thread per endpoint owns the socket and the [`Endpoint`]. It sends and receives in
//! batches (`sendmmsg`/`recvmmsg`, dozens of datagrams per system call; a batch grouped by
//! peer, each peer's DATA packets as one UDP GSO message; a GSO message from a peer taken whole
//! with `UDP_GRO` and split into its datagrams) and sleeps in `ppoll` with a microsecond timeout
//! and a 1 µs timer slack, because a tokio timer alone has millisecond granularity and the
//! protocol's retransmission timeouts are a few hundred microseconds. Async callers talk to
//! the thread through a command queue and an eventfd that wakes it.
//!
//! Copies of a payload byte in user space, from the caller's `Bytes` to the peer's handler:
//! one. A frame goes to the endpoint as its header and message (joined: tens of bytes) and
//! its payload as it is ([`Message`]); each datagram goes to `sendmmsg` as three `iovec`s, the
//! packet's header, a slice of the frame and the tag. `recvmmsg` reads into buffers that
//! each datagram is split off as `Bytes`; the endpoint copies the payload into the message
//! (the one copy), and the frame is decoded into slices of the message
//! ([`Frame::decode_bytes`]). Only the first fragment of a frame, where its header meets its
//! payload, is a copy on the sending side (at most one datagram, usually tens of bytes).
//! Before, a payload byte was copied five times (into the frame, into each datagram, out of
//! the receive buffer, into the message, out of it into the decoded frame). TCP copies none
//! on sending (header, message and payload are written one after the other) and at most one
//! on receiving.
//!
//! Thread hand-offs per request (a thread woken to take the work on), counted from the code:
//! the client's calling task posts to its I/O thread and is woken by it with the answer (2).
//! A server's I/O thread answers at once what its handler can do without waiting
//! ([`FrameHandler::handle_now`]: reads the page cache holds, writes the page cache takes;
//! 0); anything else goes to a task on the runtime, which may hand the disk work to the
//! blocking pool, and the answer comes back to the I/O thread (up to 4). Over TCP, the
//! server's task is woken by the socket and hands disk work to the blocking pool and back
//! (up to 2 beside the socket's wake-ups on both ends).

use crate::{BoxFuture, ConnectionId, FrameHandler, Reply, TransportError};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_datagram::{
    Config as DatagramConfig, Endpoint, Event, LossReason, Message, SendError, SessionId, Transmit,
};
use tessera_wire::{Frame, FrameHeader, FrameKind};
use tokio::sync::oneshot;

/// Datagrams received per system call at most.
const BATCH_DATAGRAMS_MAX: usize = 32;
/// Datagrams sent per system call at most: the endpoint hands out packets one session at a
/// time in turn, and a batch is grouped by peer before it goes, so that each peer's packets
/// leave as one GSO run; a larger batch makes longer runs when many sessions send at once.
const SEND_BATCH_DATAGRAMS_MAX: usize = 128;
/// Socket buffers: room for bursts from many peers.
const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Commands handled per loop turn, so I/O is never starved by a flood of calls.
const COMMANDS_PER_TURN_MAX: usize = 256;
/// Largest UDP payload over IPv4.
const DATAGRAM_BYTES_MAX: usize = 65_507;

/// Tunables of the datagram transport.
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The protocol's configuration (window, timeouts, datagram size).
    pub datagram: DatagramConfig,
    /// How long a call waits for its answer.
    pub request_timeout: Duration,
    /// What the client proves to key each session (a TCP handshake with the server first);
    /// `None`: sessions with the public key, which an authenticated server refuses.
    pub credential: Option<tessera_auth::Credential>,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            datagram: DatagramConfig::default(),
            request_timeout: Duration::from_secs(10),
            credential: None,
        }
    }
}

/// The detail of the error by which the I/O thread tells a keyed client that it has no session
/// to a server (never opened, or lost): the caller keys one and tries again.
const NO_KEYED_SESSION: &str = "no keyed session";
/// Handshakes one call may make to key a session before it fails.
const KEYING_ATTEMPTS_MAX: u32 = 3;

/// Wakes the I/O thread out of `ppoll`.
struct Waker(OwnedFd);

impl Waker {
    fn new() -> std::io::Result<Waker> {
        // SAFETY: eventfd with valid flags; the returned fd is checked and then owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
        Ok(Waker(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }

    fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                &mut value as *mut u64 as *mut libc::c_void,
                8,
            );
        }
    }
}

/// What async callers ask of the I/O thread.
enum Command {
    /// Send a request frame to `addr`; answer on `reply`. The answer frame will be about
    /// `reply_bytes` long, if known.
    Call {
        addr: SocketAddr,
        request_id: u64,
        frame: Message,
        reply_bytes: Option<usize>,
        reply: oneshot::Sender<Result<Reply, TransportError>>,
    },
    /// The client's reserved stream starts its periods at `at`.
    StartPeriods { at: std::time::Instant },
    /// Report the endpoint's counters.
    Counters {
        reply: oneshot::Sender<Vec<(String, u64)>>,
    },
    /// The caller gave up waiting.
    Cancel { request_id: u64 },
    /// Whether a request is still on its way out of this endpoint (waiting for its turn,
    /// its grant or its pacer, or being sent), rather than held by the peer.
    OnItsWay {
        request_id: u64,
        reply: oneshot::Sender<bool>,
    },
    /// Send a response frame on a session (server side).
    Respond { session: SessionId, frame: Message },
    /// Drop a session whose peer sent garbage (server side).
    Close { session: SessionId },
    /// Stop the thread.
    Shutdown,
    /// Open the session to `addr` keyed by a handshake (client side, keyed).
    Keyed {
        addr: SocketAddr,
        session: SessionId,
        key: tessera_auth::Key,
    },
}

/// A queue of commands plus the waker that makes the I/O thread look at it.
#[derive(Clone)]
struct Mailbox {
    commands: mpsc::Sender<Command>,
    waker: Arc<Waker>,
}

impl Mailbox {
    fn post(&self, command: Command) -> bool {
        let sent = self.commands.send(command).is_ok();
        self.waker.wake();
        sent
    }
}

/// Request timeouts a call waits out while its request is still on its way out of this
/// endpoint (queued behind the session's earlier messages, held for its grant, paced), before
/// it fails anyway. The request timeout is for a server that holds a request and does not
/// answer; a peer that stops answering altogether is found by the session
/// (`peer_lost_after_us`). A paced stream that queued more than a timeout's worth of its
/// rate (`lab radon`: a best-effort writer at its pacer's floor, three 1 MB chunks in
/// flight) had its later requests time out in its own queue, and the client's ping (queued
/// behind them) time out too: the live server was reported down ("raid0 file ... is
/// unavailable: server 1 ... unavailable").
pub const TIMEOUTS_ON_ITS_WAY_MAX: u32 = 12;

/// The client side: requests to any server over one datagram session per server.
pub struct UdpTransport {
    mailbox: Mailbox,
    /// The I/O thread, joined on drop so that its goodbyes go out before the process ends.
    driver: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    next_request_id: AtomicU64,
    request_timeout: Duration,
    credential: Option<tessera_auth::Credential>,
    /// Per server, its handshakes one at a time: a burst of calls to a new server keys one
    /// session, and different servers are keyed at once.
    keyings: std::sync::Mutex<HashMap<SocketAddr, Arc<Keying>>>,
    /// What a call needs to hash its request's fragments itself (see [`Senders`]).
    senders: Senders,
}

/// The handshakes of the client's sessions to one server ([`UdpTransport::key_session`]).
#[derive(Default)]
struct Keying {
    /// Held through a handshake.
    lock: tokio::sync::Mutex<()>,
    /// Handshakes done (their sessions posted to the I/O thread).
    done: AtomicU64,
}

/// Per server, the MAC and fragment size of the client's session to it, published by the I/O
/// thread when it opens the session: a calling task hashes its request's fragments with them
/// ([`Message::hash_fragments`]), so that the I/O thread, which sends for every task to
/// every server, only finishes each datagram's tag over its header. A stale entry (the
/// session was replaced) costs nothing but the hashing: the endpoint uses a hash only under
/// the session's own key and fragment size.
type Senders = Arc<std::sync::Mutex<HashMap<SocketAddr, (tessera_auth::PacketMac, usize)>>>;

impl UdpTransport {
    /// Bind an ephemeral UDP socket and start the I/O thread.
    pub fn new(config: UdpConfig) -> std::io::Result<Arc<UdpTransport>> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        let request_timeout = config.request_timeout;
        let senders = Senders::default();
        let (mailbox, driver) = spawn_driver(
            socket,
            config.datagram,
            Role::Client {
                pending: HashMap::new(),
                sessions: HashMap::new(),
                deferred: Default::default(),
                keyed: config.credential.is_some(),
                senders: senders.clone(),
            },
        )?;
        Ok(Arc::new(UdpTransport {
            mailbox,
            driver: std::sync::Mutex::new(Some(driver)),
            next_request_id: AtomicU64::new(1),
            request_timeout,
            credential: config.credential,
            keyings: Default::default(),
            senders,
        }))
    }

    /// A call, keying a session to `addr` first if there is none (or it was lost).
    async fn call_inner(
        self: Arc<Self>,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> Result<Reply, TransportError> {
        // A session can be lost again between keying and the call (a server's RESET for the
        // old session, racing a burst of calls): key again, a few times, before giving up.
        let mut attempt = 0;
        let keying = self.credential.as_ref().map(|_| self.keying_of(addr));
        loop {
            let seen = keying
                .as_ref()
                .map_or(0, |k| k.done.load(Ordering::Acquire));
            let answer = self
                .clone()
                .call_once(addr, message.clone(), payload.clone(), reply_bytes)
                .await;
            match (&answer, &self.credential, &keying) {
                (Err(TransportError::Disconnected { detail, .. }), Some(credential), Some(k))
                    if detail == NO_KEYED_SESSION && attempt < KEYING_ATTEMPTS_MAX =>
                {
                    attempt += 1;
                    self.key_session(addr, credential, k, seen).await?;
                }
                _ => return answer,
            }
        }
    }

    /// The handshake state of `addr`'s sessions.
    fn keying_of(&self, addr: SocketAddr) -> Arc<Keying> {
        let mut keyings = self.keyings.lock().expect("not poisoned");
        Arc::clone(keyings.entry(addr).or_default())
    }

    /// Key a session to `addr`: a handshake over TCP on the same port binds a fresh session
    /// id and both nonces to `credential`, and the server admits the session's key. Nothing
    /// to do if another call keyed one since this call's attempt read `seen`: its session is
    /// posted to the I/O thread ahead of this call's next attempt (one queue, and the count
    /// goes up only after the post), and a second handshake would only be thrown away there
    /// (`keyed` keeps the first session).
    async fn key_session(
        &self,
        addr: SocketAddr,
        credential: &tessera_auth::Credential,
        keying: &Keying,
        seen: u64,
    ) -> Result<(), TransportError> {
        let _one_at_a_time = keying.lock.lock().await;
        if keying.done.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        let connect_error = |detail: String| TransportError::Connect { addr, detail };
        let connecting = tokio::net::TcpStream::connect(addr);
        let mut stream = tokio::time::timeout(crate::handshake::HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| connect_error("timed out".into()))?
            .map_err(|e| connect_error(e.to_string()))?;
        let session: u64 = rand::random();
        let (connecting, accepting) =
            crate::handshake::connect(&mut stream, addr, Some(credential), Some(session)).await?;
        let key = tessera_auth::session_key(&credential.key, session, &connecting, &accepting);
        let keyed = Command::Keyed {
            addr,
            session: SessionId(session),
            key,
        };
        if !self.mailbox.post(keyed) {
            return Err(TransportError::Disconnected {
                addr,
                detail: "transport stopped".into(),
            });
        }
        keying.done.fetch_add(1, Ordering::Release);
        Ok(())
    }

    async fn call_once(
        self: Arc<Self>,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> Result<Reply, TransportError> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = encode_frame(FrameKind::Request, request_id, &message, payload);
        let sender = self
            .senders
            .lock()
            .expect("not poisoned")
            .get(&addr)
            .cloned();
        if let Some((mac, fragment_bytes_max)) = sender {
            frame.hash_fragments(&mac, fragment_bytes_max);
        }
        let (reply, answer) = oneshot::channel();
        if !self.mailbox.post(Command::Call {
            addr,
            request_id,
            frame,
            reply_bytes,
            reply,
        }) {
            return Err(TransportError::Disconnected {
                addr,
                detail: "transport stopped".into(),
            });
        }
        let mut answer = answer;
        let mut timeouts = 0;
        loop {
            match tokio::time::timeout(self.request_timeout, &mut answer).await {
                Ok(Ok(result)) => return result,
                Ok(Err(_)) => {
                    return Err(TransportError::Disconnected {
                        addr,
                        detail: "transport stopped".into(),
                    })
                }
                Err(_) => {
                    timeouts += 1;
                    if timeouts < TIMEOUTS_ON_ITS_WAY_MAX && self.on_its_way(request_id).await {
                        continue;
                    }
                    self.mailbox.post(Command::Cancel { request_id });
                    return Err(TransportError::Timeout {
                        addr,
                        timeout_ms: self.request_timeout.as_millis() as u64,
                    });
                }
            }
        }
    }

    /// Whether the request is still on its way out of this endpoint (see
    /// [`TIMEOUTS_ON_ITS_WAY_MAX`]).
    async fn on_its_way(&self, request_id: u64) -> bool {
        let (reply, answer) = oneshot::channel();
        self.mailbox.post(Command::OnItsWay { request_id, reply }) && answer.await.unwrap_or(false)
    }
}

/// Asks a datagram endpoint's I/O thread for its counters.
#[derive(Clone)]
pub struct UdpCounters(Mailbox);

impl UdpCounters {
    /// The endpoint's counters by name, with the socket's (`gso_sends`, `gso_datagrams`);
    /// empty if its thread has stopped.
    pub async fn get(&self) -> Vec<(String, u64)> {
        let (reply, answer) = oneshot::channel();
        if !self.0.post(Command::Counters { reply }) {
            return Vec::new();
        }
        answer.await.unwrap_or_default()
    }
}

impl Drop for UdpTransport {
    fn drop(&mut self) {
        self.mailbox.post(Command::Shutdown);
        // The thread closes every session (a RESET to each server, so that none keeps
        // retransmitting to a client that is gone) and returns at once.
        if let Some(driver) = self.driver.lock().ok().and_then(|mut d| d.take()) {
            let _ = driver.join();
        }
    }
}

impl crate::Transport for Arc<UdpTransport> {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        Box::pin(self.clone().call_inner(addr, message, payload, None))
    }

    fn call_expecting(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        Box::pin(self.clone().call_inner(addr, message, payload, reply_bytes))
    }

    fn counters(&self) -> BoxFuture<'static, Vec<(String, u64)>> {
        let counters = UdpCounters(self.mailbox.clone());
        Box::pin(async move { counters.get().await })
    }

    fn start_periods(&self, at: std::time::Instant) {
        self.mailbox.post(Command::StartPeriods { at });
    }

    fn prepare(&self, addr: SocketAddr) -> BoxFuture<'static, ()> {
        let transport = self.clone();
        Box::pin(async move {
            let Some(credential) = transport.credential else {
                return; // sessions with the public key need no handshake
            };
            let keying = transport.keying_of(addr);
            // Keyed once already: a session lost since is keyed again by the call that
            // finds it gone, as without this.
            if keying.done.load(Ordering::Acquire) == 0 {
                let _ = transport.key_session(addr, &credential, &keying, 0).await;
            }
        })
    }
}

/// A running datagram server; dropping it stops the I/O thread.
pub struct UdpServer {
    mailbox: Mailbox,
    /// The bound address.
    pub addr: SocketAddr,
}

impl UdpServer {
    /// A handle that reads the server endpoint's counters.
    pub fn counters(&self) -> UdpCounters {
        UdpCounters(self.mailbox.clone())
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.mailbox.post(Command::Shutdown);
    }
}

/// Serve `handler` on `socket`: each datagram session is a connection; its requests run on the
/// current tokio runtime and may answer out of order. A session whose frames do not decode is
/// closed; the others go on.
pub fn serve_udp(
    socket: UdpSocket,
    handler: Arc<dyn FrameHandler>,
    config: DatagramConfig,
) -> std::io::Result<UdpServer> {
    let addr = socket.local_addr()?;
    let runtime = tokio::runtime::Handle::current();
    let (mailbox, _driver) = spawn_driver(
        socket,
        config,
        Role::Server {
            handler,
            runtime,
            connections: HashMap::new(),
            next_connection: 1,
            mailbox: None,
        },
    )?;
    Ok(UdpServer { mailbox, addr })
}

/// Radon's view over the endpoint's sessions: the reserved sessions' periods and deadlines
/// (as their pacers counted them) and the largest queue a peer reports toward it, µs (its
/// RFD estimate through the median filter), for `lab radon` to sample beside `tc`.
///
/// Also, as gauges: the shortest wait between packets of a paced best-effort session (its
/// controller's rate: a full-size frame per wait; 0 with none), and the bytes queued over
/// every session (not yet acknowledged), to tell a sender held by its pacer from one with
/// nothing to send.
fn radon_counters(endpoint: &Endpoint) -> Vec<(String, u64)> {
    let (mut periods, mut met, mut missed, mut late, mut queue_us) = (0, 0, 0, 0, 0);
    let (mut best_effort_wait_ns, mut queued_bytes) = (u64::MAX, 0);
    // A reader's side: its best-effort grants' rate and its own estimate of the queue in
    // front of it (`lab radon --mirror`'s reader timelines).
    let (mut grant_rate, mut own_queue_us) = (0, 0);
    for info in endpoint
        .sessions()
        .filter_map(|id| endpoint.session_info(id))
    {
        periods += info.deadlines.periods;
        met += info.deadlines.deadlines_met;
        missed += info.deadlines.deadlines_missed;
        late += info.deadlines.late_sends;
        queue_us = queue_us.max(info.peer_queue_delay_us);
        queued_bytes += info.queued_bytes;
        grant_rate = grant_rate.max(info.best_effort_grant_rate);
        own_queue_us = own_queue_us.max(info.queue_delay_us);
        if info.reservation.is_none() && info.pacing_wait_ns > 0 {
            best_effort_wait_ns = best_effort_wait_ns.min(info.pacing_wait_ns);
        }
    }
    vec![
        ("pacer_periods".into(), periods),
        ("pacer_deadlines_met".into(), met),
        ("pacer_deadlines_missed".into(), missed),
        ("pacer_late_sends".into(), late),
        ("peer_queue_delay_us_max".into(), queue_us),
        (
            "best_effort_wait_ns".into(),
            if best_effort_wait_ns == u64::MAX {
                0
            } else {
                best_effort_wait_ns
            },
        ),
        ("queued_bytes".into(), queued_bytes),
        ("best_effort_grant_rate".into(), grant_rate),
        ("queue_delay_us_max".into(), own_queue_us),
    ]
}

/// A frame as a datagram message: its header and serialized message joined (a small copy),
/// and its payload behind them as it is, never copied (the endpoint cuts fragments out of it).
fn encode_frame(kind: FrameKind, request_id: u64, message: &[u8], payload: Bytes) -> Message {
    let header = FrameHeader {
        kind,
        message_len: message.len() as u32,
        payload_len: payload.len() as u32,
        request_id,
    };
    let mut head = Vec::with_capacity(header.frame_len() - payload.len());
    head.extend_from_slice(&header.encode());
    head.extend_from_slice(message);
    Message::new(Bytes::from(head), payload)
}

/// Tells the calling tasks the MAC and fragment size of the session to `addr` (see
/// [`Senders`]).
fn publish_sender(senders: &Senders, endpoint: &Endpoint, addr: SocketAddr, session: SessionId) {
    if let Some(sender) = endpoint.sender_of(session) {
        senders.lock().expect("not poisoned").insert(addr, sender);
    }
}

/// Forget a client session: its server mapping and its waiting requests, returned oldest
/// first (so that any sent again reach the server in the order they were first sent).
fn take_session(
    pending: &mut HashMap<u64, Pending>,
    sessions: &mut HashMap<SocketAddr, SessionId>,
    session: SessionId,
) -> Vec<(u64, Pending)> {
    sessions.retain(|_, s| *s != session);
    let mut ids: Vec<u64> = pending
        .iter()
        .filter(|(_, p)| p.session == session)
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids.into_iter()
        .filter_map(|id| pending.remove(&id).map(|p| (id, p)))
        .collect()
}

/// A request waiting for its answer.
struct Pending {
    session: SessionId,
    addr: SocketAddr,
    frame: Message,
    /// Expected size of the answer frame, if known.
    reply_bytes: Option<usize>,
    /// Whether it was already sent again after its session was reset.
    resent: bool,
    /// Its number among the messages its session queued: the peer has it whole once the
    /// session's `messages_acknowledged` reaches this.
    number: u64,
    reply: oneshot::Sender<Result<Reply, TransportError>>,
}

/// What the I/O thread does with messages, by side.
enum Role {
    Client {
        /// Requests sent and not yet answered.
        pending: HashMap<u64, Pending>,
        /// One session per server.
        sessions: HashMap<SocketAddr, SessionId>,
        /// Calls the protocol could not queue yet (a session's send queue was full).
        deferred: std::collections::VecDeque<Command>,
        /// Sessions are keyed by a handshake first (the caller's, on `NO_KEYED_SESSION`).
        keyed: bool,
        /// Shared with the calling tasks: each session's MAC and fragment size.
        senders: Senders,
    },
    Server {
        handler: Arc<dyn FrameHandler>,
        runtime: tokio::runtime::Handle,
        connections: HashMap<SessionId, ConnectionId>,
        next_connection: ConnectionId,
        mailbox: Option<Mailbox>,
    },
}

fn spawn_driver(
    socket: UdpSocket,
    config: DatagramConfig,
    mut role: Role,
) -> std::io::Result<(Mailbox, std::thread::JoinHandle<()>)> {
    socket.set_nonblocking(true)?;
    let sock = socket2::SockRef::from(&socket);
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    // The kernel stamps each datagram with its arrival, so a driver that was not scheduled for
    // a while still hands the endpoint true arrival times (for its round-trip samples).
    // Without it (an error is not fatal) the time of reading stands in.
    enable_receive_timestamps(socket.as_raw_fd());
    enable_receive_gro(socket.as_raw_fd());
    let waker = Arc::new(Waker::new()?);
    let (commands, inbox) = mpsc::channel();
    let mailbox = Mailbox {
        commands,
        waker: waker.clone(),
    };
    if let Role::Server { mailbox: slot, .. } = &mut role {
        *slot = Some(mailbox.clone());
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (std::process::id() as u64) << 32;
    let endpoint = Endpoint::new(config.clone(), seed);
    // Room for the largest datagram any path may carry (loopback's).
    let buffer_bytes = DATAGRAM_BYTES_MAX;
    let driver = std::thread::Builder::new()
        .name("tessera-udp".into())
        .spawn(move || {
            let mut driver = Driver {
                socket,
                endpoint,
                role,
                inbox,
                waker,
                origin: Instant::now(),
                unsent: Vec::new(),
                sending: SendBatch::default(),
                receiving: ReceiveBatch::new(buffer_bytes),
                datagram_bytes: HashMap::new(),
            };
            driver.run();
        })?;
    Ok((mailbox, driver))
}

struct Driver {
    socket: UdpSocket,
    endpoint: Endpoint,
    role: Role,
    inbox: mpsc::Receiver<Command>,
    waker: Arc<Waker>,
    origin: Instant,
    /// Datagrams the kernel did not take yet (its buffer was full).
    unsent: Vec<Transmit>,
    sending: SendBatch,
    receiving: ReceiveBatch,
    /// Datagram size per peer address, from the path MTU.
    datagram_bytes: HashMap<std::net::IpAddr, usize>,
}

impl Driver {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn run(&mut self) {
        // Fine-grained sleeps: the default 50 µs timer slack would blur sub-millisecond timeouts.
        // SAFETY: prctl on the calling thread with an integer argument.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64);
        }
        loop {
            if !self.take_commands() {
                return;
            }
            self.retry_deferred();
            let now = self.now();
            if self.endpoint.poll_timeout().is_some_and(|t| t <= now) {
                self.endpoint.handle_timeout(now);
            }
            self.handle_events();
            self.transmit();
            let timeout = self
                .endpoint
                .poll_timeout()
                .map(|t| t.saturating_sub(self.now()));
            self.wait(timeout);
            self.receive();
            self.handle_events();
        }
    }

    /// Apply queued commands; false once told to shut down.
    fn take_commands(&mut self) -> bool {
        for _ in 0..COMMANDS_PER_TURN_MAX {
            let command = match self.inbox.try_recv() {
                Ok(command) => command,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            };
            let now = self.now();
            match command {
                Command::Shutdown => {
                    self.say_goodbye();
                    return false;
                }
                call @ Command::Call { .. } => self.call(call, now),
                Command::Cancel { request_id } => {
                    if let Role::Client { pending, .. } = &mut self.role {
                        if let Some(p) = pending.remove(&request_id) {
                            // The answer is no longer awaited: release its grant.
                            self.endpoint.expect_cancelled(p.session, now);
                        }
                    }
                }
                Command::OnItsWay { request_id, reply } => {
                    let _ = reply.send(self.on_its_way(request_id));
                }
                Command::Counters { reply } => {
                    let mut counters: Vec<(String, u64)> = self
                        .endpoint
                        .stats()
                        .counters()
                        .into_iter()
                        .map(|(name, value)| (name.to_string(), value))
                        .collect();
                    counters.extend(radon_counters(&self.endpoint));
                    counters.push(("gso_sends".into(), self.sending.gso_sends));
                    counters.push(("gso_datagrams".into(), self.sending.gso_datagrams));
                    let _ = reply.send(counters);
                }
                Command::Respond { session, frame } => {
                    // A session lost meanwhile has nobody to answer.
                    let _ = self.endpoint.send(session, frame, now);
                }
                Command::Close { session } => {
                    self.endpoint.close(session);
                    self.forget_session(session);
                }
                Command::Keyed { addr, session, key } => self.keyed(addr, session, key, now),
                Command::StartPeriods { at } => {
                    let epoch = at.saturating_duration_since(self.origin).as_micros();
                    let epoch = u64::try_from(epoch).unwrap_or(u64::MAX);
                    self.endpoint.start_periods(epoch, now);
                }
            }
        }
        true
    }

    /// A client going away closes its sessions: each server gets a RESET and forgets the
    /// session at once, instead of retransmitting to a closed port until its backoffs run
    /// out (an answer whose last ACK had not gone out yet). Best effort: what the socket
    /// does not take now is not waited for.
    fn say_goodbye(&mut self) {
        if !matches!(self.role, Role::Client { .. }) {
            return;
        }
        // ACKs owed first, so that nothing delivered is sent again before the RESET lands.
        self.transmit();
        let sessions: Vec<SessionId> = self.endpoint.sessions().collect();
        for session in sessions {
            self.endpoint.close(session);
        }
        self.transmit();
    }

    /// Queue a call on its server's session (opening one sized to the path), or defer it if
    /// the session's queue is full.
    fn call(&mut self, call: Command, now: u64) {
        let Command::Call {
            addr,
            request_id,
            frame,
            reply_bytes,
            reply,
        } = call
        else {
            return;
        };
        let payload_bytes = self.payload_bytes_for(addr);
        let Role::Client {
            pending,
            sessions,
            deferred,
            keyed,
            senders,
        } = &mut self.role
        else {
            return;
        };
        if *keyed && !sessions.contains_key(&addr) {
            let _ = reply.send(Err(TransportError::Disconnected {
                addr,
                detail: NO_KEYED_SESSION.into(),
            }));
            return;
        }
        let session = match sessions.get(&addr) {
            Some(&session) => session,
            None => {
                let session = self.endpoint.connect_with(addr, payload_bytes, now);
                sessions.insert(addr, session);
                publish_sender(senders, &self.endpoint, addr, session);
                session
            }
        };
        // With its answer's size: under the receive budget the request waits for the grant.
        match self
            .endpoint
            .request(session, frame.clone(), reply_bytes, now)
        {
            Ok(()) => {
                let number = self
                    .endpoint
                    .session_info(session)
                    .map_or(0, |info| info.messages_acknowledged + info.queued_messages);
                pending.insert(
                    request_id,
                    Pending {
                        session,
                        addr,
                        frame,
                        reply_bytes,
                        resent: false,
                        number,
                        reply,
                    },
                );
            }
            Err(SendError::QueueFull { .. }) => deferred.push_back(Command::Call {
                addr,
                request_id,
                frame,
                reply_bytes,
                reply,
            }),
            Err(e) => {
                sessions.remove(&addr);
                let _ = reply.send(Err(TransportError::Disconnected {
                    addr,
                    detail: e.to_string(),
                }));
            }
        }
    }

    /// Whether request `request_id` is still on its way out: deferred (its session's queue
    /// was full), or not yet acknowledged whole by the peer.
    fn on_its_way(&self, request_id: u64) -> bool {
        let Role::Client {
            pending, deferred, ..
        } = &self.role
        else {
            return false;
        };
        match pending.get(&request_id) {
            Some(p) => self
                .endpoint
                .session_info(p.session)
                .is_some_and(|info| info.messages_acknowledged < p.number),
            None => deferred.iter().any(
                |call| matches!(call, Command::Call { request_id: id, .. } if *id == request_id),
            ),
        }
    }

    /// A session keyed by a handshake: the one to `addr` from now on, unless one is open.
    fn keyed(&mut self, addr: SocketAddr, session: SessionId, key: tessera_auth::Key, now: u64) {
        let payload_bytes = self.payload_bytes_for(addr);
        let Role::Client {
            sessions, senders, ..
        } = &mut self.role
        else {
            return;
        };
        if sessions.contains_key(&addr) {
            return;
        }
        if let Some(session) = self
            .endpoint
            .connect_keyed(addr, session, key, payload_bytes, now)
        {
            sessions.insert(addr, session);
            publish_sender(senders, &self.endpoint, addr, session);
        }
    }

    /// Calls deferred because a send queue was full, tried again.
    fn retry_deferred(&mut self) {
        let Role::Client { deferred, .. } = &mut self.role else {
            return;
        };
        let waiting: Vec<Command> = deferred.drain(..).collect();
        let now = self.now();
        for call in waiting {
            self.call(call, now);
        }
    }

    /// Payload bytes per datagram toward `addr`: its path MTU less the IP and UDP headers,
    /// at most the configured cap.
    fn payload_bytes_for(&mut self, addr: SocketAddr) -> usize {
        let config = self.endpoint.config();
        let (fallback, cap) = (config.payload_bytes_max, config.path_datagram_bytes_max);
        *self.datagram_bytes.entry(addr.ip()).or_insert_with(|| {
            let path = path_payload_bytes(addr).unwrap_or(fallback);
            cap.map_or(path, |cap| path.min(cap))
        })
    }

    fn forget_session(&mut self, session: SessionId) {
        match &mut self.role {
            Role::Client {
                pending, sessions, ..
            } => {
                for (_, p) in take_session(pending, sessions, session) {
                    let _ = p.reply.send(Err(TransportError::Disconnected {
                        addr: p.addr,
                        detail: "datagram session closed".into(),
                    }));
                }
            }
            Role::Server {
                handler,
                connections,
                ..
            } => {
                if let Some(connection) = connections.remove(&session) {
                    handler.closed(connection);
                }
            }
        }
    }

    fn handle_events(&mut self) {
        while let Some(event) = self.endpoint.poll_event() {
            match event {
                Event::Opened { session, peer } => {
                    let bytes = self.payload_bytes_for(peer);
                    self.endpoint.set_payload_bytes(session, bytes);
                    if let Role::Server {
                        connections,
                        next_connection,
                        ..
                    } = &mut self.role
                    {
                        connections.insert(session, *next_connection);
                        *next_connection += 1;
                    }
                }
                Event::Lost {
                    session,
                    peer,
                    reason,
                } => self.session_lost(session, peer, reason),
                Event::Message {
                    session,
                    peer,
                    message,
                } => self.handle_message(session, peer, message),
            }
        }
    }

    /// A session is gone. A client whose server answered with a RESET (it restarted) sends
    /// the waiting requests once more on a fresh session, as a TCP client reconnects; requests
    /// to a server that stopped answering fail, so the caller goes degraded.
    fn session_lost(&mut self, session: SessionId, peer: SocketAddr, reason: LossReason) {
        let Role::Client {
            pending, sessions, ..
        } = &mut self.role
        else {
            self.forget_session(session);
            return;
        };
        let mut again = Vec::new();
        let silence_ms = self.endpoint.config().peer_lost_after_us / 1000;
        // Silence is a timeout, as on TCP: the caller pings before it reports the server
        // down (its answers may only be late, on a loaded machine).
        let failure = || match reason {
            LossReason::TimedOut => TransportError::Timeout {
                addr: peer,
                timeout_ms: silence_ms,
            },
            LossReason::Reset => disconnected(peer, "server restarted"),
            LossReason::Violation => disconnected(peer, "protocol violation"),
            LossReason::Idle => disconnected(peer, "session closed for idleness"),
        };
        for (id, p) in take_session(pending, sessions, session) {
            if reason == LossReason::Reset && !p.resent {
                again.push((id, p));
            } else {
                let _ = p.reply.send(Err(failure()));
            }
        }
        let now = self.now();
        for (request_id, p) in again {
            self.call(
                Command::Call {
                    addr: p.addr,
                    request_id,
                    frame: p.frame,
                    reply_bytes: p.reply_bytes,
                    reply: p.reply,
                },
                now,
            );
            if let Role::Client { pending, .. } = &mut self.role {
                if let Some(p) = pending.get_mut(&request_id) {
                    p.resent = true;
                }
            }
        }
    }

    fn handle_message(&mut self, session: SessionId, peer: SocketAddr, message: Bytes) {
        // Message and payload are slices of the reassembled message: no copy.
        let frame = match Frame::decode_bytes(&message) {
            Ok(Some((frame, used))) if used == message.len() => frame,
            _ => {
                tracing::info!("closing datagram session from {peer}: undecodable frame");
                self.endpoint.close(session);
                self.forget_session(session);
                return;
            }
        };
        match &mut self.role {
            Role::Client { pending, .. } => {
                if frame.kind != FrameKind::Response {
                    return;
                }
                if let Some(p) = pending.remove(&frame.request_id) {
                    let _ = p.reply.send(Ok(Reply {
                        message: frame.message,
                        payload: frame.payload,
                    }));
                }
            }
            Role::Server {
                handler,
                runtime,
                connections,
                next_connection,
                mailbox,
            } => {
                if frame.kind != FrameKind::Request {
                    self.endpoint.close(session);
                    return;
                }
                let connection = *connections.entry(session).or_insert_with(|| {
                    *next_connection += 1;
                    *next_connection - 1
                });
                match handler.handle_now(connection, &frame.message, &frame.payload) {
                    Some(Some((message, payload))) => {
                        let frame =
                            encode_frame(FrameKind::Response, frame.request_id, &message, payload);
                        let now = self.now();
                        let _ = self.endpoint.send(session, frame, now);
                        return;
                    }
                    Some(None) => {
                        self.endpoint.close(session);
                        self.forget_session(session);
                        return;
                    }
                    None => {}
                }
                let handler = handler.clone();
                let mailbox = mailbox.clone().expect("server mailbox");
                runtime.spawn(async move {
                    let request_id = frame.request_id;
                    match handler
                        .handle(connection, frame.message, frame.payload)
                        .await
                    {
                        Some((message, payload)) => {
                            let frame =
                                encode_frame(FrameKind::Response, request_id, &message, payload);
                            mailbox.post(Command::Respond { session, frame });
                        }
                        None => {
                            mailbox.post(Command::Close { session });
                        }
                    }
                });
            }
        }
    }

    /// Send everything the endpoint has, in batches.
    fn transmit(&mut self) {
        let now = self.now();
        loop {
            while self.unsent.len() < SEND_BATCH_DATAGRAMS_MAX {
                match self.endpoint.poll_transmit(now) {
                    Some(t) => self.unsent.push(t),
                    None => break,
                }
            }
            if self.unsent.is_empty() {
                return;
            }
            group_by_peer(&mut self.unsent);
            match self.sending.send(self.socket.as_raw_fd(), &self.unsent) {
                Ok(0) => return,
                Ok(n) => {
                    self.unsent.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // A datagram the kernel refuses (e.g. no route) is lost like any other.
                    tracing::debug!("sendmmsg: {e}");
                    self.unsent.remove(0);
                }
            }
        }
    }

    fn wait(&mut self, timeout_us: Option<u64>) {
        let mut fds = [
            libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN
                    | if self.unsent.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    },
                revents: 0,
            },
            libc::pollfd {
                fd: self.waker.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let spec = timeout_us.map(|us| libc::timespec {
            tv_sec: (us / 1_000_000) as libc::time_t,
            tv_nsec: ((us % 1_000_000) * 1000) as libc::c_long,
        });
        let spec_ptr = spec
            .as_ref()
            .map_or(std::ptr::null(), |s| s as *const libc::timespec);
        // SAFETY: two valid pollfds that live across the call; the timespec (if any) too.
        unsafe {
            libc::ppoll(fds.as_mut_ptr(), 2, spec_ptr, std::ptr::null());
        }
        if fds[1].revents != 0 {
            self.waker.drain();
        }
    }

    /// Read every datagram waiting, in batches.
    fn receive(&mut self) {
        loop {
            let got = match self.receiving.receive(self.socket.as_raw_fd()) {
                Ok(got) => got,
                Err(_) => return,
            };
            let now = self.now();
            let wall_now = std::time::SystemTime::now();
            let full = got == BATCH_DATAGRAMS_MAX;
            // Taken and dropped datagram by datagram, so that the buffers are whole again by
            // the next call.
            let mut received = std::mem::take(&mut self.receiving.received);
            for datagram in received.drain(..) {
                // How long it waited in the socket, by the wall clock the kernel stamps with.
                let waited = datagram
                    .arrived
                    .and_then(|arrived| wall_now.duration_since(arrived).ok())
                    .map_or(0, |waited| waited.as_micros() as u64);
                if let Role::Server { handler, .. } = &self.role {
                    admit_keyed_session(&mut self.endpoint, handler.as_ref(), &datagram.datagram);
                }
                self.endpoint.handle_datagram_bytes(
                    datagram.from,
                    datagram.datagram,
                    now.saturating_sub(waited),
                    now,
                );
            }
            self.receiving.received = received;
            if !full {
                return;
            }
        }
    }
}

/// Orders a batch by peer, keeping each peer's datagrams in their order (a stable sort). The
/// endpoint takes its sessions in turn, a packet each, so a client writing to five servers
/// handed out a batch whose every GSO run was one datagram long; grouped, each peer's run
/// leaves as one. Measured with a 1,500-byte MTU, a 512 MiB RAID-0 put over 5 servers: 1.3
/// socket buffers per data packet on the way, 148 MB/s before, 560 after.
fn group_by_peer(batch: &mut [Transmit]) {
    batch.sort_by_key(|transmit| transmit.destination);
}

/// The largest UDP payload the route to `addr` carries without IP fragmentation: the route's
/// A datagram of a session the endpoint does not know yet: if a handshake keyed it (over
/// TCP), the endpoint admits its key before the datagram is handled.
fn admit_keyed_session(endpoint: &mut Endpoint, handler: &dyn FrameHandler, datagram: &[u8]) {
    let Some(session) = tessera_datagram::packet::session_of(datagram) else {
        return;
    };
    if endpoint.knows(SessionId(session)) {
        return;
    }
    if let Some(key) = handler.datagram_key(session) {
        endpoint.admit(SessionId(session), key);
    }
}

/// MTU (from a connected probe socket's `IP_MTU`) less the IP and UDP headers.
fn path_payload_bytes(addr: SocketAddr) -> Option<usize> {
    let bind: SocketAddr = match addr {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let probe = UdpSocket::bind(bind).ok()?;
    probe.connect(addr).ok()?;
    let (level, option, headers) = match addr {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU, 20 + 8),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU, 40 + 8),
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt on a live socket into a c_int with its size.
    let rc = unsafe {
        libc::getsockopt(
            probe.as_raw_fd(),
            level,
            option,
            &mut mtu as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 || mtu <= headers {
        return None;
    }
    Some((mtu as usize - headers as usize).min(DATAGRAM_BYTES_MAX))
}

/// A socket address in the kernel's layout.
fn sockaddr_of(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid; we then fill in one family's fields.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

/// The socket address the kernel wrote, if it is IPv4 or IPv6.
fn socket_addr_from(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Segments in one UDP GSO send at most (the kernel's `UDP_MAX_SEGMENTS` is 64 on older
/// kernels, 128 on newer).
const GSO_SEGMENTS_MAX: usize = 64;
/// Bytes in one UDP GSO send at most: all segments travel as one IP packet up to the device.
const GSO_BYTES_MAX: usize = 65_000;
/// `UDP_SEGMENT` (linux/udp.h), the control message that asks for segmentation offload.
const UDP_SEGMENT: libc::c_int = 103;

/// Room for one `UDP_SEGMENT` control message (a `u16`), aligned as a `cmsghdr`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
struct SegmentControl([u8; 32]);

/// The headers `sendmmsg` takes, kept across calls so that sending allocates nothing.
///
/// Back-to-back datagrams to one peer of one size (a window of DATA packets) go out as one
/// UDP GSO message (`UDP_SEGMENT`, Linux 4.18): the kernel builds and routes one large packet
/// and cuts it into the datagrams at the device, instead of running the UDP and IP layers once
/// per datagram. The receiver sees the same datagrams either way.
struct SendBatch {
    addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    iovs: Vec<libc::iovec>,
    /// Where each datagram's iovecs start in `iovs` (and, last, their end).
    iov_starts: Vec<usize>,
    headers: Vec<libc::mmsghdr>,
    controls: Vec<SegmentControl>,
    /// Datagrams carried by each header.
    segments: Vec<usize>,
    /// Whether to use segmentation offload; off for good once the kernel refuses it.
    gso: bool,
    /// GSO messages sent, and the datagrams they carried.
    gso_sends: u64,
    gso_datagrams: u64,
}

impl Default for SendBatch {
    fn default() -> Self {
        SendBatch {
            addrs: Vec::new(),
            iovs: Vec::new(),
            iov_starts: Vec::new(),
            headers: Vec::new(),
            controls: Vec::new(),
            segments: Vec::new(),
            gso: true,
            gso_sends: 0,
            gso_datagrams: 0,
        }
    }
}

impl SendBatch {
    /// `sendmmsg` of up to a batch of datagrams; returns how many the kernel took.
    fn send(&mut self, fd: RawFd, batch: &[Transmit]) -> std::io::Result<usize> {
        let n = batch.len().min(SEND_BATCH_DATAGRAMS_MAX);
        match self.send_grouped(fd, &batch[..n]) {
            Err(e) if self.gso && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                // No offload here (e.g. a device without checksum offload): one by one.
                tracing::debug!("UDP segmentation offload refused ({e}); sending datagrams singly");
                self.gso = false;
                self.send_grouped(fd, &batch[..n])
            }
            sent => sent,
        }
    }

    fn send_grouped(&mut self, fd: RawFd, batch: &[Transmit]) -> std::io::Result<usize> {
        self.segments.clear();
        let mut start = 0;
        while start < batch.len() {
            let count = if self.gso {
                gso_run(&batch[start..])
            } else {
                1
            };
            self.segments.push(count);
            start += count;
        }
        let groups = self.segments.len();
        self.addrs.clear();
        self.iovs.clear();
        self.controls.clear();
        self.headers.clear();
        let mut start = 0;
        for &count in &self.segments {
            self.addrs.push(sockaddr_of(&batch[start].destination));
            let mut control = SegmentControl::default();
            if count > 1 {
                fill_segment_control(&mut control, batch[start].len());
            }
            self.controls.push(control);
            start += count;
        }
        // Each datagram as its packet's header, payload and tag, gathered by the kernel: the
        // payload is a slice of its message, never copied here.
        self.iov_starts.clear();
        for t in batch {
            self.iov_starts.push(self.iovs.len());
            for part in [&t.header[..], &t.payload[..], &t.tag[..]] {
                if !part.is_empty() {
                    self.iovs.push(libc::iovec {
                        iov_base: part.as_ptr() as *mut libc::c_void,
                        iov_len: part.len(),
                    });
                }
            }
        }
        self.iov_starts.push(self.iovs.len());
        // SAFETY: an all-zero mmsghdr is a valid empty header.
        self.headers
            .extend((0..groups).map(|_| unsafe { std::mem::zeroed::<libc::mmsghdr>() }));
        let mut start = 0;
        for (i, &count) in self.segments.iter().enumerate() {
            let (first_iov, end_iov) = (self.iov_starts[start], self.iov_starts[start + count]);
            let header = &mut self.headers[i].msg_hdr;
            header.msg_name = &mut self.addrs[i].0 as *mut _ as *mut libc::c_void;
            header.msg_namelen = self.addrs[i].1;
            header.msg_iov = &mut self.iovs[first_iov];
            header.msg_iovlen = (end_iov - first_iov) as _;
            if count > 1 {
                header.msg_control = self.controls[i].0.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE only computes a size.
                header.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
            }
            start += count;
        }
        // SAFETY: headers, addresses, iovecs, control messages and datagram contents all
        // outlive the call, and none of the vectors grows after the pointers were taken.
        let sent = unsafe { libc::sendmmsg(fd, self.headers.as_mut_ptr(), groups as u32, 0) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let sent = &self.segments[..sent as usize];
        for &count in sent.iter().filter(|&&count| count > 1) {
            self.gso_sends += 1;
            self.gso_datagrams += count as u64;
        }
        Ok(sent.iter().sum())
    }
}

/// How many datagrams from the head of `batch` can go as one GSO message: same peer, same
/// size, except that the last may be shorter.
fn gso_run(batch: &[Transmit]) -> usize {
    let first = &batch[0];
    let size = first.len();
    let mut count = 1;
    let mut bytes = size;
    for t in &batch[1..] {
        let len = t.len();
        if t.destination != first.destination
            || len > size
            || len == 0
            || count == GSO_SEGMENTS_MAX
            || bytes + len > GSO_BYTES_MAX
        {
            break;
        }
        count += 1;
        bytes += len;
        if len < size {
            break;
        }
    }
    count
}

/// Writes a `UDP_SEGMENT` control message with segment size `size` into `control`.
fn fill_segment_control(control: &mut SegmentControl, size: usize) {
    // SAFETY: `control` is aligned for a cmsghdr and larger than CMSG_SPACE(2); the header and
    // its data are written within it.
    unsafe {
        let cmsg = control.0.as_mut_ptr().cast::<libc::cmsghdr>();
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size as u16);
    }
}

/// Asks the kernel for the arrival time of every datagram (`SO_TIMESTAMPNS`).
fn enable_receive_timestamps(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option value that lives across the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// `UDP_GRO` (linux/udp.h): the socket option that takes coalesced datagrams whole, and the
/// control message that gives their segment size.
const UDP_GRO: libc::c_int = 104;

/// Asks the kernel to hand over a run of datagrams from one sender as one (`UDP_GRO`): a UDP
/// GSO send over loopback then arrives as it was sent, one buffer of up to 64 segments read
/// in one step, where the kernel otherwise cut it into one socket buffer per datagram and
/// copied each out apart. Each segment is still its own datagram to the endpoint
/// ([`ReceiveBatch::receive`] splits them). Without the option (an older kernel) nothing
/// changes.
fn enable_receive_gro(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option value that lives across the call.
    let done = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_UDP,
            UDP_GRO,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if done != 0 {
        tracing::debug!("UDP_GRO: {}", std::io::Error::last_os_error());
    }
}

/// The segment size of a coalesced read (`UDP_GRO` control message), if it is one.
fn gro_segment_bytes(header: &libc::msghdr) -> Option<usize> {
    // SAFETY: the header's control buffer was filled by recvmmsg; the CMSG macros walk it
    // within `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int);
                return usize::try_from(size).ok().filter(|&size| size > 0);
            }
            cmsg = libc::CMSG_NXTHDR(header, cmsg);
        }
    }
    None
}

/// One datagram [`ReceiveBatch::receive`] read.
struct Received {
    /// Its bytes: the front of a receive buffer, split off it.
    datagram: Bytes,
    from: SocketAddr,
    /// The kernel's receive timestamp, if it gave one.
    arrived: Option<std::time::SystemTime>,
}

/// Control-message room per read: one `SCM_TIMESTAMPNS` (a `timespec`) and one `UDP_GRO` (a
/// `c_int`), each with its header (32 + 24 bytes on 64-bit Linux).
const CONTROL_BYTES: usize = 64;

/// The `SCM_TIMESTAMPNS` timestamp among a received message's control messages.
fn receive_timestamp(header: &libc::msghdr) -> Option<std::time::SystemTime> {
    // SAFETY: the header's control buffer was filled by recvmmsg; the CMSG macros walk it
    // within `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let spec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                let since_epoch = std::time::Duration::new(spec.tv_sec as u64, spec.tv_nsec as u32);
                return std::time::UNIX_EPOCH.checked_add(since_epoch);
            }
            cmsg = libc::CMSG_NXTHDR(header, cmsg);
        }
    }
    None
}

/// What `recvmmsg` reads into, kept across calls. Each datagram read is split off its buffer
/// as [`Bytes`], so that the endpoint can slice its payload instead of copying it; the
/// endpoint copies each payload once, into its message (or into a copy of its own, for what
/// it holds), and drops the datagram, so by the next call every buffer is whole again and is
/// reused in place: the receive path allocates nothing.
struct ReceiveBatch {
    buffers: Vec<BytesMut>,
    /// Bytes each buffer offers the kernel.
    buffer_bytes: usize,
    controls: Vec<[u8; CONTROL_BYTES]>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
    /// The whole datagrams of the last call (a truncated one is dropped).
    received: Vec<Received>,
}

impl ReceiveBatch {
    fn new(buffer_bytes: usize) -> ReceiveBatch {
        let n = BATCH_DATAGRAMS_MAX;
        ReceiveBatch {
            buffers: (0..n)
                .map(|_| BytesMut::with_capacity(buffer_bytes))
                .collect(),
            buffer_bytes,
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                n
            ],
            controls: vec![[0u8; CONTROL_BYTES]; n],
            // SAFETY: zeroed sockaddr_storage and mmsghdr are valid initial values.
            addrs: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            headers: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            received: Vec::with_capacity(n),
        }
    }

    /// `recvmmsg` into the buffers: fills `received` with each whole datagram, its sender and
    /// arrival time, and returns how many datagrams the kernel handed over.
    fn receive(&mut self, fd: RawFd) -> std::io::Result<usize> {
        let n = self.buffers.len();
        // The kernel rewrites the name and control lengths: set them (and the pointers, which
        // cost nothing) afresh for every call.
        self.received.clear();
        for i in 0..n {
            let buffer = &mut self.buffers[i];
            buffer.clear();
            // In place once the datagrams split off it last time are dropped (they are,
            // unless the caller kept one), else a fresh buffer.
            buffer.reserve(self.buffer_bytes);
            self.iovs[i] = libc::iovec {
                iov_base: buffer.spare_capacity_mut().as_mut_ptr().cast(),
                iov_len: self.buffer_bytes,
            };
            let header = &mut self.headers[i].msg_hdr;
            header.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            header.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            header.msg_iov = &mut self.iovs[i];
            header.msg_iovlen = 1;
            header.msg_control = self.controls[i].as_mut_ptr() as *mut libc::c_void;
            header.msg_controllen = CONTROL_BYTES as _;
            header.msg_flags = 0;
        }
        // SAFETY: every pointer refers to memory owned by `self`, which outlives the call;
        // the buffers are not touched between taking the pointers and the call, so the
        // iovecs stay valid and each has `buffer_bytes` of spare room. Non-blocking socket.
        let got = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for i in 0..got as usize {
            let header = &self.headers[i];
            let truncated = header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            if let (false, Some(from)) = (truncated, socket_addr_from(&self.addrs[i])) {
                let len = header.msg_len as usize;
                assert!(len <= self.buffer_bytes);
                let buffer = &mut self.buffers[i];
                // SAFETY: the kernel wrote `len` bytes (not truncated) at the buffer's start,
                // within the spare room reserved above.
                unsafe { buffer.set_len(len) };
                let bytes = buffer.split().freeze();
                let arrived = receive_timestamp(&header.msg_hdr);
                // A coalesced read is a run of datagrams of one size (the last may be
                // shorter): each goes on as its own, a slice of the buffer.
                let segment = gro_segment_bytes(&header.msg_hdr).unwrap_or(len).max(1);
                let mut at = 0;
                while at < len {
                    let end = (at + segment).min(len);
                    self.received.push(Received {
                        datagram: bytes.slice(at..end),
                        from,
                        arrived,
                    });
                    at = end;
                }
            }
        }
        Ok(got as usize)
    }
}

/// A connection lost for `detail`.
fn disconnected(addr: SocketAddr, detail: &str) -> TransportError {
    TransportError::Disconnected {
        addr,
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(port: u16, len: usize) -> Transmit {
        let overhead = tessera_datagram::OVERHEAD_LEN;
        Transmit {
            destination: SocketAddr::from(([10, 0, 0, 1], port)),
            header: [0; tessera_datagram::HEADER_LEN],
            payload: Bytes::from(vec![0; len.saturating_sub(overhead)]),
            tag: [0; tessera_datagram::TAG_LEN],
        }
    }

    fn runs(batch: &[Transmit]) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut start = 0;
        while start < batch.len() {
            let count = gso_run(&batch[start..]);
            runs.push(count);
            start += count;
        }
        runs
    }

    #[test]
    fn gso_runs_are_one_peer_one_size_with_a_shorter_last() {
        let batch = [
            datagram(1, 1472),
            datagram(1, 1472),
            datagram(1, 1472),
            datagram(1, 300), // the end of a message: ends the run
            datagram(1, 1472),
            datagram(2, 1472), // another peer
            datagram(2, 1472),
            datagram(2, 1500), // larger than the run's size
            datagram(3, 60),
        ];
        assert_eq!(runs(&batch), vec![4, 1, 2, 1, 1]);
    }

    #[test]
    fn gso_runs_stay_within_the_kernel_limits() {
        let small: Vec<Transmit> = (0..200).map(|_| datagram(1, 100)).collect();
        assert_eq!(runs(&small), vec![64, 64, 64, 8]);
        let large: Vec<Transmit> = (0..100).map(|_| datagram(1, 8972)).collect();
        let counts = runs(&large);
        assert!(
            counts.iter().all(|&c| c * 8972 <= GSO_BYTES_MAX),
            "{counts:?}"
        );
        assert_eq!(counts.iter().sum::<usize>(), 100);
        assert_eq!(counts[0], GSO_BYTES_MAX / 8972);
    }

    /// A GSO send of ten 1,000-byte datagrams and a 300-byte last one over loopback arrives as
    /// eleven datagrams with their exact bytes, whether the receiving socket takes coalesced
    /// reads (`UDP_GRO`: one read, split by its segment size) or not (eleven reads).
    #[test]
    fn a_coalesced_read_is_split_into_the_datagrams_sent() {
        let bytes: Vec<u8> = (0..10_300u32).map(|i| (i * 7 % 251) as u8).collect();
        for gro in [true, false] {
            let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
            receiver.set_nonblocking(true).unwrap();
            if gro {
                enable_receive_gro(receiver.as_raw_fd());
            }
            let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
            let segment: libc::c_int = 1000;
            // SAFETY: a valid socket and a c_int option value that lives across the call.
            let set = unsafe {
                libc::setsockopt(
                    sender.as_raw_fd(),
                    libc::SOL_UDP,
                    UDP_SEGMENT,
                    &segment as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(set, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
            sender
                .send_to(&bytes, receiver.local_addr().unwrap())
                .unwrap();
            let mut batch = ReceiveBatch::new(DATAGRAM_BYTES_MAX);
            let mut datagrams = Vec::new();
            let (mut reads, started) = (0, Instant::now());
            while datagrams.len() < 11 && started.elapsed() < Duration::from_secs(5) {
                match batch.receive(receiver.as_raw_fd()) {
                    Ok(got) => reads += got,
                    Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock),
                }
                datagrams.extend(batch.received.drain(..).map(|r| r.datagram));
            }
            let expected: Vec<&[u8]> = bytes.chunks(1000).collect();
            assert_eq!(datagrams.len(), 11, "gro {gro}");
            for (got, want) in datagrams.iter().zip(&expected) {
                assert_eq!(&got[..], *want, "gro {gro}");
            }
            assert_eq!(reads, if gro { 1 } else { 11 }, "gro {gro}: reads");
        }
    }

    /// A batch that takes three peers in turn is grouped into one GSO run per peer, each
    /// peer's datagrams in the order the endpoint gave them.
    #[test]
    fn a_batch_taking_peers_in_turn_is_grouped_by_peer_in_order() {
        let mut batch: Vec<Transmit> = (0..12u8)
            .map(|i| {
                let mut transmit = datagram(1 + u16::from(i % 3), 1472);
                transmit.header[0] = i;
                transmit
            })
            .collect();
        assert_eq!(runs(&batch), vec![1; 12]);
        group_by_peer(&mut batch);
        assert_eq!(runs(&batch), vec![4, 4, 4]);
        let order: Vec<(u16, u8)> = (batch.iter())
            .map(|t| (t.destination.port(), t.header[0]))
            .collect();
        let expected: Vec<(u16, u8)> = (0..3u8)
            .flat_map(|peer| (0..4u8).map(move |k| (1 + u16::from(peer), peer + 3 * k)))
            .collect();
        assert_eq!(order, expected);
    }
}
