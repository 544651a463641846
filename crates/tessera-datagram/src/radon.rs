//! Radon: rates and deadlines for streams, from relative forward delay (Shewmaker, "Investigating
//! efficient real-time performance guarantees on storage networks", UCSC 2009).
//!
//! Two halves, one at each end of a session:
//! - The **receiver** measures congestion without clock synchronization: for each pair of DATA
//!   packets, the relative forward delay `RFD_ij = (R_j - R_i) - (S_j - S_i)` from the
//!   sender's timestamps `S` (in every header) and its own arrival times `R`. Summed, the RFDs
//!   are the one-way delay relative to the first packet; a five-element median filter removes
//!   single outliers (a host that was not scheduled), and the filtered delay above its minimum
//!   is the bottleneck queue (TCP Santa Cruz's model, as time). [`QueueEstimator`] does this;
//!   the estimate goes back to the sender in the header's `queue` byte ([`queue_code`]).
//! - The **sender** paces its DATA packets ([`Pacer`]). A session with a [`Reservation`]
//!   schedules by percent budget: with `e_i` the wire time still owed this period and `d` the
//!   period's end, `%budget = e_i / (d - t)`, the wait target `w_op = w_min / %budget`, and the
//!   next wait `w_{k+1} = min(w_max, max(w_min, w_k - (w_k - w_op) / 2))`, where `w_min` is
//!   one packet's time on the sender's link. It holds that pace whatever the queue does, but
//!   catches up on a deficit at only [`CATCH_UP_RATE_EIGHTHS`] of its rate, not its link's,
//!   while the queue is high. A best-effort session backs off instead: it starts at a
//!   sixteenth of its link, moves its rate in proportion to itself and to the distance of the
//!   reported queue from [`RadonConfig::queue_target_us`] (counting at most a millisecond
//!   per report) and, above the target, inversely to the queue's level
//!   ([`best_effort_damped`]),
//!   and above twice the target cuts it in proportion to the queue ([`best_effort_cut`]),
//!   at most once per round of packets (the reports must come from packets sent after the
//!   last cut), so that reserved
//!   streams keep their budget and best-effort ones fill what is left. The receiver reports
//!   the queue every session's packets show ([`PortQueue`]), not only the session's own.
//!   With [`BudgetKind::Window`] a reserved session sends windows instead: "less laxity, more
//!   window", each after a dispatch offset drawn within the queue the peer reports, from a
//!   random number the session passes in.
//!
//! The pacer is time in the state machine: the session tells the endpoint when it may send
//! next, and the endpoint's `poll_timeout` includes it, like the retransmission timer.
//! Nothing here reads a clock.

use crate::Micros;

/// Samples in the median filter (the paper's five).
pub const MEDIAN_FILTER_LEN: usize = 5;

/// Largest wait between two packets of a session, in any mode.
pub const WAIT_US_MAX: Micros = 100_000;

/// The median filter forgets samples of packets sent longer than this before the newest: they
/// tell of a queue that has since drained or been replaced, and a sender slowed down sends
/// too rarely to push them out.
pub const SAMPLE_AGE_US_MAX: Micros = 1_000;

/// The most time one report of the queue counts for when a best-effort session moves its
/// rate ([`BEST_EFFORT_GROWTH_US`]; with the change clamped to a quarter of the rate).
pub const BEST_EFFORT_REPORT_US_MAX: Micros = SAMPLE_AGE_US_MAX;

/// A receiver forgets the port's queue ([`PortQueue`]) this long after the last DATA packet
/// of any session: the same age as the samples of one session's median filter, twice over.
pub const PORT_QUEUE_AGE_US_MAX: Micros = 2 * SAMPLE_AGE_US_MAX;

/// Below twice its queue target a best-effort session moves its rate in proportion to its
/// own rate: on an empty queue it grows by this share of itself per this many µs of reports
/// (`e` in that time). Grown by a fixed share of the link instead (the link's rate in
/// 20 ms), three best-effort senders beside reservations that left them a
/// twentieth of the port overshot it by a fifth within a millisecond of their reports, and
/// the port dropped the admitted streams' packets.
pub const BEST_EFFORT_GROWTH_US: Micros = 5_000;

/// A reserved session behind its budget sends at most this many eighths of its steady pace
/// (its budget over the period less the send-by margin) while its peer reports more than
/// [`RadonConfig::queue_target_us`] of queue, instead of at `w_min` (its link's rate):
/// catching up at the link's rate into a full port kept it full for the rest of the period
/// and the port dropped the reserved streams' own packets. (Above twice the target only,
/// as until session 11, a reservation catching up held the queue between the target and
/// twice it, and best effort beside it, aiming for the target, fell to its floor: in `lab
/// radon`'s punctuated run on a loaded host a short stream sent at a hundredth of the link
/// for 300 ms with the port's queue at 20-34 frames.)
pub const CATCH_UP_RATE_EIGHTHS: u64 = 9;

/// A best-effort session cut far over its queue target keeps at least this share of its rate
/// ([`best_effort_cut`]).
pub const BEST_EFFORT_CUT_DIVISOR_MAX: u64 = 8;

/// A best-effort session never paces slower than its link's rate divided by this: a
/// sender slowed to a trickle hears of the queue too rarely to come back.
pub const BEST_EFFORT_RATE_DIVISOR_MIN: u64 = 100;

/// A best-effort session starts at its link's rate divided by this, and ramps up from there:
/// it does not know what the reservations on its path leave it. (Three starting at a quarter
/// beside reservations of 0.875 of the port overflowed it at once.)
pub const BEST_EFFORT_START_DIVISOR: u64 = 16;

/// A best-effort session's grants (a reader's, [`crate::grants`]) start at its link's rate
/// divided by this: twice [`BEST_EFFORT_START_DIVISOR`]'s start. What a reader has granted
/// and not received is bounded by its receive budget (20 packets in clients), so a start too
/// high costs the port at most that, where senders' starts overflowed it; and a short read
/// spent much of itself ramping up from a sixteenth (`lab radon --mirror`'s punctuated short
/// readers, refused: 0.78-0.86 of what the reserved stream left of the port; in test
/// `mirror`'s short reader 0.80-1.05 from a sixteenth, 0.88-1.10 from an eighth).
pub const BEST_EFFORT_GRANT_START_DIVISOR: u64 = 8;

/// The smallest window of [`BudgetKind::Window`] (the paper's 2).
pub const WINDOW_PACKETS_MIN: u64 = 2;

/// A window-paced stream's largest window carries its rate this many times over, in
/// quarters.
pub const WINDOW_RATE_MAX_QUARTERS: u64 = 16;

/// A window-paced stream's window never falls below what carries its rate this many times
/// over, in quarters (the paper's floor is 2 packets, too few for a stream that needs more
/// per round trip: it fell behind early in each period and missed the deadline catching up).
pub const WINDOW_RATE_MIN_QUARTERS: u64 = 4;

/// A reserved session whose packets went out late (the host did not run its sender in
/// time) may send the next ones closer together than their wait, back onto its schedule,
/// by at most this much: on a busy host each wakeup was late and the stream never reached
/// its rate (`lab radon`: sleeps of 100 µs woke 75 µs late at the median, and the stream
/// at 0.749 of the port, 80 µs a packet, got 0.58-0.76 of its target).
pub const CATCH_UP_US_MAX: Micros = 1_000;

/// What Tessera's clients give [`RadonConfig::send_by_margin_divisor`]: a reserved
/// stream's bytes are due *done* by the period's end (acknowledged, written), which takes
/// the last packet's trip and the server's work after it, so its budget is due a sixteenth
/// of the period before, at most [`SEND_BY_MARGIN_US_MAX`].
pub const SEND_BY_MARGIN_DIVISOR: u64 = 16;

/// A reserved session's send-by margin is at most this long, whatever its period: the
/// margin covers the last packet's trip, the server's work on it and the answer's way back
/// (`lab radon --quick` on a quiet machine: a period's last chunk done about 5 ms after its
/// budget was due sent), which do not grow with the period. A margin of a share of the period alone makes a stream send at
/// `n / (n - 1)` of its rate while it sends: the punctuated run's stream at 0.749 of the
/// port sent at 0.799 of it, which left the short best-effort streams beside it 0.201, at
/// most 0.80 of the 0.251 the reservation leaves, and they got 0.72-0.75 of it (local CI,
/// 2026-11-27). Capped, the stream at 0.749 sends at 0.780 of the port in 250 ms periods
/// and at 0.757 in 1 s periods. The price: past its budget a session sends its framing at
/// the reserved rate ([`FRAMING_ALLOWANCE_DIVISOR`]), so only framing of up to `m / P` of
/// the budget goes before the deadline (1% in 1 s periods; a request's header is 0.1%).
pub const SEND_BY_MARGIN_US_MAX: Micros = 10_000;

/// A reserved session with the rate-based budget may send this share of its period's budget
/// beyond it, at the reserved rate, while data stays queued: the reservation counts the application's bytes, and the
/// session's payload carries their framing too (a request's header with every message).
/// Stopped at the budget, the last packets of a period's requests waited for the next
/// period, and the period missed its deadline by that wait (`lab radon`: 11-22% of deadlines
/// met while the rate was 0.985-1.003 of the target).
pub const FRAMING_ALLOWANCE_DIVISOR: u64 = 64;

/// The queueing delay best effort aims for by default, µs. The receiver's RFD estimate
/// carries its host's scheduling as well as the port's queue (in `lab radon` on a quiet
/// machine it read a mean of 1-3 frames, 60-180 µs, where `tc` saw 0.2-1 frame); at the
/// old 200 µs, best-effort senders backed off on that noise and the punctuated run's short
/// streams got 0.49-0.73 of what the reservation left (three quick runs), at 1 ms
/// 0.71-0.85 (two runs; the port's mean queue 6.5-7 frames of its 128).
pub const QUEUE_TARGET_US_DEFAULT: Micros = 1_000;

/// A reserved session paces slower past this many queue targets of queue reported by its
/// peer, in proportion to the queue ([`RadonConfig::reserved_queue_limit_targets`]): at 4
/// (4 ms at [`QUEUE_TARGET_US_DEFAULT`], 53 frames, 40% of the lab's 128-frame buffer at
/// 200 Mbit/s) a port that admission keeps under its share seldom reaches it (`lab radon`'s
/// admitted runs peaked at 26-34 frames), while reservations that overload it get its rate
/// in proportion, not its whole buffer.
pub const RESERVED_QUEUE_LIMIT_TARGETS: u64 = 4;

/// Shortest reservation period accepted.
pub const PERIOD_US_MIN: Micros = 1_000;

/// A stream's reserved rate: `rate_bytes_per_s` of payload in every period of `period_us`, each
/// period's bytes due by its end (the deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Payload bytes per second.
    pub rate_bytes_per_s: u64,
    /// The period, µs; each period's bytes are due at its end.
    pub period_us: Micros,
}

/// Why a [`Reservation`] cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    /// The rate is zero.
    #[error("reserved rate must be at least 1 byte/s")]
    Rate,
    /// The period is shorter than [`PERIOD_US_MIN`].
    #[error("reservation period must be at least {PERIOD_US_MIN} µs, not {0}")]
    Period(Micros),
    /// No such session.
    #[error("unknown session {0:?}")]
    UnknownSession(crate::SessionId),
}

impl Reservation {
    /// Checks the reservation.
    pub fn validate(&self) -> Result<(), ReservationError> {
        if self.rate_bytes_per_s == 0 {
            return Err(ReservationError::Rate);
        }
        if self.period_us < PERIOD_US_MIN {
            return Err(ReservationError::Period(self.period_us));
        }
        Ok(())
    }

    /// Payload bytes due in each period (at least one).
    pub fn bytes_per_period(&self) -> u64 {
        let bytes = u128::from(self.rate_bytes_per_s) * u128::from(self.period_us) / 1_000_000;
        u64::try_from(bytes).unwrap_or(u64::MAX).max(1)
    }
}

/// Radon's settings for an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RadonConfig {
    /// The sender's link rate, bytes/s: one packet's time on it is `w_min`, the shortest wait.
    pub link_bytes_per_s: u64,
    /// Queueing delay the peer may report before best-effort sessions back off, µs.
    pub queue_target_us: Micros,
    /// Whether sessions without a reservation are paced and back off (Radon's best effort);
    /// without, only reserved sessions are paced.
    pub pace_best_effort: bool,
    /// How reserved sessions spend their budget: a wait between packets, or a window per
    /// round trip.
    pub budget: BudgetKind,
    /// The largest window of [`BudgetKind::Window`], packets (`w_max`).
    pub window_packets_max: u64,
    /// A reserved session's budget is due `1 / n` of the period before its end, at most
    /// [`SEND_BY_MARGIN_US_MAX`] before it (0: one packet's wait before it, the paper's
    /// percent budget to the deadline). A margin costs rate while sending (`P / (P - m)` of
    /// the reservation for a margin `m` of a period `P`): a port booked to the full cannot
    /// carry it.
    pub send_by_margin_divisor: u64,
    /// A reserved session paces slower in proportion to the queue the peer reports past
    /// this many [`RadonConfig::queue_target_us`] (0: never): reservations that together
    /// overload the port in front of the peer then share its rate instead of filling its
    /// buffer. Only Radon's endpoints slow for the queue
    /// ([`RadonConfig::reservation_only`] has 0).
    pub reserved_queue_limit_targets: u64,
    /// A reserved reader whose own packets measure a queue in front of its host (others'
    /// answers share the port) grants at what its deadline needs, without the cushion it
    /// keeps otherwise ([`crate::grants::GrantRate::for_period`]): its laxity goes to the
    /// best-effort readers beside it. Only Radon's endpoints
    /// ([`RadonConfig::reservation_only`] keeps its cushion whatever the queue).
    pub reserved_grants_yield_laxity: bool,
}

/// The two percent-budget schedulers of the paper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BudgetKind {
    /// Rate-based: the wait between packets moves halfway to `w_op = w_min / %budget` each
    /// packet.
    #[default]
    Rate,
    /// Window-based, "less laxity, more window": each round trip a window of packets goes
    /// out back to back after a random dispatch offset within the queue the peer reports;
    /// the window moves halfway to `w_op = min(m_i, max(w_max / (l + 1), 2))`, with `m_i`
    /// the packets still due this period and `l` the laxity in round trips.
    Window,
}

impl Default for RadonConfig {
    /// A 1 Gbit/s link, [`QUEUE_TARGET_US_DEFAULT`] of queue.
    fn default() -> RadonConfig {
        RadonConfig {
            link_bytes_per_s: 125_000_000,
            queue_target_us: QUEUE_TARGET_US_DEFAULT,
            pace_best_effort: true,
            budget: BudgetKind::Rate,
            window_packets_max: 64,
            send_by_margin_divisor: 0,
            reserved_queue_limit_targets: RESERVED_QUEUE_LIMIT_TARGETS,
            reserved_grants_yield_laxity: true,
        }
    }
}

impl RadonConfig {
    /// What paces a reserved session on an endpoint without Radon of its own (the lab's
    /// constant line): its reservation's rate and deadlines, whatever the queue.
    pub fn reservation_only() -> RadonConfig {
        RadonConfig {
            reserved_queue_limit_targets: 0,
            reserved_grants_yield_laxity: false,
            ..RadonConfig::default()
        }
    }
}

/// The relative forward delay of packet `j` against packet `i`, µs: how much longer `j` took
/// to cross the network than `i` did. Sender timestamps are the wire's 32 bits (wrapping);
/// the two clocks need no synchronization, only a steady rate.
pub fn relative_forward_delay_us(
    sent_i: u32,
    arrived_i: Micros,
    sent_j: u32,
    arrived_j: Micros,
) -> i64 {
    let arrival_gap = arrived_j as i64 - arrived_i as i64;
    let send_gap = i64::from(sent_j.wrapping_sub(sent_i) as i32);
    arrival_gap - send_gap
}

/// The median of the latest [`MEDIAN_FILTER_LEN`] samples (of fewer, until that many came,
/// or when older ones expired).
#[derive(Clone, Debug, Default)]
pub struct MedianFilter {
    /// Samples and when they were taken, µs on any clock that only moves forward.
    samples: [(i64, i64); MEDIAN_FILTER_LEN],
    len: usize,
    next: usize,
}

impl MedianFilter {
    /// Adds a sample and returns the median of the latest ones.
    pub fn push(&mut self, sample: i64) -> i64 {
        self.push_at(sample, 0, Micros::MAX)
    }

    /// Adds a sample taken at `at` and returns the median of the latest ones taken at most
    /// `age_us_max` before it.
    pub fn push_at(&mut self, sample: i64, at: i64, age_us_max: Micros) -> i64 {
        self.samples[self.next] = (sample, at);
        self.next = (self.next + 1) % MEDIAN_FILTER_LEN;
        self.len = (self.len + 1).min(MEDIAN_FILTER_LEN);
        let mut sorted = [0i64; MEDIAN_FILTER_LEN];
        let mut fresh = 0;
        for &(value, taken) in &self.samples[..self.len] {
            if at.saturating_sub(taken).unsigned_abs() <= age_us_max {
                sorted[fresh] = value;
                fresh += 1;
            }
        }
        let sorted = &mut sorted[..fresh];
        sorted.sort_unstable();
        sorted[fresh / 2]
    }
}

/// The receiver's estimate of the queue in front of it on the path from one sender.
#[derive(Clone, Debug, Default)]
pub struct QueueEstimator {
    /// Sender timestamp and arrival of the previous DATA packet.
    last: Option<(u32, Micros)>,
    /// One-way delay relative to the first packet: the sum of the RFDs so far.
    relative_delay_us: i64,
    /// The sender's clock relative to the first packet, µs.
    sent_clock_us: i64,
    filter: MedianFilter,
    /// The smallest filtered relative delay: the path with an empty queue.
    base_us: Option<i64>,
    queue_delay_us: u64,
    samples: u64,
}

impl QueueEstimator {
    /// Takes one DATA packet's sender timestamp and arrival time.
    pub fn on_packet(&mut self, sent: u32, arrived: Micros) {
        if let Some((sent_i, arrived_i)) = self.last {
            self.relative_delay_us += relative_forward_delay_us(sent_i, arrived_i, sent, arrived);
            self.sent_clock_us += i64::from(sent.wrapping_sub(sent_i) as i32);
        }
        self.last = Some((sent, arrived));
        // Samples age on the sender's clock: a packet the receiver read late (a host not
        // scheduled) is no younger than its neighbours, and an outlier stays filtered.
        let filtered = self.filter.push_at(
            self.relative_delay_us,
            self.sent_clock_us,
            SAMPLE_AGE_US_MAX,
        );
        let base = self.base_us.map_or(filtered, |base| base.min(filtered));
        self.base_us = Some(base);
        self.queue_delay_us = (filtered - base) as u64;
        self.samples += 1;
    }

    /// The queueing delay on the path now, µs (0 before any packet).
    pub fn queue_delay_us(&self) -> u64 {
        self.queue_delay_us
    }

    /// Packets measured.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// The queue in front of a receiver as its sessions' packets show it: the estimate
/// ([`QueueEstimator`]) of whichever session's DATA arrived last, forgotten after
/// [`PORT_QUEUE_AGE_US_MAX`]. The receiver reports the larger of it and a session's own
/// estimate to that session's sender: a best-effort sender whose own packets are sparse
/// (backed off, or ramping from little) measures the port rarely and late, and kept sending
/// into a queue the reserved streams beside it already showed full (the unfair run behind
/// admission in the simulator: the port dropped 2.3% of the largest admitted stream's
/// packets). Reserved sessions hold their budget whatever it says. (The largest estimate
/// of every session over the last millisecond instead of the latest: six equal streams'
/// noise added up, and best effort filled 0.79 of what a reservation left.)
#[derive(Clone, Copy, Debug, Default)]
pub struct PortQueue {
    /// The latest estimate, µs, and when its packet arrived.
    delay_us: u64,
    at: Micros,
}

impl PortQueue {
    /// A session's estimate after one of its DATA packets arrived at `now`.
    pub fn on_estimate(&mut self, delay_us: u64, now: Micros) {
        self.delay_us = delay_us;
        self.at = now;
    }

    /// The port's queue as of `now`, µs: 0 once no estimate is recent.
    pub fn queue_delay_us(&self, now: Micros) -> u64 {
        if now.saturating_sub(self.at) >= PORT_QUEUE_AGE_US_MAX {
            0
        } else {
            self.delay_us
        }
    }
}

/// The header's one-byte encoding of a queueing delay: exact below 32 µs, then four bits of
/// mantissa (within 6%), rounded down, up to about half a second (255).
pub fn queue_code(delay_us: u64) -> u8 {
    if delay_us < 32 {
        return delay_us as u8;
    }
    let exponent = 63 - delay_us.leading_zeros() - 4;
    if exponent > 14 {
        return u8::MAX;
    }
    let mantissa = (delay_us >> exponent) - 16;
    (((exponent + 1) << 4) as u64 | mantissa) as u8
}

/// The queueing delay a header's `queue` byte says, µs: the inverse of [`queue_code`].
pub fn queue_delay_us(code: u8) -> u64 {
    if code < 32 {
        return u64::from(code);
    }
    let exponent = u32::from(code >> 4) - 1;
    (16 + u64::from(code & 0x0f)) << exponent
}

/// What one packet from the peer tells a sender's pacer about the queue toward the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueReport {
    /// The queueing delay the peer measured, µs.
    pub queue_delay_us: u64,
    /// When the report arrived.
    pub now: Micros,
    /// The session's smoothed round trip, µs.
    pub round_trip_us: Micros,
    /// Bytes of a full DATA packet on the wire.
    pub wire_bytes: u64,
    /// Packets the peer has acknowledged (one past the highest in order).
    pub acked_seq: u64,
    /// One past the highest packet sent so far.
    pub sent_seq: u64,
}

/// One DATA packet a session sent, for [`Pacer::on_sent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentPacket {
    /// When it went out.
    pub now: Micros,
    /// Its payload, bytes.
    pub payload_bytes: u64,
    /// Payload bytes sent for the first time (0 for a retransmission).
    pub new_bytes: u64,
    /// Its size on the wire, headers included.
    pub wire_bytes: u64,
    /// Bytes the session still has queued.
    pub queued_bytes: u64,
}

/// "Less laxity, more window": `w_op = min(m_i, max(w_max / (l + 1), 2))` with `m_i` the
/// packets still due this period and `l` the laxity in round trips, at least 1.
pub fn window_target(due_packets: u64, laxity_round_trips: u64, window_packets_max: u64) -> u64 {
    let spread = window_packets_max / laxity_round_trips.saturating_add(1);
    due_packets
        .min(spread.max(WINDOW_PACKETS_MIN))
        .min(window_packets_max)
        .max(1)
}

/// The dispatch offset before a window, µs: `N_obs / pktS * rand` packet times, that is a
/// uniform share (`random` over 2^64) of the queueing delay the peer reports. Streams that
/// meet in one queue then do not send their windows into it at the same instant.
pub fn dispatch_offset_us(queue_delay_us: u64, random: u64) -> u64 {
    ((u128::from(queue_delay_us) * u128::from(random)) >> 64) as u64
}

/// `from` moved halfway to `to` (the paper's `w_k - (w_k - w_op) / 2`), by at least one when
/// they differ.
fn halfway(from: u64, to: u64) -> u64 {
    if from > to {
        from - (from - to).div_ceil(2)
    } else {
        from + (to - from).div_ceil(2)
    }
}

/// A best-effort rate far over the queue target (`queue_delay_us > 2 * target_us`) cut in
/// proportion to how far: to `3/2 * target / queue` of itself, at most to three quarters
/// (just over twice the target) and at least to [`BEST_EFFORT_CUT_DIVISOR_MAX`]'s share. A
/// fixed cut by a quarter took eight rounds of packets, each as long as the queue, to come
/// down from the link's rate to what reservations that resumed at a period's start left, and
/// the port's queue stood at 80-100 of its 128 frames for tens of milliseconds
/// (`lab radon --quick`'s fairshare behind admission, in the simulator).
fn best_effort_cut(rate: u64, queue_delay_us: u64, target_us: u64) -> u64 {
    let rate = u128::from(rate);
    let cut = (rate * 3 / 4)
        .min(rate * 3 * u128::from(target_us) / (2 * u128::from(queue_delay_us.max(1))))
        .max(rate / u128::from(BEST_EFFORT_CUT_DIVISOR_MAX));
    u64::try_from(cut).unwrap_or(u64::MAX)
}

/// A best-effort rate moved inversely to the square of the queue's level between the target
/// and twice it (`queues_us`: the last report's and this one's): quartered as the queue rises
/// from the target to twice it, and as much back as it falls, so that a passing rise of the
/// estimate (a host that was late) costs nothing once it has passed. This damps
/// [`best_effort_toward_target`]: moved on the queue's distance from the target alone, best
/// effort beside reservations that left it a tenth of the port overshot the target by two or
/// three times in a cycle of some 75 ms (the port drains that tenth slowly), and each
/// period's start, where the reservations resume, pushed the queue to 80-100 of 128 frames.
fn best_effort_damped(rate: u64, queues_us: (u64, u64), target_us: u64) -> u64 {
    let level = |queue_us: u64| u128::from(queue_us.clamp(target_us, 2 * target_us).max(1));
    let (before, now) = (level(queues_us.0), level(queues_us.1));
    let damped = u128::from(rate) * before * before / (now * now);
    u64::try_from(damped).unwrap_or(u64::MAX)
}

/// A best-effort rate moved on a report of the queue within twice its target, bytes/s: in
/// proportion to how far the queue is from the target (LEDBAT's controller, in time) and to
/// the rate itself, up by the rate in [`BEST_EFFORT_GROWTH_US`] on an empty queue, down as
/// fast at twice the target, by at most a quarter per report.
fn best_effort_toward_target(
    rate: u64,
    since_report_us: Micros,
    queue_delay_us: u64,
    target_us: u64,
) -> u64 {
    let (rate, target) = (i128::from(rate), i128::from(target_us));
    let off = target - i128::from(queue_delay_us);
    let change = (rate * i128::from(since_report_us) * off
        / (i128::from(BEST_EFFORT_GROWTH_US) * target))
        .clamp(-rate / 4, rate / 4);
    u64::try_from(rate + change).unwrap_or(0)
}

/// What a reserved session did in its periods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacingStats {
    /// Periods that ended while reserved.
    pub periods: u64,
    /// Periods in which every byte of the budget that the application had queued was sent
    /// before the deadline.
    pub deadlines_met: u64,
    /// Periods that ended with budget queued and unsent.
    pub deadlines_missed: u64,
    /// Packets that went out more than a whole wait after the pacer let them (the host did
    /// not run the sender in time).
    pub late_sends: u64,
}

/// Radon's best effort: a rate that starts at [`BEST_EFFORT_START_DIVISOR`]'s share of the
/// link and moves on reports of the queue in front of the receiver (see the module's
/// documentation). A best-effort sender paces its packets by it ([`Pacer`]); a best-effort
/// receiver under a receive budget paces its grants by it, on its own estimate of the
/// queue in front of it ([`crate::grants`]).
#[derive(Clone, Debug)]
pub struct BestEffortRate {
    /// The rate, bytes/s on the wire.
    rate: u64,
    /// The queue the last report said, µs.
    queue_us: u64,
    /// When the queue was last reported, µs.
    reported_at: Option<Micros>,
    /// When the rate was last cut, µs.
    backed_off_at: Option<Micros>,
    /// The rate is cut again only once this packet (one sent after the last cut) has been
    /// acknowledged (or, for grants, has arrived).
    recover_seq: u64,
}

impl BestEffortRate {
    /// At [`BEST_EFFORT_START_DIVISOR`]'s share of `config`'s link.
    pub fn new(config: &RadonConfig) -> BestEffortRate {
        BestEffortRate::starting_at(config, BEST_EFFORT_START_DIVISOR)
    }

    /// A best-effort session's grants' rate, at [`BEST_EFFORT_GRANT_START_DIVISOR`]'s share
    /// of `config`'s link.
    pub fn for_grants(config: &RadonConfig) -> BestEffortRate {
        BestEffortRate::starting_at(config, BEST_EFFORT_GRANT_START_DIVISOR)
    }

    fn starting_at(config: &RadonConfig, divisor: u64) -> BestEffortRate {
        BestEffortRate {
            rate: (config.link_bytes_per_s / divisor).max(1),
            queue_us: 0,
            reported_at: None,
            backed_off_at: None,
            recover_seq: 0,
        }
    }

    /// The rate, bytes/s on the wire.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Moves the rate on one report of the queue.
    pub fn on_report(&mut self, config: &RadonConfig, report: QueueReport) {
        let QueueReport {
            queue_delay_us,
            now,
            round_trip_us,
            acked_seq,
            sent_seq,
            ..
        } = report;
        let link = config.link_bytes_per_s;
        let rate_min = (link / BEST_EFFORT_RATE_DIVISOR_MIN).max(1);
        let target = config.queue_target_us.max(1);
        // One report counts for the time since the last one, at most
        // `BEST_EFFORT_REPORT_US_MAX`: after a long silence, a single report of an empty queue
        // says little of what the rate may become. (At most a round trip, as when the rate
        // grew by a share of the link: on the lab's round trips of tens of µs a sender at a
        // sixteenth of the link, a packet and a report a millisecond, grew by 2-10% a
        // millisecond, and the punctuated run's short streams got 0.38-0.60 of the rest.)
        let since_report_us = self
            .reported_at
            .map_or(0, |at| now.saturating_sub(at))
            .min(BEST_EFFORT_REPORT_US_MAX);
        self.reported_at = Some(now);
        let queues_us = (self.queue_us, queue_delay_us);
        self.queue_us = queue_delay_us;
        let mut rate = best_effort_damped(self.rate, queues_us, target);
        if queue_delay_us > 2 * target {
            // Far over the target: cut, once per round of packets. Reports go on showing
            // the queue the old rate built until packets sent after the cut reach the peer
            // and fill its median filter; cutting again on those (the old rule: halve once
            // per round trip) drove a sender to a trickle, whose rare packets kept the stale
            // median alive longer still. (Halving once per round of packets left 0.78 of the
            // rest of the port used in the simulator, a quarter 0.84.)
            let fresh = acked_seq >= self.recover_seq;
            let round_trip_passed = self
                .backed_off_at
                .is_none_or(|at| now >= at + round_trip_us.max(1));
            if fresh && round_trip_passed {
                self.backed_off_at = Some(now);
                self.recover_seq = sent_seq + MEDIAN_FILTER_LEN as u64 / 2 + 1;
                rate = best_effort_cut(rate, queue_delay_us, target);
            }
        } else {
            rate = best_effort_toward_target(rate, since_report_us, queue_delay_us, target);
        }
        self.rate = rate.clamp(rate_min, link);
    }
}

/// The sender's pacing of one session.
#[derive(Clone, Debug)]
pub struct Pacer {
    config: RadonConfig,
    reservation: Option<Reservation>,
    /// The current wait between packets, nanoseconds (`w_k`).
    wait_ns: u64,
    /// Earliest time of the next DATA packet, nanoseconds.
    next_send_ns: u64,
    /// The current period's end (its deadline), nanoseconds.
    deadline_ns: u64,
    /// Payload bytes sent in the current period.
    period_sent_bytes: u64,
    /// Payload bytes the last period owed and did not send while they were queued: this
    /// period's budget carries them (at most a period's worth), so that a stream that fell
    /// behind (a late host, a resend taking a slot) catches up instead of staying behind.
    carried_bytes: u64,
    /// A best-effort session's rate.
    best_effort: BestEffortRate,
    /// The session's round trip and the queue the peer reports toward it, as last heard, µs.
    round_trip_us: Micros,
    peer_queue_us: u64,
    /// Window-based budget: the window (`w_k`), packets sent in the current round, and
    /// when the round began, ns.
    window_packets: u64,
    round_sent_packets: u64,
    round_started_ns: u64,
    /// The application told the pacer when its stream's periods start
    /// ([`Pacer::start_periods`]): periods keep that phase, and no guess at it
    /// ([`Pacer::restart_unused_period`]) moves them.
    aligned: bool,
    stats: PacingStats,
}

impl Pacer {
    /// A pacer; best effort until [`Pacer::reserve`].
    pub fn new(config: RadonConfig) -> Pacer {
        assert!(
            config.link_bytes_per_s > 0,
            "a link rate of zero never sends"
        );
        Pacer {
            config,
            reservation: None,
            wait_ns: 0,
            next_send_ns: 0,
            deadline_ns: 0,
            period_sent_bytes: 0,
            carried_bytes: 0,
            best_effort: BestEffortRate::new(&config),
            round_trip_us: 0,
            peer_queue_us: 0,
            window_packets: WINDOW_PACKETS_MIN,
            round_sent_packets: 0,
            round_started_ns: 0,
            aligned: false,
            stats: PacingStats::default(),
        }
    }

    /// Reserves a rate from `now` on (the first period starts now), or returns to best effort.
    pub fn reserve(&mut self, reservation: Option<Reservation>, now: Micros) {
        if let Some(reservation) = reservation {
            reservation
                .validate()
                .expect("reservations are validated by the endpoint");
            self.deadline_ns = now * 1_000 + reservation.period_us * 1_000;
            self.period_sent_bytes = 0;
            self.carried_bytes = 0;
        }
        self.reservation = reservation;
        self.best_effort.backed_off_at = None;
        self.aligned = false;
    }

    /// The application's stream counts its periods from `epoch` (µs, at most `now`): the
    /// pacer's periods end where the stream's do from now on, and the one `now` falls in
    /// starts afresh, its budget whole. A session opened and used before the stream began
    /// (`lab radon` opens each with a request) had periods of its own phase: the budget of
    /// one ran out, or its deadline came, in the middle of the stream's, and a period's
    /// last bytes went after the stream's deadline (11-12% of deadlines met) or all of them
    /// in a burst before it. No-op without a reservation.
    pub fn start_periods(&mut self, epoch: Micros, now: Micros) {
        let Some(reservation) = self.reservation else {
            return;
        };
        let period_ns = reservation.period_us * 1_000;
        let (epoch_ns, now_ns) = (epoch.min(now) * 1_000, now * 1_000);
        let periods = (now_ns - epoch_ns) / period_ns + 1;
        self.deadline_ns = epoch_ns + periods * period_ns;
        self.period_sent_bytes = 0;
        self.carried_bytes = 0;
        self.wait_ns = 0;
        self.next_send_ns = self.next_send_ns.min(now_ns);
        self.aligned = true;
    }

    /// Its settings.
    pub fn config(&self) -> &RadonConfig {
        &self.config
    }

    /// The reservation, if any.
    pub fn reservation(&self) -> Option<Reservation> {
        self.reservation
    }

    /// The end of the reserved period `now` falls in, and how long before it the period's
    /// bytes are due (the send-by margin), µs; `None` without a reservation. The periods
    /// keep their phase however long nothing was sent (the ends are those
    /// [`Pacer::roll_periods`] would reach). A reserved reader's grants are sized by it
    /// ([`crate::grants`]).
    pub fn period_due(&self, now: Micros) -> Option<(Micros, Micros)> {
        let reservation = self.reservation?;
        let period_ns = reservation.period_us * 1_000;
        let now_ns = now * 1_000;
        let mut end_ns = self.deadline_ns;
        if end_ns <= now_ns {
            end_ns += ((now_ns - end_ns) / period_ns + 1) * period_ns;
        }
        Some((end_ns / 1_000, self.send_by_margin_ns(period_ns) / 1_000))
    }

    /// Whether this pacer holds sessions back at all.
    fn active(&self) -> bool {
        self.reservation.is_some() || self.config.pace_best_effort
    }

    /// One packet of `wire_bytes` on the sender's link, ns: `w_min`.
    pub fn wait_ns_min(&self, wire_bytes: u64) -> u64 {
        (wire_bytes * 1_000_000_000).div_ceil(self.config.link_bytes_per_s)
    }

    /// The current wait between packets, ns.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns
    }

    /// The most packets a window-paced reserved session may have unacknowledged: its window
    /// (`None`: no cap of the pacer's). The window is a window, not only a burst: the next
    /// one waits for the last one's acknowledgements as well as for its round trip.
    pub fn window_cap(&self) -> Option<u32> {
        (self.reservation.is_some() && self.config.budget == BudgetKind::Window).then(|| {
            u32::try_from(self.window_packets)
                .unwrap_or(u32::MAX)
                .max(1)
        })
    }

    /// The earliest time a DATA packet may go, µs (`None`: at once).
    pub fn send_at(&self, now: Micros) -> Option<Micros> {
        if !self.active() {
            return None;
        }
        let at = self.next_send_ns.div_ceil(1_000);
        (at > now).then_some(at)
    }

    /// Starts the periods that ended by `now`, counting their deadlines: a period is met if
    /// its budget was sent or nothing was left queued (`queued_bytes`) at its end.
    pub fn roll_periods(&mut self, now: Micros, queued_bytes: u64) {
        let Some(reservation) = self.reservation else {
            return;
        };
        let period_ns = reservation.period_us * 1_000;
        let now_ns = now * 1_000;
        while self.deadline_ns <= now_ns {
            self.stats.periods += 1;
            let due = self.period_budget(reservation);
            let owed = due.saturating_sub(self.period_sent_bytes);
            if owed == 0 || queued_bytes == 0 {
                self.stats.deadlines_met += 1;
                self.carried_bytes = 0;
            } else {
                self.stats.deadlines_missed += 1;
                self.carried_bytes = owed.min(queued_bytes).min(reservation.bytes_per_period());
            }
            self.period_sent_bytes = 0;
            // A new period's first wait is its own target, not halfway from the last
            // period's (which ended at `w_min` if it caught up): streams whose periods
            // start together would otherwise open them at their links' rate.
            self.wait_ns = 0;
            // An idle gap of many periods counts once: those periods had nothing queued.
            // Aligned to the stream, the next period is the stream's; else it starts now.
            let idle_ns = now_ns - self.deadline_ns;
            self.deadline_ns = if idle_ns > period_ns {
                self.carried_bytes = 0;
                if self.aligned {
                    self.deadline_ns + (idle_ns / period_ns + 1) * period_ns
                } else {
                    now_ns + period_ns
                }
            } else {
                self.deadline_ns + period_ns
            };
        }
    }

    /// A stream that starts sending well into a period it had sent nothing in (it was
    /// idle) starts its period now: its application counts its periods from its own start,
    /// and the pacer's budget would otherwise run out, and the deadline come, that much too
    /// early each period. (In steady state a period's first packet goes at its start, and
    /// the phase holds.) A pacer told the stream's periods keeps them.
    fn restart_unused_period(&mut self, reservation: Reservation, now_ns: u64) {
        if self.aligned {
            return;
        }
        let period_ns = reservation.period_us * 1_000;
        let started_ns = self.deadline_ns.saturating_sub(period_ns);
        let unused = self.period_sent_bytes == 0 && self.carried_bytes == 0;
        if unused && now_ns >= started_ns + period_ns / SEND_BY_MARGIN_DIVISOR {
            self.deadline_ns = now_ns + period_ns;
            self.wait_ns = 0;
        }
    }

    /// Payload bytes the current period may send: the reservation's, and what the last one
    /// owed.
    fn period_budget(&self, reservation: Reservation) -> u64 {
        reservation
            .bytes_per_period()
            .saturating_add(self.carried_bytes)
    }

    /// The wait of a best-effort session between packets of `wire_bytes`, ns.
    fn best_effort_wait_ns(&self, wire_bytes: u64) -> u64 {
        let wait_ns = (wire_bytes * 1_000_000_000).div_ceil(self.best_effort.rate.max(1));
        wait_ns.clamp(self.wait_ns_min(wire_bytes), WAIT_US_MAX * 1_000)
    }

    /// A DATA packet went out at `now`: `payload_bytes` of payload, of which `new_bytes` were
    /// sent for the first time (they count against the period's budget; a retransmission
    /// takes its slot but moves nothing new), `wire_bytes` in all; `queued_bytes` are still
    /// queued, and `random` is a fresh random number (the window's dispatch offset). Sets the
    /// wait before the next one.
    pub fn on_sent(&mut self, sent: SentPacket, random: u64) {
        let now_ns = sent.now * 1_000;
        let scheduled_ns = self.next_send_ns;
        let wait_ns_min = self.wait_ns_min(sent.wire_bytes);
        if self.next_send_ns > 0 && now_ns > self.next_send_ns + self.wait_ns.max(wait_ns_min) {
            self.stats.late_sends += 1;
        }
        let Some(reservation) = self.reservation else {
            // As a reservation's, the next packet waits from when this one was due, by at
            // most `CATCH_UP_US_MAX`: waited from when it went, a best-effort sender on a
            // late host lost every wake-up's lateness, and the punctuated run's short
            // streams got 0.63-0.90 of what the reservation left them (`lab radon`, load
            // 9-10). Kept `w_min` apart instead, a sender can catch up only one packet per
            // wake-up, which is what a late host lacks (simulator, hosts late up to 400 µs
            // with 5% stalls: no gain).
            self.wait_ns = self.best_effort_wait_ns(sent.wire_bytes);
            let from_ns =
                scheduled_ns.clamp(now_ns.saturating_sub(CATCH_UP_US_MAX * 1_000), now_ns);
            self.next_send_ns = from_ns + self.wait_ns;
            return;
        };
        self.roll_periods(sent.now, sent.queued_bytes);
        self.restart_unused_period(reservation, now_ns);
        self.period_sent_bytes += sent.new_bytes;
        let budget = self.period_budget(reservation);
        if self.period_sent_bytes >= budget {
            self.round_sent_packets = 0;
            let allowance = reservation.bytes_per_period() / FRAMING_ALLOWANCE_DIVISOR;
            let next_period_ns = self.deadline_ns.max(now_ns + wait_ns_min);
            let rate_based = self.config.budget == BudgetKind::Rate;
            self.next_send_ns = if rate_based
                && sent.queued_bytes > 0
                && self.period_sent_bytes < budget.saturating_add(allowance)
            {
                // The budget is out and data still waits: the framing that came with the
                // period's bytes goes now, at the reserved rate, not after the deadline.
                let wait_ns = (u128::from(sent.payload_bytes.max(1)) * 1_000_000_000)
                    .div_ceil(u128::from(reservation.rate_bytes_per_s));
                let wait_ns = u64::try_from(wait_ns).unwrap_or(u64::MAX).max(wait_ns_min);
                now_ns.saturating_add(wait_ns).min(next_period_ns)
            } else {
                // The next packet belongs to the next period.
                next_period_ns
            };
            return;
        }
        let left_bytes = budget - self.period_sent_bytes;
        let left_packets = left_bytes.div_ceil(sent.payload_bytes.max(1));
        match self.config.budget {
            BudgetKind::Rate => {
                let period_ns = reservation.period_us * 1_000;
                let margin_ns = self.send_by_margin_ns(period_ns);
                let send_by_ns = self.deadline_ns.saturating_sub(margin_ns);
                // Without a margin, one slot more than packets left, so that the last one
                // goes (and arrives) before the deadline rather than at it.
                let left_packets = left_packets + u64::from(margin_ns == 0);
                // A packet due before this period began was held by an idle session, not a
                // late host: nothing to catch up.
                let period_start_ns = self.deadline_ns.saturating_sub(period_ns);
                let scheduled_ns = if scheduled_ns < period_start_ns {
                    now_ns
                } else {
                    scheduled_ns
                };
                let wait_ns_floor = self.catch_up_wait_ns(sent.payload_bytes, wait_ns_min);
                self.pace_by_rate(
                    now_ns,
                    scheduled_ns,
                    send_by_ns,
                    left_packets,
                    wait_ns_floor,
                )
            }
            BudgetKind::Window => self.pace_by_window(now_ns, left_packets, sent, random),
        }
    }

    /// Rate-based percent budget: `%budget = e_i / (d - t)` with `e_i = left_packets * w_min`
    /// and `d` the time to send by (the deadline less [`RadonConfig::send_by_margin_divisor`]'s
    /// share of the period, so that the last packet can be done, not only sent, by the
    /// deadline), and
    /// `w_op = w_min / %budget`. The next packet waits from when this one was due
    /// (`scheduled_ns`), not from when it went: a late host catches up, by at most
    /// [`CATCH_UP_US_MAX`].
    fn pace_by_rate(
        &mut self,
        now_ns: u64,
        scheduled_ns: u64,
        send_by_ns: u64,
        left_packets: u64,
        wait_ns_floor: u64,
    ) {
        let laxity_ns = send_by_ns.saturating_sub(now_ns).max(1);
        let wait_ns_target = laxity_ns / left_packets.max(1);
        let wait_ns_max = (WAIT_US_MAX * 1_000).max(wait_ns_floor);
        let next = if self.wait_ns == 0 {
            wait_ns_target
        } else {
            halfway(self.wait_ns, wait_ns_target)
        };
        self.wait_ns = next.clamp(wait_ns_floor, wait_ns_max);
        let from_ns = scheduled_ns.clamp(now_ns.saturating_sub(CATCH_UP_US_MAX * 1_000), now_ns);
        self.next_send_ns = from_ns + self.slowed_for_queue(self.wait_ns);
    }

    /// `wait_ns` stretched in proportion to the queue the peer reports past
    /// [`RadonConfig::reserved_queue_limit_targets`] queue targets (unchanged within it, or
    /// with no limit), at most [`WAIT_US_MAX`] or `wait_ns` if longer. The percent budget's
    /// own wait (`w_k`) stays as it was: once the queue falls the stream is paced by its
    /// deadline again, and catches up if there is time.
    fn slowed_for_queue(&self, wait_ns: u64) -> u64 {
        let limit_us = self
            .config
            .reserved_queue_limit_targets
            .saturating_mul(self.config.queue_target_us);
        if limit_us == 0 || self.peer_queue_us <= limit_us {
            return wait_ns;
        }
        let slowed = u128::from(wait_ns) * u128::from(self.peer_queue_us) / u128::from(limit_us);
        u64::try_from(slowed)
            .unwrap_or(u64::MAX)
            .min((WAIT_US_MAX * 1_000).max(wait_ns))
    }

    /// How long before a period of `period_ns` ends its budget is due sent, ns:
    /// [`RadonConfig::send_by_margin_divisor`]'s share of it, at most
    /// [`SEND_BY_MARGIN_US_MAX`].
    fn send_by_margin_ns(&self, period_ns: u64) -> u64 {
        period_ns
            .checked_div(self.config.send_by_margin_divisor)
            .unwrap_or(0)
            .min(SEND_BY_MARGIN_US_MAX * 1_000)
    }

    /// The shortest wait of a reserved session between packets of `payload_bytes` that take
    /// `wait_ns_min` on its link: `w_min`, or, while the peer reports more than the queue
    /// target, the wait that sends [`CATCH_UP_RATE_EIGHTHS`] of its steady pace (a
    /// period's budget spread over the period less the send-by margin).
    fn catch_up_wait_ns(&self, payload_bytes: u64, wait_ns_min: u64) -> u64 {
        let Some(reservation) = self.reservation else {
            return wait_ns_min;
        };
        if self.peer_queue_us <= self.config.queue_target_us {
            return wait_ns_min;
        }
        let period_ns = reservation.period_us * 1_000;
        let margin_ns = self.send_by_margin_ns(period_ns);
        let steady_ns = u128::from(period_ns - margin_ns) * u128::from(payload_bytes.max(1))
            / u128::from(reservation.bytes_per_period());
        let wait_ns = steady_ns * 8 / u128::from(CATCH_UP_RATE_EIGHTHS);
        u64::try_from(wait_ns).unwrap_or(u64::MAX).max(wait_ns_min)
    }

    /// This stream's `w_max`: what carries its rate [`WINDOW_RATE_MAX_QUARTERS`] quarters
    /// over at the current round, within [`RadonConfig::window_packets_max`]. One `w_max` for every
    /// stream let small ones send windows of dozens of packets as their laxity ran out, and
    /// six such windows overflowed a port's buffer.
    fn window_packets_max(&self, payload_bytes: u64) -> u64 {
        self.window_packets_for(WINDOW_RATE_MAX_QUARTERS, payload_bytes)
    }

    /// The window that carries `quarters` quarters of this stream's rate in a smoothed round
    /// trip, within [`WINDOW_PACKETS_MIN`] and [`RadonConfig::window_packets_max`]. (Sizing
    /// windows by how long the last round took, by the round trip and the mean dispatch
    /// offset, or by the round trip and the window's own time on the link, fed back on
    /// itself: longer rounds, larger windows, a longer queue; six fairshare streams
    /// overflowed the port.)
    fn window_packets_for(&self, quarters: u64, payload_bytes: u64) -> u64 {
        let rate = self.reservation.map_or(0, |r| r.rate_bytes_per_s);
        let round_ns = self.round_trip_us * 1_000;
        let carried = (u128::from(rate) * u128::from(round_ns) * u128::from(quarters))
            .div_ceil(4_000_000_000 * u128::from(payload_bytes.max(1)));
        let carried = u64::try_from(carried).unwrap_or(u64::MAX);
        carried.clamp(
            WINDOW_PACKETS_MIN,
            self.config.window_packets_max.max(WINDOW_PACKETS_MIN),
        )
    }

    /// Window-based percent budget: a window per round trip, back to back; between windows
    /// the dispatch offset. The window is sized when its first packet goes.
    fn pace_by_window(&mut self, now_ns: u64, left_packets: u64, sent: SentPacket, random: u64) {
        let (payload_bytes, wire_bytes) = (sent.payload_bytes, sent.wire_bytes);
        let wait_ns_min = self.wait_ns_min(wire_bytes);
        let round_trip_ns = self.round_trip_us.max(1) * 1_000;
        if self.round_sent_packets == 0 {
            // Laxity counts in rounds as long as the last one took (the peer's delayed ACK,
            // the window's own time on the link and the dispatch offset lengthen them;
            // counted in round trips, a stream behind its budget thought it had time), at
            // most four round trips (an idle gap is no round).
            let last_round_ns = now_ns.saturating_sub(self.round_started_ns);
            let round_ns = last_round_ns.clamp(round_trip_ns, 4 * round_trip_ns);
            self.round_started_ns = now_ns;
            // This packet opens the round and is one of the packets due. The laxity is the
            // rounds left beyond those the largest window needs for what is due (a window,
            // unlike a wait, cannot send faster than one per round).
            let due_packets = left_packets + 1;
            let window_max = self.window_packets_max(payload_bytes);
            let rounds_left = self.deadline_ns.saturating_sub(now_ns) / round_ns;
            let laxity = rounds_left.saturating_sub(due_packets.div_ceil(window_max));
            let window_min = self.window_packets_for(WINDOW_RATE_MIN_QUARTERS, payload_bytes);
            let target = window_target(due_packets, laxity, window_max.max(window_min))
                .max(window_min.min(due_packets));
            self.window_packets = halfway(self.window_packets, target).max(1);
        }
        self.round_sent_packets += 1;
        self.wait_ns = wait_ns_min;
        if self.round_sent_packets < self.window_packets {
            self.next_send_ns = now_ns + wait_ns_min;
            return;
        }
        self.round_sent_packets = 0;
        let offset_ns = dispatch_offset_us(self.peer_queue_us, random) * 1_000;
        let round_end_ns = (self.round_started_ns + round_trip_ns).max(now_ns + wait_ns_min);
        self.next_send_ns = round_end_ns + offset_ns;
    }

    /// The peer reported the queue toward it ([`QueueReport`]). Best effort moves its rate;
    /// a reservation holds its budget.
    pub fn on_queue_report(&mut self, report: QueueReport) {
        self.round_trip_us = report.round_trip_us;
        self.peer_queue_us = report.queue_delay_us;
        if self.reservation.is_some() || !self.config.pace_best_effort {
            self.best_effort.queue_us = report.queue_delay_us;
            return;
        }
        self.best_effort.on_report(&self.config, report);
        self.wait_ns = self.best_effort_wait_ns(report.wire_bytes);
    }

    /// The deadlines counted so far.
    pub fn stats(&self) -> PacingStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// On an idle path every packet takes as long as every other: whatever the clocks'
        /// offset and the spacing of the packets, the RFD is zero and so is the queue.
        #[test]
        fn rfd_is_zero_on_an_idle_path(
            offset in any::<u32>(),
            delay_us in 1u64..100_000,
            gaps in prop::collection::vec(0u64..100_000, 1..50),
        ) {
            let mut estimator = QueueEstimator::default();
            let mut sent = 1_000u64;
            let mut previous: Option<(u32, Micros)> = None;
            for gap in gaps {
                sent += gap;
                let stamp = (sent as u32).wrapping_add(offset);
                let arrived = sent + delay_us;
                if let Some((s, r)) = previous {
                    prop_assert_eq!(relative_forward_delay_us(s, r, stamp, arrived), 0);
                }
                previous = Some((stamp, arrived));
                estimator.on_packet(stamp, arrived);
                prop_assert_eq!(estimator.queue_delay_us(), 0);
            }
        }

        /// One packet held up (a sender that was not scheduled, a burst of cross traffic
        /// meeting one packet) does not move the filtered queue estimate.
        #[test]
        fn the_filter_ignores_a_single_outlier(
            spike_us in 1u64..1_000_000,
            at in 3usize..20,
            base_us in 0u64..1_000,
        ) {
            let mut estimator = QueueEstimator::default();
            for index in 0..25usize {
                let sent = index as u64 * 100;
                let extra = if index == at { spike_us } else { 0 };
                estimator.on_packet(sent as u32, sent + base_us + extra);
                prop_assert_eq!(estimator.queue_delay_us(), 0, "packet {}", index);
            }
        }

        #[test]
        fn queue_codes_round_down_within_six_percent(delay_us in 0u64..400_000) {
            let decoded = queue_delay_us(queue_code(delay_us));
            prop_assert!(decoded <= delay_us);
            prop_assert!(decoded * 17 >= delay_us * 16, "{} -> {}", delay_us, decoded);
        }

        /// Whatever the reservation, the queue reports, the sizes of the packets and how late
        /// the host runs the sender, the pacer never lets packets go faster than one
        /// packet's time on the link each (`w_min`): two in a row only closer when the
        /// sender catches up after a late one, and any span of them never more than
        /// [`CATCH_UP_US_MAX`] ahead of `w_min` a packet.
        #[test]
        fn pacing_never_sends_faster_than_w_min_allows(
            rate in 1u64..1_000_000_000,
            period_us in PERIOD_US_MIN..2_000_000,
            reserved in any::<bool>(),
            window in any::<bool>(),
            link in 1_000_000u64..2_000_000_000,
            steps in prop::collection::vec((1u64..9_000, 0u64..5_000, 0u64..2_000), 1..200),
        ) {
            let budget = if window { BudgetKind::Window } else { BudgetKind::Rate };
            let config = RadonConfig { link_bytes_per_s: link, budget, ..RadonConfig::default() };
            let mut pacer = Pacer::new(config);
            if reserved {
                pacer.reserve(Some(Reservation { rate_bytes_per_s: rate, period_us }), 0);
            }
            let mut now = 0;
            // Every packet sent: when, and w_min after it, ns.
            let mut sends: Vec<(Micros, u64)> = Vec::new();
            let mut last_late_at: Option<Micros> = None;
            for (seq, (bytes, extra_us, queue_us)) in (0u64..).zip(steps) {
                // Now and then the host runs the sender late (up to 2 ms).
                let late_us = if extra_us % 7 == 0 { extra_us % 2_000 } else { extra_us % 3 };
                now = pacer.send_at(now).unwrap_or(now) + late_us;
                if let Some(&(at, w_min_ns)) = sends.last() {
                    // Packet to packet, w_min apart at least, unless catching up after a late
                    // send; over any span of packets, never more than CATCH_UP_US_MAX ahead
                    // of w_min per packet (1 µs of rounding per packet).
                    // (Catching up: behind its schedule after a late send, by at most
                    // CATCH_UP_US_MAX.)
                    let close = now - at < w_min_ns / 1_000;
                    let catching_up = last_late_at
                        .is_some_and(|late| late + 2 * CATCH_UP_US_MAX >= at);
                    prop_assert!(
                        !close || catching_up,
                        "{} after {} (w_min {} ns)", now, at, w_min_ns
                    );
                    let mut needed_ns = 0u64;
                    for (k, &(at, w_min_ns)) in sends.iter().rev().enumerate() {
                        needed_ns += w_min_ns;
                        let slack_us = CATCH_UP_US_MAX + k as u64 + 1;
                        prop_assert!(
                            now - at + slack_us >= needed_ns / 1_000,
                            "{} packets in {} µs (w_min total {} ns)", k + 1, now - at, needed_ns
                        );
                    }
                }
                pacer.on_sent(sent(now, bytes, 1 << 20), seq.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                sends.push((now, pacer.wait_ns_min(bytes + 88)));
                if late_us > 0 {
                    last_late_at = Some(now);
                }
                pacer.on_queue_report(QueueReport {
                    queue_delay_us: queue_us,
                    now,
                    round_trip_us: 100,
                    wire_bytes: bytes + 88,
                    acked_seq: seq / 2,
                    sent_seq: seq + 1,
                });
            }
        }
    }

    proptest! {
        /// The window never exceeds the packets due nor `w_max`, is 2 while there is time,
        /// and grows as laxity shrinks.
        #[test]
        fn less_laxity_more_window(
            due in 1u64..10_000,
            laxity in 0u64..10_000,
            window_max in 2u64..512,
        ) {
            let window = window_target(due, laxity, window_max);
            prop_assert!(window >= 1 && window <= due && window <= window_max);
            prop_assert!(window >= due.min(WINDOW_PACKETS_MIN));
            prop_assert!(window_target(due, laxity / 2, window_max) >= window);
            prop_assert_eq!(window_target(due, 0, window_max), due.min(window_max));
        }

        /// The dispatch offset is a share of the reported queue: none on an empty path,
        /// never the whole queue.
        #[test]
        fn the_dispatch_offset_lies_within_the_queue(queue_us in 0u64..1_000_000, random in any::<u64>()) {
            let offset = dispatch_offset_us(queue_us, random);
            prop_assert!(offset <= queue_us.saturating_sub(1) || queue_us == 0);
            prop_assert_eq!(dispatch_offset_us(0, random), 0);
        }
    }

    /// Sends a reserved window-paced stream's packets as fast as the pacer lets them go,
    /// hearing a round trip of `round_trip_us` and a queue of `queue_us` after each, until
    /// `until`; returns the send times.
    fn window_paced_sends(
        reservation: Reservation,
        round_trip_us: Micros,
        queue_us: u64,
        until: Micros,
    ) -> (Pacer, Vec<Micros>) {
        let config = RadonConfig {
            budget: BudgetKind::Window,
            ..RadonConfig::default()
        };
        let mut pacer = Pacer::new(config);
        pacer.reserve(Some(reservation), 0);
        pacer.on_queue_report(report_with(queue_us, 0, round_trip_us));
        let mut now = 0;
        let mut times = Vec::new();
        let mut random = 1u64;
        while now < until {
            times.push(now);
            random = random
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            pacer.on_sent(sent(now, 1_000, 1 << 30), random);
            pacer.on_queue_report(report_with(queue_us, now, round_trip_us));
            now = pacer.send_at(now).unwrap_or(now);
        }
        (pacer, times)
    }

    fn report_with(queue_delay_us: u64, now: Micros, round_trip_us: Micros) -> QueueReport {
        QueueReport {
            round_trip_us,
            ..report(queue_delay_us, now, 0, 0)
        }
    }

    #[test]
    fn with_laxity_to_spare_a_window_of_two_goes_each_round_trip() {
        // 100 packets of 1,000 bytes due in 100 ms, a round trip of 1 ms, an empty path:
        // pairs of packets back to back, one pair per round trip, all sent by 50 ms.
        let reservation = Reservation {
            rate_bytes_per_s: 1_000_000,
            period_us: 100_000,
        };
        let (pacer, times) = window_paced_sends(reservation, 1_000, 0, 100_000);
        let in_period: Vec<_> = times.iter().filter(|&&t| t < 100_000).collect();
        assert_eq!(in_period.len(), 100);
        assert_eq!(
            *in_period[1] - *in_period[0],
            9,
            "back to back (w_min 8.7 µs)"
        );
        assert_eq!(*in_period[2], 1_000, "the next window a round trip later");
        assert!(*in_period[99] < 50_000);
        assert_eq!(pacer.stats().deadlines_missed, 0);
    }

    #[test]
    fn as_laxity_runs_out_the_window_grows() {
        // 100 packets due in 10 ms with a round trip of 1 ms: the window starts on its way
        // from 2 to the 10 that carry the rate, and grows past that as the laxity runs out;
        // all 100 go before the deadline.
        let reservation = Reservation {
            rate_bytes_per_s: 10_000_000,
            period_us: 10_000,
        };
        let (_, times) = window_paced_sends(reservation, 1_000, 0, 10_000);
        let in_period: Vec<_> = times.iter().filter(|&&t| t < 10_000).collect();
        assert_eq!(in_period.len(), 100, "{times:?}");
        // Packets per round trip (each window goes at its start, back to back).
        let mut rounds = [0usize; 10];
        for &&t in &in_period {
            rounds[(t / 1_000) as usize] += 1;
        }
        let largest = rounds
            .iter()
            .position(|&n| n == *rounds.iter().max().unwrap());
        let largest = largest.unwrap();
        assert!(rounds[0] <= 6, "{rounds:?}");
        assert!(rounds[largest] >= 2 * rounds[0], "{rounds:?}");
        assert!(
            rounds[..=largest].windows(2).all(|w| w[0] <= w[1]),
            "{rounds:?}"
        );
    }

    #[test]
    fn windows_start_at_a_random_offset_within_the_reported_queue() {
        let reservation = Reservation {
            rate_bytes_per_s: 1_000_000,
            period_us: 100_000,
        };
        let (_, times) = window_paced_sends(reservation, 1_000, 400, 100_000);
        // Each window opens one round trip after the last plus its offset, in [0, 400) µs;
        // the offsets differ.
        let opens: Vec<Micros> = times.chunks(2).map(|pair| pair[0]).collect();
        let gaps: Vec<Micros> = opens.windows(2).map(|w| w[1] - w[0]).take(40).collect();
        assert!(
            gaps.iter().all(|gap| (1_000..1_400).contains(gap)),
            "{gaps:?}"
        );
        let mut distinct = gaps.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 10, "{gaps:?}");
    }

    #[test]
    fn the_queue_estimate_follows_a_growing_queue() {
        let mut estimator = QueueEstimator::default();
        // Packets sent every 10 µs into a port that serves one per 12 µs: each waits 2 µs
        // longer than the one before.
        for index in 0..100u64 {
            estimator.on_packet((index * 10) as u32, 50 + index * 12);
        }
        // The median of the latest five lags the newest by two packets.
        assert_eq!(estimator.queue_delay_us(), 97 * 2);
    }

    #[test]
    fn a_reservation_spreads_its_budget_over_the_period() {
        let mut pacer = Pacer::new(RadonConfig::default());
        // 1,000 packets of 1,000 bytes in a second: one every millisecond, far above w_min.
        pacer.reserve(
            Some(Reservation {
                rate_bytes_per_s: 1_000_000,
                period_us: 1_000_000,
            }),
            0,
        );
        let mut now = 0;
        let mut packets = 0u64;
        while now < 1_000_000 {
            pacer.on_sent(sent(now, 1_000, 1 << 30), 0);
            packets += 1;
            now = pacer.send_at(now).expect("paced");
        }
        assert_eq!(packets, 1_000);
        // The budget is out: the next packet waits for the next period.
        assert_eq!(now, 1_000_000);
        pacer.roll_periods(now, 1 << 30);
        assert_eq!(
            pacer.stats(),
            PacingStats {
                periods: 1,
                deadlines_met: 1,
                deadlines_missed: 0,
                late_sends: 0,
            }
        );
    }

    #[test]
    fn a_late_host_catches_up_and_a_period_s_deficit_carries_over() {
        // 8,000 packets of 1,000 bytes in 100 ms, 11.7 µs apart to be sent by 15/16 of it,
        // on a link where one takes 8.7 µs (w_min).
        let fast = Reservation {
            rate_bytes_per_s: 80_000_000,
            period_us: 100_000,
        };
        let mut pacer = Pacer::new(RadonConfig {
            send_by_margin_divisor: SEND_BY_MARGIN_DIVISOR,
            ..RadonConfig::default()
        });
        pacer.reserve(Some(fast), 0);
        // A host that runs the sender 10 µs late every other packet still sends the budget
        // before the deadline: the packets after a late one catch up. (Waiting from when
        // each went, the average gap is 13.7 µs at least, and 8,000 take 109 ms.)
        let (mut now, mut packets, mut last) = (0, 0u64, 0);
        while now < 100_000 {
            pacer.on_sent(sent(now, 1_000, 1 << 30), 0);
            (packets, last) = (packets + 1, now);
            let due = pacer.send_at(now).unwrap_or(now);
            now = if packets % 2 == 0 { due + 10 } else { due };
        }
        // The budget, and with data still queued the framing allowance after it.
        assert_eq!(packets, 8_000 + 8_000 / FRAMING_ALLOWANCE_DIVISOR);
        assert!(last < 97_000, "budget sent by {last} µs");
        assert_eq!(pacer.stats().deadlines_missed, 0);
        let reservation = Reservation {
            rate_bytes_per_s: 1_000_000,
            period_us: 1_000_000,
        };
        // A period in which the sender could send only half the budget (the host stalled)
        // with the rest queued: the next period's budget carries the rest.
        let mut pacer = Pacer::new(RadonConfig::default());
        pacer.reserve(Some(reservation), 0);
        for index in 0..500 {
            pacer.on_sent(sent(index, 1_000, 1 << 30), 0);
        }
        let mut now = 1_000_000;
        let mut packets = 0u64;
        while now < 2_000_000 {
            pacer.on_sent(sent(now, 1_000, 1 << 30), 0);
            packets += 1;
            // After the stall, at most CATCH_UP_US_MAX of packets back to back.
            now = pacer.send_at(now).unwrap_or(now);
        }
        assert_eq!(packets, 1_500);
        assert_eq!(pacer.stats().deadlines_missed, 1);
        // Nothing queued at a period's end: nothing owed, nothing carried.
        pacer.on_sent(sent(2_000_000, 1_000, 0), 0);
        pacer.on_sent(sent(3_000_000, 1_000, 0), 0);
        assert_eq!(pacer.stats().deadlines_missed, 1);
    }

    #[test]
    fn the_framing_of_a_period_s_bytes_goes_before_its_deadline_and_no_more() {
        // 1,000 packets of 1,000 bytes due in a second, sent by 10 ms before its end
        // (SEND_BY_MARGIN_US_MAX); the application queued them with 0.5% more of framing
        // (a request's 64-byte header per 64 KiB is 0.1%), then a second period's worth
        // behind them. Past the budget the framing goes at the reserved rate, so the margin
        // carries 1% of the budget's worth of it before the deadline.
        let reservation = Reservation {
            rate_bytes_per_s: 1_000_000,
            period_us: 1_000_000,
        };
        let mut pacer = Pacer::new(RadonConfig {
            send_by_margin_divisor: SEND_BY_MARGIN_DIVISOR,
            ..RadonConfig::default()
        });
        pacer.reserve(Some(reservation), 0);
        let (mut now, mut sent_bytes) = (0, 0u64);
        let mut queued: u64 = 3_000_000;
        while now < 1_000_000 {
            queued -= 1_000;
            pacer.on_sent(sent(now, 1_000, queued), 0);
            sent_bytes += 1_000;
            now = pacer.send_at(now).expect("paced");
        }
        // In the first period: the budget, the framing, and no more than the allowance.
        let allowance = 1_000_000 / FRAMING_ALLOWANCE_DIVISOR;
        assert!(sent_bytes >= 1_005_000, "{sent_bytes}");
        assert!(sent_bytes <= 1_000_000 + allowance + 1_000, "{sent_bytes}");
        assert_eq!(now, 1_000_000, "the rest waits for the next period");
        // Past the budget, the packets are a reserved rate's wait apart (1 ms each).
        let mut pacer = Pacer::new(RadonConfig::default());
        pacer.reserve(Some(reservation), 0);
        for index in 0..1_000 {
            pacer.on_sent(sent(index, 1_000, 1 << 30), 0);
        }
        assert_eq!(pacer.send_at(1_000), Some(1_999));
        assert_eq!(pacer.stats().deadlines_missed, 0);
    }

    #[test]
    fn a_stream_that_starts_into_an_unused_period_starts_its_period() {
        let mut pacer = Pacer::new(RadonConfig::default());
        pacer.reserve(
            Some(Reservation {
                rate_bytes_per_s: 1_000_000,
                period_us: 1_000_000,
            }),
            0,
        );
        // The reservation came at 0, the data at 400 ms: its period runs to 1.4 s, the budget
        // is spread over it, and the next period opens at 1.4 s.
        let mut now = 400_000;
        let mut packets = 0u64;
        while now < 1_400_000 {
            pacer.on_sent(sent(now, 1_000, 1 << 30), 0);
            packets += 1;
            now = pacer.send_at(now).expect("paced");
        }
        assert_eq!(packets, 1_000);
        assert_eq!(now, 1_400_000);
        assert_eq!(pacer.stats().deadlines_missed, 0);
    }

    /// A first transmission of `payload_bytes` with 88 bytes of headers.
    #[test]
    fn a_best_effort_sender_on_a_late_host_keeps_its_rate() {
        // Best effort at its starting rate (a sixteenth of 125 MB/s: 1,088 bytes on the wire
        // every 139 µs), on a host that runs the sender 70 µs late at every packet (`lab
        // radon`'s median lateness): the packets go at the rate, 70 µs behind, not 70 µs
        // apart more each (0.67 of the rate, as before the catch-up).
        let mut pacer = Pacer::new(RadonConfig::default());
        let wait_us = 1_088.0 * BEST_EFFORT_START_DIVISOR as f64 / 125.0;
        let (mut now, mut packets) = (0, 0u64);
        while now < 100_000 {
            pacer.on_sent(sent(now, 1_000, 1 << 30), 0);
            packets += 1;
            now = pacer.send_at(now).unwrap_or(now) + 70;
        }
        let expected = 100_000.0 / wait_us;
        assert!(
            packets as f64 >= 0.98 * expected,
            "{packets} packets in 100 ms, {expected:.0} at the rate"
        );
        // Catching up stops at CATCH_UP_US_MAX: after a stall of 10 ms, at most 1 ms of
        // packets go back to back.
        let stalled = now + 10_000;
        pacer.on_sent(sent(stalled, 1_000, 1 << 30), 0);
        let mut burst = 1;
        while pacer.send_at(stalled).is_none() {
            pacer.on_sent(sent(stalled, 1_000, 1 << 30), 0);
            burst += 1;
        }
        assert!(
            burst as f64 <= 1_000.0 / wait_us + 2.0,
            "{burst} packets at once"
        );
    }

    fn sent(now: Micros, payload_bytes: u64, queued_bytes: u64) -> SentPacket {
        SentPacket {
            now,
            payload_bytes,
            new_bytes: payload_bytes,
            wire_bytes: payload_bytes + 88,
            queued_bytes,
        }
    }

    fn report(queue_delay_us: u64, now: Micros, acked_seq: u64, sent_seq: u64) -> QueueReport {
        QueueReport {
            queue_delay_us,
            now,
            round_trip_us: 100,
            wire_bytes: 1_488,
            acked_seq,
            sent_seq,
        }
    }

    /// The wait a reserved pacer sets after a packet sent when due, with the peer reporting
    /// `queue_us` of queue, µs.
    fn reserved_gap_us(pacer: &mut Pacer, now: &mut Micros, queue_us: u64) -> Micros {
        pacer.on_queue_report(report(queue_us, *now, 0, 0));
        pacer.on_sent(sent(*now, 1_000, 1 << 30), 0);
        let due = pacer.send_at(*now).expect("paced");
        let gap = due - *now;
        *now = due;
        gap
    }

    #[test]
    fn a_reserved_session_slows_in_proportion_to_a_queue_past_its_limit() {
        // 1,000 packets of 1,000 bytes a second: about 1 ms apart on schedule.
        let reservation = Reservation {
            rate_bytes_per_s: 1_000_000,
            period_us: 1_000_000,
        };
        let limit_us = RESERVED_QUEUE_LIMIT_TARGETS * QUEUE_TARGET_US_DEFAULT;
        for (config, slows) in [
            (RadonConfig::default(), true),
            (RadonConfig::reservation_only(), false),
        ] {
            let mut pacer = Pacer::new(config);
            pacer.reserve(Some(reservation), 0);
            let mut now = 0;
            for _ in 0..20 {
                reserved_gap_us(&mut pacer, &mut now, 0);
            }
            let steady = reserved_gap_us(&mut pacer, &mut now, 0);
            assert!((990..=1_010).contains(&steady), "{steady} µs");
            // Within the limit, the queue changes nothing.
            let within = reserved_gap_us(&mut pacer, &mut now, limit_us);
            assert!(within.abs_diff(steady) <= 2, "{within} against {steady} µs");
            for times in [2, 3] {
                let gap = reserved_gap_us(&mut pacer, &mut now, times * limit_us);
                let expected = if slows { times * steady } else { steady };
                assert!(
                    gap.abs_diff(expected) <= expected / 50,
                    "queue {} limits: {gap} µs apart, expected {expected}",
                    times
                );
            }
            // The queue gone, the deadline paces it again at once (a little faster: it
            // fell behind while it slowed).
            let after = reserved_gap_us(&mut pacer, &mut now, 0);
            assert!(after <= steady + 2, "{after} against {steady} µs");
        }
    }

    #[test]
    fn best_effort_backs_off_once_per_round_of_packets_and_recovers() {
        let mut pacer = Pacer::new(RadonConfig::default());
        pacer.on_sent(sent(0, 1_400, 0), 0);
        let w_min = pacer.wait_ns_min(1_488);
        // It starts at a sixteenth of its link.
        assert_eq!(pacer.wait_ns(), BEST_EFFORT_START_DIVISOR * w_min);
        let start = pacer.wait_ns();
        assert_eq!(start, BEST_EFFORT_START_DIVISOR * w_min);
        // Back to the link's rate within 20 ms of reports every 100 µs.
        let mut now = 0;
        for _ in 0..200 {
            now += 100;
            pacer.on_queue_report(report(0, now, 0, 0));
        }
        assert_eq!(pacer.wait_ns(), w_min);
        // A queue at the target, then far over it (more than twice it): the rise from the
        // target to twice it quarters the rate, and three times the target cuts it to half
        // (3/2 of the target over the queue).
        let target = QUEUE_TARGET_US_DEFAULT;
        let far = 3 * target;
        pacer.on_queue_report(report(target, now, 0, 0));
        assert_eq!(pacer.wait_ns(), w_min);
        pacer.on_queue_report(report(far, now + 10, 0, 1));
        let cut = pacer.wait_ns();
        assert!(cut.abs_diff(8 * w_min) <= 8, "{w_min} -> {cut}");
        // Later reports that still come from packets sent before the cut change nothing,
        // however many round trips they take to arrive.
        pacer.on_queue_report(report(far, now + 500, 2, 3));
        pacer.on_queue_report(report(far, now + 5_000, 3, 3));
        assert_eq!(pacer.wait_ns(), cut);
        // Once the peer has seen enough packets sent after it, the next cut.
        pacer.on_queue_report(report(far, now + 5_100, 4, 5));
        assert!(
            pacer.wait_ns().abs_diff(2 * cut) <= 8,
            "{cut} -> {}",
            pacer.wait_ns()
        );
        // A single report of an empty queue after a long silence counts for
        // BEST_EFFORT_REPORT_US_MAX only: a fifth more (e in BEST_EFFORT_GROWTH_US), and four
        // times for the queue's fall from twice the target.
        let before = pacer.wait_ns();
        pacer.on_queue_report(report(0, 1_000_000, 5, 5));
        assert!(
            pacer.wait_ns().abs_diff(before * 5 / 24) <= 8,
            "{before} -> {}",
            pacer.wait_ns()
        );
        let mut now = 1_000_000;
        for _ in 0..200 {
            now += 100;
            pacer.on_queue_report(report(0, now, 5, 5));
        }
        assert_eq!(pacer.wait_ns(), w_min);
        // A reservation ignores the queue.
        pacer.reserve(
            Some(Reservation {
                rate_bytes_per_s: 1,
                period_us: PERIOD_US_MIN,
            }),
            now,
        );
        let before = pacer.wait_ns();
        pacer.on_queue_report(report(100_000, now + 1_000, 100, 100));
        assert_eq!(pacer.wait_ns(), before);
    }

    #[test]
    fn a_passing_rise_of_the_queue_costs_best_effort_nothing() {
        let mut pacer = Pacer::new(RadonConfig::default());
        pacer.on_sent(sent(0, 1_400, 0), 0);
        let start = pacer.wait_ns();
        let target = QUEUE_TARGET_US_DEFAULT;
        // Reports that come at once (no time to move toward the target): a rise from the
        // target to twice it quarters the rate, the fall back restores it.
        pacer.on_queue_report(report(target, 10, 0, 0));
        pacer.on_queue_report(report(2 * target, 10, 0, 0));
        assert!(
            pacer.wait_ns().abs_diff(4 * start) <= 4,
            "{start} -> {}",
            pacer.wait_ns()
        );
        pacer.on_queue_report(report(target, 10, 0, 0));
        assert!(
            pacer.wait_ns().abs_diff(start) <= 1,
            "{start} -> {}",
            pacer.wait_ns()
        );
        // Below the target the queue's level does not matter, only its distance.
        pacer.on_queue_report(report(target / 2, 10, 0, 0));
        assert_eq!(pacer.wait_ns(), pacer.best_effort_wait_ns(1_488));
    }

    #[test]
    fn the_port_queue_is_the_latest_estimate_of_any_session_until_it_ages() {
        let mut port = PortQueue::default();
        assert_eq!(port.queue_delay_us(0), 0);
        port.on_estimate(800, 10);
        port.on_estimate(200, 20);
        assert_eq!(port.queue_delay_us(20), 200);
        port.on_estimate(900, 30);
        assert_eq!(port.queue_delay_us(30 + PORT_QUEUE_AGE_US_MAX - 1), 900);
        assert_eq!(port.queue_delay_us(30 + PORT_QUEUE_AGE_US_MAX), 0);
    }

    #[test]
    fn a_reserved_session_catches_up_slower_into_a_high_queue() {
        let config = RadonConfig {
            link_bytes_per_s: 25_000_000,
            ..RadonConfig::default()
        };
        let mut pacer = Pacer::new(config);
        let reservation = Reservation {
            rate_bytes_per_s: 5_000_000,
            period_us: 100_000,
        };
        pacer.reserve(Some(reservation), 0);
        let w_min = pacer.wait_ns_min(1_488);
        assert_eq!(pacer.catch_up_wait_ns(1_400, w_min), w_min);
        let high = 2 * config.queue_target_us + 1;
        pacer.on_queue_report(report_with(high, 10, 100));
        // 9/8 of the steady pace: 1,400 of the period's 500,000 bytes each 280 µs.
        let wait = pacer.catch_up_wait_ns(1_400, w_min);
        assert_eq!(wait, 280_000 * 8 / 9);
        // A stream 80 ms behind its budget (one packet sent at the period's start) would go
        // at w_min; into the high queue it goes no faster than the catch-up rate.
        pacer.on_sent(sent(0, 1_400, 1_000_000), 0);
        for now in (80_000..81_000).step_by(100) {
            pacer.on_sent(sent(now, 1_400, 1_000_000), 0);
            assert!(pacer.wait_ns() >= wait, "{}", pacer.wait_ns());
        }
        // Once the queue is reported down, it catches up at its link's rate.
        pacer.on_queue_report(report_with(0, 81_000, 100));
        assert_eq!(pacer.catch_up_wait_ns(1_400, w_min), w_min);
        for now in (81_000..82_000).step_by(100) {
            pacer.on_sent(sent(now, 1_400, 1_000_000), 0);
        }
        assert_eq!(pacer.wait_ns(), w_min);
    }

    #[test]
    fn the_median_filter_forgets_old_samples() {
        let mut filter = MedianFilter::default();
        for at in 0..4 {
            filter.push_at(1_000, at, SAMPLE_AGE_US_MAX);
        }
        assert_eq!(filter.push_at(0, 4, SAMPLE_AGE_US_MAX), 1_000);
        // Of packets sent long after, a single one outvotes the old ones.
        let later = 5 + SAMPLE_AGE_US_MAX as i64;
        assert_eq!(filter.push_at(0, later, SAMPLE_AGE_US_MAX), 0);
    }

    #[test]
    fn a_sparse_sender_hears_of_a_drained_queue_from_its_next_packet() {
        let mut estimator = QueueEstimator::default();
        estimator.on_packet(0, 100);
        // Three packets that met a queue of 800 µs, then one sent 5 ms later that met none.
        for sent in [10u32, 20, 30] {
            estimator.on_packet(sent, u64::from(sent) + 900);
        }
        assert_eq!(estimator.queue_delay_us(), 800);
        estimator.on_packet(5_030, 5_130);
        assert_eq!(estimator.queue_delay_us(), 0);
    }

    #[test]
    fn reservations_refuse_zero_rates_and_short_periods() {
        let ok = Reservation {
            rate_bytes_per_s: 1,
            period_us: 1_000_000,
        };
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(
            Reservation {
                rate_bytes_per_s: 0,
                ..ok
            }
            .validate(),
            Err(ReservationError::Rate)
        );
        assert_eq!(
            Reservation { period_us: 0, ..ok }.validate(),
            Err(ReservationError::Period(0))
        );
    }
}
