//! The datagram transport protocol of Tessera, as a sans-IO state machine, and a deterministic
//! network simulator to test it.
//!
//! This crate owns the protocol that moves whole messages between two peers over datagrams:
//! sessions, fragmentation and reassembly, go-back-N retransmission with cumulative
//! acknowledgements, receiver windows, RTT estimation and congestion control. It is the
//! adaptive flow control of Swift/RAID (Fullmer, Long and Cabrera, "Adding adaptive flow
//! control to Swift/RAID", 1995): go-back-N with TCP's congestion avoidance, a sender that
//! never probes past the receiver's window, and retransmission on the first RESTART. It must
//! never do I/O: no sockets, threads, clocks or unseeded randomness. Time comes in as
//! `now: Micros` arguments, randomness from the seed given to [`Endpoint::new`], and datagrams
//! go in through [`Endpoint::handle_datagram`] and out through [`Endpoint::poll_transmit`].
//! The UDP driver and the [`sim`] simulator run the very same code.
//!
//! # Driving an endpoint
//!
//! In the manner of `quinn-proto`: feed inputs with `handle_*` (and `send`, `connect`,
//! `close`), then drain every output before waiting again: `poll_transmit` until `None` (send
//! each datagram), `poll_event` until `None` (deliver each event), and finally `poll_timeout`,
//! the time by which `handle_timeout` must be called if nothing else arrives first. `now` must
//! never go backwards.
//!
//! ```
//! use bytes::Bytes;
//! use tessera_datagram::{Config, Endpoint, Event};
//!
//! let client_addr = "127.0.0.1:4000".parse().unwrap();
//! let server_addr = "127.0.0.2:4000".parse().unwrap();
//! let mut client = Endpoint::new(Config::default(), 1);
//! let mut server = Endpoint::new(Config::default(), 2);
//!
//! let mut now = 0;
//! let session = client.connect(server_addr, now);
//! client.send(session, Bytes::from(vec![7u8; 5000]), now).unwrap();
//!
//! let mut received = None;
//! while received.is_none() {
//!     // A perfect network: every datagram arrives 50 µs later.
//!     now += 50;
//!     while let Some(transmit) = client.poll_transmit(now) {
//!         server.handle_datagram(client_addr, &transmit.contents(), now);
//!     }
//!     while let Some(transmit) = server.poll_transmit(now) {
//!         client.handle_datagram(server_addr, &transmit.contents(), now);
//!     }
//!     while let Some(event) = server.poll_event() {
//!         if let Event::Message { message, .. } = event {
//!             received = Some(message);
//!         }
//!     }
//!     for endpoint in [&mut client, &mut server] {
//!         if endpoint.poll_timeout().is_some_and(|deadline| deadline <= now) {
//!             endpoint.handle_timeout(now);
//!         }
//!     }
//! }
//! assert_eq!(received.unwrap().len(), 5000);
//! assert_eq!(server.stats().messages_delivered, 1);
//! ```
//!
//! [`sim::Sim`] does this for many endpoints at once over a network with delay, jitter, loss,
//! duplication and bottleneck queues, jumping virtual time from one event to the next.
//!
//! # Packet layout
//!
//! Every datagram is one packet: a fixed 40-byte header, big-endian, then the payload, then a
//! 16-byte MAC (since version 3; AES-128-GCM-SIV and no CRC32C since version 4, see
//! [`packet`] for why).
//!
//! ```text
//! offset size field
//!  0      2   magic        0x5453 ("TS")
//!  2      1   version      4; checked first, so a later version may change all that follows
//!  3      1   kind         1 DATA, 2 ACK, 3 RESTART, 4 RESET
//!  4      8   session      chosen at random by the connecting side
//! 12      4   seq          DATA: sequence number; RESTART: the sequence number expected
//! 16      4   ack          cumulative: the next sequence number expected from the peer
//! 20      4   window       packets past `ack` the sender of this packet can still accept
//! 24      4   timestamp    the sender's clock, µs, low 32 bits
//! 28      4   echo         the timestamp of the packet that last advanced `ack`
//! 32      4   message_len  DATA with FIRST: length of the whole message
//!             or ack_delay otherwise: µs from the arrival of the packet whose timestamp
//!                          is echoed to the sending of this one
//! 36      1   flags        0x01 FIRST, 0x02 LAST (DATA); 0x04 PROBE (ACK)
//! 37      1   queue        the queueing delay the sender measured on the path from the peer,
//!                          or in front of it from any peer if larger (Radon,
//!                          [`radon::queue_code`], [`radon::PortQueue`]); 0 for none. Reserved and zero
//!                          before, so packets of older peers decode as "no queue seen"
//! 38      2   payload_len  bytes of payload; the datagram is exactly 56 + payload_len
//! 40      -   payload      DATA only: one fragment, at least one byte unless the message
//!                          is empty
//!  end   16   tag          AES-128-GCM-SIV of header and payload (`tessera_auth::PacketMac`)
//!                          under the session's key (the public all-zero key for sessions
//!                          set up without a handshake, and for every RESET)
//! ```
//!
//! **Authentication.** The endpoint never sees a handshake: the driver keys a session
//! ([`Endpoint::connect_keyed`] at the connecting side, [`Endpoint::admit`] at the accepting
//! side) with the key a handshake elsewhere agreed (`tessera-transport`: mutual proof over TCP,
//! both nonces, the session id). Every packet of the session is tagged with it and a packet
//! whose tag does not verify (forged, or changed on the way: the tag is the datagram's only
//! integrity check) is dropped ([`Stats::dropped_unauthentic`]). With
//! [`Config::require_session_keys`] a peer cannot open a session no key was admitted for (its
//! DATA earns a rate-limited RESET, so that a client of a restarted server keys a new session
//! at once). RESETs carry the public key, since their sender forgot the session: anyone who
//! knows a session's random 64-bit id can end it, which an off-path attacker cannot learn.
//!
//! [`packet::decode`] never panics and refuses (and the endpoint counts in [`Stats`]) anything
//! truncated, with trailing bytes, of another magic or version, or with inconsistent
//! fields; [`packet::verify`] checks the tag. Sequence numbers are 64-bit inside the endpoint and widened from
//! the wire's 32 bits around the value expected ([`packet::widen`]).
//!
//! # Copies of a payload byte
//!
//! The protocol copies a payload byte once on its way from the sending application to the
//! receiving one, where a driver that gathers and scatters (the UDP driver of
//! `tessera-transport` does) lets it:
//! - *Sending: none.* A [`Message`] may be a small head and a large body (a frame's header and
//!   its payload) that are never joined: every fragment is a slice of one part, but for the
//!   first, short fragment where they meet (a copy of at most one fragment, usually of tens
//!   of bytes of the body). [`Transmit`] carries a packet's header, its payload (that slice)
//!   and its tag apart, so the driver hands the kernel three `iovec`s and builds no datagram.
//! - *Receiving: one.* [`Endpoint::handle_datagram_bytes`] decodes a packet whose payload is a
//!   slice of the driver's receive buffer ([`packet::decode_bytes`]) and copies it into its
//!   message, whose buffer is allocated once at the first fragment, sized from the length
//!   it announces (the memory budget reserved that length anyway), so it never grows and
//!   is handed to the application as it is. A one-packet message is copied into a buffer of
//!   its own, and so is a packet held past a gap (it is copied into its message when the gap
//!   fills), so that the driver's receive buffers are never held.
//!
//! Each packet's tag still reads its payload once, on both sides (its CRC32C read it a second
//! time until format 4).
//! Before (to `38e20fe`), a payload byte was copied five times: joined into its frame,
//! copied into each datagram, out of the receive buffer, into the message (whose buffer
//! doubled past 1 MiB, which copied again), and out of the message by the frame decoder.
//!
//! # Protocol
//!
//! **Sessions.** [`Endpoint::connect`] picks a random session id and sends nothing; the
//! first DATA packet (sequence number 0) creates the session at the peer, within the limits
//! of [`admission`] (rates per source and in total; at most `sessions_max` sessions): beyond
//! them the packet is dropped and counted. The session is half-open until it delivers its
//! first whole message, when the peer reports [`Event::Opened`] just before that message; a
//! half-open session is evicted without a word when silent for the half-open timeout or to
//! make room for a newcomer, so junk that opens sessions never holds the table. An
//! established session a peer opened that sends nothing for the idle timeout (30 s) is closed
//! with a RESET and reported [`LossReason::Idle`], so an authenticated peer that goes silent
//! holds its address's share of the table for that long at most. Each session carries messages both ways, each direction with its own sequence
//! numbers starting at 0. For a session it does not know (it restarted, or closed or lost
//! the session), an endpoint answers with a RESET a RESTART, a window probe, or a DATA packet
//! past the initial window ([`WINDOW_INITIAL_PACKETS`]), whose sender must have heard from
//! it before; DATA within the initial window may belong to a new session whose first packet
//! was lost, and is dropped quietly until that packet is retransmitted. These RESETs are
//! rate-limited: [`RESET_BURST_MAX`] at once, then one per [`RESET_INTERVAL_US`]. A RESET
//! makes the peer report [`Event::Lost`]. [`Endpoint::close`] forgets a session (with its
//! events not yet polled) and sends the peer one RESET. The last [`FORGOTTEN_SESSIONS_MAX`]
//! sessions closed or lost are remembered, so that a late duplicate of their first packet
//! is answered with a RESET rather than opening them again.
//!
//! **Sender (go-back-N).** Messages are cut into fragments of at most
//! `payload_bytes_max - 44` bytes and numbered. The sender keeps every unacknowledged packet
//! and transmits packet `s` only if `s < base + min(congestion window, window_packets_max)`
//! and `s < ack + window` as last advertised by the receiver: it never has more packets
//! unacknowledged than the smaller window allows and never sends past the receiver's window
//! (both `assert!`ed before every transmission). Until it hears a window it assumes
//! [`WINDOW_INITIAL_PACKETS`]. On the first RESTART for a sequence number it goes back there
//! and retransmits at once (a repeated RESTART for the same point is honoured again only
//! after one smoothed RTT). When the retransmission timer expires it goes back to the oldest
//! unacknowledged packet and doubles the timeout, up to `retransmit_timer_max_us` (1 ms);
//! a timeout that finds the peer silent for `peer_lost_after_us` since the first timeout
//! without progress, after at least [`LOST_AFTER_TIMEOUTS_MIN`] unanswered timeouts, reports
//! the session [`Event::Lost`] and drops its queue. Time this host was late to handle its
//! timers (beyond 2 ms each) is not counted as the peer's silence: a process kept off the
//! CPU for a second resends and listens before it gives up on anyone. A
//! timeout whose first advancing ACK echoes a transmission from before it was spurious
//! (Eifel, RFC 3522): the window cut is undone and the sender goes on from where it was. A
//! paced session that keeps sending (new packets since the timer was armed, or more the
//! window lets go) does not go back on its first [`TIMEOUTS_WITHOUT_RESEND_MAX`]
//! timeouts in a row: the timer backs off and the receiver, seeing any gap in what follows,
//! asks for it; on a busy host late ACKs otherwise cost 1-5% of a paced stream in resends. If
//! the receiver's window is closed and nothing is in flight, the same timer sends window
//! probes (ACKs with the PROBE flag), at most one per `probe_interval_min_us` and backing
//! off up to `rto_max_us`, which the receiver answers at once; any answer proves the peer
//! alive.
//!
//! **Receiver.** It delivers in sequence. Packets past a gap are kept (within the window
//! promised and the out-of-order budgets of [`MemoryConfig`]) until it fills; once [`REORDER_PACKETS`] of them wait, the gap is taken for a
//! loss and one RESTART carries the expected number, re-sent only if the gap outlives a
//! retransmission timeout; a duplicate is dropped and acknowledged again; a packet past the
//! advertised window edge is dropped. ACKs go out
//! every `ack_every_packets` packets, at once for the last fragment of a message, and at most
//! `ack_delay_us` late otherwise; every packet of the session also carries them. The receive
//! window is `receive_window_packets` minus the packets held for the application (fragments
//! of complete messages not yet taken by [`Endpoint::poll_event`], plus those of the message
//! being reassembled unless the application took everything before it); its right edge
//! never moves back. When the application's draining opens the window by a quarter, the
//! receiver sends a window update at once. The connecting side's first packet carries its
//! window, and the accepting side sends nothing before it has that packet, so the connecting
//! side (a client) promises nothing it did not advertise.
//!
//! **Receive budget** ([`grants`]). With [`Config::receive_budget_packets`], an endpoint
//! drives what is sent to it: the window of each session is exactly what the endpoint
//! granted it from a budget shared by all sessions, and a session earns grants only for the
//! messages the application announced with [`Endpoint::expect`] (the answers to its
//! requests). What is in flight toward the endpoint then never exceeds the budget, however
//! many peers answer at once, which is what keeps a switch port from overflowing under
//! incast. [`Endpoint::request`] sends a request and announces its answer together, and
//! holds a request for a large answer until the grant of its session reaches into that
//! answer, so that a server is asked only when it may answer.
//!
//! **Round-trip time.** Jacobson and Karels from timestamp echoes: srtt and rttvar, RTO =
//! srtt + 4 rttvar clamped to `[rto_min_us, rto_max_us]`. Samples come from every
//! acknowledgement that advances, retransmissions included: the echoed timestamp names the
//! transmission that was acknowledged, so Karn's ambiguity does not arise (RFC 7323). A
//! sample ends when the acknowledgement arrived ([`Endpoint::handle_datagram_arrived`]: the
//! kernel's receive timestamp), not when this host read it, and leaves out the `ack_delay`
//! the peer reports having held the echoed packet (QUIC's ack delay, RFC 9002): the RTO
//! follows the network, not the scheduling of busy hosts. Each
//! timer is armed for the RTO plus up to a quarter more at random, so that senders that
//! lost packets in the same overflow do not retransmit in lockstep; backoff doubles it up to
//! `retransmit_timer_max_us` (1 ms). Only where the round trip stays longer than that (even
//! the smallest of the latest [`rtt::RECENT_SAMPLES`] samples reaches it) do timers follow
//! the spread RTO past it; a short path's late samples (a passing queue, a host that was not
//! scheduled) raise srtt + 4 rttvar but not the timers, and a timer that fires during one is
//! found spurious. The time the peer reports holding its ACKs (`ack_delay`) is left out of
//! the samples and added to a timer, as QUIC's PTO adds max_ack_delay, where nothing sent
//! after the packets in flight could show the receiver a gap: a paced session's, and any
//! session's tail (everything queued is in flight: an answer, the end of a request). Without
//! it, servers resent each answer to a client busy with a sequential write 1.5-4 times.
//!
//! **Congestion.** Behind [`CongestionControl`]: [`Adaptive`] (the paper's: slow start from
//! two packets, one more packet per window of ACKs above the threshold, halved on a restart,
//! one packet after a timeout, never growing past the receiver's window nor
//! `window_packets_max`)
//! or [`Fixed`]; chosen with [`Config::congestion`].
//!
//! **Radon** ([`radon`]). Every receiver estimates the queue on the path from each peer from
//! the relative forward delay of its DATA packets (sender timestamps against arrival times,
//! no clock synchronization, a five-element median filter) and reports it in the `queue`
//! byte of every packet it sends back. [`Endpoint::reserve`] gives a session a rate over a
//! period, paced by the paper's percent budget; with [`Config::radon`] the other sessions
//! are paced too and back off when the reported queue passes its target. The pacer is a
//! timer: `poll_timeout` includes the time the next paced packet may go.
//!
//! **Limits.** Every queue has a bound: messages up to `message_bytes_max`, at most
//! [`SEND_QUEUE_BYTES_MAX`] (or one message, if larger) and
//! [`MemoryConfig::send_queue_messages_per_session_max`] messages queued per session and
//! [`MemoryConfig::send_queue_bytes_max`] over all sessions ([`SendError::QueueFull`]
//! beyond), reassembly of one message at a time per session, within an endpoint-wide and a
//! per-source-address budget of bytes reserved at each message's first fragment and held
//! until the application takes the message (a first fragment that does not fit is dropped
//! unacknowledged and resent by its sender; a reassembly that stalls for
//! [`MemoryConfig::reassembly_stall_us`] is given up with its session), packets held past a
//! gap within budgets of their own, endpoint-wide and per source (beyond them dropped
//! unacknowledged; held at most [`MemoryConfig::out_of_order_hold_us`]), `sessions_max`
//! sessions opened by peers, [`CONTROL_QUEUE_MAX`] RESETs waiting to be sent, and the
//! events waiting for the application by the receive windows and the message budget
//! (messages) and [`EVENT_QUEUE_MAX`] (no session opens while more wait), sessions opened
//! per second per source and in total, and half-open sessions ([`AdmissionConfig`]). A peer
//! that breaks the protocol (a fragment out of place, a message over `message_bytes_max`) is
//! reset: both sides report [`Event::Lost`] (the accepting side only if the session had
//! delivered a message). Established sessions without traffic have no timer and stay until
//! closed or reset.

pub mod admission;
pub mod congestion;
mod endpoint;
pub mod grants;
mod message;
pub mod packet;
pub mod radon;
pub mod rtt;
mod session;
pub mod sim;

use bytes::Bytes;
use std::net::SocketAddr;

pub use admission::AdmissionConfig;
pub use congestion::{Adaptive, CongestionControl, Fixed};
pub use endpoint::{
    Endpoint, CONTROL_QUEUE_MAX, EVENT_QUEUE_MAX, FORGOTTEN_SESSIONS_MAX, HOLD_ANSWER_PACKETS_MIN,
    RESET_BURST_MAX, RESET_INTERVAL_US, SEND_QUEUE_BYTES_MAX,
};
pub use message::Message;
pub use packet::{decode, Packet, PacketError, PacketKind, HEADER_LEN, OVERHEAD_LEN, TAG_LEN};
pub use radon::{PacingStats, RadonConfig, Reservation, ReservationError};
pub use session::{
    LOST_AFTER_TIMEOUTS_MIN, REORDER_PACKETS, TIMEOUTS_WITHOUT_RESEND_MAX, WINDOW_INITIAL_PACKETS,
};

// The drivers move endpoints between threads.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Endpoint>();
};

/// What a packet held past a gap costs beyond its payload, for the out-of-order budgets:
/// its header fields, its buffer's bookkeeping and its node in the session's map.
pub const HELD_PACKET_OVERHEAD_BYTES: usize = 192;

/// Microseconds since an arbitrary origin.
pub type Micros = u64;

/// Names a session; chosen at random by the connecting side and carried in every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// Which congestion controller a session uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CongestionKind {
    /// The paper's adaptive window ([`Adaptive`]).
    Adaptive,
    /// A window fixed at this many packets ([`Fixed`]); `Fixed(1)` is stop-and-wait.
    Fixed(u32),
}

/// An endpoint's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest datagram, our header included: 1472 fits a 1500-byte MTU after the IP and UDP
    /// headers; 8972 fits a 9000-byte jumbo frame.
    pub payload_bytes_max: usize,
    /// Cap on the send window, in packets.
    pub window_packets_max: u32,
    /// Receive buffer this endpoint advertises per session, in packets.
    pub receive_window_packets: u32,
    /// Retransmission timeout before the first RTT sample.
    pub rto_initial_us: u64,
    /// Floor of the retransmission timeout.
    pub rto_min_us: u64,
    /// Ceiling of the RTO estimate and of the window-probe interval.
    pub rto_max_us: u64,
    /// Longest a retransmission timer is armed for, backoff and spread included, unless the
    /// round trip stays longer (the smallest of the latest [`rtt::RECENT_SAMPLES`] samples
    /// reaches it): then the spread RTO, since a timer shorter than the round trip would only
    /// fire early, again and again. Doubling stops here rather than at
    /// `rto_max_us`: a datacenter round trip is tens to hundreds of microseconds, and a
    /// timer of many milliseconds leaves the link idle after a loss, which is the incast
    /// collapse itself (the incast paper's fine-grained timeouts). What one retransmission
    /// every millisecond or so costs is bounded: a timeout resends one packet (the window
    /// drops to one), and a receiver with a budget bounds what is in flight toward it anyway.
    pub retransmit_timer_max_us: u64,
    /// How long a session may wait without any answer from its peer (timeouts and window
    /// probes unanswered) before it is reported lost. A time, not a count of timeouts: with
    /// short timers a count would give up on a live peer that a busy host did not schedule.
    /// The time this host was late to handle its own timers is left out, and at least
    /// [`LOST_AFTER_TIMEOUTS_MIN`] timeouts must go unanswered.
    pub peer_lost_after_us: u64,
    /// Shortest wait before a window probe, µs. A closed window opens by the receiver's
    /// own update, so a probe is only insurance against that update's loss: probing every
    /// RTO while a receiver hands out its budget to others (64 servers waiting their turn
    /// behind one client's grants) costs both sides a wakeup per probe and no throughput.
    pub probe_interval_min_us: u64,
    /// The congestion controller.
    pub congestion: CongestionKind,
    /// Largest message `send` accepts and reassembly will hold.
    pub message_bytes_max: usize,
    /// Most sessions peers may open with this endpoint.
    pub sessions_max: usize,
    /// Most sessions peers at one IP address may hold open with this endpoint: a newcomer
    /// beyond it evicts that address's half-open session silent longest, or is dropped.
    pub sessions_per_source_max: usize,
    /// In-order packets per ACK.
    pub ack_every_packets: u32,
    /// An ACK owed is sent at most this late.
    pub ack_delay_us: u64,
    /// Receiver-driven flow control across sessions: at most this many packets granted and
    /// not yet arrived, summed over every session of the endpoint (about one bandwidth-delay
    /// product plus the switch buffer in front of this host). `None`: each session
    /// advertises `receive_window_packets` on its own. With a budget, sessions get window
    /// only for messages announced with [`Endpoint::expect`]: for endpoints that receive only
    /// answers they asked for, such as a client.
    pub receive_budget_packets: Option<u32>,
    /// Limits on the sessions peers open: rates, and the eviction of half-open sessions.
    pub admission: AdmissionConfig,
    /// Accept a peer's new session only with a key admitted for it beforehand
    /// ([`Endpoint::admit`], after a handshake elsewhere): a server of an authenticated
    /// cluster. Without, peers open sessions freely, tagged with the public key.
    pub require_session_keys: bool,
    /// Radon ([`radon`]): pace this endpoint's sessions (best effort backing off on the
    /// queue its peers measure, reserved ones slowing for a queue past their limit,
    /// [`radon::RadonConfig::reserved_queue_limit_targets`]). `None`: only sessions given a
    /// reservation are paced, at their rate whatever the queue ([`Endpoint::reserve`], with
    /// [`radon::RadonConfig::reservation_only`]).
    pub radon: Option<radon::RadonConfig>,
    /// A reservation given to every session this endpoint opens ([`Endpoint::connect`] and
    /// the like): a client whose whole traffic is one reserved stream.
    pub connect_reservation: Option<radon::Reservation>,
    /// Bounds on the memory peers can make the endpoint hold: messages being reassembled
    /// and messages queued to send.
    pub memory: MemoryConfig,
    /// The largest datagram a transport sends toward any peer, below what the path carries
    /// (`None`: the path's MTU decides, ~64 KiB on loopback). 1,472 on loopback measures a
    /// LAN's per-packet costs on one host (`tessera --datagram-bytes`).
    pub path_datagram_bytes_max: Option<usize>,
}

/// Bounds on the memory an endpoint holds for its peers (issue 15).
///
/// - **Messages**: a message reserves its whole announced length when its first fragment
///   is taken (a one-packet message, its length), and holds it while it is reassembled and
///   then until the application takes it with [`Endpoint::poll_event`], so a message
///   admitted always has room to complete; a first fragment that does not fit is dropped
///   unacknowledged (the sender resends it after its timeout, as for a loss). A peer that
///   starts messages and never finishes them holds at most the budget of its address, for
///   at most `reassembly_stall_us` per message: then its session is given up.
/// - **Packets past a gap**, kept until the gap fills: each costs its payload plus
///   [`HELD_PACKET_OVERHEAD_BYTES`], within their own budgets, endpoint-wide and per source
///   address. One that does not fit is dropped unacknowledged (go-back-N resends it after
///   the gap), and the packets of a gap that has not filled for `out_of_order_hold_us` are
///   dropped, so a peer that sends only past a gap holds them for that long at most. They
///   are a cache: dropping them never loses or corrupts anything, it only costs a resend.
/// - **Queued answers**: bytes in all and messages per session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Bytes of messages being reassembled or waiting for the application, summed over
    /// every session.
    pub reassembly_bytes_max: usize,
    /// The same, over the sessions of one source IP address.
    pub reassembly_bytes_per_source_max: usize,
    /// A message being reassembled that takes no fragment for this long, µs, is given up
    /// with its session ([`Stats::reassemblies_stalled`]).
    pub reassembly_stall_us: Micros,
    /// Bytes of packets held past a gap, summed over every session.
    pub out_of_order_bytes_max: usize,
    /// The same, over the sessions of one source IP address.
    pub out_of_order_bytes_per_source_max: usize,
    /// Packets held past a gap that has not filled for this long, µs, are dropped
    /// ([`Stats::out_of_order_expired`]); the session stays.
    pub out_of_order_hold_us: Micros,
    /// Bytes queued to send and not yet acknowledged, summed over every session; past it
    /// `send` refuses ([`SendError::QueueFull`]), also into an empty queue.
    pub send_queue_bytes_max: usize,
    /// Messages queued on one session and not yet acknowledged; past it `send` refuses.
    pub send_queue_messages_per_session_max: usize,
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            // Generous: 32 messages of the largest size at once, 16 from one address (every
            // client of a local cluster shares 127.0.0.1).
            reassembly_bytes_max: 32 * (17 << 20),
            reassembly_bytes_per_source_max: 16 * (17 << 20),
            reassembly_stall_us: 5_000_000,
            // Four honest sessions' worth per address (a sender keeps at most 64 packets,
            // of up to 64 KiB on loopback, in flight), sixteen in all.
            out_of_order_bytes_max: 64 << 20,
            out_of_order_bytes_per_source_max: 16 << 20,
            out_of_order_hold_us: 1_000_000,
            send_queue_bytes_max: 1 << 30,
            send_queue_messages_per_session_max: 4096,
        }
    }
}

impl MemoryConfig {
    /// Whether every bound admits a message of `message_bytes_max` (and a packet held past
    /// a gap), every total is at least its per-source bound, and timeouts have a length.
    pub fn is_valid(&self, message_bytes_max: usize) -> bool {
        self.reassembly_bytes_per_source_max >= message_bytes_max
            && self.reassembly_bytes_max >= self.reassembly_bytes_per_source_max
            && self.out_of_order_bytes_per_source_max
                >= packet::DATAGRAM_LEN_MAX + HELD_PACKET_OVERHEAD_BYTES
            && self.out_of_order_bytes_max >= self.out_of_order_bytes_per_source_max
            && self.out_of_order_hold_us > 0
            && self.send_queue_bytes_max >= message_bytes_max
            && self.reassembly_stall_us > 0
            && self.send_queue_messages_per_session_max > 0
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            payload_bytes_max: 1472,
            window_packets_max: 64,
            receive_window_packets: 256,
            rto_initial_us: 1_000,
            rto_min_us: 300,
            rto_max_us: 200_000,
            retransmit_timer_max_us: 1_000,
            peer_lost_after_us: 1_000_000,
            probe_interval_min_us: 20_000,
            congestion: CongestionKind::Adaptive,
            message_bytes_max: 17 << 20,
            sessions_max: 4096,
            sessions_per_source_max: 1024,
            ack_every_packets: 2,
            ack_delay_us: 100,
            receive_budget_packets: None,
            admission: AdmissionConfig::default(),
            require_session_keys: false,
            radon: None,
            connect_reservation: None,
            memory: MemoryConfig::default(),
            path_datagram_bytes_max: None,
        }
    }
}

/// Why a [`Config`] cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `payload_bytes_max` leaves no room for a payload, or exceeds what `payload_len` can say.
    #[error("payload_bytes_max {0} must be in {min}..={max}", min = OVERHEAD_LEN + 1, max = packet::DATAGRAM_LEN_MAX)]
    PayloadBytes(usize),
    /// `window_packets_max` is zero.
    #[error("window_packets_max must be at least 1")]
    WindowPackets,
    /// `receive_window_packets` is below the window every sender may assume.
    #[error("receive_window_packets {0} must be at least {WINDOW_INITIAL_PACKETS}")]
    ReceiveWindow(u32),
    /// The RTO bounds are not `1 <= min <= initial <= max`.
    #[error("RTO bounds must satisfy 1 <= min ({min}) <= initial ({initial}) <= max ({max})")]
    Rto {
        /// `rto_min_us`.
        min: u64,
        /// `rto_initial_us`.
        initial: u64,
        /// `rto_max_us`.
        max: u64,
    },
    /// `retransmit_timer_max_us` is below `rto_min_us`.
    #[error("retransmit_timer_max_us {timer_max} must be at least rto_min_us {min}")]
    RetransmitTimer {
        /// `retransmit_timer_max_us`.
        timer_max: u64,
        /// `rto_min_us`.
        min: u64,
    },
    /// `peer_lost_after_us` is zero.
    #[error("peer_lost_after_us must be at least 1")]
    PeerLostAfter,
    /// `Fixed(0)` can never send.
    #[error("a fixed congestion window must be at least 1 packet")]
    FixedWindow,
    /// `message_bytes_max` does not fit the 32-bit `message_len`.
    #[error("message_bytes_max {0} exceeds u32::MAX")]
    MessageBytes(usize),
    /// `sessions_max` or `sessions_per_source_max` is zero.
    #[error("sessions_max and sessions_per_source_max must be at least 1")]
    Sessions,
    /// `ack_every_packets` is zero.
    #[error("ack_every_packets must be at least 1")]
    AckEvery,
    /// `receive_budget_packets` is zero.
    #[error("receive_budget_packets must be at least 1")]
    ReceiveBudget,
    /// `connect_reservation` is not a valid reservation.
    #[error("connect_reservation: {0}")]
    Reservation(radon::ReservationError),
    /// Radon's link rate is zero.
    #[error("radon link_bytes_per_s must be at least 1")]
    RadonLink,
    /// A limit of [`AdmissionConfig`] is zero, so no session could ever open.
    #[error("every admission limit (rates, bursts, sources, half-open sessions and timeout) must be at least 1")]
    Admission,
    /// A bound of [`MemoryConfig`] admits no message of `message_bytes_max` or no datagram
    /// (or a total is below its per-source bound, or a timeout or message count is zero).
    #[error("the reassembly budgets must each hold a message of message_bytes_max and the out-of-order ones a datagram (each total at least its per-source one), and the timeouts and queued messages be at least 1")]
    Memory,
}

impl Config {
    /// Checks the settings; [`Endpoint::new`] panics on what this refuses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.payload_bytes_max <= OVERHEAD_LEN
            || self.payload_bytes_max > packet::DATAGRAM_LEN_MAX
        {
            return Err(ConfigError::PayloadBytes(self.payload_bytes_max));
        }
        if self.window_packets_max == 0 {
            return Err(ConfigError::WindowPackets);
        }
        if self.receive_window_packets < WINDOW_INITIAL_PACKETS {
            return Err(ConfigError::ReceiveWindow(self.receive_window_packets));
        }
        if !(1 <= self.rto_min_us
            && self.rto_min_us <= self.rto_initial_us
            && self.rto_initial_us <= self.rto_max_us)
        {
            return Err(ConfigError::Rto {
                min: self.rto_min_us,
                initial: self.rto_initial_us,
                max: self.rto_max_us,
            });
        }
        if self.retransmit_timer_max_us < self.rto_min_us {
            return Err(ConfigError::RetransmitTimer {
                timer_max: self.retransmit_timer_max_us,
                min: self.rto_min_us,
            });
        }
        if self.peer_lost_after_us == 0 {
            return Err(ConfigError::PeerLostAfter);
        }
        if self.radon.is_some_and(|radon| radon.link_bytes_per_s == 0) {
            return Err(ConfigError::RadonLink);
        }
        if let Some(reservation) = self.connect_reservation {
            reservation.validate().map_err(ConfigError::Reservation)?;
        }
        if self.congestion == CongestionKind::Fixed(0) {
            return Err(ConfigError::FixedWindow);
        }
        if u32::try_from(self.message_bytes_max).is_err() {
            return Err(ConfigError::MessageBytes(self.message_bytes_max));
        }
        if self.sessions_max == 0 || self.sessions_per_source_max == 0 {
            return Err(ConfigError::Sessions);
        }
        if self.ack_every_packets == 0 {
            return Err(ConfigError::AckEvery);
        }
        if self.receive_budget_packets == Some(0) {
            return Err(ConfigError::ReceiveBudget);
        }
        if !self.admission.is_valid() {
            return Err(ConfigError::Admission);
        }
        if !self.memory.is_valid(self.message_bytes_max) {
            return Err(ConfigError::Memory);
        }
        Ok(())
    }

    /// Largest fragment of a message one packet carries.
    pub fn fragment_bytes_max(&self) -> usize {
        self.payload_bytes_max - OVERHEAD_LEN
    }
}

/// A datagram to send: its packet's header, payload and tag, one after the other. The payload
/// is a slice of the message it is a fragment of, not a copy, so that a driver sends the three
/// parts as they are (one `iovec` each, as the UDP driver does) and the payload is copied only
/// by the kernel; [`contents`](Transmit::contents) joins them, for simulators and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub destination: SocketAddr,
    /// The packet's header.
    pub header: [u8; HEADER_LEN],
    /// The packet's payload (empty but for DATA).
    pub payload: Bytes,
    /// The packet's MAC, over header and payload.
    pub tag: [u8; TAG_LEN],
}

impl Transmit {
    /// The datagram carrying `packet` to `destination`, tagged with `key`.
    pub fn of(destination: SocketAddr, packet: Packet, mac: &tessera_auth::PacketMac) -> Transmit {
        Transmit::of_hashed(destination, packet, mac, None)
    }

    /// [`of`](Self::of), with the payload's part of the tag from `hash` where it fits
    /// ([`tessera_auth::PacketMac::tag_hashed`]).
    pub fn of_hashed(
        destination: SocketAddr,
        packet: Packet,
        mac: &tessera_auth::PacketMac,
        hash: Option<&tessera_auth::PayloadHash>,
    ) -> Transmit {
        let (header, tag) = packet.encode_parts_hashed(mac, hash);
        Transmit {
            destination,
            header,
            payload: packet.payload,
            tag,
        }
    }

    /// Bytes of the datagram.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len() + TAG_LEN
    }

    /// Always false: a datagram has at least a header and a tag.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The datagram as one buffer (a copy of its parts).
    pub fn contents(&self) -> Vec<u8> {
        let mut datagram = Vec::with_capacity(self.len());
        datagram.extend_from_slice(&self.header);
        datagram.extend_from_slice(&self.payload);
        datagram.extend_from_slice(&self.tag);
        datagram
    }
}

/// What the endpoint has to tell the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A peer opened a session to us.
    Opened {
        /// The new session.
        session: SessionId,
        /// Who opened it.
        peer: SocketAddr,
    },
    /// One whole message, in order, exactly once.
    Message {
        /// The session it came on.
        session: SessionId,
        /// Who sent it.
        peer: SocketAddr,
        /// The message.
        message: Bytes,
    },
    /// The peer stopped answering (for `peer_lost_after_us`) or sent a RESET: the
    /// session is gone, with whatever it had queued.
    Lost {
        /// The session.
        session: SessionId,
        /// Its peer.
        peer: SocketAddr,
        /// Why.
        reason: LossReason,
    },
}

/// Why a session was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// The peer answered with a RESET: it is alive but does not know the session (it
    /// restarted, or closed it). A new session to it may well work.
    Reset,
    /// The peer stopped answering.
    TimedOut,
    /// The peer broke the protocol (e.g. a message over the size limit).
    Violation,
    /// The peer opened the session and sent nothing on it for
    /// [`AdmissionConfig::idle_timeout_us`]: this side closed it (and sent the peer a RESET).
    Idle,
}

/// Why [`Endpoint::send`] refused a message.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// No such session: never opened, or closed.
    #[error("unknown session {0:?}")]
    UnknownSession(SessionId),
    /// The message exceeds `message_bytes_max`.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// `message_bytes_max`.
        max: usize,
    },
    /// The session was lost (the peer stopped answering or reset it).
    #[error("session {0:?} was lost")]
    Lost(SessionId),
    /// The session already holds as many unacknowledged bytes as it may
    /// ([`SEND_QUEUE_BYTES_MAX`]); try again once some are acknowledged.
    #[error("session {session:?} has {queued_bytes} bytes queued, at most {max}")]
    QueueFull {
        /// The session.
        session: SessionId,
        /// Bytes queued and not yet acknowledged.
        queued_bytes: usize,
        /// The bound.
        max: usize,
    },
}

/// Counters of everything an endpoint did and refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams handed out by `poll_transmit`.
    pub datagrams_sent: u64,
    /// Datagrams given to `handle_datagram`.
    pub datagrams_received: u64,
    /// DATA packets sent, retransmissions included.
    pub data_packets_sent: u64,
    /// DATA packets sent more than once.
    pub retransmissions: u64,
    /// Of the retransmissions, those a retransmission timeout sent (going back to the oldest
    /// unacknowledged packet, until the next acknowledgement): on a path that drops nothing
    /// these are the spurious ones. The rest followed a RESTART (the receiver saw a gap).
    pub timeout_retransmissions: u64,
    /// RESTARTs sent (gaps seen, and re-sent).
    pub restarts_sent: u64,
    /// RESTARTs received.
    pub restarts_received: u64,
    /// RESTARTs that made the sender go back.
    pub restarts_honoured: u64,
    /// Retransmission timer expiries (packets were in flight and went unacknowledged).
    pub timeouts: u64,
    /// The longest retransmission timeout that expired, from its arming to its handling, µs:
    /// the timer's length plus however late a busy host ran it.
    pub timeout_us_max: u64,
    /// The longest retransmission timer (the length armed: the RTO, backoff included)
    /// among those that expired, µs; without the wait for the peer's ACK holds
    /// (`ack_hold_wait_us_max`), which is the peer's, not the RTO's.
    pub timer_us_max: u64,
    /// The longest wait for the peer's reported ACK holds added to an expired timer past
    /// its RTO, µs (paced packets, packets the peer granted, a session's tail: QUIC's
    /// max_ack_delay in its PTO).
    pub ack_hold_wait_us_max: u64,
    /// Retransmission timeouts whose timer was armed for longer than
    /// `retransmit_timer_max_us`, because the round trip stayed longer than that (a slow
    /// path, a standing queue, or hosts too busy to move packets on time).
    pub long_timeouts: u64,
    /// Runs of retransmission timeouts (one or more in a row without progress) found
    /// spurious afterwards: the packet had arrived, only its acknowledgement was late (Eifel
    /// detection, RFC 3522). Their timeouts are counted in `timeouts` too.
    pub spurious_timeouts: u64,
    /// Retransmission timeouts of a paced session that resent nothing: it had sent new
    /// packets since the timer was armed, enough past the oldest unacknowledged one for the
    /// receiver to see a gap and ask for it (RESTART). Counted in `timeouts` too.
    pub timeouts_without_resend: u64,
    /// Window-probe timer expiries (the peer's window was closed and nothing in flight).
    pub probe_timeouts: u64,
    /// Times this receiver extended a session's window from its receive budget.
    pub grants: u64,
    /// Requests held until the receive budget granted into their answers ([`Endpoint::request`]).
    pub requests_held: u64,
    /// Bare ACKs sent (not counting acknowledgements piggybacked on other packets).
    pub acks_sent: u64,
    /// Window probes sent.
    pub probes_sent: u64,
    /// RESETs sent.
    pub resets_sent: u64,
    /// RESETs received for a known session.
    pub resets_received: u64,
    /// Datagrams dropped: shorter than their header or announced payload.
    pub dropped_truncated: u64,
    /// Datagrams dropped: another protocol version.
    pub dropped_version: u64,
    /// Datagrams dropped: another magic, trailing bytes, or inconsistent fields.
    pub dropped_malformed: u64,
    /// Packets dropped: for a session this endpoint does not know.
    pub dropped_unknown_session: u64,
    /// Packets dropped: would open a session beyond `sessions_max`.
    pub dropped_sessions_full: u64,
    /// Packets dropped: would open a session beyond `sessions_per_source_max` of their
    /// address, none of whose sessions was half-open.
    pub dropped_sessions_source_full: u64,
    /// Packets dropped: would open a session faster than its source may
    /// ([`AdmissionConfig::opens_per_second_per_source`]).
    pub dropped_opens_source_rate: u64,
    /// Packets dropped: would open a session faster than all peers together may
    /// ([`AdmissionConfig::opens_per_second`]).
    pub dropped_opens_total_rate: u64,
    /// Half-open sessions evicted, for their silence or to make room for a newcomer.
    pub half_open_evicted: u64,
    /// Established sessions peers opened, closed after [`AdmissionConfig::idle_timeout_us`]
    /// of silence (also counted in `sessions_lost`).
    pub idle_sessions_closed: u64,
    /// Packets dropped: DATA past the advertised window edge, or an ACK of the never sent.
    pub dropped_out_of_window: u64,
    /// DATA packets that arrived past a gap and were kept until it filled (reordered on the
    /// way, or after a loss until the RESTART's retransmission came).
    pub held_out_of_order: u64,
    /// DATA packets dropped: already received.
    pub dropped_duplicate: u64,
    /// RESETs not sent because of the rate limit or a full control queue.
    pub resets_suppressed: u64,
    /// Sessions reset because the peer broke the protocol.
    pub protocol_violations: u64,
    /// Messages queued by `send`.
    pub messages_sent: u64,
    /// Whole messages delivered to the event queue.
    pub messages_delivered: u64,
    /// Sessions opened by peers.
    pub sessions_opened: u64,
    /// Sessions reported lost (timeouts, RESETs or violations).
    pub sessions_lost: u64,
    /// Times a sender with data and congestion window to spare was blocked by the
    /// receiver's window.
    pub window_limited: u64,
    /// Datagrams dropped: their MAC is not the session key's (forged, or changed on the way:
    /// since format 4 the MAC is the only integrity check), or they would open a session no
    /// key was admitted for.
    pub dropped_unauthentic: u64,
    /// First fragments dropped unacknowledged: their message did not fit the reassembly
    /// budget left (endpoint-wide or of their source address; [`MemoryConfig`]).
    pub dropped_reassembly_budget: u64,
    /// Sessions lost because the message they were reassembling made no progress for
    /// [`MemoryConfig::reassembly_stall_us`].
    pub reassemblies_stalled: u64,
    /// DATA packets past a gap dropped unacknowledged: they did not fit the out-of-order
    /// budget left (endpoint-wide or of their source address; [`MemoryConfig`]).
    pub dropped_out_of_order_budget: u64,
    /// Packets held past a gap dropped because it did not fill for
    /// [`MemoryConfig::out_of_order_hold_us`].
    pub out_of_order_expired: u64,
    /// Messages `send` refused because the session's or the endpoint's send queue was full
    /// ([`SendError::QueueFull`]): answers dropped for a peer that does not take them.
    pub sends_refused_queue_full: u64,
}

impl Stats {
    /// Every counter by name, for metrics and experiment reports.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("datagrams_sent", self.datagrams_sent),
            ("datagrams_received", self.datagrams_received),
            ("data_packets_sent", self.data_packets_sent),
            ("retransmissions", self.retransmissions),
            ("timeout_retransmissions", self.timeout_retransmissions),
            ("restarts_sent", self.restarts_sent),
            ("restarts_received", self.restarts_received),
            ("restarts_honoured", self.restarts_honoured),
            ("timeouts", self.timeouts),
            ("timeout_us_max", self.timeout_us_max),
            ("timer_us_max", self.timer_us_max),
            ("ack_hold_wait_us_max", self.ack_hold_wait_us_max),
            ("long_timeouts", self.long_timeouts),
            ("spurious_timeouts", self.spurious_timeouts),
            ("timeouts_without_resend", self.timeouts_without_resend),
            ("probe_timeouts", self.probe_timeouts),
            ("grants", self.grants),
            ("requests_held", self.requests_held),
            ("acks_sent", self.acks_sent),
            ("probes_sent", self.probes_sent),
            ("resets_sent", self.resets_sent),
            ("resets_received", self.resets_received),
            ("dropped_truncated", self.dropped_truncated),
            ("dropped_unauthentic", self.dropped_unauthentic),
            ("dropped_version", self.dropped_version),
            ("dropped_malformed", self.dropped_malformed),
            ("dropped_unknown_session", self.dropped_unknown_session),
            ("dropped_sessions_full", self.dropped_sessions_full),
            (
                "dropped_sessions_source_full",
                self.dropped_sessions_source_full,
            ),
            ("dropped_opens_source_rate", self.dropped_opens_source_rate),
            ("dropped_opens_total_rate", self.dropped_opens_total_rate),
            ("half_open_evicted", self.half_open_evicted),
            ("idle_sessions_closed", self.idle_sessions_closed),
            ("dropped_out_of_window", self.dropped_out_of_window),
            ("held_out_of_order", self.held_out_of_order),
            ("dropped_duplicate", self.dropped_duplicate),
            ("resets_suppressed", self.resets_suppressed),
            ("protocol_violations", self.protocol_violations),
            ("messages_sent", self.messages_sent),
            ("messages_delivered", self.messages_delivered),
            ("sessions_opened", self.sessions_opened),
            ("sessions_lost", self.sessions_lost),
            ("window_limited", self.window_limited),
            ("dropped_reassembly_budget", self.dropped_reassembly_budget),
            ("reassemblies_stalled", self.reassemblies_stalled),
            (
                "dropped_out_of_order_budget",
                self.dropped_out_of_order_budget,
            ),
            ("out_of_order_expired", self.out_of_order_expired),
            ("sends_refused_queue_full", self.sends_refused_queue_full),
        ]
    }
}

/// A snapshot of one session's flow-control state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The peer.
    pub peer: SocketAddr,
    /// The congestion window, in packets (capped at `window_packets_max`).
    pub congestion_window: u32,
    /// Packets the peer can accept past the oldest unacknowledged one, as last advertised.
    pub peer_receive_window: u32,
    /// Packets sent and not acknowledged in the current round (go-back-N).
    pub in_flight: u32,
    /// Smoothed RTT, 0 before the first sample.
    pub srtt_us: u64,
    /// Retransmission timeout, without backoff.
    pub rto_us: u64,
    /// Packets queued and not yet sent in this round.
    pub queued_packets: u64,
    /// Bytes queued and not yet acknowledged.
    pub queued_bytes: u64,
    /// Messages queued (or held for their grant) and not yet acknowledged whole.
    pub queued_messages: u64,
    /// Messages the peer acknowledged whole since the session opened. A message queued now
    /// is the `messages_acknowledged + queued_messages`-th: the peer has it whole once this
    /// count reaches that (a transport tells a request still on its way from one the peer
    /// holds).
    pub messages_acknowledged: u64,
    /// The receive window this side would advertise now.
    pub receive_window: u32,
    /// Consecutive timeouts without progress.
    pub backoffs: u32,
    /// Oldest unacknowledged sequence number.
    pub send_base: u64,
    /// Next sequence number expected from the peer.
    pub recv_next: u64,
    /// Radon's estimate of the queue on the path from the peer, µs.
    pub queue_delay_us: u64,
    /// The queue the peer last reported on the path toward it, µs.
    pub peer_queue_delay_us: u64,
    /// The pacer's current wait between DATA packets, ns (0: not paced).
    pub pacing_wait_ns: u64,
    /// The rate a best-effort session's grants go at under Radon, bytes/s on the wire (0:
    /// not paced so; see [`grants`]).
    pub best_effort_grant_rate: u64,
    /// The rate reserved for what this side sends, if any.
    pub reservation: Option<radon::Reservation>,
    /// The reservation's periods and deadlines so far.
    pub deadlines: radon::PacingStats,
}

#[cfg(test)]
mod stats_tests {
    use super::Stats;

    #[test]
    fn counters_name_every_field_once() {
        let counters = Stats::default().counters();
        let fields = format!("{:?}", Stats::default()).matches(": 0").count();
        assert_eq!(counters.len(), fields);
        let mut names: Vec<_> = counters.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), fields);
    }
}
