//! Radon in the simulator: the paper's punctuated and fairshare experiments in miniature.
//! Six senders write into one receiver behind a 200 Mbit/s switch port with a small buffer;
//! reserved streams must keep their rate while best-effort ones share what is left.

use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use tessera_datagram::radon::{BudgetKind, RadonConfig, Reservation};
use tessera_datagram::sim::{addr, BottleneckConfig, Sim, DATAGRAM_OVERHEAD_BYTES};
use tessera_datagram::{Config, Event, Micros, OVERHEAD_LEN};

const PORT_BITS_PER_S: u64 = 200_000_000;
const DATAGRAM_BYTES: usize = 1472;
const FRAGMENT_BYTES: usize = DATAGRAM_BYTES - OVERHEAD_LEN;
/// Messages of ten packets: the receiver counts bytes as whole messages arrive.
const MESSAGE_BYTES: usize = 10 * FRAGMENT_BYTES;
const PERIOD_US: Micros = 100_000;
/// The port's buffer, in full-size datagrams: smaller than one sender's window (64), so a
/// best-effort burst that does not back off overflows it.
const BUFFER_PACKETS: usize = 24;

/// Payload bytes per second the port can carry with every header.
fn payload_capacity() -> f64 {
    let wire = (DATAGRAM_BYTES + DATAGRAM_OVERHEAD_BYTES) as f64;
    PORT_BITS_PER_S as f64 / 8.0 * FRAGMENT_BYTES as f64 / wire
}

/// One sender's stream.
#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Reserved share of the port's payload capacity; `None`: best effort.
    share: Option<f64>,
    start_us: Micros,
    /// Packets to send; `None`: as many as the run lasts.
    packets: Option<u64>,
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    bytes: u64,
    first_us: Option<Micros>,
    last_us: Micros,
    /// Bytes delivered per period since the stream started.
    per_period: Vec<u64>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        let span = self.last_us - self.first_us.unwrap_or(self.last_us);
        self.bytes as f64 * 1e6 / span.max(1) as f64
    }
}

struct Run {
    outcomes: Vec<Outcome>,
    queue_drops: u64,
    datagrams: u64,
    /// One line per sender: packets, retransmissions, timeouts, drops at the port. Printed
    /// under the run's name by `report` (printed before it, a run's lines read as the
    /// previous run's: "481 retransmissions at 0 drops" was the unpaced punctuated run's
    /// reserved sender, with 50 of its packets dropped, read under the paced run's header).
    senders: Vec<String>,
}

fn sender_config(radon_best_effort: bool, budget: BudgetKind) -> Config {
    Config {
        payload_bytes_max: DATAGRAM_BYTES,
        radon: Some(RadonConfig {
            link_bytes_per_s: PORT_BITS_PER_S / 8,
            queue_target_us: 300,
            pace_best_effort: radon_best_effort,
            budget,
            ..RadonConfig::default()
        }),
        ..Config::default()
    }
}

/// The same, with reserved senders slowed past `queue_limit_targets` queue targets of queue
/// (0: never, as [`RadonConfig::reservation_only`]).
fn sender_config_limited(queue_limit_targets: u64) -> Config {
    let mut config = sender_config(true, BudgetKind::Rate);
    if let Some(radon) = config.radon.as_mut() {
        radon.reserved_queue_limit_targets = queue_limit_targets;
    }
    config
}

fn run(streams: &[Stream], radon_best_effort: bool, duration_us: Micros, seed: u64) -> Run {
    run_with(
        streams,
        radon_best_effort,
        BudgetKind::Rate,
        duration_us,
        seed,
    )
}

fn run_with(
    streams: &[Stream],
    radon_best_effort: bool,
    budget: BudgetKind,
    duration_us: Micros,
    seed: u64,
) -> Run {
    let config = sender_config(radon_best_effort, budget);
    run_configured(streams, &config, duration_us, seed)
}

/// Runs `streams`, each sender with `config`.
fn run_configured(streams: &[Stream], config: &Config, duration_us: Micros, seed: u64) -> Run {
    let mut sim = Sim::new(seed);
    let receiver = addr(100);
    sim.add_endpoint(
        receiver,
        Config {
            payload_bytes_max: DATAGRAM_BYTES,
            ..Config::default()
        },
    );
    sim.set_bottleneck(
        receiver,
        BottleneckConfig {
            rate_bits_per_s: PORT_BITS_PER_S,
            buffer_bytes: BUFFER_PACKETS * (DATAGRAM_BYTES + DATAGRAM_OVERHEAD_BYTES),
        },
    );
    let senders: Vec<SocketAddr> = (1..=streams.len() as u8).map(addr).collect();
    for (&sender, stream) in senders.iter().zip(streams) {
        sim.add_endpoint(sender, config.clone());
        sim.wake_at(stream.start_us);
    }
    let mut sessions = vec![None; streams.len()];
    let mut packets_queued = vec![0u64; streams.len()];
    let mut outcomes = vec![Outcome::default(); streams.len()];
    let index_of: HashMap<SocketAddr, usize> =
        senders.iter().enumerate().map(|(i, &a)| (a, i)).collect();
    let result = sim.run_until(duration_us, |sim| {
        let now = sim.now();
        for (index, stream) in streams.iter().enumerate() {
            if now < stream.start_us {
                continue;
            }
            let endpoint = sim.endpoint(senders[index]);
            let session = *sessions[index].get_or_insert_with(|| {
                let session = endpoint.connect(receiver, now);
                if let Some(share) = stream.share {
                    let reservation = Reservation {
                        rate_bytes_per_s: (share * payload_capacity()) as u64,
                        period_us: PERIOD_US,
                    };
                    endpoint.reserve(session, Some(reservation), now).unwrap();
                }
                session
            });
            let queued = endpoint.session_info(session).unwrap().queued_bytes;
            let wanted = stream.packets.unwrap_or(u64::MAX);
            if queued < 4 * MESSAGE_BYTES as u64 && packets_queued[index] < wanted {
                endpoint
                    .send(session, Bytes::from(vec![0u8; MESSAGE_BYTES]), now)
                    .unwrap();
                packets_queued[index] += 10;
            }
        }
        while let Some(event) = sim.endpoint(receiver).poll_event() {
            if let Event::Message { peer, message, .. } = event {
                let index = index_of[&peer];
                let outcome = &mut outcomes[index];
                let start = streams[index].start_us;
                outcome.bytes += message.len() as u64;
                outcome.first_us.get_or_insert(now);
                outcome.last_us = now;
                let period = ((now - start) / PERIOD_US) as usize;
                if outcome.per_period.len() <= period {
                    outcome.per_period.resize(period + 1, 0);
                }
                outcome.per_period[period] += message.len() as u64;
            }
        }
        false
    });
    assert!(result.is_err(), "the condition never holds");
    let sender_lines = senders.iter().map(|&sender| {
        let stats = sim.endpoint_ref(sender).stats();
        format!(
            "    {sender}: {} data packets, {} retransmitted, {} timeouts ({} spurious), {} dropped \
             at the port, {} restarts honoured",
            stats.data_packets_sent,
            stats.retransmissions,
            stats.timeouts,
            stats.spurious_timeouts,
            sim.stats().queue_drops_from.get(&sender).copied().unwrap_or(0),
            stats.restarts_honoured,
        )
    });
    Run {
        senders: sender_lines.collect(),
        outcomes,
        queue_drops: sim.stats().queue_drops,
        datagrams: sim.stats().datagrams_sent,
    }
}

/// Full periods of a reserved stream that delivered at least 0.97 of their budget, of all its
/// full periods in the run.
fn deadlines_met(
    outcome: &Outcome,
    share: f64,
    duration_us: Micros,
    start_us: Micros,
) -> (usize, usize) {
    let budget = share * payload_capacity() * PERIOD_US as f64 / 1e6;
    let full = ((duration_us - start_us) / PERIOD_US) as usize;
    let met = outcome
        .per_period
        .iter()
        .take(full)
        .filter(|&&bytes| bytes as f64 >= 0.97 * budget)
        .count();
    (met, full)
}

fn report(name: &str, streams: &[Stream], run: &Run) {
    eprintln!(
        "{name}: port drops {} of {} datagrams",
        run.queue_drops, run.datagrams
    );
    for line in &run.senders {
        eprintln!("{line}");
    }
    for (index, (stream, outcome)) in streams.iter().zip(&run.outcomes).enumerate() {
        let target = stream.share.map(|s| s * payload_capacity());
        eprintln!(
            "  stream {}: target {} received {:.2} MB/s ({} bytes){}",
            index + 1,
            target.map_or("best effort".into(), |t| format!("{:.2} MB/s", t / 1e6)),
            outcome.rate() / 1e6,
            outcome.bytes,
            target.map_or(String::new(), |t| format!(
                ", {:.3} of target",
                outcome.rate() / t
            )),
        );
    }
}

/// Stream 1 reserves 0.749 of the port for the whole run; five best-effort bursts of 500
/// packets interrupt it one after another (the paper's short streams 2-6).
fn punctuated() -> Vec<Stream> {
    let mut streams = vec![Stream {
        share: Some(0.749),
        start_us: 0,
        packets: None,
    }];
    for burst in 0..5u64 {
        streams.push(Stream {
            share: None,
            start_us: 100_000 + burst * 150_000,
            packets: Some(500),
        });
    }
    streams
}

const DURATION_US: Micros = 1_000_000;

#[test]
fn punctuated_reserved_stream_keeps_its_rate_while_best_effort_bursts_share_the_rest() {
    let streams = punctuated();
    let radon = run(&streams, true, DURATION_US, 1);
    report("punctuated, Radon", &streams, &radon);
    let constant = run(&streams, false, DURATION_US, 1);
    report("punctuated, best effort not paced", &streams, &constant);

    let target = 0.749 * payload_capacity();
    let primary = &radon.outcomes[0];
    assert!(
        primary.rate() >= 0.97 * target,
        "reserved stream received {:.3} of its target",
        primary.rate() / target
    );
    let (met, periods) = deadlines_met(primary, 0.749, DURATION_US, 0);
    eprintln!("  Radon: reserved stream met {met} of {periods} periods");
    assert_eq!(met, periods);
    // The bursts get the rest of the port: each moves its 500 packets at 0.8 of what the
    // reservation leaves at least.
    let rest = (1.0 - 0.749) * payload_capacity();
    for (index, outcome) in radon.outcomes.iter().enumerate().skip(1) {
        assert_eq!(outcome.bytes, 500 * FRAGMENT_BYTES as u64, "burst {index}");
        assert!(
            outcome.rate() >= 0.8 * rest,
            "burst {index}: {:.3} of the rest",
            outcome.rate() / rest
        );
    }
    // Backing off on the queue is what keeps the port's small buffer from overflowing.
    assert!(
        radon.queue_drops * 10 <= constant.queue_drops.max(1),
        "Radon dropped {} at the port, unpaced best effort {}",
        radon.queue_drops,
        constant.queue_drops
    );
}

/// One reserved stream holds its share of the port the whole run; best-effort senders, from
/// 50 ms on, fill what it leaves without making it miss a deadline.
#[test]
fn best_effort_fills_what_the_reservation_leaves() {
    for (share, best_effort) in [(0.749, 1), (0.749, 2), (0.5, 2), (0.3, 3)] {
        let mut streams = vec![Stream {
            share: Some(share),
            start_us: 0,
            packets: None,
        }];
        streams.extend(std::iter::repeat_n(
            Stream {
                share: None,
                start_us: 50_000,
                packets: None,
            },
            best_effort,
        ));
        let radon = run(&streams, true, DURATION_US, 5);
        let name = format!("reserved {share} and {best_effort} best effort, Radon");
        report(&name, &streams, &radon);
        let rest = (1.0 - share) * payload_capacity();
        let filled: f64 = radon.outcomes.iter().skip(1).map(Outcome::rate).sum();
        let (met, periods) = deadlines_met(&radon.outcomes[0], share, DURATION_US, 0);
        eprintln!(
            "  best effort {:.3} of the rest; reserved met {met} of {periods} periods",
            filled / rest
        );
        assert!(filled >= 0.8 * rest, "{name}: {:.3}", filled / rest);
        assert_eq!(met, periods, "{name}");
        assert!(radon.queue_drops * 1000 <= radon.datagrams, "{name}");
    }
}

#[test]
fn fairshare_six_reserved_streams_each_keep_their_rate() {
    let streams = vec![
        Stream {
            share: Some(0.166),
            start_us: 0,
            packets: None,
        };
        6
    ];
    let radon = run(&streams, true, DURATION_US, 2);
    report("fairshare, Radon", &streams, &radon);
    let target = 0.166 * payload_capacity();
    let rates: Vec<f64> = radon.outcomes.iter().map(Outcome::rate).collect();
    for (index, rate) in rates.iter().enumerate() {
        assert!(
            *rate >= 0.97 * target,
            "stream {}: {:.3} of target",
            index + 1,
            rate / target
        );
    }
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    let jain = sum * sum / (rates.len() as f64 * squares);
    eprintln!("  Jain's fairness index {jain:.4}");
    assert!(jain >= 0.99);
    assert!(
        radon.queue_drops * 1000 <= radon.datagrams,
        "{} drops",
        radon.queue_drops
    );
}

/// Six streams reserved at 0.18 of the port each (1.08 of it, as reservations that no
/// admission checked). Slowed in proportion to the queue their receiver reports past 2 of
/// this harness's queue targets (600 µs, 40% of the port's buffer, as 4 ms of the lab's
/// 9.7 ms), they get a sixth of the port each (0.93-1.04) and the port drops 247-266 of
/// about 33,000 datagrams (seeds 1, 2); paced by their deadlines alone, they keep the port's
/// buffer full and it drops 814-847, the streams getting 0.78-1.05 of a sixth and less in
/// all. (With the limit at 83% of the buffer, 4 targets here, the queue it allows is too
/// close to a full buffer: one stream of six lost its packets again and again and got
/// 0.28-0.42 of a sixth.)
#[test]
fn reservations_that_overload_the_port_give_rate_not_packets() {
    let streams = vec![
        Stream {
            share: Some(0.18),
            start_us: 0,
            packets: None,
        };
        6
    ];
    let sixth = payload_capacity() / 6.0;
    for seed in [1, 2] {
        let limited = run_configured(&streams, &sender_config_limited(2), DURATION_US, seed);
        report("overloaded, slowed past the limit", &streams, &limited);
        let unlimited = run_configured(&streams, &sender_config_limited(0), DURATION_US, seed);
        report("overloaded, deadlines only", &streams, &unlimited);
        assert!(
            limited.queue_drops * 2 <= unlimited.queue_drops,
            "seed {seed}: the port dropped {} slowed, {} not",
            limited.queue_drops,
            unlimited.queue_drops
        );
        for (index, outcome) in limited.outcomes.iter().enumerate() {
            assert!(
                outcome.rate() >= 0.9 * sixth,
                "seed {seed}: stream {} got {:.3} of a sixth of the port",
                index + 1,
                outcome.rate() / sixth
            );
        }
        let total = |run: &Run| run.outcomes.iter().map(Outcome::rate).sum::<f64>();
        assert!(
            total(&limited) >= total(&unlimited),
            "seed {seed}: {:.2} MB/s in all slowed, {:.2} not",
            total(&limited) / 1e6,
            total(&unlimited) / 1e6
        );
    }
}

/// The window-based percent budget ("less laxity, more window", windows dispatched at a
/// random offset within the reported queue) on the fairshare and punctuated runs.
#[test]
fn window_budget_keeps_fairshare_and_punctuated_reservations() {
    let fairshare = vec![
        Stream {
            share: Some(0.166),
            start_us: 0,
            packets: None,
        };
        6
    ];
    let window = run_with(&fairshare, true, BudgetKind::Window, DURATION_US, 2);
    report("fairshare, window budget", &fairshare, &window);
    let target = 0.166 * payload_capacity();
    for (index, outcome) in window.outcomes.iter().enumerate() {
        let (met, periods) = deadlines_met(outcome, 0.166, DURATION_US, 0);
        eprintln!("  stream {}: met {met} of {periods}", index + 1);
        assert!(outcome.rate() >= 0.97 * target, "stream {}", index + 1);
        assert_eq!(met, periods, "stream {}", index + 1);
    }
    assert!(window.queue_drops * 1000 <= window.datagrams);

    let streams = punctuated();
    let window = run_with(&streams, true, BudgetKind::Window, DURATION_US, 1);
    report("punctuated, window budget", &streams, &window);
    let (met, periods) = deadlines_met(&window.outcomes[0], 0.749, DURATION_US, 0);
    eprintln!("  reserved stream met {met} of {periods} periods");
    // Here the window budget falls short of the rate budget (1.001 of target, every
    // deadline): with laxity to spare its window carries the rate per smoothed round trip,
    // but its rounds last longer than that once best effort queues at the port, and "less
    // laxity, more window" catches up too late. The README has the numbers; this guards
    // against worse.
    let target = 0.749 * payload_capacity();
    assert!(
        window.outcomes[0].rate() >= 0.8 * target,
        "{:.3} of target",
        window.outcomes[0].rate() / target
    );
    let rest = (1.0 - 0.749) * payload_capacity();
    for (index, outcome) in window.outcomes.iter().enumerate().skip(1) {
        assert_eq!(outcome.bytes, 500 * FRAGMENT_BYTES as u64, "burst {index}");
        eprintln!("  burst {index}: {:.3} of the rest", outcome.rate() / rest);
    }
}

#[test]
fn best_effort_streams_alone_share_the_port_and_back_off_before_it_overflows() {
    // Three best-effort senders, no reservation: with Radon they keep the queue near its
    // target instead of filling the buffer.
    let streams = vec![
        Stream {
            share: None,
            start_us: 0,
            packets: None,
        };
        3
    ];
    let radon = run(&streams, true, 300_000, 3);
    report("three best effort, Radon", &streams, &radon);
    let unpaced = run(&streams, false, 300_000, 3);
    report("three best effort, not paced", &streams, &unpaced);
    let total: f64 = radon.outcomes.iter().map(Outcome::rate).sum();
    eprintln!(
        "  Radon total {:.3} of the port",
        total / payload_capacity()
    );
    assert!(total >= 0.6 * payload_capacity());
    assert!(radon.queue_drops * 4 <= unpaced.queue_drops.max(1));
}

#[test]
fn sessions_an_endpoint_opens_carry_its_connect_reservation() {
    // 1 MB/s in periods of 100 ms: 100,000 bytes per period, whatever is queued.
    let mut sim = Sim::new(4);
    let (client, server) = (addr(1), addr(2));
    let reservation = Reservation {
        rate_bytes_per_s: 1_000_000,
        period_us: PERIOD_US,
    };
    sim.add_endpoint(
        client,
        Config {
            connect_reservation: Some(reservation),
            ..Config::default()
        },
    );
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    assert_eq!(
        sim.endpoint(client)
            .session_info(session)
            .unwrap()
            .reservation,
        Some(reservation)
    );
    for _ in 0..100 {
        sim.endpoint(client)
            .send(session, Bytes::from(vec![0u8; 10_000]), 0)
            .unwrap();
    }
    let mut delivered = 0u64;
    let mut drain = |sim: &mut Sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message, .. } = event {
                delivered += message.len() as u64;
            }
        }
    };
    sim.run_until(250_000, |sim| {
        drain(sim);
        false
    })
    .unwrap_err();
    drain(&mut sim);
    // Periods 0 and 1 whole, and period 2 half: about 250,000 bytes, never 300,000.
    eprintln!("delivered {delivered} bytes in 250 ms at 1 MB/s");
    assert!((220_000..300_000).contains(&delivered), "{delivered}");
}

/// Bytes of framing an application sends with each request (a frame and message header).
const REQUEST_HEADER_BYTES: usize = 64;
/// The application's requests carry at most this much data each (a stripe unit).
const REQUEST_DATA_BYTES: u64 = 64 << 10;

/// What a periodic run measured for each stream: periods, deadlines met, the worst
/// lateness (µs), and its sender's retransmissions, timeouts and spurious timeouts.
#[derive(Debug, Default)]
struct Deadlines {
    periods: u64,
    met: u64,
    worst_late_us: Micros,
    retransmissions: u64,
    timeouts: u64,
    spurious: u64,
    data_packets: u64,
    /// Its packets dropped at the port.
    dropped: u64,
    /// Its data delivered, bytes, and when its last byte arrived.
    delivered_bytes: u64,
    last_delivered_us: Micros,
    /// Every message's delivery: when, and its data bytes.
    deliveries: Vec<(Micros, u64)>,
}

/// Six hosts (or fewer) write reserved streams into one receiver behind the port, as
/// `lab radon`'s clients do: each period's bytes are handed to the session at the period's
/// start (the application's clock, which starts `start_lag_us` before the session's first
/// packet can go), as requests of at most a stripe unit, cut at the period's end, each with
/// its header. A period is met if its last request reached the receiver by the period's
/// end. Every host wakes late by `lateness`.
fn run_periodic(
    shares: &[f64],
    lateness: Option<tessera_datagram::sim::Lateness>,
    duration_us: Micros,
    seed: u64,
) -> Vec<Deadlines> {
    run_periodic_from(
        shares,
        lateness,
        duration_us,
        seed,
        PeriodicStart::default(),
    )
    .0
}

/// When a periodic run's streams start, and what their sessions did before.
#[derive(Clone, Copy, Debug)]
struct PeriodicStart {
    /// When the application's first period starts.
    start_us: Micros,
    /// A small request each session sends at this time before the stream (the lab opens
    /// its sessions with one), in a period of the session's own.
    opening_us: Option<Micros>,
    /// Streams from this index on are not reserved (refused by admission control): they
    /// release their bytes a period at a time as the others do, and their sessions run
    /// best effort.
    best_effort_from: usize,
    /// The port, the streams' period and best effort's queue target.
    port: PortSetup,
    /// The best-effort streams send this many bytes each, all handed to the session when
    /// they start (the punctuated run's short streams), instead of a period's at a time.
    short: Option<ShortStreams>,
}

/// Best-effort streams that each send `bytes` at once from their own start: stream
/// `best_effort_from + k` at `starts_us[k]`.
#[derive(Clone, Copy, Debug)]
struct ShortStreams {
    starts_us: &'static [Micros],
    bytes: u64,
}

/// What a periodic run's port queued: the most, µs of its rate, and the milliseconds in
/// which it held more than twice the senders' queue target, of all of them.
#[derive(Clone, Copy, Debug)]
struct PortQueueSeen {
    us_max: Micros,
    ms_over_twice_target: usize,
    ms: usize,
}

/// The port's buffer, the streams' period and the senders' queue target of a periodic run.
#[derive(Clone, Copy, Debug)]
struct PortSetup {
    buffer_packets: usize,
    period_us: Micros,
    queue_target_us: Micros,
}

impl Default for PortSetup {
    /// The other runs' small port, 100 ms periods, 300 µs of queue.
    fn default() -> PortSetup {
        PortSetup {
            buffer_packets: BUFFER_PACKETS,
            period_us: PERIOD_US,
            queue_target_us: 300,
        }
    }
}

/// `lab radon --quick`'s port: 128 frames of buffer, periods of 250 ms, best effort's
/// default queue target (1 ms).
const LAB_QUICK_PORT: PortSetup = PortSetup {
    buffer_packets: 128,
    period_us: 250_000,
    queue_target_us: tessera_datagram::radon::QUEUE_TARGET_US_DEFAULT,
};

impl Default for PeriodicStart {
    fn default() -> PeriodicStart {
        PeriodicStart {
            start_us: 10_000,
            opening_us: None,
            best_effort_from: usize::MAX,
            port: PortSetup::default(),
            short: None,
        }
    }
}

fn run_periodic_from(
    shares: &[f64],
    lateness: Option<tessera_datagram::sim::Lateness>,
    duration_us: Micros,
    seed: u64,
    start: PeriodicStart,
) -> (Vec<Deadlines>, PortQueueSeen) {
    let period_us = start.port.period_us;
    let mut sim = Sim::new(seed);
    let receiver = addr(100);
    sim.add_endpoint(
        receiver,
        Config {
            payload_bytes_max: DATAGRAM_BYTES,
            ..Config::default()
        },
    );
    sim.set_bottleneck(
        receiver,
        BottleneckConfig {
            rate_bits_per_s: PORT_BITS_PER_S,
            buffer_bytes: start.port.buffer_packets * (DATAGRAM_BYTES + DATAGRAM_OVERHEAD_BYTES),
        },
    );
    sim.set_lateness(receiver, lateness);
    let senders: Vec<SocketAddr> = (1..=shares.len() as u8).map(addr).collect();
    let mut sessions = Vec::new();
    let budgets: Vec<u64> = shares
        .iter()
        .map(|share| (share * payload_capacity() * period_us as f64 / 1e6) as u64)
        .collect();
    for (index, (&sender, &share)) in senders.iter().zip(shares).enumerate() {
        let mut config = sender_config(true, BudgetKind::Rate);
        if let Some(radon) = config.radon.as_mut() {
            radon.send_by_margin_divisor = tessera_datagram::radon::SEND_BY_MARGIN_DIVISOR;
            radon.queue_target_us = start.port.queue_target_us;
        }
        sim.add_endpoint(sender, config);
        sim.set_lateness(sender, lateness);
        let session = sim.endpoint(sender).connect(receiver, 0);
        let reservation = Reservation {
            rate_bytes_per_s: (share * payload_capacity()) as u64,
            period_us,
        };
        if index < start.best_effort_from {
            sim.endpoint(sender)
                .reserve(session, Some(reservation), 0)
                .unwrap();
        }
        sessions.push(session);
    }
    // The streams start once their sessions are open, each period at a period's start.
    let PeriodicStart {
        start_us,
        opening_us,
        ..
    } = start;
    if let Some(at) = opening_us {
        sim.wake_at(at);
    }
    let mut opened = opening_us.is_none();
    let mut started_at = None;
    let periods = (duration_us - start_us) / period_us - 1;
    for period in 0..=periods {
        sim.wake_at(start_us + period * period_us);
    }
    // A short stream's start and bytes.
    let short_stream = |index: usize| {
        let short = start.short.filter(|_| index >= start.best_effort_from)?;
        Some((short.starts_us[index - start.best_effort_from], short.bytes))
    };
    for index in 0..shares.len() {
        if let Some((at, _)) = short_stream(index) {
            sim.wake_at(at);
        }
    }
    let index_of: HashMap<SocketAddr, usize> =
        senders.iter().enumerate().map(|(i, &a)| (a, i)).collect();
    let mut released = vec![0u64; shares.len()];
    let mut delivered = vec![0u64; shares.len()];
    let mut results: Vec<Deadlines> = shares.iter().map(|_| Deadlines::default()).collect();
    let end = start_us + (periods + 2) * period_us;
    // The port's largest queue in each millisecond, µs.
    let mut queue_ms: Vec<Micros> = Vec::new();
    let _ = sim.run_until(end, |sim| {
        let now = sim.now();
        let ms = (now / 1_000) as usize;
        if queue_ms.len() <= ms {
            queue_ms.resize(ms + 1, 0);
        }
        queue_ms[ms] = queue_ms[ms].max(sim.port_queue_us(receiver).unwrap_or(0));
        if !opened && opening_us.is_some_and(|at| now >= at) {
            opened = true;
            for (&sender, &session) in senders.iter().zip(&sessions) {
                let request = Bytes::from(vec![0u8; REQUEST_HEADER_BYTES]);
                sim.endpoint(sender).send(session, request, now).unwrap();
                sim.notify(sender);
            }
        }
        if started_at.is_none() && now >= start_us {
            // The application's stream starts: its sessions' pacers count from its start.
            started_at = Some(now);
            for &sender in &senders {
                sim.endpoint(sender).start_periods(start_us, now);
            }
        }
        let due = if now >= start_us {
            ((now - start_us) / period_us + 1).min(periods)
        } else {
            0
        };
        for index in 0..shares.len() {
            let target = match short_stream(index) {
                Some((at, bytes)) => u64::from(now >= at) * bytes,
                None => due * budgets[index],
            };
            while released[index] < target {
                // A request never spans a period's end.
                let period_end = (released[index] / budgets[index] + 1) * budgets[index];
                let data = REQUEST_DATA_BYTES
                    .min(period_end - released[index])
                    .min(target - released[index]);
                let message = vec![0u8; REQUEST_HEADER_BYTES + data as usize];
                sim.endpoint(senders[index])
                    .send(sessions[index], Bytes::from(message), now)
                    .unwrap();
                released[index] += data;
                sim.notify(senders[index]);
            }
        }
        while let Some(event) = sim.endpoint(receiver).poll_event() {
            if let Event::Message { peer, message, .. } = event {
                let index = index_of[&peer];
                if message.len() == REQUEST_HEADER_BYTES {
                    continue; // the opening request
                }
                let before = delivered[index] / budgets[index];
                delivered[index] += (message.len() - REQUEST_HEADER_BYTES) as u64;
                results[index]
                    .deliveries
                    .push((now, (message.len() - REQUEST_HEADER_BYTES) as u64));
                results[index].delivered_bytes = delivered[index];
                results[index].last_delivered_us = now;
                let after = delivered[index] / budgets[index];
                for period in before..after {
                    let deadline = start_us + (period + 1) * period_us;
                    let result = &mut results[index];
                    result.periods += 1;
                    if now <= deadline {
                        result.met += 1;
                    } else {
                        result.worst_late_us = result.worst_late_us.max(now - deadline);
                    }
                }
            }
        }
        false
    });
    for (index, &sender) in senders.iter().enumerate() {
        let stats = sim.endpoint_ref(sender).stats();
        let result = &mut results[index];
        if index < start.best_effort_from {
            assert_eq!(
                result.periods,
                periods,
                "stream {}: every period's bytes delivered",
                index + 1
            );
        }
        result.retransmissions = stats.retransmissions;
        result.timeouts = stats.timeouts;
        result.spurious = stats.spurious_timeouts;
        result.data_packets = stats.data_packets_sent;
        result.dropped = sim
            .stats()
            .queue_drops_from
            .get(&sender)
            .copied()
            .unwrap_or(0);
    }
    let twice_target_us = 2 * start.port.queue_target_us;
    let seen = PortQueueSeen {
        us_max: queue_ms.iter().copied().max().unwrap_or(0),
        ms_over_twice_target: queue_ms.iter().filter(|&&q| q > twice_target_us).count(),
        ms: queue_ms.len(),
    };
    (results, seen)
}

fn report_deadlines(name: &str, shares: &[f64], results: &[Deadlines]) {
    eprintln!("{name}:");
    for (index, (share, result)) in shares.iter().zip(results).enumerate() {
        eprintln!(
            "  stream {} at {share}: met {} of {} deadlines (worst {} µs late); {} data \
             packets, {} retransmitted, {} timeouts ({} spurious), {} dropped at the port",
            index + 1,
            result.met,
            result.periods,
            result.worst_late_us,
            result.data_packets,
            result.retransmissions,
            result.timeouts,
            result.spurious,
            result.dropped,
        );
    }
}

/// How late the lab's hosts wake (`lab radon`'s calibration: sleeps of 100 µs woke 70 µs
/// late at the median, 100-180 µs at the 99th percentile, a few ms at most).
const LAB_LATENESS: tessera_datagram::sim::Lateness = tessera_datagram::sim::Lateness {
    late_us_max: 140,
    stall: 0.002,
    stall_us_max: 3_000,
};

/// Every deadline of the application's periods, requests with their headers and all, on
/// hosts that wake late: five fairshare streams (what admission at 0.9 of the port lets in),
/// and a stream at 0.749 with a small one. (Six at 0.166 book 0.996 of the port, which
/// cannot carry the 16/15 of the send-by margin.) Without the framing allowance the stream
/// at 0.749 missed all 8 deadlines, by 615 µs at most.
///
/// Spurious timeouts stay under 1.5% of the packets sent: the retransmission timer waits
/// for the holds the receiver reports. (Waiting only for its configured ACK delay, the
/// late receiver's ACKs came after 38-63 timeouts per fairshare stream, 2.2-2.8% of its
/// packets, and 72 of the stream at 0.1, 5.1%.)
#[test]
fn reserved_streams_meet_their_application_deadlines_on_late_hosts() {
    for shares in [vec![0.166; 5], vec![0.749, 0.1]] {
        for lateness in [None, Some(LAB_LATENESS)] {
            let results = run_periodic(&shares, lateness, DURATION_US, 6);
            let name = format!("periodic {shares:?}, lateness {lateness:?}");
            report_deadlines(&name, &shares, &results);
            for (index, result) in results.iter().enumerate() {
                let stream = index + 1;
                assert_eq!(result.met, result.periods, "{name}: stream {stream}");
                assert!(
                    result.spurious * 1_000 <= result.data_packets * 15,
                    "{name}: stream {stream}: {} spurious timeouts",
                    result.spurious
                );
            }
        }
    }
}

/// A stream that starts at any point into a period of a session that has been open and
/// used before (the lab opens each stream's session with a request shortly before the
/// start) meets every deadline of its own periods, on hosts as late as the lab's, and
/// sends no burst the port drops: the sessions' pacers count their periods from the
/// stream's start (`Endpoint::start_periods`), not from their own. (Before, with the
/// session's own periods, the stream opened 30 ms before its start had 151 packets dropped
/// at the port and a stream beside it met 6 of 8 deadlines.)
#[test]
fn a_stream_that_starts_mid_period_of_an_older_session_meets_its_deadlines() {
    let shares = [0.166; 5];
    for offset_us in [3_000, 8_000, 30_000, 60_000, 97_000] {
        let start = PeriodicStart {
            start_us: 5 * PERIOD_US,
            opening_us: Some(5 * PERIOD_US - offset_us),
            ..PeriodicStart::default()
        };
        let duration_us = start.start_us + 9 * PERIOD_US;
        let (results, _) = run_periodic_from(&shares, Some(LAB_LATENESS), duration_us, 7, start);
        let name = format!("periodic from 500 ms, opened {offset_us} µs before");
        report_deadlines(&name, &shares, &results);
        for (index, result) in results.iter().enumerate() {
            let stream = index + 1;
            assert_eq!(result.met, result.periods, "{name}: stream {stream}");
            assert_eq!(result.dropped, 0, "{name}: stream {stream}");
        }
    }
}

/// Hosts busier than [`LAB_LATENESS`], toward the lab's on a loaded machine: every wake-up
/// up to 300 µs late and 1% of them stalled for up to 3 ms (`lab radon` at load 13-18:
/// wake-ups over 1 ms late 29% of the time, 16 ms at most).
const BUSY_LATENESS: tessera_datagram::sim::Lateness = tessera_datagram::sim::Lateness {
    late_us_max: 300,
    stall: 0.01,
    stall_us_max: 3_000,
};

/// Reserved streams on busy hosts resend at most 0.1% of their packets when the port drops
/// none (the target for fairshare), and still meet every deadline: a paced sender
/// whose timer expires while it keeps sending leaves the receiver to ask for a gap rather
/// than going back. (Going back at every timeout, the five streams resent 25-29 packets each,
/// 1.1-1.3%, with 0-1 dropped: 23-26 of their timeouts were found spurious.)
#[test]
fn reserved_streams_on_busy_hosts_resend_nothing_the_port_did_not_drop() {
    let shares = [0.166; 5];
    let results = run_periodic(&shares, Some(BUSY_LATENESS), DURATION_US, 8);
    let name = format!("periodic {shares:?}, lateness {BUSY_LATENESS:?}");
    report_deadlines(&name, &shares, &results);
    for (index, result) in results.iter().enumerate() {
        let stream = index + 1;
        assert_eq!(result.met, result.periods, "{name}: stream {stream}");
        assert_eq!(result.dropped, 0, "{name}: stream {stream}");
        assert!(
            result.retransmissions * 1_000 <= result.data_packets,
            "{name}: stream {stream}: {} of {} packets resent",
            result.retransmissions,
            result.data_packets
        );
    }
}

/// The paper's unfair run behind admission control (`lab radon`'s tessera line): 0.5, 0.25
/// and 0.125 of the port admitted and reserved, the three that do not fit (0.0625, 0.03125,
/// 0.03125) refused and sent best effort, each period's bytes released at its start as the
/// admitted streams' are, on hosts as late as the lab's. The target: best effort
/// yields to the reservations, every admitted stream meets its deadlines and loses at most
/// 0.1% of its packets at the port.
///
/// Before (session 7), with seed 9, 163, 31 and 20 packets of the admitted streams were
/// dropped and stream 1 met 4 of 8 deadlines: the best-effort senders started at a quarter
/// of the link each and ramped by a share of the link on their own sparse estimates, the
/// port's queue filled, and the admitted streams caught up at line rate into it. Now the
/// receiver reports the queue any session's packets show (`radon::PortQueue`), best effort
/// starts at a sixteenth of the link and grows in proportion to its own rate, and a reserved
/// stream catches up at 9/8 of its rate while the queue is high: 0 dropped, every deadline
/// (seeds 1-11: at most 2 packets of an admitted stream dropped, 0.06%). Each change alone
/// left 20-112 dropped.
#[test]
fn refused_streams_sent_best_effort_do_not_push_admitted_streams_into_loss() {
    let shares = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125];
    let start = PeriodicStart {
        best_effort_from: 3,
        ..PeriodicStart::default()
    };
    let (results, _) = run_periodic_from(&shares, Some(LAB_LATENESS), DURATION_US, 9, start);
    let name = "unfair, three admitted, three best effort";
    report_deadlines(name, &shares, &results);
    for (index, result) in results.iter().enumerate().take(3) {
        let stream = index + 1;
        assert_eq!(result.met, result.periods, "{name}: stream {stream}");
        assert!(
            result.dropped * 1_000 <= result.data_packets,
            "{name}: stream {stream}: {} of {} packets dropped at the port",
            result.dropped,
            result.data_packets
        );
    }
}

/// Frames of the lab's port per µs of its queue (1514-byte frames at 200 Mbit/s: 60.56 µs).
const LAB_FRAME_US: Micros = 61;

/// `lab radon --quick`'s fairshare and bulk runs behind admission control: five streams at
/// 0.166 admitted, the sixth refused (fairshare: a period's 0.166 released at a time) or a
/// bulk writer with more queued than the port can carry, both sent best effort, into the
/// lab's 128-frame port in 250 ms periods, hosts as late as the lab's. The reservations send
/// about 0.9 of the port and stop a sixteenth of each period before its end (the send-by
/// margin); best effort grows into that gap and must come down when they resume.
///
/// Before (session 8's controller: best effort cut by a quarter once per round of packets,
/// moved by the queue's distance from the target alone), the port's queue rose to 81-105
/// frames at each period's start and held more than twice the target (1 ms) for 611-690 ms
/// of the 1.7-2 s, for tens of ms at a time; in the lab, with noisier hosts, it reached the
/// 128 frames and dropped the admitted streams' packets (0.9-1.9% resent). Now (the cut in
/// proportion to the queue, the rate moved inversely to the square of the queue's level
/// between the target and twice it) 41-43 frames, 70-80 ms.
#[test]
fn best_effort_beside_resuming_reservations_keeps_the_port_queue_low() {
    let bulk = [0.166, 0.166, 0.166, 0.166, 0.166, 1.0];
    for (name, shares) in [("fairshare", [0.166; 6]), ("bulk", bulk)] {
        for seed in 1..=2 {
            let start = PeriodicStart {
                best_effort_from: 5,
                port: LAB_QUICK_PORT,
                ..PeriodicStart::default()
            };
            let (results, queue) =
                run_periodic_from(&shares, Some(LAB_LATENESS), 2_000_000, seed, start);
            let name = format!("{name} behind admission, lab's quick port, seed {seed}");
            report_deadlines(&name, &shares, &results);
            eprintln!("  port queue: {queue:?}");
            for (index, result) in results.iter().enumerate().take(5) {
                let stream = index + 1;
                assert_eq!(result.met, result.periods, "{name}: stream {stream}");
                assert_eq!(result.dropped, 0, "{name}: stream {stream}");
            }
            let frames_max = queue.us_max / LAB_FRAME_US;
            assert!(
                frames_max <= LAB_QUICK_PORT.buffer_packets as u64 / 2,
                "{name}: the port queued {frames_max} frames"
            );
            assert!(
                queue.ms_over_twice_target * 100 <= queue.ms * 15,
                "{name}: over twice the target {} of {} ms",
                queue.ms_over_twice_target,
                queue.ms
            );
        }
    }
}

/// `lab radon`'s punctuated run behind admission, on the lab's quick port: stream 1 admitted
/// at 0.749 of the port, its bytes released a period at a time and due done a send-by
/// margin before each period's end (as the lab's clients have it), and five short streams
/// of 500 packets, refused and sent best effort, each starting 30 ms into a period and
/// done well before the period's end: they run only while stream 1 holds its reservation.
/// The target: the short streams get at least 0.8 of what stream 1 leaves, while
/// stream 1 meets every deadline and loses at most 0.5% of its packets.
///
/// Before, the margin was a sixteenth of the period (15.6 ms of 250 ms), so stream 1 sent
/// at 16/15 of its rate, 0.799 of the port, while it sent: 0.201 was left, 0.80 of the
/// rest, before any controller's cost, and the short streams got 0.73-0.81 of the rest
/// (seeds 1-3; the local CI's lab run: 0.73 and 0.75 for the two that ran entirely inside
/// a period). The margin is now at most [`tessera_datagram::radon::SEND_BY_MARGIN_US_MAX`].
#[test]
fn short_best_effort_streams_get_the_rest_while_a_reservation_sends() {
    const STARTS_US: [Micros; 5] = [290_000, 540_000, 790_000, 1_040_000, 1_290_000];
    let shares = [0.749, 0.251, 0.251, 0.251, 0.251, 0.251];
    let short_bytes = 500 * FRAGMENT_BYTES as u64;
    let rest = (1.0 - 0.749) * payload_capacity();
    for seed in 1..=3 {
        let start = PeriodicStart {
            best_effort_from: 1,
            port: LAB_QUICK_PORT,
            short: Some(ShortStreams {
                starts_us: &STARTS_US,
                bytes: short_bytes,
            }),
            ..PeriodicStart::default()
        };
        let duration_us = start.start_us + 7 * LAB_QUICK_PORT.period_us;
        let (results, queue) =
            run_periodic_from(&shares, Some(LAB_LATENESS), duration_us, seed, start);
        let name = format!("punctuated behind admission, lab's quick port, seed {seed}");
        report_deadlines(&name, &shares, &results);
        eprintln!("  port queue: {queue:?}");
        let long = &results[0];
        assert_eq!(long.met, long.periods, "{name}: stream 1's deadlines");
        assert!(
            long.retransmissions * 1_000 <= long.data_packets * 5,
            "{name}: stream 1 resent {} of {} packets",
            long.retransmissions,
            long.data_packets
        );
        for (index, (result, &start_us)) in results[1..].iter().zip(&STARTS_US).enumerate() {
            let stream = index + 2;
            assert_eq!(
                result.delivered_bytes, short_bytes,
                "{name}: stream {stream}"
            );
            let rate = short_bytes as f64 * 1e6 / (result.last_delivered_us - start_us) as f64;
            eprintln!(
                "  stream {stream}: {:.3} of the rest, done {} ms after its start",
                rate / rest,
                (result.last_delivered_us - start_us) / 1_000
            );
            assert!(
                rate >= 0.8 * rest,
                "{name}: stream {stream} got {:.3} of the rest",
                rate / rest
            );
        }
    }
}

/// `lab radon`'s full punctuated run in the simulator: 1 s periods over 10 s, the short
/// streams starting at 1/7 to 5/7 of the run (0.14-0.86 s into a period). With the lab's
/// usual lateness every short stream gets at least 0.8 of the rest (the target);
/// on a loaded host (late up to 400 us, 5% stalls) the shares are printed only: they reach
/// 0.54-0.97 there.
#[test]
fn short_best_effort_streams_in_the_full_run() {
    const STARTS_US: [Micros; 5] = [1_438_571, 2_867_143, 4_295_714, 5_724_286, 7_152_857];
    const FULL_PORT: PortSetup = PortSetup {
        period_us: 1_000_000,
        ..LAB_QUICK_PORT
    };
    // A loaded host (`lab radon` at load 9-10: wake-ups over 1 ms late 30% of the time).
    const LOADED: tessera_datagram::sim::Lateness = tessera_datagram::sim::Lateness {
        late_us_max: 400,
        stall: 0.05,
        stall_us_max: 3_000,
    };
    let shares = [0.749, 0.251, 0.251, 0.251, 0.251, 0.251];
    let short_bytes = 500 * FRAGMENT_BYTES as u64;
    let rest = (1.0 - 0.749) * payload_capacity();
    for (seed, lateness) in [
        (1, LAB_LATENESS),
        (2, LAB_LATENESS),
        (1, LOADED),
        (2, LOADED),
    ] {
        eprintln!("lateness {lateness:?}");
        let start = PeriodicStart {
            best_effort_from: 1,
            port: FULL_PORT,
            short: Some(ShortStreams {
                starts_us: &STARTS_US,
                bytes: short_bytes,
            }),
            ..PeriodicStart::default()
        };
        let duration_us = start.start_us + 10 * FULL_PORT.period_us;
        let (results, queue) = run_periodic_from(&shares, Some(lateness), duration_us, seed, start);
        let name = format!("punctuated behind admission, lab's full run, seed {seed}");
        report_deadlines(&name, &shares, &results);
        eprintln!("  port queue: {queue:?}");
        for (index, (result, &start_us)) in results[1..].iter().zip(&STARTS_US).enumerate() {
            let rate = short_bytes as f64 * 1e6 / (result.last_delivered_us - start_us) as f64;
            let end_us = result.last_delivered_us;
            let long: u64 = results[0]
                .deliveries
                .iter()
                .filter(|(at, _)| (start_us..=end_us).contains(at))
                .map(|(_, bytes)| bytes)
                .sum();
            let long_share = long as f64 * 1e6 / (end_us - start_us) as f64 / payload_capacity();
            eprintln!(
                "  stream {}: {:.3} of the rest, done {} ms after its start; stream 1 got {:.3} \
                 of the port meanwhile, the two {:.3}",
                index + 2,
                rate / rest,
                (end_us - start_us) / 1_000,
                long_share,
                long_share + rate / payload_capacity(),
            );
            if lateness == LAB_LATENESS {
                assert!(
                    rate / rest >= 0.8,
                    "{name}: stream {} got {:.3} of the rest",
                    index + 2,
                    rate / rest
                );
            }
        }
    }
}
