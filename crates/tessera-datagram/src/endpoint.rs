//! The endpoint: every session with every peer behind one local address, and the routing of
//! datagrams, timers and events between them and the driver.

use crate::admission::{Admission, Refusal};
use crate::packet::{self, decode, public_mac, Packet, PacketError, PacketKind, OVERHEAD_LEN};
use crate::radon::{RadonConfig, Reservation, ReservationError};
use crate::session::{PendingEvent, Room, Session, Verdict, WINDOW_INITIAL_PACKETS};
use crate::{
    Config, Event, LossReason, Message, Micros, SendError, SessionId, SessionInfo, Stats, Transmit,
};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use tessera_auth::{Key, PacketMac};

/// Bytes a session may hold queued and unacknowledged; a single message larger than this is
/// still accepted into an empty queue.
pub const SEND_QUEUE_BYTES_MAX: usize = 64 << 20;
/// Packets an answer must take for [`Endpoint::request`] to hold its request until the
/// receive budget grants the session: smaller answers (a write's acknowledgement, a
/// lookup) go at once, since waiting would only delay them behind large reads.
pub const HOLD_ANSWER_PACKETS_MIN: u64 = 4;
/// RESETs waiting to be sent; more are dropped (the peer's own timeouts still end its session).
pub const CONTROL_QUEUE_MAX: usize = 64;
/// RESETs an endpoint may send in a burst.
pub const RESET_BURST_MAX: u32 = 8;
/// After a burst, one RESET per this many microseconds.
pub const RESET_INTERVAL_US: Micros = 1_000;
/// Events waiting for the application beyond which peers may open no more sessions. Messages
/// are bounded by the receive windows; this bounds the `Opened` and `Lost` events of an
/// application that does not poll.
pub const EVENT_QUEUE_MAX: usize = 1 << 16;
/// Sessions closed or lost that the endpoint remembers, so that late packets of theirs are
/// answered with a RESET rather than opening them again.
pub const FORGOTTEN_SESSIONS_MAX: usize = 1024;

/// Why a session was forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forgotten {
    Closed,
    Lost,
}

/// The protocol state of one local address: sessions, timers, and queues of datagrams and
/// events for the driver. See the crate documentation for the order of calls.
#[derive(Debug)]
pub struct Endpoint {
    config: Config,
    rng: StdRng,
    sessions: BTreeMap<SessionId, Session>,
    /// Every session's earliest deadline, ordered.
    timers: BTreeSet<(Micros, SessionId)>,
    /// Sessions that may have a packet to send, in round-robin order.
    ready: VecDeque<SessionId>,
    /// RESETs waiting to be sent.
    control: VecDeque<Transmit>,
    events: VecDeque<PendingEvent>,
    forgotten: BTreeMap<SessionId, (SocketAddr, Forgotten)>,
    forgotten_order: VecDeque<SessionId>,
    reset_tokens: u32,
    reset_refilled_at: Micros,
    /// The latest `now` seen, for the calls that take none.
    now: Micros,
    /// Next ticket of the receive budget's first-come order.
    next_ticket: u64,
    /// Something changed what the receive budget can hand out (an arrival, a drained
    /// message, a session gone): grant at the next `poll_transmit`, once for everything read
    /// in between, not once per packet (a client reading from 64 servers spent a sixth of
    /// its time sorting claims per arriving packet).
    grants_due: bool,
    /// Reused across grants.
    claims: Vec<(SessionId, crate::session::Claim)>,
    /// Rate limits on the sessions peers open.
    admission: Admission,
    /// Sessions opened by peers that have not delivered a whole message yet, by when they
    /// were last heard (their DATA), oldest first; see [`crate::admission`].
    half_open: BTreeSet<(Micros, SessionId)>,
    /// When each half-open session was last heard: its key in `half_open`.
    half_open_heard: BTreeMap<SessionId, Micros>,
    /// Established sessions peers opened, by the time each is filed under (when it was last
    /// heard, as of its filing; its `heard_at` may be later, and it is filed again then
    /// rather than on every packet). See [`crate::AdmissionConfig::idle_timeout_us`].
    idle: BTreeSet<(Micros, SessionId)>,
    /// Keys admitted for sessions peers will open, oldest first ([`Endpoint::admit`]).
    admitted: BTreeMap<SessionId, PacketMac>,
    admitted_order: VecDeque<SessionId>,
    /// Bytes reserved by messages being reassembled or waiting for the application, in all
    /// and per source address ([`crate::MemoryConfig`]).
    messages_held: Held,
    /// Bytes of packets held past a gap, in all and per source address.
    out_of_order_held: Held,
    /// Bytes queued to send and not acknowledged, over every session.
    send_queued_bytes: usize,
    /// Sessions peers opened, per source address.
    accepted_by_source: HashMap<IpAddr, usize>,
    /// When the application's reserved stream started its periods
    /// ([`Endpoint::start_periods`]): sessions opened later count theirs from it too.
    periods_epoch: Option<Micros>,
    /// The queue in front of this endpoint, from every session's DATA
    /// ([`crate::radon::PortQueue`]).
    port_queue: crate::radon::PortQueue,
    stats: Stats,
}

/// What a session (or an event waiting for the application) holds of the endpoint's memory
/// budgets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Footprint {
    /// Of the message budget: a message being reassembled, or waiting for the application.
    messages: usize,
    queued: usize,
    out_of_order: usize,
}

impl Footprint {
    fn of(session: &Session) -> Footprint {
        Footprint {
            messages: session.reassembly_reserved(),
            queued: session.queued_bytes(),
            out_of_order: session.out_of_order_bytes(),
        }
    }
}

/// Bytes held against one budget, in all and per source address.
#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Held {
    /// What `source` may still take within `total_max` in all and `source_max` of its own.
    fn room(&self, source: IpAddr, total_max: usize, source_max: usize) -> usize {
        let of_source = self.by_source.get(&source).copied().unwrap_or(0);
        (total_max - self.total).min(source_max - of_source)
    }

    /// `source` went from holding `before` to `after` (of one session or event); asserts
    /// the bounds still hold.
    fn change(&mut self, source: IpAddr, before: usize, after: usize, maxima: (usize, usize)) {
        if before == after {
            return;
        }
        self.total = self.total + after - before;
        let of_source = self.by_source.entry(source).or_default();
        *of_source = *of_source + after - before;
        let of_source = *of_source;
        if of_source == 0 {
            self.by_source.remove(&source);
        }
        assert!(
            self.total <= maxima.0,
            "{} bytes held, at most {}",
            self.total,
            maxima.0
        );
        assert!(
            of_source <= maxima.1,
            "{source} holds {of_source} bytes, at most {}",
            maxima.1
        );
    }
}

/// Keys admitted and not yet used that an endpoint keeps; the oldest goes first.
pub const ADMITTED_KEYS_MAX: usize = 4096;

impl Endpoint {
    /// An endpoint with these settings; `seed` is the only source of randomness (session
    /// ids). Panics if the settings are invalid ([`Config::validate`]).
    pub fn new(config: Config, seed: u64) -> Endpoint {
        if let Err(error) = config.validate() {
            panic!("invalid datagram transport config: {error}");
        }
        Endpoint {
            config,
            rng: StdRng::seed_from_u64(seed),
            sessions: BTreeMap::new(),
            timers: BTreeSet::new(),
            ready: VecDeque::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            forgotten: BTreeMap::new(),
            forgotten_order: VecDeque::new(),
            reset_tokens: RESET_BURST_MAX,
            reset_refilled_at: 0,
            now: 0,
            next_ticket: 0,
            grants_due: false,
            claims: Vec::new(),
            admission: Admission::new(),
            half_open: BTreeSet::new(),
            half_open_heard: BTreeMap::new(),
            idle: BTreeSet::new(),
            admitted: BTreeMap::new(),
            admitted_order: VecDeque::new(),
            messages_held: Held::default(),
            out_of_order_held: Held::default(),
            send_queued_bytes: 0,
            accepted_by_source: HashMap::new(),
            periods_epoch: None,
            port_queue: crate::radon::PortQueue::default(),
            stats: Stats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens a session to `peer`. Nothing is sent until the first message; the peer learns
    /// of the session from it. The id comes from the seeded generator. Sessions opened here
    /// are bounded by the caller, not by `sessions_max`, which bounds those peers open.
    pub fn connect(&mut self, peer: SocketAddr, now: Micros) -> SessionId {
        let bytes = self.config.payload_bytes_max;
        self.connect_with(peer, bytes, now)
    }

    /// Like [`connect`](Self::connect), with datagrams of at most `payload_bytes_max` bytes on
    /// this session (what the path's MTU allows; see [`set_payload_bytes`](Self::set_payload_bytes)).
    pub fn connect_with(
        &mut self,
        peer: SocketAddr,
        payload_bytes_max: usize,
        now: Micros,
    ) -> SessionId {
        self.observe(now);
        let id = loop {
            let id = SessionId(self.rng.gen());
            if !self.sessions.contains_key(&id) && !self.forgotten.contains_key(&id) {
                break id;
            }
        };
        let mut session = Session::new(id, peer, &self.config, false);
        session.fragment_bytes_max = fragment_bytes_for(payload_bytes_max);
        // Until the peer shows its datagram size, assume the path carries the same both ways.
        session.peer_fragment_bytes = session.fragment_bytes_max;
        self.reserve_connected(&mut session, now);
        self.sessions.insert(id, session);
        id
    }

    /// Opens session `id` to `peer` keyed with `key`, both agreed with the peer by a
    /// handshake elsewhere (the peer [`admit`](Self::admit)s the same). `None` if an id of
    /// that value is in use here.
    pub fn connect_keyed(
        &mut self,
        peer: SocketAddr,
        id: SessionId,
        key: Key,
        payload_bytes_max: usize,
        now: Micros,
    ) -> Option<SessionId> {
        self.observe(now);
        if self.sessions.contains_key(&id) || self.forgotten.contains_key(&id) {
            return None;
        }
        let mut session = Session::new(id, peer, &self.config, false);
        session.mac = PacketMac::new(&key);
        session.fragment_bytes_max = fragment_bytes_for(payload_bytes_max);
        session.peer_fragment_bytes = session.fragment_bytes_max;
        self.reserve_connected(&mut session, now);
        self.sessions.insert(id, session);
        Some(id)
    }

    /// Gives a session this side opens [`Config::connect_reservation`], if there is one.
    fn reserve_connected(&self, session: &mut Session, now: Micros) {
        if let Some(reservation) = self.config.connect_reservation {
            let radon_config = self
                .config
                .radon
                .unwrap_or_else(RadonConfig::reservation_only);
            session.reserve(Some(reservation), radon_config, now);
            if let Some(epoch) = self.periods_epoch {
                session.start_periods(epoch, now);
            }
        }
    }

    /// Accept session `id` when a peer opens it, keyed with `key` (agreed by a handshake
    /// elsewhere). At most [`ADMITTED_KEYS_MAX`] keys wait; the oldest is dropped first.
    pub fn admit(&mut self, id: SessionId, key: Key) {
        if self.sessions.contains_key(&id)
            || self.admitted.insert(id, PacketMac::new(&key)).is_some()
        {
            return;
        }
        self.admitted_order.push_back(id);
        while self.admitted_order.len() > ADMITTED_KEYS_MAX {
            if let Some(old) = self.admitted_order.pop_front() {
                self.admitted.remove(&old);
            }
        }
    }

    /// Whether datagrams of session `id` have a key here (a live session or an admitted one).
    pub fn knows(&self, id: SessionId) -> bool {
        self.sessions.contains_key(&id) || self.admitted.contains_key(&id)
    }

    /// The MAC a datagram of session `id` and kind `kind` must be tagged with, if any: RESETs
    /// come from peers that forgot the session, so they carry the public key.
    fn mac_for(&self, id: SessionId, kind: PacketKind) -> Option<&PacketMac> {
        if kind == PacketKind::Reset {
            return Some(public_mac());
        }
        match self.sessions.get(&id) {
            Some(session) => Some(&session.mac),
            None => match self.admitted.get(&id) {
                Some(mac) => Some(mac),
                None if self.config.require_session_keys => None,
                None => Some(public_mac()),
            },
        }
    }

    /// Send datagrams of at most `payload_bytes_max` bytes on `session` from now on: each
    /// path has its own MTU (1500 on most LANs, 9000 with jumbo frames, 65536 on loopback),
    /// and fewer, larger datagrams cost less per byte. The receiver accepts any size up to
    /// the protocol's limit.
    pub fn set_payload_bytes(&mut self, session: SessionId, payload_bytes_max: usize) {
        if let Some(state) = self.sessions.get_mut(&session) {
            state.fragment_bytes_max = fragment_bytes_for(payload_bytes_max);
        }
    }

    /// Queues a message on a session, cut into as many packets as it needs.
    /// A [`Message`] of two parts (a head and a body) is sent without joining them: each
    /// fragment is a slice of one part, but for the first where they meet.
    pub fn send(
        &mut self,
        session: SessionId,
        message: impl Into<Message>,
        now: Micros,
    ) -> Result<(), SendError> {
        let message = message.into();
        self.observe(now);
        self.send_checks(session, message.len())?;
        self.enqueue(session, message, None, now);
        Ok(())
    }

    /// Queues a checked message, or holds it behind held requests or, for a request whose
    /// answer is the expectation `answer`, until the grant reaches into that answer (see
    /// [`request`](Self::request)).
    fn enqueue(&mut self, session: SessionId, message: Message, answer: Option<u64>, now: Micros) {
        let state = self
            .sessions
            .get_mut(&session)
            .expect("checked by send_checks");
        self.send_queued_bytes += message.len();
        if state.queue_or_hold(message, answer) && answer.is_some() {
            self.stats.requests_held += 1;
        }
        self.stats.messages_sent += 1;
        self.touch(session, now);
    }

    /// Why a message of `len` bytes cannot be queued on `session` now, if it cannot.
    fn send_checks(&mut self, session: SessionId, len: usize) -> Result<(), SendError> {
        let checked = self.send_fits(session, len);
        if let Err(SendError::QueueFull { .. }) = checked {
            self.stats.sends_refused_queue_full += 1;
        }
        checked
    }

    fn send_fits(&self, session: SessionId, len: usize) -> Result<(), SendError> {
        let Some(state) = self.sessions.get(&session) else {
            return Err(match self.forgotten.get(&session) {
                Some((_, Forgotten::Lost)) => SendError::Lost(session),
                _ => SendError::UnknownSession(session),
            });
        };
        if len > self.config.message_bytes_max {
            return Err(SendError::TooLarge {
                len,
                max: self.config.message_bytes_max,
            });
        }
        let queued_bytes = state.queued_bytes();
        let memory = &self.config.memory;
        let full = |max| SendError::QueueFull {
            session,
            queued_bytes,
            max,
        };
        if queued_bytes > 0 && queued_bytes + len > SEND_QUEUE_BYTES_MAX {
            return Err(full(SEND_QUEUE_BYTES_MAX));
        }
        // The endpoint's total is a bound on memory: no exception for an empty queue.
        if self.send_queued_bytes + len > memory.send_queue_bytes_max {
            return Err(full(memory.send_queue_bytes_max));
        }
        if state.queued_messages() >= memory.send_queue_messages_per_session_max {
            return Err(full(SEND_QUEUE_BYTES_MAX));
        }
        Ok(())
    }

    /// Sends a request and announces its answer of `answer_bytes` (`None`: size unknown):
    /// [`send`](Self::send), then [`expect`](Self::expect). Under a receive budget, a request
    /// whose answer takes at least [`HOLD_ANSWER_PACKETS_MIN`] packets waits here until the
    /// window granted its session reaches into that answer (all answers expected before it
    /// on the session are granted whole), and then goes out with the grant. A client
    /// that asks 64 servers at once for their stripe units would otherwise wake all 64 to
    /// take a request that most cannot answer yet: each acknowledges it, sleeps, and wakes
    /// again for its grant, and on two shared CPUs the crowd of wakeups delayed the
    /// acknowledgements past the client's retransmission timer (about 20 spurious request
    /// timeouts per read in `tessera lab incast` at N = 64). Held, a request reaches its
    /// server when that server may answer it, as grants pace the answers (Homa, pHost).
    /// The same holds for a client that reads ahead, with a second request on a session
    /// whose first answer is still coming: released with the first grant of the session, it
    /// had servers waiting for grants with a request in hand (7,882 window probes in one
    /// run at N = 64 with read-ahead 2).
    pub fn request(
        &mut self,
        session: SessionId,
        message: impl Into<Message>,
        answer_bytes: Option<usize>,
        now: Micros,
    ) -> Result<(), SendError> {
        let message = message.into();
        let hold = self.config.receive_budget_packets.is_some()
            && self.sessions.get(&session).is_some_and(|state| {
                answer_bytes
                    .is_some_and(|bytes| state.packets_from_peer(bytes) >= HOLD_ANSWER_PACKETS_MIN)
            });
        if !hold {
            self.send(session, message, now)?;
            // Announced with the request, so a grant rides on the request's packets.
            self.expect(session, answer_bytes, now);
            return Ok(());
        }
        // Validated and counted like any message, then held unless the grant reaches into
        // its answer already: `expect` grants at once if the budget has room.
        self.send_checks(session, message.len())?;
        let answer = self.next_ticket;
        self.expect(session, answer_bytes, now);
        self.enqueue(session, message, Some(answer), now);
        Ok(())
    }

    /// Announces that a message of `bytes` (`None`: size unknown) is expected from the peer
    /// of `session`, typically the answer to a request just sent on it. Under a receive
    /// budget ([`Config::receive_budget_packets`]) this is what earns the session window;
    /// without one it changes nothing. Unknown sessions are ignored.
    pub fn expect(&mut self, session: SessionId, bytes: Option<usize>, now: Micros) {
        self.observe(now);
        if self.config.receive_budget_packets.is_none() {
            return;
        }
        let ticket = self.next_ticket;
        let Some(state) = self.sessions.get_mut(&session) else {
            return;
        };
        self.next_ticket += 1;
        state.expect(bytes, ticket);
        // At once, not at the next poll: the request about to be sent carries the grant.
        self.grant(now);
    }

    /// Withdraws one expectation announced with [`expect`](Self::expect) (the application
    /// stopped waiting for that answer), so that it holds no budget.
    pub fn expect_cancelled(&mut self, session: SessionId, now: Micros) {
        self.observe(now);
        if let Some(state) = self.sessions.get_mut(&session) {
            state.expect_cancelled();
            self.grants_due = true;
            self.touch(session, now);
        }
    }

    /// Hands out the free part of the receive budget. See [`crate::grants`].
    fn grant(&mut self, now: Micros) {
        let Some(budget) = self.config.receive_budget_packets else {
            return;
        };
        let promised_total: u64 = self.sessions.values().map(|s| s.promised_packets()).sum();
        if promised_total >= budget as u64 {
            return;
        }
        let mut claims = std::mem::take(&mut self.claims);
        claims.clear();
        for session in self.sessions.values_mut() {
            session.age_best_effort_grants(now, &self.config);
        }
        for (id, session) in &self.sessions {
            if let Some(claim) = session.claim(&self.config, now) {
                claims.push((*id, claim));
            }
        }
        for (id, packets) in crate::grants::allocate(budget as u64, promised_total, &mut claims) {
            if let Some(session) = self.sessions.get_mut(&id) {
                session.grant(packets, &self.config, &mut self.stats, now);
            }
            self.touch(id, now);
        }
        self.claims = claims;
    }

    /// Handles one datagram from `from` that arrived just now. Anything that is not a valid
    /// packet for a session this endpoint knows (or may open) is dropped and counted in
    /// [`Stats`]; never panics.
    pub fn handle_datagram(&mut self, from: SocketAddr, datagram: &[u8], now: Micros) {
        self.handle_datagram_arrived(from, datagram, now, now);
    }

    /// Handles one datagram from `from` that arrived at `arrived` (the kernel's receive
    /// timestamp, earlier than `now` when the host was busy and read it late). Round-trip
    /// samples end at `arrived`, so they measure the network, not this host's scheduling.
    pub fn handle_datagram_arrived(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        arrived: Micros,
        now: Micros,
    ) {
        self.handle_decoded(from, datagram, decode(datagram), arrived, now);
    }

    /// [`handle_datagram_arrived`](Self::handle_datagram_arrived) of a datagram held as
    /// [`Bytes`] (the UDP driver's receive buffers): the payload of a DATA packet stays a
    /// slice of `datagram` until it is copied into its message, the one copy on the way
    /// from the socket to the application. What the session keeps longer (a packet past a
    /// gap, a message of one packet) it copies, so that no receive buffer is held.
    pub fn handle_datagram_bytes(
        &mut self,
        from: SocketAddr,
        datagram: Bytes,
        arrived: Micros,
        now: Micros,
    ) {
        let packet = packet::decode_bytes(&datagram);
        self.handle_decoded(from, &datagram, packet, arrived, now);
    }

    fn handle_decoded(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        packet: Result<Packet, PacketError>,
        arrived: Micros,
        now: Micros,
    ) {
        self.observe(now);
        let arrived = arrived.min(now);
        self.stats.datagrams_received += 1;
        let packet = match packet {
            Ok(packet) => packet,
            Err(error) => {
                self.count_refused(&error);
                return;
            }
        };
        let id = SessionId(packet.session);
        // A session without a key here (unknown, none admitted) cannot be verified; such a
        // packet never opens a session and at most earns a RESET (`on_unknown_session`).
        let authentic = self
            .mac_for(id, packet.kind)
            .is_none_or(|mac| packet::verify(datagram, mac));
        if !authentic {
            self.stats.dropped_unauthentic += 1;
            return;
        }
        match self.sessions.get(&id) {
            Some(session) if session.peer == from => {
                let data = packet.kind == PacketKind::Data;
                self.dispatch(id, packet, arrived, now);
                if data {
                    // An arrival frees budget (or ends a session, freeing its promise).
                    self.grants_due = true;
                }
            }
            Some(_) => {
                // The id is taken by a session with another peer (ids are random, so this is
                // a collision or a stray): refuse the newcomer.
                self.stats.dropped_unknown_session += 1;
                if packet.kind == PacketKind::Data {
                    self.queue_reset(from, id, now, true);
                }
            }
            None => self.on_unknown_session(from, id, packet, arrived, now),
        }
    }

    fn count_refused(&mut self, error: &PacketError) {
        let counter = match error {
            PacketError::Truncated { .. } => &mut self.stats.dropped_truncated,
            PacketError::Version(_) => &mut self.stats.dropped_version,
            PacketError::TrailingBytes { .. }
            | PacketError::Magic(_)
            | PacketError::Kind(_)
            | PacketError::Flags { .. }
            | PacketError::Payload { .. }
            | PacketError::MessageLength { .. } => &mut self.stats.dropped_malformed,
        };
        *counter += 1;
    }

    fn on_unknown_session(
        &mut self,
        from: SocketAddr,
        id: SessionId,
        packet: Packet,
        arrived: Micros,
        now: Micros,
    ) {
        let opens = packet.kind == PacketKind::Data && packet.seq == 0 && packet.first;
        let forgotten = self
            .forgotten
            .get(&id)
            .is_some_and(|(peer, _)| *peer == from);
        let keyed = !self.config.require_session_keys || self.admitted.contains_key(&id);
        if opens && !forgotten && keyed {
            if self.make_room(from, now) {
                let mut session = Session::new(id, from, &self.config, true);
                if let Some(mac) = self.admitted.remove(&id) {
                    self.admitted_order.retain(|admitted| *admitted != id);
                    session.mac = mac;
                }
                self.sessions.insert(id, session);
                *self.accepted_by_source.entry(from.ip()).or_default() += 1;
                self.half_open.insert((now, id));
                self.half_open_heard.insert(id, now);
                self.stats.sessions_opened += 1;
                self.dispatch(id, packet, arrived, now);
            }
            return;
        }
        if keyed {
            self.stats.dropped_unknown_session += 1;
        } else {
            self.stats.dropped_unauthentic += 1;
        }
        // Tell a peer that is waiting on this session that it is gone: one that sends data,
        // asks for a resend, or probes a window. A DATA packet within the window every
        // sender may assume ([`WINDOW_INITIAL_PACKETS`]) may be a new session whose first
        // packet was lost or overtaken: drop it quietly, and the sender's retransmission of
        // packet 0 opens the session. A packet past that window proves the peer heard from
        // this endpoint on this session before, so this endpoint forgot it. Never answer a
        // RESET or a bare ACK (ACKs after a close are normal; answering them would only add
        // traffic). DATA for a session this endpoint forgot is answered whatever its number,
        // and so is DATA of a session no key was admitted for (an old client of a restarted
        // server keys a new session at once, rather than timing out).
        let answer = match packet.kind {
            PacketKind::Data => forgotten || packet.seq >= WINDOW_INITIAL_PACKETS || !keyed,
            PacketKind::Restart => true,
            PacketKind::Ack => packet.probe,
            PacketKind::Reset => false,
        };
        if answer {
            self.queue_reset(from, id, now, true);
        }
    }

    /// Whether a session from `from` may open now, within the rate limits and the bounds on
    /// sessions and events, after evicting the half-open session silent longest if the table
    /// is full. Counts the refusal if not.
    fn make_room(&mut self, from: SocketAddr, now: Micros) -> bool {
        match self.admission.admit(from.ip(), now, &self.config.admission) {
            Ok(()) => {}
            Err(Refusal::SourceRate) => {
                self.stats.dropped_opens_source_rate += 1;
                return false;
            }
            Err(Refusal::TotalRate) => {
                self.stats.dropped_opens_total_rate += 1;
                return false;
            }
        }
        if self.events.len() >= EVENT_QUEUE_MAX {
            self.stats.dropped_sessions_full += 1;
            return false;
        }
        let of_source = self.accepted_by_source.get(&from.ip()).copied();
        if of_source.unwrap_or(0) >= self.config.sessions_per_source_max {
            // Its own half-open session silent longest makes room; one address never
            // evicts another's sessions.
            let sessions = &self.sessions;
            let oldest = self
                .half_open
                .iter()
                .find(|(_, id)| sessions[id].peer.ip() == from.ip());
            let Some(&(_, oldest)) = oldest else {
                self.stats.dropped_sessions_source_full += 1;
                return false;
            };
            self.evict_half_open(oldest);
        }
        let full = self.sessions.len() >= self.config.sessions_max
            || self.half_open.len() >= self.config.admission.half_open_sessions_max;
        if full {
            let Some(&(_, oldest)) = self.half_open.first() else {
                self.stats.dropped_sessions_full += 1;
                return false;
            };
            self.evict_half_open(oldest);
        }
        assert!(self.half_open.len() < self.config.admission.half_open_sessions_max);
        true
    }

    /// Closes the established sessions peers opened that nothing arrived on for
    /// [`crate::AdmissionConfig::idle_timeout_us`]: a RESET tells the peer (which keys a new session
    /// when it next calls; if the RESET is lost, the one that answers its next packet does,
    /// since the session is remembered as forgotten), and the application gets
    /// [`Event::Lost`] with [`LossReason::Idle`]. A session heard since it was filed is filed
    /// again under that time instead: one re-filing per idle period, not one per packet.
    fn expire_idle(&mut self, now: Micros) {
        let timeout_us = self.config.admission.idle_timeout_us;
        while let Some(&(filed, id)) = self.idle.first() {
            if filed.saturating_add(timeout_us) > now {
                break;
            }
            self.idle.remove(&(filed, id));
            let session = self.sessions.get_mut(&id).expect("idle sessions are known");
            if session.heard_at.saturating_add(timeout_us) > now {
                session.idle_filed = Some(session.heard_at);
                self.idle.insert((session.heard_at, id));
                continue;
            }
            session.idle_filed = None;
            let peer = session.peer;
            self.remove(id);
            self.queue_reset(peer, id, now, false);
            self.remember(id, peer, Forgotten::Lost);
            self.events.push_back(PendingEvent {
                event: Event::Lost {
                    session: id,
                    peer,
                    reason: LossReason::Idle,
                },
                session: id,
                packets: 0,
                bytes: 0,
            });
            self.stats.sessions_lost += 1;
            self.stats.idle_sessions_closed += 1;
            self.grants_due = true;
        }
    }

    /// Forgets a half-open session without a word to anyone: the application never heard
    /// of it, and an honest peer's retransmission of its first packet opens it again (one
    /// past the initial window is answered with a RESET, so the peer starts over).
    fn evict_half_open(&mut self, id: SessionId) {
        assert!(self.half_open_heard.contains_key(&id));
        self.remove(id);
        self.stats.half_open_evicted += 1;
        self.grants_due = true;
    }

    fn dispatch(&mut self, id: SessionId, packet: Packet, arrived: Micros, now: Micros) {
        let events_before = self.events.len();
        let data = packet.kind == PacketKind::Data;
        let session = self.sessions.get(&id).expect("dispatch to a known session");
        let (source, before) = (session.peer.ip(), Footprint::of(session));
        let room = self.room(source);
        let session = self.sessions.get_mut(&id).expect("just looked up");
        session.heard_at = now;
        let verdict = session.on_packet(
            packet,
            arrived,
            now,
            &self.config,
            room,
            &mut self.stats,
            &mut self.events,
        );
        if data {
            self.port_queue.on_estimate(session.queue_delay_us(), now);
        }
        let mut after = Footprint::of(session);
        // Messages delivered by this packet hold their bytes until the application takes them.
        after.messages += self
            .events
            .range(events_before..)
            .map(|pending| pending.bytes)
            .sum::<usize>();
        self.account(source, before, after);
        if let Some(heard) = self.half_open_heard.get(&id).copied() {
            let delivered = self
                .events
                .range(events_before..)
                .any(|pending| matches!(pending.event, Event::Message { .. }));
            if delivered {
                self.establish(id, events_before, now);
            } else if data && heard < now {
                self.half_open.remove(&(heard, id));
                self.half_open.insert((now, id));
                self.half_open_heard.insert(id, now);
            }
        }
        self.settle(id, verdict, now);
    }

    /// A half-open session delivered its first message: the application learns of it now,
    /// just before that message (at `events_at` in the queue).
    fn establish(&mut self, id: SessionId, events_at: usize, now: Micros) {
        let heard = self
            .half_open_heard
            .remove(&id)
            .expect("establish a half-open session");
        self.half_open.remove(&(heard, id));
        let session = self
            .sessions
            .get_mut(&id)
            .expect("establish a known session");
        session.idle_filed = Some(now);
        self.idle.insert((now, id));
        let peer = session.peer;
        self.events.insert(
            events_at,
            PendingEvent {
                event: Event::Opened { session: id, peer },
                session: id,
                packets: 0,
                bytes: 0,
            },
        );
    }

    fn settle(&mut self, id: SessionId, verdict: Verdict, now: Micros) {
        match verdict {
            Verdict::Keep => self.touch(id, now),
            Verdict::Reset => self.lose(id, LossReason::Reset),
            Verdict::TimedOut => self.lose(id, LossReason::TimedOut),
            Verdict::Violation => {
                self.stats.protocol_violations += 1;
                let peer = self.sessions[&id].peer;
                self.queue_reset(peer, id, now, false);
                self.lose(id, LossReason::Violation);
            }
        }
    }

    fn lose(&mut self, id: SessionId, reason: LossReason) {
        let half_open = self.half_open_heard.contains_key(&id);
        let Some(session) = self.remove(id) else {
            return;
        };
        self.stats.sessions_lost += 1;
        if half_open {
            // The application never heard of it: nothing to report.
            self.remember(id, session.peer, Forgotten::Lost);
            self.grants_due = true;
            return;
        }
        self.events.push_back(PendingEvent {
            event: Event::Lost {
                session: id,
                peer: session.peer,
                reason,
            },
            session: id,
            packets: 0,
            bytes: 0,
        });
        self.remember(id, session.peer, Forgotten::Lost);
        // Its promise is void: the budget it held goes to the others.
        self.grants_due = true;
    }

    /// What is left of the memory budgets for new messages and packets past a gap from
    /// `source`.
    fn room(&self, source: IpAddr) -> Room {
        let memory = &self.config.memory;
        Room {
            messages: self.messages_held.room(
                source,
                memory.reassembly_bytes_max,
                memory.reassembly_bytes_per_source_max,
            ),
            out_of_order: self.out_of_order_held.room(
                source,
                memory.out_of_order_bytes_max,
                memory.out_of_order_bytes_per_source_max,
            ),
        }
    }

    /// A session (or event) of `source` went from holding `before` to holding `after`.
    fn account(&mut self, source: IpAddr, before: Footprint, after: Footprint) {
        self.send_queued_bytes = self.send_queued_bytes + after.queued - before.queued;
        let memory = self.config.memory;
        let messages_max = (
            memory.reassembly_bytes_max,
            memory.reassembly_bytes_per_source_max,
        );
        self.messages_held
            .change(source, before.messages, after.messages, messages_max);
        let out_of_order_max = (
            memory.out_of_order_bytes_max,
            memory.out_of_order_bytes_per_source_max,
        );
        let (before, after) = (before.out_of_order, after.out_of_order);
        self.out_of_order_held
            .change(source, before, after, out_of_order_max);
    }

    /// Bytes reserved by messages being reassembled or waiting for the application, over
    /// every session.
    pub fn reassembly_bytes(&self) -> usize {
        self.messages_held.total
    }

    /// Bytes held by packets past a gap ([`crate::HELD_PACKET_OVERHEAD_BYTES`] each beyond
    /// their payload), over every session.
    pub fn out_of_order_bytes(&self) -> usize {
        self.out_of_order_held.total
    }

    /// The same two, for one source address.
    pub fn held_bytes_of(&self, source: IpAddr) -> (usize, usize) {
        let of = |held: &Held| held.by_source.get(&source).copied().unwrap_or(0);
        (of(&self.messages_held), of(&self.out_of_order_held))
    }

    /// Bytes queued to send and not yet acknowledged, over every session.
    pub fn send_queued_bytes(&self) -> usize {
        self.send_queued_bytes
    }

    fn remove(&mut self, id: SessionId) -> Option<Session> {
        let session = self.sessions.remove(&id)?;
        if session.accepted {
            let source = session.peer.ip();
            let of_source = self
                .accepted_by_source
                .get_mut(&source)
                .expect("an accepted session counts");
            *of_source -= 1;
            if *of_source == 0 {
                self.accepted_by_source.remove(&source);
            }
        }
        self.account(
            session.peer.ip(),
            Footprint::of(&session),
            Footprint::default(),
        );
        if let Some(deadline) = session.timer {
            self.timers.remove(&(deadline, id));
        }
        if let Some(heard) = self.half_open_heard.remove(&id) {
            self.half_open.remove(&(heard, id));
        }
        if let Some(filed) = session.idle_filed {
            self.idle.remove(&(filed, id));
        }
        Some(session)
    }

    fn remember(&mut self, id: SessionId, peer: SocketAddr, why: Forgotten) {
        if self.forgotten.insert(id, (peer, why)).is_none() {
            self.forgotten_order.push_back(id);
        }
        while self.forgotten_order.len() > FORGOTTEN_SESSIONS_MAX {
            if let Some(oldest) = self.forgotten_order.pop_front() {
                self.forgotten.remove(&oldest);
            }
        }
    }

    /// Queues a RESET within the control queue's bound and, for RESETs that answer
    /// strangers' packets (`rate_limited`), within the rate limit.
    fn queue_reset(&mut self, to: SocketAddr, id: SessionId, now: Micros, rate_limited: bool) {
        let refills = now.saturating_sub(self.reset_refilled_at) / RESET_INTERVAL_US;
        if refills > 0 {
            let tokens = (self.reset_tokens as u64 + refills).min(RESET_BURST_MAX as u64);
            self.reset_tokens = tokens as u32;
            self.reset_refilled_at = now;
        }
        let limited = rate_limited && self.reset_tokens == 0;
        if limited || self.control.len() >= CONTROL_QUEUE_MAX {
            self.stats.resets_suppressed += 1;
            return;
        }
        if rate_limited {
            self.reset_tokens -= 1;
        }
        let reset = Packet {
            kind: PacketKind::Reset,
            first: false,
            last: false,
            probe: false,
            session: id.0,
            seq: 0,
            ack: 0,
            window: 0,
            timestamp: now as u32,
            echo: 0,
            message_len: 0,
            ack_delay: 0,
            queue: 0,
            payload: Bytes::new(),
        };
        self.control
            .push_back(Transmit::of(to, reset, public_mac()));
        self.stats.resets_sent += 1;
    }

    /// Re-files a session's deadline and readiness after it changed.
    fn touch(&mut self, id: SessionId, now: Micros) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        let deadline = session.next_deadline(now, &self.config);
        // A paced grant due by now has no timer left to run it (`Session::grant_ready`): a
        // best-effort reader whose host read a datagram on waking, just past its grant's
        // time, was never granted again and its answer stalled for good.
        self.grants_due |= session.grant_ready(now, &self.config);
        if session.timer != deadline {
            if let Some(old) = session.timer {
                self.timers.remove(&(old, id));
            }
            if let Some(new) = deadline {
                self.timers.insert((new, id));
            }
            session.timer = deadline;
        }
        if !session.in_ready && session.wants_transmit(now, &self.config) {
            session.in_ready = true;
            self.ready.push_back(id);
        }
    }

    fn observe(&mut self, now: Micros) {
        self.now = self.now.max(now);
    }

    /// The next datagram to send, if any: RESETs first, then one packet per ready session in
    /// turn.
    pub fn poll_transmit(&mut self, now: Micros) -> Option<Transmit> {
        self.observe(now);
        if std::mem::take(&mut self.grants_due) {
            self.grant(now);
        }
        if let Some(transmit) = self.control.pop_front() {
            self.stats.datagrams_sent += 1;
            return Some(transmit);
        }
        for _ in 0..self.ready.len() {
            let id = self.ready.pop_front()?;
            let Some(session) = self.sessions.get_mut(&id) else {
                continue;
            };
            session.in_ready = false;
            session.port_queue_us = self.port_queue.queue_delay_us(now);
            let packet = session.build_transmit(now, &self.config, &mut self.stats);
            let transmit = packet.map(|packet| {
                let hash = match packet.kind {
                    PacketKind::Data => session.sent_payload_hash(),
                    _ => None,
                };
                Transmit::of_hashed(session.peer, packet, &session.mac, hash)
            });
            self.touch(id, now);
            if let Some(transmit) = transmit {
                self.stats.datagrams_sent += 1;
                return Some(transmit);
            }
        }
        None
    }

    /// The earliest time [`Endpoint::handle_timeout`] must be called, if any timer is set.
    pub fn poll_timeout(&self) -> Option<Micros> {
        let session = self.timers.first().map(|&(deadline, _)| deadline);
        let half_open = self
            .half_open
            .first()
            .map(|&(heard, _)| heard + self.config.admission.half_open_timeout_us);
        let idle = self
            .idle
            .first()
            .map(|&(filed, _)| filed.saturating_add(self.config.admission.idle_timeout_us));
        [session, half_open, idle].into_iter().flatten().min()
    }

    /// Runs every timer due at `now`: delayed ACKs, retransmissions, window probes, sessions
    /// lost to timeouts, half-open sessions evicted and established ones closed for their
    /// silence.
    pub fn handle_timeout(&mut self, now: Micros) {
        self.observe(now);
        let timeout_us = self.config.admission.half_open_timeout_us;
        while let Some(&(heard, id)) = self.half_open.first() {
            if heard + timeout_us > now {
                break;
            }
            self.evict_half_open(id);
        }
        self.expire_idle(now);
        let due: Vec<(Micros, SessionId)> = self
            .timers
            .range(..=(now, SessionId(u64::MAX)))
            .copied()
            .collect();
        for (deadline, id) in due {
            self.timers.remove(&(deadline, id));
            let Some(session) = self.sessions.get_mut(&id) else {
                continue;
            };
            session.timer = None;
            let before = Footprint::of(session);
            let verdict = session.on_timeout(now, &self.config, &mut self.stats);
            let (source, after) = (session.peer.ip(), Footprint::of(session));
            self.account(source, before, after);
            self.settle(id, verdict, now);
            // A reserved session's grants may be due (their pace, `grants.rs`).
            self.grants_due |= self.config.receive_budget_packets.is_some();
        }
    }

    /// The next event for the application, if any. Taking a message frees its packets from
    /// the session's receive window.
    pub fn poll_event(&mut self) -> Option<Event> {
        let pending = self.events.pop_front()?;
        self.release_event(&pending);
        if pending.packets > 0 {
            if let Some(session) = self.sessions.get_mut(&pending.session) {
                session.on_drained(pending.packets, &self.config);
                let now = self.now;
                self.touch(pending.session, now);
                // Drained buffer may let a session take more of the budget.
                if self.config.receive_budget_packets.is_some() {
                    self.grants_due = true;
                }
            }
        }
        Some(pending.event)
    }

    /// The application took (or no longer gets) an event: its message's bytes are free.
    fn release_event(&mut self, pending: &PendingEvent) {
        if let Event::Message { peer, .. } = &pending.event {
            let held = Footprint {
                messages: pending.bytes,
                ..Footprint::default()
            };
            self.account(peer.ip(), held, Footprint::default());
        }
    }

    /// Forgets a session: nothing more is sent or retransmitted on it, queued messages and
    /// its events not yet polled are dropped, and the peer gets one RESET so that it forgets
    /// the session too (it reports [`Event::Lost`]). No event is reported here.
    pub fn close(&mut self, session: SessionId) {
        if let Some(state) = self.remove(session) {
            let (dropped, kept) = std::mem::take(&mut self.events)
                .into_iter()
                .partition(|pending| pending.session == session);
            self.events = kept;
            for pending in dropped.iter() {
                self.release_event(pending);
            }
            let now = self.now;
            self.queue_reset(state.peer, session, now, false);
            self.remember(session, state.peer, Forgotten::Closed);
            // Its promise is void: the budget it held goes to the others.
            self.grants_due = true;
        }
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Reserves `reservation` for what this side sends on `session` from `now` on (Radon's
    /// percent-budget pacing; see [`crate::radon`]), or with `None` returns it to best
    /// effort.
    pub fn reserve(
        &mut self,
        session: SessionId,
        reservation: Option<Reservation>,
        now: Micros,
    ) -> Result<(), ReservationError> {
        self.observe(now);
        if let Some(reservation) = &reservation {
            reservation.validate()?;
        }
        let radon_config = self
            .config
            .radon
            .unwrap_or_else(RadonConfig::reservation_only);
        let state = self
            .sessions
            .get_mut(&session)
            .ok_or(ReservationError::UnknownSession(session))?;
        state.reserve(reservation, radon_config, now);
        self.touch(session, now);
        Ok(())
    }

    /// The application's reserved stream starts its periods at `epoch` (µs, at most `now`;
    /// its deadlines are their ends): every reserved session paces its budget over those
    /// periods, not its own, and so do sessions opened later with
    /// [`Config::connect_reservation`]. See [`crate::radon::Pacer::start_periods`].
    pub fn start_periods(&mut self, epoch: Micros, now: Micros) {
        self.observe(now);
        let epoch = epoch.min(now);
        self.periods_epoch = Some(epoch);
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            if let Some(session) = self.sessions.get_mut(&id) {
                session.start_periods(epoch, now);
            }
            self.touch(id, now);
        }
    }

    /// What a caller needs to hash a message's fragments for `session` before queuing it
    /// ([`Message::hash_fragments`]): the session's MAC and its fragment size.
    pub fn sender_of(&self, session: SessionId) -> Option<(tessera_auth::PacketMac, usize)> {
        let state = self.sessions.get(&session)?;
        Some((state.mac.clone(), state.fragment_bytes_max))
    }

    /// A snapshot of a session's flow-control state.
    pub fn session_info(&self, session: SessionId) -> Option<SessionInfo> {
        self.sessions
            .get(&session)
            .map(|state| state.info(&self.config))
    }

    /// The sessions this endpoint has, in id order.
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.sessions.keys().copied()
    }

    /// How many sessions this endpoint has.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }
}

/// Payload bytes per packet for datagrams of `payload_bytes_max`, within the protocol's bounds.
fn fragment_bytes_for(payload_bytes_max: usize) -> usize {
    payload_bytes_max.clamp(OVERHEAD_LEN + 1, crate::packet::DATAGRAM_LEN_MAX) - OVERHEAD_LEN
}
