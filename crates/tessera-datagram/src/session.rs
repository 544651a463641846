//! One session: a go-back-N sender and a go-back-N receiver sharing one peer, one RTT
//! estimate and one stream of piggybacked acknowledgements.

use crate::congestion::{self, CongestionControl};
use crate::grants::{GrantPace, GrantPeriod, GrantRate, SHARED_PORT_QUEUE_DIVISOR};
use crate::packet::{widen, Packet, PacketKind};
use crate::radon::{self, Pacer, QueueEstimator, Reservation};
use crate::rtt::RttEstimator;
use crate::{Config, Event, Message, Micros, SessionId, SessionInfo, Stats};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

/// The receive window every sender may assume before it has heard one, and that every
/// receiver therefore promises from the start (`Config::receive_window_packets` must be at
/// least this).
pub const WINDOW_INITIAL_PACKETS: u32 = 2;

/// The fewest consecutive timeouts (retransmissions or window probes, all unanswered) before
/// a session may be given up, however long its peer was silent: one long wait is not
/// evidence that the peer is gone if nothing was sent again during it.
pub const LOST_AFTER_TIMEOUTS_MIN: u32 = 3;

/// Retransmission timeouts in a row after which a paced sender goes back even while it keeps
/// sending (see `Session::may_wait_for_acks`): with the timer doubling at each, about seven
/// timers' worth of waiting for late ACKs.
pub const TIMEOUTS_WITHOUT_RESEND_MAX: u32 = 3;

/// How late a host may handle a timer before the rest counts as its own stall rather than
/// the peer's silence (see `Session::peer_silent_too_long`): a scheduler's usual lateness
/// stays counted, so a peer that is gone is still found within about `peer_lost_after_us`.
const HOST_LATE_SLACK_US: Micros = 2_000;

/// What the endpoint must do with a session after it handled an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep it.
    Keep,
    /// The peer sent a RESET: forget the session and report it lost.
    Reset,
    /// The peer stopped answering: forget the session and report it lost.
    TimedOut,
    /// The peer broke the protocol (a fragment out of place, an oversized message): reset it.
    Violation,
}

/// An event waiting for the application, with the receive-window packets it holds.
#[derive(Debug)]
pub(crate) struct PendingEvent {
    pub(crate) event: Event,
    pub(crate) session: SessionId,
    pub(crate) packets: u32,
    /// Bytes of the message budget it holds until the application takes it (its message's
    /// length; 0 for other events).
    pub(crate) bytes: usize,
}

/// A packet of the send queue: a fragment of a queued message.
#[derive(Debug)]
struct Outgoing {
    payload: Bytes,
    /// The payload's part of its tag, if the sender hashed it ([`Message::hash_fragments`]).
    payload_hash: Option<tessera_auth::PayloadHash>,
    first: bool,
    last: bool,
    message_len: u32,
    transmissions: u32,
}

/// A message being put back together from its fragments.
#[derive(Debug)]
struct Reassembly {
    message_len: u32,
    buffer: Vec<u8>,
    packets: u32,
    /// When its last fragment was taken: a reassembly still short of its end
    /// [`crate::MemoryConfig::reassembly_stall_us`] later is given up with its session.
    progress_at: Micros,
}

/// A message the application expects from the peer (an answer to its request), for the
/// receive budget.
#[derive(Debug, Clone, Copy)]
struct Expectation {
    /// Its place in the endpoint's first-come order of expectations.
    ticket: u64,
    /// Packets it will take.
    packets: u64,
    /// Whether the application said its size (`packets` is then what it takes).
    sized: bool,
    /// The size the application said, to count `packets` again if the peer's datagrams
    /// turn out to be of another size than assumed.
    bytes: Option<usize>,
}

/// Packets assumed for an expected message whose size the application did not say: one at a
/// time, since budget granted beyond a message stays promised to its session.
pub(crate) const UNKNOWN_MESSAGE_PACKETS: u64 = 1;

/// Packets that must arrive past a gap before it is taken for a loss: fewer may just have
/// been overtaken on the way.
pub const REORDER_PACKETS: usize = 3;

/// RESTARTs sent for one gap: after these, the sender's own timer is what recovers it (and
/// what notices a peer that is gone).
const RESTART_RESENDS_MAX: u32 = 10;

/// What a session under a receive budget asks of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    /// First come, first granted: the ticket of its oldest expected message not granted
    /// whole.
    pub(crate) ticket: u64,
    /// Packets granted and not yet arrived.
    pub(crate) promised: u64,
    /// Packets more that message could use now (expected and not yet granted, within the
    /// session's buffer).
    pub(crate) wanted: u64,
    /// The session has a reservation: what it wants is bounded by its grants' pace, and it
    /// is granted before best-effort sessions, from the whole budget.
    pub(crate) reserved: bool,
}

/// The receiver's record of the gap it reported.
#[derive(Debug)]
struct RestartState {
    /// The sequence number the RESTART asks for (the receiver's next expected).
    point: u64,
    /// When the RESTART for this point was last sent.
    sent_at: Option<Micros>,
    /// How many times it was re-sent because the gap persisted.
    resends: u32,
    /// A RESTART is waiting to go out.
    owed: bool,
}

/// A message held back in [`Session::held_requests`].
#[derive(Debug)]
struct HeldMessage {
    message: Message,
    /// The expectation of the request's answer; `None` for a message that only keeps its
    /// place behind a held request.
    answer: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct Session {
    /// The MAC its datagrams are tagged with both ways, keyed once (with
    /// [`crate::packet::PUBLIC_KEY`] for a session set up without a handshake).
    pub(crate) mac: tessera_auth::PacketMac,
    pub(crate) id: SessionId,
    pub(crate) peer: SocketAddr,
    /// The peer opened it (it counts toward `sessions_max` and its address's share).
    pub(crate) accepted: bool,
    /// When a packet of the peer last arrived on it (for the idle expiry of established
    /// sessions peers opened, [`crate::AdmissionConfig::idle_timeout_us`]).
    pub(crate) heard_at: crate::Micros,
    /// The time it is filed under in the endpoint's idle queue, if it is there.
    pub(crate) idle_filed: Option<crate::Micros>,
    /// Payload bytes per packet this side sends (the path's datagram size less the header).
    pub(crate) fragment_bytes_max: usize,

    // Sender. Sequence numbers are 64-bit here and truncated on the wire. The send queue
    // holds every packet from `send_base` (oldest unacknowledged) to the last one queued;
    // `send_next` is the next to transmit, and goes back to a restart point or to
    // `send_base` (go-back-N); `send_high` is one past the highest ever transmitted.
    outgoing: VecDeque<Outgoing>,
    send_base: u64,
    send_next: u64,
    send_high: u64,
    queued_bytes: usize,
    /// Messages in `queued_bytes`.
    queued_messages: usize,
    /// Messages whose every packet the peer acknowledged, ever: with `queued_messages`, the
    /// number of a message queued now, which the peer has whole once this reaches it.
    messages_acknowledged: u64,
    /// Bytes of the message budget the packet being handled may still reserve (set by
    /// `on_packet`, spent by each message it admits).
    reassembly_room: usize,
    /// Bytes of the out-of-order budget the packet being handled may still take (set by
    /// `on_packet`).
    out_of_order_room: usize,
    /// Requests waiting until the grant of the receive budget reaches into their answers,
    /// oldest first, with any message sent after them (see [`crate::Endpoint::request`]);
    /// their bytes count in `queued_bytes`.
    held_requests: VecDeque<HeldMessage>,
    /// One past the highest sequence number the peer said it can accept (ack + window).
    /// Only grows: receivers never take back window they advertised.
    peer_window_edge: u64,
    congestion: Box<dyn CongestionControl>,
    rtt: RttEstimator,
    /// Retransmission timer while packets are in flight; window-probe timer while the peer's
    /// window is closed and nothing is in flight.
    rto_deadline: Option<Micros>,
    /// When the retransmission timer was armed (its expiry minus its length).
    rto_armed_at: Micros,
    /// What the armed timer waits past the RTO for the ACK holds the peer reports (paced,
    /// granted and tail packets): counted apart from the RTO in the stats.
    rto_hold_us: Micros,
    /// `send_high` when the retransmission timer was armed: a paced sender that sent new
    /// packets since need not go back when it expires (see `Session::may_wait_for_acks`).
    send_high_at_arm: u64,
    /// Consecutive timeouts without progress.
    backoffs: u32,
    /// When the timer whose expiry began those timeouts was armed: the peer has been silent
    /// since (see [`Config::peer_lost_after_us`]).
    stalled_since: Option<Micros>,
    /// See [`Config::retransmit_timer_max_us`].
    retransmit_timer_max_us: Micros,
    /// State of the generator that spreads retransmission timeouts (xorshift).
    jitter: u64,
    /// Consecutive window probes (spaces them out exponentially).
    probes: u32,
    /// See [`Config::probe_interval_min_us`].
    probe_interval_min_us: Micros,
    probe_owed: bool,
    /// The last restart point acted on and when: a repeated RESTART for it is ignored until
    /// the retransmission had time to arrive.
    restart_honoured: Option<(u64, Micros)>,
    /// Since the first of the timeouts not yet followed by an acknowledgement: when its
    /// retransmission went out (wire timestamp), and how far the sender had sent before going
    /// back.
    timed_out: Option<TimedOut>,
    window_blocked: bool,
    /// Radon's pacing of DATA packets, if the endpoint or a reservation asks for it.
    pacer: Option<Pacer>,
    /// The queueing delay the peer last reported on the path toward it, µs.
    peer_queue_delay_us: u64,
    /// The longest the peer holds an ACK (its `ack_delay_us`, assumed ours).
    ack_delay_us: Micros,

    // Receiver.
    recv_next: u64,
    /// Radon's estimate of the queue on the path from the peer, from its DATA packets.
    queue_estimate: QueueEstimator,
    /// The queue in front of this endpoint as all its sessions measure it
    /// ([`radon::PortQueue`]), set by the endpoint before each packet is built: reported to
    /// the peer when larger than this session's own estimate.
    pub(crate) port_queue_us: u64,
    reassembly: Option<Reassembly>,
    /// DATA packets that arrived past a gap, by sequence number, until it fills.
    out_of_order: BTreeMap<u64, Packet>,
    /// What they cost of the out-of-order budget ([`held_packet_bytes`]).
    out_of_order_bytes: usize,
    /// Since when they have waited without the stream moving on: past
    /// [`crate::MemoryConfig::out_of_order_hold_us`] they are dropped.
    out_of_order_since: Option<Micros>,
    /// Packets of complete messages waiting in the endpoint's event queue.
    pub(crate) undrained_packets: u32,
    /// One past the highest sequence number this side ever advertised (or promised).
    advertised_edge: u64,
    /// The pace of the grants of a reserved session, or of a best-effort one under Radon
    /// (see [`crate::grants`]).
    grant_pace: GrantPace,
    /// Under Radon with a receive budget, the rate a best-effort session's grants go at,
    /// moved on this session's own estimate of the queue in front of this host.
    best_effort_grants: Option<radon::BestEffortRate>,
    /// When a DATA packet last measured the queue for them, µs.
    queue_measured_at: Micros,
    /// Timestamp of the packet that last advanced `recv_next`.
    echo: u32,
    /// When that packet arrived, if any did: the ACK delay is counted from there.
    echo_arrived_at: Option<Micros>,
    ack_pending_packets: u32,
    ack_deadline: Option<Micros>,
    ack_now: bool,
    restart: Option<RestartState>,
    /// Messages the application expects from the peer, oldest first (receive budget).
    expected: VecDeque<Expectation>,
    /// Packets of the oldest expected message received so far.
    expected_received: u64,
    /// Largest fragment the peer sent, to turn expected bytes into packets.
    pub(crate) peer_fragment_bytes: usize,

    // The endpoint's bookkeeping.
    pub(crate) timer: Option<Micros>,
    pub(crate) in_ready: bool,
}

/// What is left of the endpoint's memory budgets for one source address, for the packet
/// being handled ([`crate::MemoryConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    /// Bytes of messages (being reassembled or waiting for the application).
    pub(crate) messages: usize,
    /// Bytes of packets held past a gap.
    pub(crate) out_of_order: usize,
}

/// Appends `bytes` to `buffer`, growing it as `Vec` does but never past `capacity_max` (the
/// message's length, checked to hold it): doubling would take up to twice what the message
/// reserved of the budget.
fn append_within(buffer: &mut Vec<u8>, bytes: &[u8], capacity_max: usize) {
    let needed = buffer.len() + bytes.len();
    assert!(needed <= capacity_max);
    if needed > buffer.capacity() {
        let target = (buffer.capacity() * 2).max(needed).min(capacity_max);
        buffer.reserve_exact(target - buffer.len());
    }
    buffer.extend_from_slice(bytes);
}

/// What a packet held past a gap costs of the out-of-order budget.
fn held_packet_bytes(packet: &Packet) -> usize {
    packet.payload.len() + crate::HELD_PACKET_OVERHEAD_BYTES
}

/// A peer that advertises a window under this many packets is taken to grant it from a
/// receive budget ([`crate::grants`]): its ACKs, like a paced sender's, come a few packets
/// at a time, at its host's pace, and the retransmission timer waits for its holds.
/// (Receivers without a budget advertise [`Config::receive_window_packets`], 256 by default.)
const GRANTED_WINDOW_PACKETS_MAX: u64 = 64;

/// Packets a message of `bytes` takes in fragments of `fragment_bytes` (one at least).
fn packets_of(bytes: usize, fragment_bytes: usize) -> u64 {
    bytes.div_ceil(fragment_bytes).max(1) as u64
}

/// Bytes a DATA packet of `payload_bytes` takes on the wire: our header and tag, and IPv4 and
/// UDP's.
fn wire_bytes(payload_bytes: u64) -> u64 {
    payload_bytes + crate::OVERHEAD_LEN as u64 + crate::sim::DATAGRAM_OVERHEAD_BYTES as u64
}

fn timestamp(now: Micros) -> u32 {
    // The low 32 bits: RTTs are computed with wrapping subtraction.
    now as u32
}

/// What an acknowledgement tells about the round trip: the echoed timestamp, how long the
/// peer held the packet before acknowledging it (if the packet could say), and when the
/// acknowledgement arrived here.
#[derive(Clone, Copy, Debug)]
struct Echo {
    timestamp: u32,
    ack_delay: Option<u32>,
    arrived: Micros,
}

/// See [`Session::timed_out`].
#[derive(Clone, Copy, Debug)]
struct TimedOut {
    retransmitted_at: u32,
    sent_up_to: u64,
}

impl Session {
    /// A session. The side that connects promises the peer only what its first packet will
    /// advertise (`advertised_edge` 0), and the side that accepts learns the connector's
    /// window from that first packet (`peer_window_edge` 0): the connecting side, a client,
    /// decides what may come back to it. The accepting side promises
    /// [`WINDOW_INITIAL_PACKETS`], which the connector assumes before it hears a window.
    pub(crate) fn new(id: SessionId, peer: SocketAddr, config: &Config, accepted: bool) -> Session {
        let (peer_window_edge, advertised_edge) = if accepted {
            (0, WINDOW_INITIAL_PACKETS as u64)
        } else {
            (WINDOW_INITIAL_PACKETS as u64, 0)
        };
        Session {
            mac: crate::packet::public_mac().clone(),
            id,
            peer,
            accepted,
            heard_at: 0,
            idle_filed: None,
            fragment_bytes_max: config.fragment_bytes_max(),
            outgoing: VecDeque::new(),
            send_base: 0,
            send_next: 0,
            send_high: 0,
            queued_bytes: 0,
            queued_messages: 0,
            messages_acknowledged: 0,
            reassembly_room: 0,
            out_of_order_room: 0,
            held_requests: VecDeque::new(),
            peer_window_edge,
            congestion: congestion::controller(config.congestion, config.window_packets_max),
            rtt: RttEstimator::new(config.rto_initial_us, config.rto_min_us, config.rto_max_us),
            rto_deadline: None,
            rto_armed_at: 0,
            rto_hold_us: 0,
            send_high_at_arm: 0,
            backoffs: 0,
            stalled_since: None,
            retransmit_timer_max_us: config.retransmit_timer_max_us,
            // Any odd, id-derived state: deterministic per session, different across them.
            jitter: id.0 | 1,
            probes: 0,
            probe_interval_min_us: config.probe_interval_min_us,
            probe_owed: false,
            restart_honoured: None,
            timed_out: None,
            window_blocked: false,
            pacer: config.radon.map(Pacer::new),
            peer_queue_delay_us: 0,
            ack_delay_us: config.ack_delay_us,
            recv_next: 0,
            queue_estimate: QueueEstimator::default(),
            port_queue_us: 0,
            reassembly: None,
            out_of_order: BTreeMap::new(),
            out_of_order_bytes: 0,
            out_of_order_since: None,
            undrained_packets: 0,
            advertised_edge,
            grant_pace: GrantPace::default(),
            best_effort_grants: config
                .radon
                .filter(|radon| radon.pace_best_effort && config.receive_budget_packets.is_some())
                .map(|radon| radon::BestEffortRate::for_grants(&radon)),
            queue_measured_at: 0,
            echo: 0,
            echo_arrived_at: None,
            ack_pending_packets: 0,
            ack_deadline: None,
            ack_now: false,
            restart: None,
            expected: VecDeque::new(),
            expected_received: 0,
            peer_fragment_bytes: config.fragment_bytes_max(),
            timer: None,
            in_ready: false,
        }
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Messages queued (held requests included) and not wholly acknowledged.
    pub(crate) fn queued_messages(&self) -> usize {
        self.queued_messages
    }

    /// Bytes the message being reassembled reserves of the endpoint's reassembly budget: its
    /// whole announced length, from its first fragment on.
    pub(crate) fn reassembly_reserved(&self) -> usize {
        self.reassembly
            .as_ref()
            .map_or(0, |reassembly| reassembly.message_len as usize)
    }

    /// Bytes of the out-of-order budget held by packets past a gap.
    pub(crate) fn out_of_order_bytes(&self) -> usize {
        self.out_of_order_bytes
    }

    fn send_end(&self) -> u64 {
        self.send_base + self.outgoing.len() as u64
    }

    fn in_flight(&self) -> u64 {
        self.send_next - self.send_base
    }

    fn congestion_window(&self, config: &Config) -> u32 {
        let paced = self.pacer.as_ref().and_then(Pacer::window_cap);
        self.congestion
            .window()
            .min(config.window_packets_max)
            .min(paced.unwrap_or(u32::MAX))
            .max(1)
    }

    fn peer_receive_window(&self) -> u64 {
        self.peer_window_edge.saturating_sub(self.send_base)
    }

    /// One past the highest sequence number the sender may transmit now: the smaller of the
    /// congestion window and the peer's receive window, both counted from `send_base`.
    fn send_limit(&self, config: &Config) -> u64 {
        (self.send_base + self.congestion_window(config) as u64).min(self.peer_window_edge)
    }

    /// Whether a DATA packet waits and the windows let it go (pacing aside).
    fn data_waiting(&self, config: &Config) -> bool {
        self.send_next < self.send_end() && self.send_next < self.send_limit(config)
    }

    /// When the pacer lets the waiting DATA packet go, if later than `now`.
    fn paced_until(&self, now: Micros) -> Option<Micros> {
        self.pacer.as_ref().and_then(|pacer| pacer.send_at(now))
    }

    fn can_send_data(&self, now: Micros, config: &Config) -> bool {
        self.data_waiting(config) && self.paced_until(now).is_none()
    }

    /// Reserves a rate for what this side sends (or returns to best effort), paced by
    /// `radon_config` if the endpoint had no Radon of its own.
    pub(crate) fn reserve(
        &mut self,
        reservation: Option<Reservation>,
        radon_config: radon::RadonConfig,
        now: Micros,
    ) {
        self.pacer
            .get_or_insert_with(|| Pacer::new(radon_config))
            .reserve(reservation, now);
    }

    /// The application's reserved stream counts its periods from `epoch`: the pacer's
    /// follow ([`Pacer::start_periods`]).
    pub(crate) fn start_periods(&mut self, epoch: Micros, now: Micros) {
        if let Some(pacer) = self.pacer.as_mut() {
            pacer.start_periods(epoch, now);
        }
    }

    /// Queues a message, cut into fragments of at most `fragment_bytes_max`.
    /// The fragments are slices of the message's parts ([`Message::fragment_bounds`]).
    pub(crate) fn queue_message(&mut self, message: Message, fragment_bytes_max: usize) {
        let message_len = u32::try_from(message.len()).expect("message length checked by send");
        self.queued_bytes += message.len();
        self.queued_messages += 1;
        let bounds = message.fragment_bounds(fragment_bytes_max);
        for (index, piece) in bounds.windows(2).enumerate() {
            self.outgoing.push_back(Outgoing {
                payload: message.range(piece[0]..piece[1]),
                payload_hash: message.fragment_hash(index, fragment_bytes_max),
                first: index == 0,
                last: index + 2 == bounds.len(),
                message_len,
                transmissions: 0,
            });
        }
    }

    /// The receive window this side advertises: `receive_window_packets` minus the packets it
    /// holds for the application (fragments of complete messages not yet taken by
    /// `poll_event`, plus those of the message in reassembly unless everything before it was
    /// taken, since a message larger than the window could otherwise never complete), but
    /// never less than what it already promised.
    /// Under a receive budget the window is exactly what was granted and not yet used.
    pub(crate) fn receive_window(&self, config: &Config) -> u32 {
        let computed = if config.receive_budget_packets.is_some() {
            0
        } else {
            config
                .receive_window_packets
                .saturating_sub(self.held_packets())
        };
        assert!(self.advertised_edge >= self.recv_next);
        let promised = u32::try_from(self.advertised_edge - self.recv_next).unwrap_or(u32::MAX);
        computed.max(promised)
    }

    /// Packets of the receive buffer the application holds: see [`Session::receive_window`].
    fn held_packets(&self) -> u32 {
        let reassembly_packets = self.reassembly.as_ref().map_or(0, |r| r.packets);
        if self.undrained_packets > 0 {
            self.undrained_packets.saturating_add(reassembly_packets)
        } else {
            0
        }
    }

    /// The application expects a message of `bytes` (or of a size it does not know) from
    /// the peer; `ticket` is its place in the endpoint's first-come order.
    pub(crate) fn expect(&mut self, bytes: Option<usize>, ticket: u64) {
        let packets = match bytes {
            Some(bytes) => self.packets_from_peer(bytes),
            None => UNKNOWN_MESSAGE_PACKETS,
        };
        self.expected.push_back(Expectation {
            ticket,
            packets,
            sized: bytes.is_some(),
            bytes,
        });
    }

    /// A message of `packets` packets arrived whole: forget the expectation it most likely
    /// answers. Answers may come in any order (a small one the server answers at once
    /// overtakes reads waiting for its disk), so not simply the oldest: of the requests
    /// sent, the one nearest its size if within an eighth (the oldest of equals), else the
    /// oldest of a size not said, else the oldest. Taken for the oldest, a small answer
    /// settled a large read's expectation; the session then expected too little, and the
    /// last read's answer was granted a packet per round trip (seconds for a few MB on a
    /// busy host, until the client's request timeout sent the read again: `lab radon
    /// --mirror`, whose readers ask their server for its counters every 10 ms as they read).
    fn settle_expectation(&mut self, packets: u32) -> Option<Expectation> {
        let packets = u64::from(packets);
        // Only a request that went out can have been answered: settling a held one's
        // expectation would leave a stale one ahead of it, never granted past.
        let sent: Vec<usize> = (0..self.expected.len())
            .filter(|&i| {
                let ticket = Some(self.expected[i].ticket);
                !self.held_requests.iter().any(|held| held.answer == ticket)
            })
            .collect();
        // A size estimated with another fragment size than the peer used is off by a
        // little: still that answer, not one of unknown size.
        let close = sent
            .iter()
            .copied()
            .filter(|&i| self.expected[i].sized)
            .min_by_key(|&i| self.expected[i].packets.abs_diff(packets))
            .filter(|&i| {
                let expected = self.expected[i].packets;
                expected.abs_diff(packets) <= (expected / 8).max(1)
            });
        // Otherwise sizes were announced wrong: the oldest stands for it, right in sum.
        let position = close
            .or_else(|| sent.iter().copied().find(|&i| !self.expected[i].sized))
            .or_else(|| sent.first().copied())
            .unwrap_or(0);
        self.expected.remove(position)
    }

    /// Packets of a message of `bytes` from the peer.
    pub(crate) fn packets_from_peer(&self, bytes: usize) -> u64 {
        packets_of(bytes, self.peer_fragment_bytes)
    }

    /// Queues `message`, or holds it back: behind requests held already (the peer sees a
    /// session's messages in order), and, if it is a request whose answer is the
    /// expectation `answer`, until the grant reaches into that answer. Returns whether it
    /// was held.
    pub(crate) fn queue_or_hold(&mut self, message: Message, answer: Option<u64>) -> bool {
        let hold = !self.held_requests.is_empty()
            || answer.is_some_and(|ticket| !self.may_ask_for(ticket));
        if hold {
            self.queued_bytes += message.len();
            self.queued_messages += 1;
            self.held_requests
                .push_back(HeldMessage { message, answer });
        } else {
            self.queue_message(message, self.fragment_bytes_max);
        }
        hold
    }

    /// Whether the window granted reaches into the answer of expectation `ticket`: every
    /// packet still expected ahead of it is granted, and at least one of its own. A server
    /// asked earlier would hold the request with nothing it may send, then wait for the
    /// grant (probing for it), while a request sent with the grant that lets it start is
    /// answered at once. An expectation no longer there (given up) is granted nothing more
    /// and waits for nothing.
    fn granted_into(&self, ticket: u64) -> bool {
        let Some(position) = self.expected.iter().position(|e| e.ticket == ticket) else {
            return true;
        };
        let ahead: u64 = self.expected.iter().take(position).map(|e| e.packets).sum();
        self.promised_packets() > ahead.saturating_sub(self.expected_received)
    }

    /// Whether the request whose answer is expectation `ticket` may go: the grant reaches
    /// into its answer ([`Session::granted_into`]), or, on a reserved session, the answer
    /// just ahead of it began to arrive ([`Session::answer_ahead_began`]).
    fn may_ask_for(&self, ticket: u64) -> bool {
        self.granted_into(ticket)
            || (self.reservation().is_some() && self.answer_ahead_began(ticket))
    }

    /// Whether the answer just ahead of expectation `ticket` began to arrive (every answer
    /// before that one is in, and at least one packet of it). A reserved reader's grants
    /// are paced at its rate, so the grant reaches into the next answer only as the current
    /// one ends: its request then went out with the last grants of the current answer, and
    /// its server, which takes a while to produce an answer (a disk read), idled between
    /// the two while the reader's grants saved credit it then spent in a burst at the port
    /// (`tessera lab radon --mirror`). Asked as the current answer begins to arrive, the
    /// server produces the next while it sends the current one, which its grants still
    /// pace. One answer ahead only: the server holds at most one answer it may not send.
    fn answer_ahead_began(&self, ticket: u64) -> bool {
        let Some(position) = self.expected.iter().position(|e| e.ticket == ticket) else {
            return true;
        };
        let Some(before_ahead) = position.checked_sub(1) else {
            return false;
        };
        let earlier: u64 = self
            .expected
            .iter()
            .take(before_ahead)
            .map(|e| e.packets)
            .sum();
        self.expected_received > earlier
    }

    /// Sends, in order, the held requests that may go now ([`Session::may_ask_for`]).
    fn release_granted_requests(&mut self) {
        while let Some(held) = self.held_requests.front() {
            if held.answer.is_some_and(|ticket| !self.may_ask_for(ticket)) {
                break;
            }
            let held = self.held_requests.pop_front().expect("looked at above");
            self.queued_bytes -= held.message.len();
            self.queued_messages -= 1;
            self.queue_message(held.message, self.fragment_bytes_max);
        }
    }

    /// The application no longer expects a message it announced with `expect` (it gave up
    /// waiting): forget the newest expectation. Held requests stay in order (which of them
    /// was given up is the application's business); the one whose expectation went and
    /// any behind it that are granted go out now, and all of them once nothing is
    /// expected, since no grant would come for them.
    pub(crate) fn expect_cancelled(&mut self) {
        self.expected.pop_back();
        if self.expected.is_empty() {
            self.expected_received = 0;
        }
        self.release_granted_requests();
    }

    /// What this session asks of the receive budget, if it expects anything: for its
    /// oldest expected message not granted whole, under that message's own ticket. What is
    /// received and promised covers the expected messages oldest first, so an answer asked
    /// for later (a client reading ahead) waits its turn behind the other sessions' older
    /// ones, even on a session that holds a grant; granted as one, it would let the server
    /// start an answer that then waits for the rest of its grant behind all of those.
    /// A reserved session's claim is what its grants' pace allows at `now`
    /// ([`crate::grants::GrantPace`]).
    /// A best-effort session under Radon is paced by its [`radon::BestEffortRate`].
    pub(crate) fn claim(&self, config: &Config, now: Micros) -> Option<Claim> {
        let mut claim = self.claim_unpaced(config)?;
        if let Some(rate) = self.grant_rate(now) {
            claim.wanted = claim.wanted.min(self.grant_pace.available(rate, now));
        }
        claim.reserved = self.reservation().is_some();
        Some(claim)
    }

    fn reservation(&self) -> Option<Reservation> {
        self.pacer.as_ref()?.reservation()
    }

    /// The pace of this session's grants at `now`: a reserved session's, else a best-effort
    /// session's under Radon (`None`: not paced).
    fn grant_rate(&self, now: Micros) -> Option<GrantRate> {
        if self.reservation().is_some() {
            return self.reserved_grant_rate(now);
        }
        let rate = self.best_effort_grants.as_ref()?.rate();
        let wire = wire_bytes(self.peer_fragment_bytes as u64);
        Some(GrantRate::best_effort(rate, wire))
    }

    /// A reserved session's grants' pace at `now`: its reserved rate, or what its period's
    /// outstanding answers need ([`GrantRate::for_period`]).
    fn reserved_grant_rate(&self, now: Micros) -> Option<GrantRate> {
        let reservation = self.reservation()?;
        let rate = GrantRate::new(reservation.rate_bytes_per_s, self.peer_fragment_bytes);
        Some(match self.grant_period(now) {
            Some(period) => {
                GrantRate::on_schedule(reservation.rate_bytes_per_s, self.peer_fragment_bytes)
                    .for_period(rate, &self.grant_pace, period, now, self.shares_port())
            }
            None => rate,
        })
    }

    /// Whether a reserved reader's own packets measure a queue in front of its host, so that
    /// it yields its laxity to the others there
    /// ([`crate::radon::RadonConfig::reserved_grants_yield_laxity`]).
    fn shares_port(&self) -> bool {
        self.pacer.as_ref().is_some_and(|pacer| {
            let config = pacer.config();
            config.reserved_grants_yield_laxity
                && self.queue_estimate.queue_delay_us() * SHARED_PORT_QUEUE_DIVISOR
                    >= config.queue_target_us.max(1)
        })
    }

    /// The reserved period `now` falls in, with what this session's expected answers still
    /// need granted.
    fn grant_period(&self, now: Micros) -> Option<GrantPeriod> {
        let pacer = self.pacer.as_ref()?;
        let reservation = pacer.reservation()?;
        let (end_us, margin_us) = pacer.period_due(now)?;
        let expected: u64 = self.expected.iter().map(|e| e.packets).sum();
        let covered = self.expected_received + self.promised_packets();
        Some(GrantPeriod {
            end_us,
            period_us: reservation.period_us,
            margin_us,
            budget_packets: GrantPeriod::budget_packets(
                reservation.rate_bytes_per_s,
                reservation.period_us,
                self.peer_fragment_bytes,
            ),
            due_packets: GrantPeriod::due_packets(
                reservation.rate_bytes_per_s,
                reservation.period_us,
                self.peer_fragment_bytes,
            ),
            outstanding_packets: expected.saturating_sub(covered),
        })
    }

    /// When a reserved session held back by its grants' pace may be granted more (`None`:
    /// it is not held back by the pace).
    fn grant_due(&self, now: Micros, config: &Config) -> Option<Micros> {
        self.paced_grant_at(now, config).filter(|&due| due > now)
    }

    /// Whether a session held back by its grants' pace may be granted more now: its timer
    /// ([`Session::grant_due`]) was due, and whatever recomputes the timer (a datagram the
    /// host read on waking, before its timers ran) drops it without running the grants.
    pub(crate) fn grant_ready(&self, now: Micros, config: &Config) -> bool {
        self.paced_grant_at(now, config)
            .is_some_and(|due| due <= now)
    }

    /// When the grants' pace lets a session that wants packets granted be granted more,
    /// due or not (`None`: no receive budget, grants not paced, or nothing wanted).
    fn paced_grant_at(&self, now: Micros, config: &Config) -> Option<Micros> {
        config.receive_budget_packets?;
        let rate = self.grant_rate(now)?;
        let wanted = self.claim_unpaced(config)?.wanted;
        if wanted == 0 {
            return None;
        }
        Some(self.grant_pace.due(rate, wanted, now))
    }

    fn claim_unpaced(&self, config: &Config) -> Option<Claim> {
        let oldest = self.expected.front()?;
        let promised = self.promised_packets();
        let mut covered = self.expected_received + promised;
        let mut current = None;
        for expectation in &self.expected {
            if covered < expectation.packets {
                current = Some((expectation.ticket, expectation.packets - covered));
                break;
            }
            covered -= expectation.packets;
        }
        // At least one packet while any message is expected and nothing is promised: an
        // estimate that was short must not leave the sender waiting for a grant that
        // never comes.
        let (ticket, outstanding) = current.unwrap_or((oldest.ticket, u64::from(promised == 0)));
        let buffer_room = (config.receive_window_packets as u64)
            .saturating_sub(self.held_packets() as u64)
            .saturating_sub(promised);
        Some(Claim {
            ticket,
            promised,
            wanted: outstanding.min(buffer_room),
            reserved: false,
        })
    }

    /// Packets granted and not yet arrived.
    pub(crate) fn promised_packets(&self) -> u64 {
        self.advertised_edge - self.recv_next
    }

    /// Extends the window by `packets` from the receive budget. A sender that has used up
    /// (or nearly) what it had is told at once; otherwise the next ACK carries it.
    pub(crate) fn grant(&mut self, packets: u64, config: &Config, stats: &mut Stats, now: Micros) {
        if packets == 0 {
            return;
        }
        if let Some(rate) = self.grant_rate(now) {
            let period = self.grant_period(now);
            self.grant_pace.spend(rate, packets, now, period);
        }
        let promised_before = self.promised_packets();
        self.advertised_edge += packets;
        stats.grants += 1;
        // The requests go out with the grant: the peer wakes once for both.
        self.release_granted_requests();
        if promised_before <= config.ack_every_packets as u64 {
            self.ack_now = true;
        }
    }

    /// The retransmission timer after `backoffs` doublings of the RTO, spread at random over
    /// up to a quarter more, so that senders that lost packets in the same overflow do not
    /// all retransmit at the same instant (the randomised timeout of Vasudevan et al., "Safe
    /// and effective fine-grained TCP retransmissions for datacenter communication", 2009).
    ///
    /// Backoff stops at `retransmit_timer_max_us`, or at the spread RTO where the round trip
    /// stays long: where even the smallest of the latest samples reaches the ceiling, a
    /// timer shorter than the round trip would only fire early, again and again (the
    /// simulator's queue of three windows into one port took such a sender to 17% of the
    /// port). Where the round trip is short when nothing delays it, long samples are a queue
    /// that drains or a busy host that was not scheduled, and srtt + 4 rttvar follows them
    /// up (to 5 ms and more with 65 hosts on two CPUs in `tessera lab incast`): a timer that
    /// fires during one is found spurious (Eifel) and costs one packet, while a timer that
    /// waits them out leaves the link idle after a real loss. A timer that would pass the
    /// ceiling is spread over the fifth below it instead, which keeps timers apart at the
    /// ceiling too.
    fn retransmit_timer(&mut self, backoffs: u32) -> Micros {
        let timer = self.jittered(self.rtt.rto_us_backed_off(backoffs));
        let rto = self.rtt.rto_us();
        let ceiling = if self
            .rtt
            .recent_min_us()
            .is_some_and(|base| base >= self.retransmit_timer_max_us)
        {
            self.retransmit_timer_max_us.max(rto + rto / 4)
        } else {
            self.retransmit_timer_max_us
        };
        if timer <= ceiling {
            timer
        } else {
            ceiling - self.random() % (ceiling / 5 + 1)
        }
    }

    /// The window-probe interval after `probes` probes: the backed-off RTO, but at least
    /// `probe_interval_min_us`, spread like the RTO.
    fn probe_interval_jittered(&mut self) -> Micros {
        let interval = self
            .rtt
            .rto_us_backed_off(self.probes)
            .max(self.probe_interval_min_us);
        self.jittered(interval)
    }

    fn jittered(&mut self, rto: Micros) -> Micros {
        rto + self.random() % (rto / 4 + 1)
    }

    fn random(&mut self) -> u64 {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        self.jitter
    }

    /// The queue this session's DATA packets measured on their path, µs.
    pub(crate) fn queue_delay_us(&self) -> u64 {
        self.queue_estimate.queue_delay_us()
    }

    fn fill_control_fields(&mut self, packet: &mut Packet, now: Micros, config: &Config) {
        let window = self.receive_window(config);
        self.advertised_edge = self.advertised_edge.max(self.recv_next + window as u64);
        packet.ack = self.recv_next as u32;
        packet.window = window;
        packet.timestamp = timestamp(now);
        packet.echo = self.echo;
        let queue_us = self.queue_estimate.queue_delay_us().max(self.port_queue_us);
        packet.queue = radon::queue_code(queue_us);
        if !packet.first {
            // A first fragment has no room for it (see `Packet::ack_delay`).
            packet.ack_delay = self.echo_arrived_at.map_or(0, |arrived| {
                u32::try_from(now.saturating_sub(arrived)).unwrap_or(u32::MAX)
            });
        }
        // Every packet carries the cumulative acknowledgement.
        self.ack_pending_packets = 0;
        self.ack_deadline = None;
        self.ack_now = false;
    }

    fn blank(&self, kind: PacketKind) -> Packet {
        Packet {
            kind,
            first: false,
            last: false,
            probe: false,
            session: self.id.0,
            seq: self.send_next as u32,
            ack: 0,
            window: 0,
            timestamp: 0,
            echo: 0,
            message_len: 0,
            ack_delay: 0,
            queue: 0,
            payload: Bytes::new(),
        }
    }

    /// Whether `build_transmit` would return a packet.
    pub(crate) fn wants_transmit(&self, now: Micros, config: &Config) -> bool {
        self.restart.as_ref().is_some_and(|r| r.owed)
            || self.can_send_data(now, config)
            || self.probe_owed
            || self.ack_now
            || self.ack_deadline.is_some_and(|deadline| deadline <= now)
    }

    /// The payload hash of the DATA packet [`build_transmit`](Self::build_transmit) just
    /// returned (the fragment before `send_next`), if its sender made one.
    pub(crate) fn sent_payload_hash(&self) -> Option<&tessera_auth::PayloadHash> {
        let index = self.send_next.checked_sub(self.send_base + 1)?;
        self.outgoing.get(index as usize)?.payload_hash.as_ref()
    }

    /// The next packet this session wants to send, if any: a RESTART, then DATA, then a window
    /// probe, then a bare ACK.
    pub(crate) fn build_transmit(
        &mut self,
        now: Micros,
        config: &Config,
        stats: &mut Stats,
    ) -> Option<Packet> {
        if let Some(restart) = self.restart.as_mut().filter(|r| r.owed) {
            restart.owed = false;
            restart.sent_at = Some(now);
            let point = restart.point;
            let mut packet = self.blank(PacketKind::Restart);
            self.fill_control_fields(&mut packet, now, config);
            packet.seq = point as u32;
            stats.restarts_sent += 1;
            return Some(packet);
        }
        if self.can_send_data(now, config) {
            return Some(self.build_data(now, config, stats));
        }
        if self.probe_owed {
            self.probe_owed = false;
            let mut packet = self.blank(PacketKind::Ack);
            packet.probe = true;
            self.fill_control_fields(&mut packet, now, config);
            stats.probes_sent += 1;
            return Some(packet);
        }
        if self.ack_now || self.ack_deadline.is_some_and(|deadline| deadline <= now) {
            let mut packet = self.blank(PacketKind::Ack);
            self.fill_control_fields(&mut packet, now, config);
            stats.acks_sent += 1;
            return Some(packet);
        }
        None
    }

    fn build_data(&mut self, now: Micros, config: &Config, stats: &mut Stats) -> Packet {
        let seq = self.send_next;
        // The paper's rule: never more unacknowledged packets than the congestion window
        // allows, and never a packet past the receiver's advertised window.
        assert!(
            seq < self.send_base + self.congestion_window(config) as u64,
            "session {:?}: seq {seq} beyond the congestion window",
            self.id
        );
        assert!(
            seq < self.peer_window_edge,
            "session {:?}: seq {seq} beyond the peer's receive window edge {}",
            self.id,
            self.peer_window_edge
        );
        let index = (seq - self.send_base) as usize;
        let entry = &mut self.outgoing[index];
        let retransmission = entry.transmissions > 0;
        if retransmission {
            stats.retransmissions += 1;
            if self.timed_out.is_some() {
                stats.timeout_retransmissions += 1;
            }
        }
        entry.transmissions = entry.transmissions.saturating_add(1);
        let mut packet = Packet {
            kind: PacketKind::Data,
            first: entry.first,
            last: entry.last,
            probe: false,
            session: self.id.0,
            seq: seq as u32,
            ack: 0,
            window: 0,
            timestamp: 0,
            echo: 0,
            message_len: if entry.first { entry.message_len } else { 0 },
            ack_delay: 0,
            queue: 0,
            payload: entry.payload.clone(),
        };
        self.send_next += 1;
        self.send_high = self.send_high.max(self.send_next);
        stats.data_packets_sent += 1;
        self.fill_control_fields(&mut packet, now, config);
        if self.pacer.is_some() {
            let payload_bytes = packet.payload.len() as u64;
            let sent = radon::SentPacket {
                now,
                payload_bytes,
                new_bytes: if retransmission { 0 } else { payload_bytes },
                wire_bytes: wire_bytes(payload_bytes),
                queued_bytes: self.queued_bytes as u64,
            };
            let random = self.random();
            if let Some(pacer) = self.pacer.as_mut() {
                pacer.on_sent(sent, random);
            }
        }
        self.rearm(now, stats);
        assert!(self.in_flight() <= self.peer_receive_window());
        packet
    }

    /// Re-establishes the timer and blocked state after any change.
    fn rearm(&mut self, now: Micros, stats: &mut Stats) {
        // Blocked by the receiver: data waits and the next packet would pass its window
        // (whether or not the congestion window, which follows the receiver's, also stops it).
        let blocked = self.send_next < self.send_end() && self.send_next >= self.peer_window_edge;
        if blocked && !self.window_blocked {
            stats.window_limited += 1;
        }
        self.window_blocked = blocked;
        if self.in_flight() > 0 {
            if self.rto_deadline.is_none() {
                self.rto_armed_at = now;
                self.send_high_at_arm = self.send_high;
                // A paced packet often travels alone, and its ACK waits out the peer's
                // delay and its host's lateness (which RTT samples leave out): the timer
                // waits for them too, as QUIC's PTO adds max_ack_delay, by the holds the
                // peer reports (on a busy host its ACK delay of 100 µs was often 200 and
                // more, and 1-5% of a paced stream's packets were resent with none lost).
                //
                // So does a session's tail: with everything queued in flight (an answer, the
                // end of a request) no later packet can show the receiver a gap, so a timer
                // that fires before the peer's ACK only sends again what arrived. A client
                // busy pushing a sequential write holds the ACKs of its servers' answers for
                // milliseconds (in `bench --quick`, 1.5-4 spurious resends per write answer,
                // a third of the datagrams the client read during raid0 and hybrid writes).
                //
                // So does a packet the peer granted: a window this small is a receive
                // budget's grant (a reader's, 20 packets in clients), a few packets at a
                // time that travel alone as a paced sender's do. Without, the servers of
                // readers on a late host resent 7-8% of their packets, nearly all on timers
                // found spurious, once best-effort readers yielded and the port's queue no
                // longer stretched their RTO (test `mirror`; `lab radon --mirror`: 2-3.4%).
                // It waits for the longest hold of the last second too: the holds' mean and
                // deviation barely move on a host stalled at 1% of its wake-ups, and each
                // stall fired the timers, 0.8% of the servers' packets resent in the lab
                // and 0.9-1.5% in test `mirror` (0.05-0.28% with the peak). And half the
                // peak again: the peak is the longest stall a stream happened to see, and
                // the next is often a little longer (`rtt::HOLD_PEAK_MARGIN_DIVISOR`). A
                // real loss waits that much longer to be resent; a reader's deadlines are
                // periods.
                let tail = self.send_next >= self.send_end();
                let granted = self.peer_receive_window() < GRANTED_WINDOW_PACKETS_MAX;
                let ack_delay_us = if granted {
                    self.ack_delay_us
                        .max(self.rtt.hold_allowance_us())
                        .max(self.rtt.hold_peak_wait_us())
                } else if self.pacer.is_some() {
                    self.ack_delay_us.max(self.rtt.hold_allowance_us())
                } else if tail {
                    self.rtt.hold_allowance_us()
                } else {
                    0
                };
                self.rto_hold_us = ack_delay_us;
                self.rto_deadline = Some(now + self.retransmit_timer(self.backoffs) + ack_delay_us);
            }
        } else if self.window_blocked {
            if self.rto_deadline.is_none() {
                self.rto_armed_at = now;
                self.rto_hold_us = 0;
                self.rto_deadline = Some(now + self.probe_interval_jittered());
            }
        } else {
            self.rto_deadline = None;
            self.probes = 0;
        }
    }

    /// The earliest time `on_timeout` must run: its timers, and the pacer's next sending
    /// time while a DATA packet waits for it.
    pub(crate) fn next_deadline(&self, now: Micros, config: &Config) -> Option<Micros> {
        let paced = if self.data_waiting(config) {
            self.paced_until(now)
        } else {
            None
        };
        let stalled = self.reassembly.as_ref().map(|reassembly| {
            (reassembly.progress_at).saturating_add(config.memory.reassembly_stall_us)
        });
        let held = self
            .out_of_order_since
            .map(|since| since.saturating_add(config.memory.out_of_order_hold_us));
        let granted = self.grant_due(now, config);
        [
            self.rto_deadline,
            self.ack_deadline,
            paced,
            stalled,
            held,
            granted,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the timeout due at `deadline`, handled at `now`, finds the peer silent for
    /// [`Config::peer_lost_after_us`]. Silence is counted from when the first unanswered
    /// timer was armed, less the time this host itself was late to handle its timers: a
    /// process kept off the CPU for a second would otherwise give up on every peer at its
    /// first timeout, without a retransmission, while their answers waited in its socket.
    /// And at least [`LOST_AFTER_TIMEOUTS_MIN`] timeouts must have gone unanswered.
    fn peer_silent_too_long(&mut self, deadline: Micros, now: Micros, config: &Config) -> bool {
        let late = now
            .saturating_sub(deadline)
            .saturating_sub(HOST_LATE_SLACK_US);
        let since = self.stalled_since.get_or_insert(self.rto_armed_at);
        *since = since.saturating_add(late).min(now);
        now - *since >= config.peer_lost_after_us && self.backoffs + 1 >= LOST_AFTER_TIMEOUTS_MIN
    }

    /// Whether this retransmission timeout (the `backoffs`-th in a row) may leave the packets
    /// in flight alone: the session is paced, it is one of the first
    /// [`TIMEOUTS_WITHOUT_RESEND_MAX`] in a row, and the sender keeps sending (it sent new
    /// packets since the timer was armed, or has more waiting that the peer's window lets
    /// go). If a packet was lost, the receiver sees the gap in what follows and asks for it
    /// (RESTART); if none was, the ACKs were only late. On a busy host the receiver's
    /// wake-ups are late by more than any timer a paced stream can afford (`lab radon`:
    /// wake-ups over 1 ms late 29% of the time), and going back at each timeout resent 1-5%
    /// of a paced stream's packets with none lost at the port. A lost tail waits the few
    /// backed-off timers longer; a sender that stopped still goes back, and still finds a
    /// peer gone.
    fn may_wait_for_acks(&self, config: &Config) -> bool {
        self.pacer.is_some()
            && self.backoffs <= TIMEOUTS_WITHOUT_RESEND_MAX
            && (self.send_high > self.send_high_at_arm || self.data_waiting(config))
    }

    pub(crate) fn on_timeout(
        &mut self,
        now: Micros,
        config: &Config,
        stats: &mut Stats,
    ) -> Verdict {
        if self.reassembly.as_ref().is_some_and(|reassembly| {
            now.saturating_sub(reassembly.progress_at) >= config.memory.reassembly_stall_us
        }) {
            // Its reservation would otherwise stand for good. The stream cannot skip the
            // message, so the session goes with it.
            stats.reassemblies_stalled += 1;
            return Verdict::TimedOut;
        }
        if self
            .out_of_order_since
            .is_some_and(|since| now.saturating_sub(since) >= config.memory.out_of_order_hold_us)
        {
            // The gap never filled: a sender that went quiet, or one that sends only past
            // it. An honest sender resends them after the gap.
            stats.out_of_order_expired += self.out_of_order.len() as u64;
            self.out_of_order.clear();
            self.out_of_order_bytes = 0;
            self.out_of_order_since = None;
        }
        if self.ack_deadline.is_some_and(|deadline| deadline <= now) {
            self.ack_deadline = None;
            self.ack_now = true;
        }
        if let Some(deadline) = self.rto_deadline.filter(|deadline| *deadline <= now) {
            self.rto_deadline = None;
            if self.in_flight() > 0 {
                stats.timeouts += 1;
                stats.timeout_us_max = stats.timeout_us_max.max(now - self.rto_armed_at);
                let timer = (deadline - self.rto_armed_at).saturating_sub(self.rto_hold_us);
                stats.timer_us_max = stats.timer_us_max.max(timer);
                stats.ack_hold_wait_us_max = stats.ack_hold_wait_us_max.max(self.rto_hold_us);
                if timer > config.retransmit_timer_max_us {
                    stats.long_timeouts += 1;
                }
            } else {
                stats.probe_timeouts += 1;
            }
            if self.peer_silent_too_long(deadline, now, config) {
                return Verdict::TimedOut;
            }
            self.backoffs += 1;
            if self.in_flight() > 0 && self.may_wait_for_acks(config) {
                // The receiver asks for what it misses: no resend, the timer only backs off.
                stats.timeouts_without_resend += 1;
            } else if self.in_flight() > 0 {
                // Go back to the oldest unacknowledged packet; the timer restarts, doubled,
                // with its retransmission.
                self.timed_out.get_or_insert(TimedOut {
                    retransmitted_at: timestamp(now),
                    sent_up_to: self.send_next,
                });
                self.send_next = self.send_base;
                self.congestion.on_timeout();
                self.restart_honoured = None;
            } else if self.window_blocked {
                // The window update may have been lost: ask for it again.
                self.probe_owed = true;
                self.probes += 1;
                self.rto_armed_at = now;
                self.rto_hold_us = 0;
                self.rto_deadline = Some(now + self.probe_interval_jittered());
            }
        }
        self.rearm(now, stats);
        Verdict::Keep
    }

    /// Handles one packet from the peer, which arrived at `arrived` (at most `now`: a host
    /// that was busy reads what waited in its socket late, and the RTT must not count that).
    /// `room`: what is left of the endpoint's budgets for this session's source, which the
    /// messages and packets past a gap this packet brings may take.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_packet(
        &mut self,
        packet: Packet,
        arrived: Micros,
        now: Micros,
        config: &Config,
        room: Room,
        stats: &mut Stats,
        events: &mut VecDeque<PendingEvent>,
    ) -> Verdict {
        self.reassembly_room = room.messages;
        self.out_of_order_room = room.out_of_order;
        if packet.kind == PacketKind::Reset {
            stats.resets_received += 1;
            return Verdict::Reset;
        }
        // A DATA packet past the window edge is not from an honest peer: do not let its other
        // fields touch the state either.
        if packet.kind == PacketKind::Data
            && widen(packet.seq, self.recv_next) >= self.advertised_edge
        {
            stats.dropped_out_of_window += 1;
            return Verdict::Keep;
        }
        let ack = widen(packet.ack, self.send_base);
        if ack > self.send_high {
            // Acknowledges what was never sent.
            stats.dropped_out_of_window += 1;
            return Verdict::Keep;
        }
        if ack >= self.send_base {
            let round_trip = Echo {
                timestamp: packet.echo,
                // A first fragment has no room for the delay (see `Packet::ack_delay`).
                ack_delay: (!packet.first).then_some(packet.ack_delay),
                arrived,
            };
            self.on_ack(ack, packet.window, round_trip, stats);
        }
        self.on_queue_report(packet.queue, now);
        if self.in_flight() == 0 && self.send_next >= self.peer_window_edge {
            // Waiting for the peer's window with nothing at risk, the peer answering at all
            // is progress: a sender that waits for a slow application does not declare a
            // live peer lost.
            self.backoffs = 0;
            self.stalled_since = None;
        }
        let verdict = match packet.kind {
            PacketKind::Data => self.on_data(packet, arrived, now, config, stats, events),
            PacketKind::Ack => {
                if packet.probe {
                    self.ack_now = true;
                }
                Verdict::Keep
            }
            PacketKind::Restart => {
                self.on_restart(packet.seq, now, stats);
                Verdict::Keep
            }
            PacketKind::Reset => unreachable!("handled above"),
        };
        self.rearm(now, stats);
        verdict
    }

    fn on_ack(&mut self, ack: u64, window: u32, echo: Echo, stats: &mut Stats) {
        let edge = ack + window as u64;
        if edge > self.peer_window_edge {
            self.peer_window_edge = edge;
            if self.in_flight() == 0 {
                // The window opened: the probe timer has done its job.
                self.rto_deadline = None;
                self.probes = 0;
            }
        }
        if ack == self.send_base {
            return;
        }
        let newly_acked = ack - self.send_base;
        // Every transmission carries its own timestamp and the receiver echoes the one that
        // advanced its acknowledgement, so a sample is unambiguous even for a retransmitted
        // packet (RFC 7323's argument). Karn's rule would discard exactly those samples, and a
        // session whose timeout fell below a grown queueing delay then retransmitted every
        // window and never measured the round trip again (seen in the simulator: three fixed
        // windows of 8 into one 200 Mbit/s port, srtt stuck at 271 us against 1.9 ms real).
        //
        // The sample runs from the original's sending to the ACK's arrival at this host (not
        // to when this side got around to reading it) less the time the peer held the packet
        // before acknowledging it (QUIC's ack delay, RFC 9002 section 5.3): what is left is
        // the network's round trip, not the scheduling delays of two busy hosts. Those are
        // what the Eifel check below is for; an RTO inflated by them only stalls the link
        // after a real loss. A delay longer than the whole round trip is not believed. A
        // first fragment of an answer says nothing of how long the peer held the request it
        // acknowledges (waiting for a grant, for the disk): no sample from it.
        if let Some(held) = echo.ack_delay {
            let round_trip = timestamp(echo.arrived).wrapping_sub(echo.timestamp) as Micros;
            let held = held as Micros;
            if held < round_trip {
                // The hold goes to the retransmission timer of its own (see `rearm`).
                self.rtt.on_hold(held, echo.arrived);
                self.rtt.on_sample(round_trip - held);
            } else {
                self.rtt.on_sample(round_trip);
            }
        }
        for _ in 0..newly_acked {
            let done = self
                .outgoing
                .pop_front()
                .expect("acknowledged packets are queued");
            self.queued_bytes -= done.payload.len();
            if done.last {
                self.queued_messages -= 1;
                self.messages_acknowledged += 1;
            }
        }
        self.send_base = ack;
        self.send_next = self.send_next.max(ack);
        if let Some(timed_out) = self.timed_out.take() {
            // Eifel detection (RFC 3522): the receiver echoes the timestamp of the packet that
            // advanced its acknowledgement. One sent before the retransmission means the
            // original had arrived and only the acknowledgement was late (a receiver that
            // was not scheduled, on a busy host): undo the timeout's cut (RFC 4015) and go
            // on from where the sender was rather than resending what is already there.
            // Anything that was in fact lost shows up as a gap, answered by a RESTART.
            if (timed_out.retransmitted_at.wrapping_sub(echo.timestamp) as i32) > 0 {
                stats.spurious_timeouts += 1;
                self.congestion.undo_timeout();
                self.send_next = self.send_next.max(timed_out.sent_up_to.min(self.send_high));
            }
        }
        self.backoffs = 0;
        self.stalled_since = None;
        self.probes = 0;
        // Progress restarts the retransmission timer.
        self.rto_deadline = None;
        if self.restart_honoured.is_some_and(|(point, _)| point < ack) {
            self.restart_honoured = None;
        }
        let receiver_window = u32::try_from(self.peer_receive_window()).unwrap_or(u32::MAX);
        self.congestion.on_ack(
            u32::try_from(newly_acked).unwrap_or(u32::MAX),
            receiver_window,
        );
    }

    /// The peer's measure of the queue toward it: best-effort pacing backs off on it.
    fn on_queue_report(&mut self, code: u8, now: Micros) {
        self.peer_queue_delay_us = radon::queue_delay_us(code);
        let round_trip_us = self.rtt.srtt_us().unwrap_or(self.rtt.rto_us());
        let wire = wire_bytes(self.fragment_bytes_max as u64);
        let report = radon::QueueReport {
            queue_delay_us: self.peer_queue_delay_us,
            now,
            round_trip_us,
            wire_bytes: wire,
            acked_seq: self.send_base,
            sent_seq: self.send_high,
        };
        if let Some(pacer) = self.pacer.as_mut() {
            pacer.on_queue_report(report);
        }
    }

    /// A best-effort session's grants move on the queue its own DATA packets measure, as a
    /// best-effort sender's pace moves on the queue its receiver reports: the packets
    /// granted after a cut (past the edge advertised then) show whether it was enough.
    fn pace_best_effort_grants(&mut self, arrived: Micros, config: &Config) {
        self.queue_measured_at = arrived;
        self.report_queue_to_grants(self.queue_estimate.queue_delay_us(), arrived, config);
    }

    /// A best-effort session whose packets have not measured the queue for
    /// [`radon::PORT_QUEUE_AGE_US_MAX`] takes it as empty, as a receiver reports the port's
    /// queue to a sender ([`radon::PortQueue`]): granted slowly, its packets are too sparse
    /// to say the queue drained, and its grants stayed at their floor while the port
    /// emptied.
    pub(crate) fn age_best_effort_grants(&mut self, now: Micros, config: &Config) {
        if now >= self.queue_measured_at + radon::PORT_QUEUE_AGE_US_MAX {
            self.report_queue_to_grants(0, now, config);
        }
    }

    fn report_queue_to_grants(&mut self, queue_delay_us: u64, now: Micros, config: &Config) {
        let (Some(radon), false) = (config.radon, self.reservation().is_some()) else {
            return;
        };
        let Some(grants) = self.best_effort_grants.as_mut() else {
            return;
        };
        let report = radon::QueueReport {
            queue_delay_us,
            now,
            round_trip_us: self.rtt.srtt_us().unwrap_or(self.rtt.rto_us()),
            wire_bytes: wire_bytes(self.peer_fragment_bytes as u64),
            acked_seq: self.recv_next,
            sent_seq: self.advertised_edge,
        };
        grants.on_report(&radon, report);
    }

    fn on_restart(&mut self, wire_point: u32, now: Micros, stats: &mut Stats) {
        stats.restarts_received += 1;
        let point = widen(wire_point, self.send_base);
        if point != self.send_base || self.send_next <= point {
            // Stale, or nothing past the point was sent since: nothing to resend.
            return;
        }
        if let Some((honoured, at)) = self.restart_honoured {
            let settle_us = self.rtt.srtt_us().unwrap_or(self.rtt.rto_us());
            if honoured == point && now < at + settle_us {
                // The retransmission for this point is already on its way.
                return;
            }
        }
        // Retransmit at once from the restart point: the paper's fast retransmit on the first
        // RESTART, not after three duplicate acknowledgements.
        self.send_next = point;
        self.congestion.on_restart();
        self.restart_honoured = Some((point, now));
        stats.restarts_honoured += 1;
        // The timer restarts with the retransmission.
        self.rto_deadline = None;
    }

    fn on_data(
        &mut self,
        packet: Packet,
        arrived: Micros,
        now: Micros,
        config: &Config,
        stats: &mut Stats,
        events: &mut VecDeque<PendingEvent>,
    ) -> Verdict {
        // Every DATA packet inside the window measures the path, duplicates included.
        self.queue_estimate.on_packet(packet.timestamp, arrived);
        self.pace_best_effort_grants(arrived, config);
        let seq = widen(packet.seq, self.recv_next);
        if seq < self.recv_next {
            // A duplicate: the sender may have missed our acknowledgement, so acknowledge
            // again (aggregated like in-order packets).
            stats.dropped_duplicate += 1;
            self.ack_owed(now, config, false);
            return Verdict::Keep;
        }
        assert!(seq < self.advertised_edge, "checked by on_packet");
        if seq > self.recv_next {
            // A gap. Packets can overtake each other on the way (two CPUs' backlogs on a
            // virtual link, several paths), so the ones past it are kept, within the window
            // already promised, and the gap is taken for a loss only once REORDER_PACKETS
            // of them have come (TCP's duplicate-ACK threshold, RFC 5681): then a RESTART
            // asks for a resend, once per gap, and again only if the gap outlives a
            // retransmission timeout. The go-back-N sender resends from the gap on; what
            // is kept here already is dropped as duplicate.
            if self.out_of_order.contains_key(&seq) {
                stats.dropped_duplicate += 1;
                return Verdict::Keep;
            }
            let cost = held_packet_bytes(&packet);
            if cost > self.out_of_order_room {
                // Dropped unacknowledged, as if lost; it still shows the gap, so the
                // sender is asked to resend from there as if it had been kept.
                stats.dropped_out_of_order_budget += 1;
                self.note_gap(now);
                return Verdict::Keep;
            }
            self.out_of_order_room -= cost;
            self.out_of_order_bytes += cost;
            self.out_of_order_since.get_or_insert(now);
            // A copy of its own, so that it pins no receive buffer of the driver's.
            let payload = Bytes::copy_from_slice(&packet.payload);
            self.out_of_order.insert(seq, Packet { payload, ..packet });
            stats.held_out_of_order += 1;
            if self.out_of_order.len() >= REORDER_PACKETS {
                self.note_gap(now);
            }
            return Verdict::Keep;
        }
        let timestamp = packet.timestamp;
        let Some(mut verdict) = self.accept_in_order(packet, now, config, stats, events) else {
            // Over the reassembly budget: dropped unacknowledged, as if lost on the way; the
            // sender's timeout resends it, by when a reservation may have ended.
            return Verdict::Keep;
        };
        // The packets kept past the gap it filled follow it.
        while verdict == Verdict::Keep {
            let Some(next) = self.out_of_order.remove(&self.recv_next) else {
                break;
            };
            self.out_of_order_bytes -= held_packet_bytes(&next);
            match self.accept_in_order(next, now, config, stats, events) {
                Some(next_verdict) => verdict = next_verdict,
                None => break,
            }
        }
        // The stream moved on: what is still held waits for a new gap, from now.
        self.out_of_order_since = (!self.out_of_order.is_empty()).then_some(now);
        // Echo the packet that filled the gap, not those it released: their timestamps are
        // older and would pass a retransmission off as a late original (RFC 7323, 4.3).
        self.echo = timestamp;
        self.echo_arrived_at = Some(arrived);
        verdict
    }

    /// Takes the next expected packet, `recv_next`, into the message being reassembled;
    /// `None` (nothing changed) if it is the first fragment of a message whose length does
    /// not fit the reassembly budget left.
    fn accept_in_order(
        &mut self,
        packet: Packet,
        now: Micros,
        config: &Config,
        stats: &mut Stats,
        events: &mut VecDeque<PendingEvent>,
    ) -> Option<Verdict> {
        debug_assert_eq!(widen(packet.seq, self.recv_next), self.recv_next);
        // The next expected packet: check it fits the message being reassembled before
        // changing anything.
        let payload_len = packet.payload.len();
        match (&self.reassembly, packet.first) {
            (None, true) => {
                let message_len = packet.message_len as usize;
                if message_len > config.message_bytes_max {
                    return Some(Verdict::Violation);
                }
                if message_len > self.reassembly_room {
                    stats.dropped_reassembly_budget += 1;
                    return None;
                }
                // Held from here until the application takes the message.
                self.reassembly_room -= message_len;
            }
            (Some(reassembly), false) => {
                let len = reassembly.buffer.len() + payload_len;
                let message_len = reassembly.message_len as usize;
                if len > message_len || (packet.last && len != message_len) {
                    return Some(Verdict::Violation);
                }
            }
            (None, false) | (Some(_), true) => return Some(Verdict::Violation),
        }
        self.recv_next += 1;
        self.echo = packet.timestamp;
        // A message's middle fragments are as large as the peer sends (its first may be
        // shorter, holding the seam of head and body; its last is the rest). If the size
        // assumed until now (this end's own, at first) was wrong, so were the packet counts
        // of the answers expected. Kept as the largest seen, a client whose path carried
        // 64 KiB datagrams expected one packet for a server's 45 of 1,472 bytes, and was
        // granted the rest a few at a time.
        let full_size = !packet.first && !packet.last;
        if full_size && payload_len != self.peer_fragment_bytes {
            self.peer_fragment_bytes = payload_len;
            for expectation in &mut self.expected {
                if let Some(bytes) = expectation.bytes {
                    expectation.packets = packets_of(bytes, payload_len);
                }
            }
        } else if packet.first && !packet.last {
            self.peer_fragment_bytes = self.peer_fragment_bytes.max(payload_len);
        }
        if !self.expected.is_empty() {
            self.expected_received += 1;
            // A reserved session's next request goes as its answer ahead begins to arrive.
            if !self.held_requests.is_empty() && self.reservation().is_some() {
                self.release_granted_requests();
            }
        }
        if self
            .restart
            .as_ref()
            .is_some_and(|r| r.point < self.recv_next)
        {
            self.restart = None;
        }
        let complete = if packet.first && packet.last {
            // Copied (the one copy between socket and application), so that a small message
            // pins no receive buffer of the driver's while it waits for the application.
            Some((Bytes::copy_from_slice(&packet.payload), 1))
        } else if packet.first {
            let message_len = packet.message_len as usize;
            // Sized from the announced length, which the budget reserved whole above (so it
            // bounds what peers make us allocate), so that it never grows: growing copied it.
            let mut buffer = Vec::with_capacity(message_len);
            buffer.extend_from_slice(&packet.payload);
            self.reassembly = Some(Reassembly {
                message_len: packet.message_len,
                buffer,
                packets: 1,
                progress_at: now,
            });
            None
        } else {
            let reassembly = self.reassembly.as_mut().expect("checked above");
            let message_len = reassembly.message_len as usize;
            append_within(&mut reassembly.buffer, &packet.payload, message_len);
            reassembly.packets += 1;
            reassembly.progress_at = now;
            if packet.last {
                let reassembly = self.reassembly.take().expect("checked above");
                Some((Bytes::from(reassembly.buffer), reassembly.packets))
            } else {
                None
            }
        };
        if let Some((message, packets)) = complete {
            if self.settle_expectation(packets).is_some() {
                self.expected_received = 0;
                // A grant that outran a short estimate may reach the next answer already.
                self.release_granted_requests();
            }
            self.undrained_packets += packets;
            stats.messages_delivered += 1;
            let bytes = message.len();
            events.push_back(PendingEvent {
                event: Event::Message {
                    session: self.id,
                    peer: self.peer,
                    message,
                },
                session: self.id,
                packets,
                bytes,
            });
        }
        self.ack_owed(now, config, packet.last);
        Some(Verdict::Keep)
    }

    fn ack_owed(&mut self, now: Micros, config: &Config, immediate: bool) {
        self.ack_pending_packets = self.ack_pending_packets.saturating_add(1);
        if immediate
            || self.ack_pending_packets >= config.ack_every_packets
            || config.ack_delay_us == 0
        {
            self.ack_now = true;
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + config.ack_delay_us);
        }
    }

    fn note_gap(&mut self, now: Micros) {
        match self.restart.as_mut() {
            Some(restart) if restart.point == self.recv_next => {
                if restart.owed || restart.resends >= RESTART_RESENDS_MAX {
                    return;
                }
                let resend_at = restart
                    .sent_at
                    .map(|at| at + self.rtt.rto_us_backed_off(restart.resends));
                if resend_at.is_some_and(|at| now >= at) {
                    restart.owed = true;
                    restart.resends += 1;
                }
            }
            _ => {
                self.restart = Some(RestartState {
                    point: self.recv_next,
                    sent_at: None,
                    resends: 0,
                    owed: true,
                });
            }
        }
    }

    /// The application took a message holding `packets` packets of the receive window: if
    /// that opens the window noticeably, tell the peer at once.
    pub(crate) fn on_drained(&mut self, packets: u32, config: &Config) {
        assert!(packets <= self.undrained_packets);
        self.undrained_packets -= packets;
        let edge = self.recv_next + self.receive_window(config) as u64;
        let step = (config.receive_window_packets / 4).max(1) as u64;
        if edge >= self.advertised_edge + step {
            self.ack_now = true;
        }
    }

    pub(crate) fn info(&self, config: &Config) -> SessionInfo {
        SessionInfo {
            peer: self.peer,
            congestion_window: self.congestion_window(config),
            peer_receive_window: u32::try_from(self.peer_receive_window()).unwrap_or(u32::MAX),
            in_flight: self.in_flight() as u32,
            srtt_us: self.rtt.srtt_us().unwrap_or(0),
            rto_us: self.rtt.rto_us(),
            queued_packets: self.send_end() - self.send_next,
            queued_bytes: self.queued_bytes as u64,
            queued_messages: self.queued_messages as u64,
            messages_acknowledged: self.messages_acknowledged,
            receive_window: self.receive_window(config),
            backoffs: self.backoffs,
            send_base: self.send_base,
            recv_next: self.recv_next,
            queue_delay_us: self.queue_estimate.queue_delay_us(),
            peer_queue_delay_us: self.peer_queue_delay_us,
            pacing_wait_ns: self.pacer.as_ref().map_or(0, Pacer::wait_ns),
            best_effort_grant_rate: self
                .best_effort_grants
                .as_ref()
                .filter(|_| self.reservation().is_none())
                .map_or(0, radon::BestEffortRate::rate),
            reservation: self.pacer.as_ref().and_then(Pacer::reservation),
            deadlines: self.pacer.as_ref().map(Pacer::stats).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::append_within;

    #[test]
    fn a_reassembly_buffer_never_grows_past_its_message() {
        let len = (17 << 20) + 7;
        let mut buffer = Vec::with_capacity(1 << 20);
        let fragment = vec![1; 1428];
        while buffer.len() < len {
            let n = (len - buffer.len()).min(fragment.len());
            append_within(&mut buffer, &fragment[..n], len);
            assert!(buffer.capacity() <= len, "{} past {len}", buffer.capacity());
        }
        assert_eq!(buffer.capacity(), len);
    }
}
