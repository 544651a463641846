//! Radon's mirror case in the simulator: several reader processes on one host, each with
//! its own receive budget, read from their own servers, and the servers' answers meet in
//! the one switch port in front of the readers' host (`tessera lab radon --mirror`). No
//! budget sees the whole port: a best-effort reader's grants must yield to the queue there,
//! as a best-effort sender yields to the queue its receiver reports.

use bytes::Bytes;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tessera_datagram::radon::{RadonConfig, Reservation, SEND_BY_MARGIN_DIVISOR};
use tessera_datagram::sim::{addr, BottleneckConfig, Lateness, Sim, DATAGRAM_OVERHEAD_BYTES};
use tessera_datagram::{Config, Event, Micros, SessionId, OVERHEAD_LEN};

const PORT_BITS_PER_S: u64 = 200_000_000;
const DATAGRAM_BYTES: usize = 1472;
/// The lab's switch buffer: 128 full frames.
const BUFFER_BYTES: usize = 128 * (DATAGRAM_BYTES + DATAGRAM_OVERHEAD_BYTES);
/// A reader process's receive budget (the client's default).
const RECEIVE_BUDGET_PACKETS: u32 = 20;
/// `lab radon --quick`'s period.
const PERIOD_US: Micros = 250_000;
/// A reserved reader asks for each period's bytes at its start, in answers of this size.
const ANSWER_BYTES: u64 = 64 << 10;
/// The bulk reader keeps this many answers of [`BULK_ANSWER_BYTES`] asked for.
const BULK_AHEAD: usize = 4;
const BULK_ANSWER_BYTES: u64 = 256 << 10;
/// The streams start here, once the sessions are open.
const START_US: Micros = 20_000;
/// The readers' host on a busy machine: wake-ups up to 0.5 ms late, and 1% of them stalled
/// by up to 5 ms more (as the scenarios' busy reader).
const BUSY_HOST: Lateness = Lateness {
    late_us_max: 500,
    stall: 0.01,
    stall_us_max: 5_000,
};

/// Payload bytes per second the port carries with every header.
fn payload_capacity() -> f64 {
    let fragment = (DATAGRAM_BYTES - OVERHEAD_LEN) as f64;
    let wire = (DATAGRAM_BYTES + DATAGRAM_OVERHEAD_BYTES) as f64;
    PORT_BITS_PER_S as f64 / 8.0 * fragment / wire
}

/// Reader process `index` on the readers' host (one IP, a port each).
fn reader(index: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 100)),
        7000 + index as u16,
    )
}

/// A reader process's settings, as the CLI's with `--link-rate`: Radon on, best effort
/// paced (`yield_best_effort`; off, a best-effort session's grants go as the budget lets).
fn reader_config(yield_best_effort: bool) -> Config {
    Config {
        payload_bytes_max: DATAGRAM_BYTES,
        receive_budget_packets: Some(RECEIVE_BUDGET_PACKETS),
        radon: Some(RadonConfig {
            link_bytes_per_s: PORT_BITS_PER_S / 8,
            pace_best_effort: yield_best_effort,
            send_by_margin_divisor: SEND_BY_MARGIN_DIVISOR,
            ..RadonConfig::default()
        }),
        ..Config::default()
    }
}

/// What one reader got.
#[derive(Clone, Debug, Default)]
struct Read {
    /// Periods whose bytes all arrived, and of those the ones by the period's end.
    periods: u64,
    met: u64,
    worst_late_us: Micros,
    bytes: u64,
    /// Bytes that arrived while the reserved periods ran.
    bytes_in_periods: u64,
    /// Its server's DATA packets, the ones it resent, and its timeouts found spurious.
    server_data_packets: u64,
    server_resent: u64,
    server_spurious_timeouts: u64,
    /// A short reader's: when its last byte arrived, from its start.
    took_us: Option<Micros>,
    /// When each answer arrived and the bytes in by then.
    arrivals: Vec<(Micros, u64)>,
}

/// The best-effort reader: a bulk one, or one short read (the punctuated run's).
#[derive(Clone, Copy, Debug)]
enum BestEffort {
    /// Keeps [`BULK_AHEAD`] answers of [`BULK_ANSWER_BYTES`] asked for.
    Bulk,
    /// Asks for this many bytes in one answer at this time, µs.
    Short(u64, Micros),
}

/// A short reader starts a third into the second period, when the reserved ones run.
const SHORT_START_US: Micros = START_US + PERIOD_US + PERIOD_US / 3;

/// One reader process and its session to its own server.
struct Reader {
    addr: SocketAddr,
    server: SocketAddr,
    session: SessionId,
    /// Bytes per period if reserved; `None`: the best-effort reader.
    budget: Option<u64>,
    best_effort: BestEffort,
    asked: u64,
    read: Read,
}

/// The simulator with the readers' host behind the lab's 200 Mbit/s port and buffer.
fn readers_host(seed: u64) -> Sim {
    let mut sim = Sim::new(seed);
    sim.set_bottleneck(
        reader(0),
        BottleneckConfig {
            rate_bits_per_s: PORT_BITS_PER_S,
            buffer_bytes: BUFFER_BYTES,
        },
    );
    sim
}

impl Reader {
    /// Reader process `index` on the busy readers' host, with a session to its own server:
    /// reserved for `budget` bytes per period, or the best-effort one.
    fn open(
        sim: &mut Sim,
        index: usize,
        budget: Option<u64>,
        best_effort: BestEffort,
        yield_best_effort: bool,
        host: Lateness,
    ) -> Reader {
        let (addr, server) = (reader(index), addr(1 + index as u8));
        sim.add_endpoint(addr, reader_config(yield_best_effort));
        sim.set_lateness(addr, Some(host));
        sim.add_endpoint(
            server,
            Config {
                payload_bytes_max: DATAGRAM_BYTES,
                ..Config::default()
            },
        );
        let session = sim.endpoint(addr).connect(server, 0);
        if let Some(budget) = budget {
            let reservation = Reservation {
                rate_bytes_per_s: budget * 1_000_000 / PERIOD_US,
                period_us: PERIOD_US,
            };
            sim.endpoint(addr)
                .reserve(session, Some(reservation), 0)
                .unwrap();
        }
        Reader {
            addr,
            server,
            session,
            budget,
            best_effort,
            asked: 0,
            read: Read::default(),
        }
    }

    /// Asks for what is due by `now`: a reserved reader each period's bytes at its start;
    /// the bulk reader keeps [`BULK_AHEAD`] answers asked for.
    fn ask(&mut self, sim: &mut Sim, periods: u64, now: Micros) {
        let due = match self.budget {
            Some(budget) if now >= START_US => {
                ((now - START_US) / PERIOD_US + 1).min(periods) * budget
            }
            Some(_) => 0,
            None => match self.best_effort {
                BestEffort::Bulk if now >= START_US => {
                    self.read.bytes + BULK_AHEAD as u64 * BULK_ANSWER_BYTES
                }
                BestEffort::Short(bytes, start_us) if now >= start_us => bytes,
                _ => 0,
            },
        };
        let answer_bytes = match (self.budget, self.best_effort) {
            (Some(_), _) => ANSWER_BYTES,
            (None, BestEffort::Bulk) => BULK_ANSWER_BYTES,
            (None, BestEffort::Short(bytes, _)) => bytes,
        };
        while self.asked < due {
            let len = answer_bytes.min(due - self.asked);
            let request = Bytes::from(len.to_le_bytes().to_vec());
            sim.endpoint(self.addr)
                .request(self.session, request, Some(len as usize), now)
                .unwrap();
            self.asked += len;
            sim.notify(self.addr);
        }
    }

    /// Takes the answers that arrived, counting each period whose bytes are all in.
    fn take(&mut self, sim: &mut Sim, periods: u64, now: Micros) {
        while let Some(event) = sim.endpoint(self.addr).poll_event() {
            let Event::Message { message, .. } = event else {
                continue;
            };
            self.read.bytes += message.len() as u64;
            self.read.arrivals.push((now, self.read.bytes));
            if now <= START_US + periods * PERIOD_US {
                self.read.bytes_in_periods += message.len() as u64;
            }
            let Some(budget) = self.budget else {
                if let BestEffort::Short(bytes, start_us) = self.best_effort {
                    if self.read.bytes >= bytes && self.read.took_us.is_none() {
                        self.read.took_us = Some(now - start_us);
                    }
                }
                continue;
            };
            while self.read.bytes >= (self.read.periods + 1) * budget {
                let deadline = START_US + (self.read.periods + 1) * PERIOD_US;
                self.read.periods += 1;
                if now <= deadline {
                    self.read.met += 1;
                } else {
                    self.read.worst_late_us = self.read.worst_late_us.max(now - deadline);
                }
            }
        }
    }
}

/// Each server answers every request at once with the bytes it asks for.
fn serve(sim: &mut Sim, server: SocketAddr, now: Micros) {
    while let Some(event) = sim.endpoint(server).poll_event() {
        if let Event::Message {
            session, message, ..
        } = event
        {
            let len = u64::from_le_bytes(<[u8; 8]>::try_from(&message[..]).unwrap());
            let answer = Bytes::from(vec![7u8; len as usize]);
            sim.endpoint(server).send(session, answer, now).unwrap();
        }
    }
}

/// Reader processes on one busy host behind a 200 Mbit/s port with the lab's buffer, each
/// reading from its own server: one per share in `shares` reserved at that share of the
/// port's payload capacity over [`PERIOD_US`], and one more best effort, reading as fast
/// as it may or once. Returns the reserved readers' reads and then the best-effort one's.
fn mirror(
    shares: &[f64],
    best_effort: BestEffort,
    yield_best_effort: bool,
    periods: u64,
    seed: u64,
) -> Vec<Read> {
    mirror_on(
        BUSY_HOST,
        shares,
        best_effort,
        yield_best_effort,
        periods,
        seed,
    )
}

/// [`mirror`] on a readers' host as late as `host`.
fn mirror_on(
    host: Lateness,
    shares: &[f64],
    best_effort: BestEffort,
    yield_best_effort: bool,
    periods: u64,
    seed: u64,
) -> Vec<Read> {
    let mut sim = readers_host(seed);
    let budgets = shares
        .iter()
        .map(|&share| Some((share * payload_capacity() * PERIOD_US as f64 / 1e6) as u64));
    let mut readers: Vec<Reader> = budgets
        .chain([None])
        .enumerate()
        .map(|(index, budget)| {
            Reader::open(
                &mut sim,
                index,
                budget,
                best_effort,
                yield_best_effort,
                host,
            )
        })
        .collect();
    for period in 0..periods {
        sim.wake_at(START_US + period * PERIOD_US);
    }
    let mut started = false;
    let end = START_US + (periods + 2) * PERIOD_US;
    let _ = sim.run_until(end, |sim| {
        let now = sim.now();
        if !started && now >= START_US {
            started = true;
            for reader in &readers {
                sim.endpoint(reader.addr).start_periods(START_US, now);
            }
        }
        for reader in &mut readers {
            reader.ask(sim, periods, now);
            serve(sim, reader.server, now);
            reader.take(sim, periods, now);
        }
        false
    });
    let reads: Vec<Read> = readers
        .into_iter()
        .map(|reader| {
            let stats = sim.endpoint_ref(reader.server).stats();
            Read {
                server_data_packets: stats.data_packets_sent,
                server_resent: stats.retransmissions,
                server_spurious_timeouts: stats.spurious_timeouts,
                ..reader.read
            }
        })
        .collect();
    report(shares, yield_best_effort, periods, &reads);
    reads
}

/// Reader `index` met all `periods` deadlines, or missed by no more than one of its host's
/// stalls.
fn assert_on_time(read: &Read, periods: u64, seed: u64, index: usize) {
    assert!(
        read.met == periods || read.worst_late_us <= BUSY_HOST.stall_us_max,
        "seed {seed}: reader {} met {} of {periods}, worst {} µs late",
        index + 1,
        read.met,
        read.worst_late_us
    );
}

fn report(shares: &[f64], yield_best_effort: bool, periods: u64, reads: &[Read]) {
    let span_s = (periods * PERIOD_US) as f64 / 1e6;
    eprintln!(
        "best effort {}:",
        if yield_best_effort {
            "yields"
        } else {
            "does not yield"
        }
    );
    for (index, read) in reads.iter().enumerate() {
        let share = shares.get(index).copied();
        eprintln!(
            "  reader {} ({}): {:.2} MB/s, {} of {} periods by their end, worst {} µs late; \
             its server resent {} of {} packets ({} timeouts found spurious)",
            index + 1,
            share.map_or("best effort".to_string(), |s| format!("reserved {s}")),
            read.bytes_in_periods as f64 / span_s / 1e6,
            read.met,
            read.periods,
            read.worst_late_us,
            read.server_resent,
            read.server_data_packets,
            read.server_spurious_timeouts
        );
    }
}

/// The mirror case's fairshare behind admission: five readers reserved at 0.166 of the
/// port, a best-effort bulk reader beside them on the same host. With best effort's grants
/// paced by the queue the readers' own packets measure, every reserved period arrives by
/// its end (give or take the host's lateness), the bulk reader gets most of the rest
/// (0.79-0.82 in seeds 1-3), and the reserved readers' servers resend at most 0.5% of their
/// packets (0.05-0.28%). Without (a best-effort session granted whatever its process's
/// budget lets), the bulk reader keeps the port's queue full and the reserved readers miss
/// all 40 deadlines, 23-66 ms late. (Before the servers' timers waited for the holds of a
/// peer that grants their window, the servers resent 7-8%, timers found spurious, and the
/// bulk reader got 0.20-0.26 of the rest: resends took the port. Before they waited for
/// the longest hold of the last second too, not only the holds' mean and deviation, they
/// resent 0.86-1.5%: the host's stalls, 1% of its wake-ups, fired the timers.)
#[test]
fn best_effort_readers_yield_to_reserved_readers_on_the_same_host() {
    let shares = [0.166; 5];
    let periods = 8;
    for seed in [1, 2, 3] {
        let paced = mirror(&shares, BestEffort::Bulk, true, periods, seed);
        let unpaced = mirror(&shares, BestEffort::Bulk, false, periods, seed);
        let (reserved, bulk) = paced.split_at(shares.len());
        for (index, read) in reserved.iter().enumerate() {
            assert_eq!(read.periods, periods, "seed {seed}, reader {}", index + 1);
            // The servers' timers wait for the late readers' ACKs (a granted window), even
            // through the readers' host's rare stalls.
            assert!(
                read.server_resent * 200 <= read.server_data_packets,
                "seed {seed}: reader {}'s server resent {} of {}",
                index + 1,
                read.server_resent,
                read.server_data_packets
            );
            assert_on_time(read, periods, seed, index);
        }
        let rest = payload_capacity() * (1.0 - shares.iter().sum::<f64>());
        let bulk_rate = bulk[0].bytes_in_periods as f64 * 1e6 / (periods * PERIOD_US) as f64;
        eprintln!(
            "seed {seed}: the bulk reader got {:.3} of the rest",
            bulk_rate / rest
        );
        // Its floor is a hundredth of the link, 0.06 of the rest.
        assert!(
            bulk_rate >= 0.5 * rest,
            "seed {seed}: the bulk reader got {:.3} of the rest",
            bulk_rate / rest
        );
        let missed: u64 = unpaced[..shares.len()]
            .iter()
            .map(|read| read.periods - read.met)
            .sum();
        assert!(
            missed >= periods * shares.len() as u64 / 2,
            "seed {seed}: without yielding, the reserved readers missed only {missed} deadlines"
        );
    }
}

/// The punctuated run's short readers in the mirror case: one reader reserved at 0.749 of
/// the port, and a best-effort one that reads 500 packets once, a third into a period. Its
/// grants start at an eighth of the link and grow while the port's queue is short: it gets
/// 0.84-1.11 of what the reserved reader leaves of the port (seeds 1-8), 0.97 on average.
/// (Its grants starting at a sixteenth, as best-effort senders do, it got 0.77-1.06, 0.89
/// on average: much of a short read went on ramping up.) One seed's short read is at the
/// mercy of where the busy host's stalls fall: over seeds 1-32 it got 0.75-1.43 with either
/// timer (session 18), so the test asks the mean of 8 seeds for 0.92 and each for 0.8.
/// (Session 17 asked each of seeds 1-8 for 0.85, which they then happened to meet; five
/// of seeds 1-32 do not, before and after session 18's timer.)
#[test]
fn a_short_best_effort_read_gets_most_of_what_a_reservation_leaves() {
    const SHORT_BYTES: u64 = 716_000;
    let shares = [0.749];
    let rest = payload_capacity() * (1.0 - shares[0]);
    let mut got = Vec::new();
    for seed in 1..=8 {
        let reads = mirror(
            &shares,
            BestEffort::Short(SHORT_BYTES, SHORT_START_US),
            true,
            4,
            seed,
        );
        assert!(
            reads[0].met == 4 || reads[0].worst_late_us <= 5_000,
            "seed {seed}: the reserved reader met {} of 4, worst {} µs late",
            reads[0].met,
            reads[0].worst_late_us
        );
        let took_us = reads[1].took_us.expect("the short read ends");
        got.push(SHORT_BYTES as f64 * 1e6 / took_us as f64 / rest);
    }
    eprintln!("the short reader got {got:.3?} of the rest");
    let mean = got.iter().sum::<f64>() / got.len() as f64;
    assert!(
        mean >= 0.92 && got.iter().all(|&fraction| fraction >= 0.8),
        "the short reader got {got:.3?} of the rest, {mean:.3} on average"
    );
}

/// The unfair run's admitted readers in the mirror case (0.5, 0.25 and 0.125 of the port)
/// beside a best-effort bulk reader, on a host stalled on 1% of its wake-ups by up to
/// 5 ms. The slowest reader's server hears the fewest of its reader's holds, and its
/// timers fired in stalls a little longer than the longest hold it had seen: it resent
/// 0.09-0.40% of its packets (seeds 1-8; 0.24% of them all), nearly all on timeouts found
/// spurious, when its timer waited for the peak alone. Waiting for half the peak again
/// (`rtt::HOLD_PEAK_MARGIN_DIVISOR`) it resends 0.05-0.14% (0.09% of them all), and no
/// reader misses a deadline by more than a stall of its host. (Part of what is left are the
/// first tenths of a second, before the server has seen a stall; the lab's streams run
/// 10 s.)
#[test]
fn the_slowest_reserved_readers_server_waits_out_the_readers_stalls() {
    let shares = [0.5, 0.25, 0.125];
    let periods = 8;
    let (mut resent, mut packets) = (0, 0);
    for seed in 1..=8 {
        let reads = mirror(&shares, BestEffort::Bulk, true, periods, seed);
        // Within one of the host's stalls: over seeds 1-24, 3 seeds had the reader at 0.5
        // miss a period, with its requests asked as the grant reached their answers (up to
        // 11.8 ms late) and as the answer ahead began to arrive (up to 4.7 ms; session 21).
        for (index, read) in reads[..shares.len()].iter().enumerate() {
            assert_on_time(read, periods, seed, index);
        }
        let slowest = &reads[shares.len() - 1];
        assert!(
            slowest.server_resent * 500 <= slowest.server_data_packets,
            "seed {seed}: the slowest reader's server resent {} of {}",
            slowest.server_resent,
            slowest.server_data_packets
        );
        resent += slowest.server_resent;
        packets += slowest.server_data_packets;
    }
    assert!(
        resent * 100_000 <= packets * 120,
        "the slowest reader's server resent {resent} of {packets}"
    );
}

/// How long a server takes to produce an answer once asked (a disk read), µs.
const PRODUCE_US: Micros = 2_000;

/// A reader reserved at 0.5 of the port reads 4 periods from a server that takes
/// [`PRODUCE_US`] to produce each answer, on the busy host. Returns the answers the server produced while it
/// still had packets of an earlier answer to send, all the answers it produced, and the
/// periods the reader met of 4.
fn produced_while_sending(seed: u64) -> (u64, u64, u64) {
    let periods = 4;
    let mut sim = readers_host(seed);
    let budget = (0.5 * payload_capacity() * PERIOD_US as f64 / 1e6) as u64;
    let mut reader = Reader::open(&mut sim, 0, Some(budget), BestEffort::Bulk, true, BUSY_HOST);
    let (addr, server) = (reader.addr, reader.server);
    for period in 0..periods {
        sim.wake_at(START_US + period * PERIOD_US);
    }
    // Answers being produced: when each is ready, on which session, of how many bytes.
    let mut producing: std::collections::VecDeque<(Micros, SessionId, u64)> =
        std::collections::VecDeque::new();
    let (mut while_sending, mut produced) = (0, 0);
    let mut started = false;
    let _ = sim.run_until(START_US + (periods + 2) * PERIOD_US, |sim| {
        let now = sim.now();
        if !started && now >= START_US {
            started = true;
            sim.endpoint(addr).start_periods(START_US, now);
        }
        reader.ask(sim, periods, now);
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message {
                session, message, ..
            } = event
            {
                let len = u64::from_le_bytes(<[u8; 8]>::try_from(&message[..]).unwrap());
                producing.push_back((now + PRODUCE_US, session, len));
                sim.wake_at(now + PRODUCE_US);
            }
        }
        while producing.front().is_some_and(|&(ready, _, _)| ready <= now) {
            let (_, session, len) = producing.pop_front().unwrap();
            let info = sim.endpoint_ref(server).session_info(session).unwrap();
            produced += 1;
            while_sending += u64::from(info.queued_packets > 0);
            let answer = Bytes::from(vec![7u8; len as usize]);
            sim.endpoint(server).send(session, answer, now).unwrap();
            sim.notify(server);
        }
        reader.take(sim, periods, now);
        false
    });
    (while_sending, produced, reader.read.met)
}

/// A reserved reader's next request goes out when the answer ahead of it begins to arrive,
/// not when the grant reaches into its own answer (which, the grants paced at the reader's
/// rate, is only as the answer ahead ends): its server, which takes a while to produce an
/// answer, produces the next one while it still sends the current one, and the port in
/// front of the reader sees no gap between them that the reader's grants then make up in
/// a burst. Here nearly every answer but each period's first is produced while the server
/// still sends the one before (seeds 1-4); asked when the grant reached into its answer,
/// none was.
#[test]
fn a_reserved_readers_server_produces_its_next_answer_while_it_sends_one() {
    for seed in 1..=4 {
        let (while_sending, produced, met) = produced_while_sending(seed);
        eprintln!("seed {seed}: {while_sending} of {produced} answers produced while sending, {met} of 4 periods met");
        assert_eq!(met, 4, "seed {seed}");
        assert!(
            while_sending * 4 >= produced * 3,
            "seed {seed}: only {while_sending} of {produced} answers were produced while the \
             server still sent one"
        );
    }
}

/// The readers' host on a quiet machine: wake-ups up to 0.1 ms late, a thousandth of them
/// stalled by up to 2 ms (the lab's mirror run with the machine otherwise idle).
const QUIET_HOST: Lateness = Lateness {
    late_us_max: 100,
    stall: 0.001,
    stall_us_max: 2_000,
};

/// A reader's rate while `from..to`, of `rate` bytes/s (from the answers that arrived).
fn rate_while(read: &Read, from: Micros, to: Micros, rate: f64) -> f64 {
    let bytes_by = |t: Micros| {
        read.arrivals
            .iter()
            .take_while(|(when, _)| *when <= t)
            .last()
            .map_or(0, |&(_, bytes)| bytes)
    };
    (bytes_by(to) - bytes_by(from)) as f64 * 1e6 / (to - from) as f64 / rate
}

/// Radon's laxity goes to the short reader: on a quiet host (the lab's idle runs) the port
/// in front of the readers is full while a short best-effort read runs, so what the
/// reserved reader at 0.749 takes beyond its rate comes out of the short read's share. Its
/// grants ran on schedule at 1.026 of its rate (done a cushion before the due time, and
/// 65/64 for framing): it received 1.042-1.056 of its rate while the short read ran (its
/// answers' bytes, counted per 64 KiB answer), and the short read got 0.875-0.895 of the
/// rest (seeds 1-8). Keeping to what its deadline needs while its own packets measure a
/// queue (`RadonConfig::reserved_grants_yield_laxity`): 1.026-1.044, and the short read
/// 0.904-0.920; every period still met.
#[test]
fn a_reserved_reader_leaves_its_laxity_to_a_short_read_beside_it() {
    const SHORT_BYTES: u64 = 716_000;
    let shares = [0.749];
    let capacity = payload_capacity();
    let rest = capacity * (1.0 - shares[0]);
    let (mut short, mut reserved) = (Vec::new(), Vec::new());
    for seed in 1..=8 {
        let reads = mirror_on(
            QUIET_HOST,
            &shares,
            BestEffort::Short(SHORT_BYTES, SHORT_START_US),
            true,
            4,
            seed,
        );
        assert_eq!(
            reads[0].met, 4,
            "seed {seed}: the reserved reader met {} of 4",
            reads[0].met
        );
        let took_us = reads[1].took_us.expect("the short read ends");
        short.push(SHORT_BYTES as f64 * 1e6 / took_us as f64 / rest);
        reserved.push(rate_while(
            &reads[0],
            SHORT_START_US,
            SHORT_START_US + took_us,
            shares[0] * capacity,
        ));
    }
    eprintln!("the short reader got {short:.3?} of the rest; the reserved one {reserved:.3?} of its rate meanwhile");
    assert!(
        short.iter().all(|&fraction| fraction >= 0.9),
        "the short reader got {short:.3?} of the rest"
    );
}
