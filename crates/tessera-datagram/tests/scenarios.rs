//! Scenario tests of the datagram transport over the seeded simulator: delivery under loss,
//! duplication and reordering; liveness at heavy loss; the receiver-window rule of the paper;
//! throughput through a bottleneck; fixed windows; garbage; vanished and restarted peers;
//! retransmission on the first RESTART. Every failure prints the seed that replays it.

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use tessera_datagram::packet::{self, Packet, PacketKind};
use tessera_datagram::sim::{
    addr, BottleneckConfig, LinkConfig, NetworkStats, Sim, TraceEvent, TraceKind,
};
use tessera_datagram::{
    decode, Config, CongestionKind, Endpoint, Event, LossReason, Micros, SendError, SessionId,
    Stats, Transmit, SEND_QUEUE_BYTES_MAX, WINDOW_INITIAL_PACKETS,
};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Proptest settings for the scenarios: `cases` cases from a fixed seed, so that the suite is
/// the same on every run (set `PROPTEST_RNG_SEED` to explore others). Each case prints its
/// simulator seed if it fails.
fn scenario_config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if config.rng_seed == RngSeed::Random {
        config.rng_seed = RngSeed::Fixed(0x7E55_E2A0);
    }
    config
}

/// The content of message `index` of flow `tag`: every byte depends on all three, so a
/// message delivered twice, out of order, or damaged never compares equal to the expected one.
fn message(tag: u64, index: u32, len: usize) -> Bytes {
    let mut state = tag
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index as u64)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ len as u64;
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let chunk = state.to_le_bytes();
        let take = (len - bytes.len()).min(8);
        bytes.extend_from_slice(&chunk[..take]);
    }
    Bytes::from(bytes)
}

/// A message size: mostly small, sometimes multi-fragment, occasionally 200 KiB.
fn message_len(rng: &mut impl FnMut() -> u64) -> usize {
    match rng() % 10 {
        0..=3 => 1 + (rng() % 100) as usize,
        4..=6 => 100 + (rng() % 5_000) as usize,
        7 | 8 => 5_000 + (rng() % 45_000) as usize,
        _ => 50_000 + (rng() % (200 * 1024 - 50_000 + 1)) as usize,
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Checks, from the datagrams on the wire, that no DATA packet is ever sent past the receive
/// window its receiver advertised (ack + window, or the initial window before any), and, if
/// `window_fixed` is set, never more than that many past the highest acknowledgement the
/// sender has received.
#[derive(Default)]
struct WindowChecker {
    /// (session, sender, receiver) -> one past the highest sequence number the receiver
    /// advertised it can accept.
    edge: BTreeMap<(u64, SocketAddr, SocketAddr), u64>,
    /// (session, sender, receiver) -> the highest acknowledgement delivered to the sender.
    acked: BTreeMap<(u64, SocketAddr, SocketAddr), u64>,
    window_fixed: Option<u32>,
    data_checked: u64,
    seed: u64,
}

impl WindowChecker {
    fn install(sim: &mut Sim, window_fixed: Option<u32>) -> Rc<RefCell<WindowChecker>> {
        let checker = Rc::new(RefCell::new(WindowChecker {
            window_fixed,
            seed: sim.seed(),
            ..WindowChecker::default()
        }));
        let inner = checker.clone();
        sim.set_tracer(move |event| inner.borrow_mut().observe(event));
        checker
    }

    fn observe(&mut self, event: &TraceEvent<'_>) {
        let Ok(packet) = decode(event.contents) else {
            return;
        };
        if packet.kind == PacketKind::Reset {
            return;
        }
        // This packet's ack and window speak for the data flowing the other way.
        let reverse = (packet.session, event.to, event.from);
        match event.kind {
            TraceKind::Sent => {
                let edge = self
                    .edge
                    .entry(reverse)
                    .or_insert(WINDOW_INITIAL_PACKETS as u64);
                *edge = (*edge).max(packet.ack as u64 + packet.window as u64);
                if packet.kind == PacketKind::Data {
                    let forward = (packet.session, event.from, event.to);
                    let edge = self
                        .edge
                        .get(&forward)
                        .copied()
                        .unwrap_or(WINDOW_INITIAL_PACKETS as u64);
                    assert!(
                        (packet.seq as u64) < edge,
                        "seed {}: DATA seq {} sent past the receiver's window edge {edge}",
                        self.seed,
                        packet.seq
                    );
                    if let Some(window) = self.window_fixed {
                        let acked = self.acked.get(&forward).copied().unwrap_or(0);
                        assert!(
                            (packet.seq as u64) < acked + window as u64,
                            "seed {}: DATA seq {} with only {acked} acknowledged: more than \
                             {window} in flight",
                            self.seed,
                            packet.seq
                        );
                    }
                    self.data_checked += 1;
                }
            }
            TraceKind::Delivered => {
                let acked = self.acked.entry(reverse).or_insert(0);
                *acked = (*acked).max(packet.ack as u64);
            }
        }
    }
}

/// Asserts the sender-side invariants every endpoint reports, for every session.
fn assert_session_invariants(sim: &Sim, window_fixed: Option<u32>) {
    for host in sim.addrs() {
        let endpoint = sim.endpoint_ref(host);
        for session in endpoint.sessions().collect::<Vec<_>>() {
            let info = endpoint.session_info(session).unwrap();
            assert!(
                info.in_flight <= info.peer_receive_window,
                "seed {}: {host} {session:?} has {} in flight, peer window {}",
                sim.seed(),
                info.in_flight,
                info.peer_receive_window
            );
            assert!(
                info.in_flight <= info.congestion_window,
                "seed {}: {host} {session:?} has {} in flight, congestion window {}",
                sim.seed(),
                info.in_flight,
                info.congestion_window
            );
            if let Some(window) = window_fixed {
                assert!(info.in_flight <= window, "seed {}", sim.seed());
            }
        }
    }
}

/// One request/response flow: a client session to a server, with the sizes of its requests
/// and of the server's answers.
struct Flow {
    client: SocketAddr,
    server: SocketAddr,
    session: SessionId,
    requests: Vec<usize>,
    responses: Vec<usize>,
    sent: usize,
    served: usize,
    answered: usize,
    pipeline: usize,
}

const RESPONSE_TAG: u64 = 1 << 40;

struct Workload {
    flows: Vec<Flow>,
    by_session: BTreeMap<SessionId, usize>,
}

impl Workload {
    /// `clients` clients at 127.0.0.10.., `servers` servers at 127.0.0.2.., each client with
    /// `sessions_per_client` sessions to servers in turn, each session with `requests`
    /// requests.
    #[allow(clippy::too_many_arguments)]
    fn new(
        sim: &mut Sim,
        config: &Config,
        clients: u8,
        servers: u8,
        sessions_per_client: usize,
        requests: usize,
        size_seed: u64,
        len_max: Option<usize>,
    ) -> Workload {
        let mut state = size_seed;
        let mut rng = move || splitmix(&mut state);
        let server_addrs: Vec<SocketAddr> = (0..servers).map(|s| addr(2 + s)).collect();
        for &server in &server_addrs {
            sim.add_endpoint(server, config.clone());
        }
        let mut flows = Vec::new();
        let mut by_session = BTreeMap::new();
        for c in 0..clients {
            let client = addr(10 + c);
            sim.add_endpoint(client, config.clone());
            for s in 0..sessions_per_client {
                let server = server_addrs[(c as usize + s) % server_addrs.len()];
                let now = sim.now();
                let session = sim.endpoint(client).connect(server, now);
                let count = 2 * requests;
                let mut lens: Vec<usize> = (0..count)
                    .map(|_| {
                        let len = message_len(&mut rng);
                        len_max.map_or(len, |max| len.min(max))
                    })
                    .collect();
                let responses = lens.split_off(requests);
                let requests = lens;
                by_session.insert(session, flows.len());
                flows.push(Flow {
                    client,
                    server,
                    session,
                    requests,
                    responses,
                    sent: 0,
                    served: 0,
                    answered: 0,
                    pipeline: 1 + (rng() % 4) as usize,
                });
            }
        }
        Workload { flows, by_session }
    }

    fn tag(flow: usize) -> u64 {
        flow as u64 + 1
    }

    /// Plays the applications for one step; returns whether every response arrived.
    fn step(&mut self, sim: &mut Sim) -> bool {
        let now = sim.now();
        let seed = sim.seed();
        // Clients keep up to `pipeline` requests outstanding.
        for (index, flow) in self.flows.iter_mut().enumerate() {
            while flow.sent < flow.requests.len() && flow.sent - flow.answered < flow.pipeline {
                let request = message(Self::tag(index), flow.sent as u32, flow.requests[flow.sent]);
                sim.endpoint(flow.client)
                    .send(flow.session, request, now)
                    .unwrap_or_else(|error| panic!("seed {seed}: client send: {error}"));
                flow.sent += 1;
            }
        }
        // Servers answer each request in order; clients check each answer.
        let mut hosts: Vec<SocketAddr> = self.flows.iter().map(|f| f.server).collect();
        hosts.extend(self.flows.iter().map(|f| f.client));
        hosts.sort();
        hosts.dedup();
        for host in hosts {
            while let Some(event) = sim.endpoint(host).poll_event() {
                match event {
                    Event::Opened { session, peer } => {
                        let flow = &self.flows[self.by_session[&session]];
                        assert_eq!((flow.server, flow.client), (host, peer), "seed {seed}");
                    }
                    Event::Message {
                        session,
                        peer,
                        message: received,
                    } => {
                        let index = self.by_session[&session];
                        let flow = &mut self.flows[index];
                        if host == flow.server {
                            assert_eq!(peer, flow.client);
                            let n = flow.served;
                            assert!(n < flow.sent, "seed {seed}: request {n} never sent");
                            let expected = message(Self::tag(index), n as u32, flow.requests[n]);
                            assert!(
                                received == expected,
                                "seed {seed}: flow {index} request {n} damaged, duplicated or \
                                 out of order ({} bytes, expected {})",
                                received.len(),
                                expected.len()
                            );
                            flow.served += 1;
                            let response = message(
                                Self::tag(index) | RESPONSE_TAG,
                                n as u32,
                                flow.responses[n],
                            );
                            sim.endpoint(host)
                                .send(session, response, now)
                                .unwrap_or_else(|error| {
                                    panic!("seed {seed}: server send: {error}")
                                });
                        } else {
                            assert_eq!((host, peer), (flow.client, flow.server));
                            let n = flow.answered;
                            assert!(n < flow.served, "seed {seed}: response {n} before request");
                            let expected = message(
                                Self::tag(index) | RESPONSE_TAG,
                                n as u32,
                                flow.responses[n],
                            );
                            assert!(
                                received == expected,
                                "seed {seed}: flow {index} response {n} damaged, duplicated or \
                                 out of order"
                            );
                            flow.answered += 1;
                        }
                    }
                    Event::Lost { session, peer, .. } => {
                        panic!("seed {seed}: {host} lost {session:?} with {peer}")
                    }
                }
            }
        }
        self.flows
            .iter()
            .all(|flow| flow.answered == flow.requests.len())
    }

    fn total_bytes(&self) -> usize {
        self.flows
            .iter()
            .map(|f| f.requests.iter().sum::<usize>() + f.responses.iter().sum::<usize>())
            .sum()
    }
}

fn total_stats(sim: &Sim) -> Stats {
    let mut total = Stats::default();
    for host in sim.addrs() {
        let stats = sim.endpoint_ref(host).stats();
        total.retransmissions += stats.retransmissions;
        total.timeouts += stats.timeouts;
        total.restarts_sent += stats.restarts_sent;
        total.dropped_duplicate += stats.dropped_duplicate;
        total.held_out_of_order += stats.held_out_of_order;
        total.messages_delivered += stats.messages_delivered;
        total.window_limited += stats.window_limited;
        total.sessions_lost += stats.sessions_lost;
    }
    total
}

// ---------------------------------------------------------------------------------------------
// 1. Exactly once, in order, under loss, duplication, reordering and delay.

/// The default settings: a session is lost only after a second without an answer, and
/// timers never pass a millisecond, so even at 30% loss each way (a retransmission's round
/// trip failing half the time) a live session is not given up.
fn lossy_config() -> Config {
    Config::default()
}

#[allow(clippy::too_many_arguments)]
fn run_request_response(
    seed: u64,
    link: LinkConfig,
    clients: u8,
    servers: u8,
    sessions_per_client: usize,
    requests: usize,
    len_max: Option<usize>,
    config: Config,
    deadline: Micros,
) -> (Sim, Workload) {
    let mut sim = Sim::new(seed);
    sim.set_default_link(link);
    let checker = WindowChecker::install(&mut sim, None);
    let mut workload = Workload::new(
        &mut sim,
        &config,
        clients,
        servers,
        sessions_per_client,
        requests,
        seed ^ 0x5EED,
        len_max,
    );
    sim.run_until(deadline, |sim| {
        assert_session_invariants(sim, None);
        workload.step(sim)
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(checker.borrow().data_checked > 0);
    (sim, workload)
}

proptest! {
    #![proptest_config(scenario_config(128))]

    #[test]
    fn every_message_is_delivered_exactly_once_in_order_under_loss_duplication_and_reordering(
        seed in any::<u64>(),
        loss in 0.0f64..0.3,
        duplicate in 0.0f64..0.1,
        delay_us in 10u64..500,
        jitter_us in prop_oneof![Just(0u64), 1u64..300],
        clients in 1u8..5,
        sessions_per_client in 1usize..3,
        requests in 1usize..7,
    ) {
        let link = LinkConfig { delay_us, jitter_us, loss, duplicate };
        // Heavy loss with large messages is covered below; keep these cases quick.
        let len_max = if loss > 0.15 { Some(20_000) } else { None };
        let (sim, workload) = run_request_response(
            seed, link, clients, 2, sessions_per_client, requests, len_max, lossy_config(),
            600_000_000,
        );
        let expected: usize = workload.flows.iter().map(|f| 2 * f.requests.len()).sum();
        prop_assert_eq!(total_stats(&sim).messages_delivered as usize, expected);
    }
}

#[test]
fn request_response_with_1_byte_to_200_kib_messages_at_30_percent_loss_delivers_all_in_order() {
    for seed in [1, 2, 3, 4] {
        let link = LinkConfig {
            delay_us: 100,
            jitter_us: 40,
            loss: 0.3,
            duplicate: 0.05,
        };
        let mut sim = Sim::new(seed);
        sim.set_default_link(link);
        let checker = WindowChecker::install(&mut sim, None);
        let config = lossy_config();
        let mut workload = Workload::new(&mut sim, &config, 3, 1, 1, 2, seed, None);
        // Make sure both extremes are there: a 1-byte request and a 200 KiB answer.
        workload.flows[0].requests[0] = 1;
        workload.flows[0].responses[0] = 200 * 1024;
        workload.flows[1].requests[0] = 200 * 1024;
        workload.flows[1].responses[0] = 1;
        let bytes = workload.total_bytes();
        let end = sim
            .run_until(3_600_000_000, |sim| {
                assert_session_invariants(sim, None);
                workload.step(sim)
            })
            .unwrap_or_else(|error| panic!("{error}"));
        let stats = total_stats(&sim);
        println!(
            "seed {seed}: {bytes} bytes at 30% loss in {end} µs of virtual time, {} \
             retransmissions, {} timeouts, {} restarts, {} window checks",
            stats.retransmissions,
            stats.timeouts,
            stats.restarts_sent,
            checker.borrow().data_checked
        );
    }
}

#[test]
fn same_seed_replays_the_same_run() {
    let link = LinkConfig {
        delay_us: 80,
        jitter_us: 60,
        loss: 0.1,
        duplicate: 0.05,
    };
    let run = || {
        let (sim, _) = run_request_response(
            99,
            link,
            2,
            2,
            2,
            3,
            Some(30_000),
            Config::default(),
            600_000_000,
        );
        let stats: Vec<Stats> = sim
            .addrs()
            .iter()
            .map(|&a| sim.endpoint_ref(a).stats())
            .collect();
        (sim.now(), stats, sim.stats().clone())
    };
    assert_eq!(run(), run());
}

// ---------------------------------------------------------------------------------------------
// 2. No deadlock or livelock below 50% loss.

/// Every message of the 45%-loss workload (two clients, three requests and answers of up to
/// 12 KB each) arrives within this much virtual time; the runs take 0.04 to 3.3 s.
const VIRTUAL_TIME_AT_45_PERCENT_LOSS_US_MAX: Micros = 60_000_000;

#[test]
fn no_deadlock_or_livelock_at_45_percent_loss() {
    // At 45% loss each way a round trip succeeds 30% of the time; a second of failures in a
    // row (about a thousand timeouts) does not happen, so the default loses no session.
    let config = Config::default();
    for seed in 0..16u64 {
        let link = LinkConfig {
            delay_us: 100,
            jitter_us: 50,
            loss: 0.45,
            duplicate: 0.02,
        };
        let (sim, workload) = run_request_response(
            seed,
            link,
            2,
            1,
            1,
            3,
            Some(12_000),
            config.clone(),
            VIRTUAL_TIME_AT_45_PERCENT_LOSS_US_MAX,
        );
        let stats = total_stats(&sim);
        println!(
            "seed {seed}: {} bytes at 45% loss in {} µs of virtual time, {} retransmissions, {} \
             timeouts",
            workload.total_bytes(),
            sim.now(),
            stats.retransmissions,
            stats.timeouts
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. The receiver's window is never exceeded.

// Section 4 of the paper: "we do not allow our congestion avoidance algorithm to probe past
// the known window size." Checked from the wire (the WindowChecker) and from every session's
// own report, with receive windows of 2 to 8 packets, messages of up to 12 packets, and an
// application that drains its events only every few milliseconds.
proptest! {
    #![proptest_config(scenario_config(96))]

    #[test]
    fn unacknowledged_packets_never_exceed_the_advertised_receive_window(
        seed in any::<u64>(),
        receive_window_packets in 2u32..9,
        fixed in prop_oneof![Just(None), (1u32..40).prop_map(Some)],
        drain_every_us in prop_oneof![Just(0u64), 200u64..5_000],
        loss in prop_oneof![Just(0.0f64), 0.0f64..0.1],
        jitter_us in prop_oneof![Just(0u64), 1u64..100],
    ) {
        let config = Config {
            receive_window_packets,
            congestion: fixed.map_or(CongestionKind::Adaptive, CongestionKind::Fixed),
            ..Config::default()
        };
        let mut sim = Sim::new(seed);
        sim.set_default_link(LinkConfig { delay_us: 50, jitter_us, loss, duplicate: 0.0 });
        let checker = WindowChecker::install(&mut sim, fixed);
        let (client, server) = (addr(1), addr(2));
        sim.add_endpoint(client, config.clone());
        sim.add_endpoint(server, config.clone());
        let session = sim.endpoint(client).connect(server, 0);
        // Messages of 1 to 12 packets, many larger than the receive window.
        let lens: Vec<usize> = (0..12u32).map(|i| 1 + (i as usize * 1409) % (12 * 1428)).collect();
        for (i, &len) in lens.iter().enumerate() {
            sim.endpoint(client).send(session, message(7, i as u32, len), 0).unwrap();
        }
        let mut received = 0;
        let mut next_drain = 0;
        sim.run_until(600_000_000, |sim| {
            assert_session_invariants(sim, fixed);
            // The application drains its events only every `drain_every_us`, so the window
            // closes while messages wait.
            if sim.now() >= next_drain {
                next_drain = sim.now() + drain_every_us;
                if drain_every_us > 0 {
                    sim.wake_at(next_drain);
                }
                while let Some(event) = sim.endpoint(server).poll_event() {
                    if let Event::Message { message: m, .. } = event {
                        assert!(m == message(7, received, lens[received as usize]), "seed {seed}");
                        received += 1;
                    }
                }
            }
            received as usize == lens.len()
        }).unwrap_or_else(|error| panic!("{error}"));
        prop_assert!(checker.borrow().data_checked >= lens.len() as u64);
        if drain_every_us >= 1_000 {
            // A window that small with a slow application must have blocked the sender.
            prop_assert!(sim.endpoint_ref(client).stats().window_limited > 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Throughput through a bottleneck at 1% loss.

/// Throughput at 1% random loss (each way) through the bottleneck, as a fraction of the
/// loss-free throughput, is at least this.
const THROUGHPUT_FRACTION_AT_1_PERCENT_LOSS_MIN: f64 = 0.6;
/// Loss-free goodput is at least this fraction of what the bottleneck can carry after headers.
const THROUGHPUT_FRACTION_OF_LINE_RATE_MIN: f64 = 0.85;
const BOTTLENECK_BITS_PER_S: u64 = 1_000_000_000;

/// Moves `messages` messages of 64 KiB from a client to a server whose port is a 1 Gbit/s
/// bottleneck with a 64 KiB buffer; returns the goodput in bytes per second.
fn bulk_throughput(seed: u64, loss: f64, messages: usize) -> (f64, Stats, NetworkStats) {
    let mut sim = Sim::new(seed);
    sim.set_default_link(LinkConfig {
        delay_us: 25,
        jitter_us: 0,
        loss,
        duplicate: 0.0,
    });
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    sim.set_bottleneck(
        server,
        BottleneckConfig {
            rate_bits_per_s: BOTTLENECK_BITS_PER_S,
            buffer_bytes: 64 << 10,
        },
    );
    let len = 64 << 10;
    let session = sim.endpoint(client).connect(server, 0);
    for i in 0..messages {
        sim.endpoint(client)
            .send(session, message(3, i as u32, len), 0)
            .unwrap();
    }
    let mut received = 0;
    let end = sim
        .run_until(60_000_000, |sim| {
            while let Some(event) = sim.endpoint(server).poll_event() {
                if let Event::Message { message: m, .. } = event {
                    assert_eq!(m.len(), len);
                    received += 1;
                }
            }
            received == messages
        })
        .unwrap_or_else(|error| panic!("{error}"));
    let bytes = (messages * len) as f64;
    (
        bytes / (end as f64 / 1e6),
        sim.endpoint_ref(client).stats(),
        sim.stats().clone(),
    )
}

#[test]
fn throughput_through_a_bottleneck_at_1_percent_loss_stays_within_the_stated_fraction_of_loss_free()
{
    let messages = 128; // 8 MiB
    let (clean, clean_stats, clean_network) = bulk_throughput(1, 0.0, messages);
    let fragment = Config::default().fragment_bytes_max() as f64;
    let wire = (Config::default().payload_bytes_max + 28) as f64;
    let line_goodput = BOTTLENECK_BITS_PER_S as f64 / 8.0 * fragment / wire;
    println!(
        "loss-free: {:.1} MB/s ({:.1}% of the {:.1} MB/s the 1 Gbit/s port carries after \
         headers), {} tail drops at the port, {} retransmissions, {} restarts",
        clean / 1e6,
        100.0 * clean / line_goodput,
        line_goodput / 1e6,
        clean_network.queue_drops,
        clean_stats.retransmissions,
        clean_stats.restarts_received
    );
    assert!(clean >= THROUGHPUT_FRACTION_OF_LINE_RATE_MIN * line_goodput);
    for seed in [1, 2, 3] {
        let (lossy, stats, _) = bulk_throughput(seed, 0.01, messages);
        println!(
            "1% loss (seed {seed}): {:.1} MB/s = {:.2} of loss-free, {} retransmissions, {} \
             restarts, {} timeouts",
            lossy / 1e6,
            lossy / clean,
            stats.retransmissions,
            stats.restarts_received,
            stats.timeouts
        );
        assert!(
            lossy >= THROUGHPUT_FRACTION_AT_1_PERCENT_LOSS_MIN * clean,
            "seed {seed}: {lossy} < {THROUGHPUT_FRACTION_AT_1_PERCENT_LOSS_MIN} x {clean}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Fixed windows.

fn run_fixed_window(seed: u64, window: u32, loss: f64) -> Stats {
    let config = Config {
        congestion: CongestionKind::Fixed(window),
        ..Config::default()
    };
    let mut sim = Sim::new(seed);
    sim.set_default_link(LinkConfig {
        delay_us: 60,
        jitter_us: 30,
        loss,
        duplicate: 0.02,
    });
    let checker = WindowChecker::install(&mut sim, Some(window));
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config);
    let session = sim.endpoint(client).connect(server, 0);
    let lens = [1, 3_000, 40_000, 10, 70_000];
    for (i, &len) in lens.iter().enumerate() {
        sim.endpoint(client)
            .send(session, message(5, i as u32, len), 0)
            .unwrap();
    }
    let mut received = 0;
    sim.run_until(600_000_000, |sim| {
        assert_session_invariants(sim, Some(window));
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                assert!(m == message(5, received as u32, lens[received]));
                received += 1;
            }
        }
        received == lens.len()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(checker.borrow().data_checked > 80);
    sim.endpoint_ref(client).stats()
}

/// Section 2 of the paper: stop-and-wait is go-back-N with a window of one.
#[test]
fn fixed_1_is_stop_and_wait() {
    for seed in 0..3 {
        run_fixed_window(seed, 1, 0.05);
    }
}

proptest! {
    #![proptest_config(scenario_config(64))]

    #[test]
    fn fixed_n_never_has_more_than_n_packets_in_flight(
        seed in any::<u64>(), window in 1u32..70, loss in 0.0f64..0.1,
    ) {
        run_fixed_window(seed, window, loss);
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Garbage.

/// A datagram in flight: from, to, contents.
type Datagram = (SocketAddr, SocketAddr, Vec<u8>);

/// Sends `count` messages each way on `session` and checks they all arrive intact.
fn exchange(sim: &mut Sim, client: SocketAddr, server: SocketAddr, session: SessionId, round: u32) {
    let count = 4;
    let now = sim.now();
    for i in 0..count {
        let len = 1 + (i as usize * 7919 + round as usize * 104_729) % 30_000;
        sim.endpoint(client)
            .send(session, message(round as u64, i, len), now)
            .unwrap();
    }
    let (mut at_server, mut at_client) = (0, 0);
    sim.run_until(sim.now() + 60_000_000, |sim| {
        let now = sim.now();
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                let len = 1 + (at_server as usize * 7919 + round as usize * 104_729) % 30_000;
                assert!(m == message(round as u64, at_server, len));
                sim.endpoint(server)
                    .send(
                        session,
                        message(round as u64 | RESPONSE_TAG, at_server, len / 2),
                        now,
                    )
                    .unwrap();
                at_server += 1;
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            match event {
                Event::Message { message: m, .. } => {
                    let len = 1 + (at_client as usize * 7919 + round as usize * 104_729) % 30_000;
                    assert!(m == message(round as u64 | RESPONSE_TAG, at_client, len / 2));
                    at_client += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        at_client == count
    })
    .unwrap_or_else(|error| panic!("{error}"));
}

/// A simulator with links of 50 µs that duplicate a share `duplicate` of datagrams, and the
/// last DATA datagram of more than 100 payload bytes that `addr(1)` sent, kept as sent.
fn capturing_sim(seed: u64, duplicate: f64) -> (Sim, Rc<RefCell<Vec<Vec<u8>>>>) {
    let mut sim = Sim::new(seed);
    sim.set_default_link(LinkConfig {
        delay_us: 50,
        jitter_us: 0,
        loss: 0.0,
        duplicate,
    });
    let captured: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let capture = captured.clone();
    let client = addr(1);
    sim.set_tracer(move |event| {
        if event.kind == TraceKind::Sent && event.from == client {
            if let Ok(p) = decode(event.contents) {
                if p.kind == PacketKind::Data && p.payload.len() > 100 {
                    *capture.borrow_mut() = vec![event.contents.to_vec()];
                }
            }
        }
    });
    (sim, captured)
}

#[test]
fn garbage_is_dropped_and_counted_and_the_session_keeps_delivering() {
    // Duplicated datagrams come from the network itself.
    let (mut sim, captured) = capturing_sim(11, 0.3);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    let before = sim.endpoint_ref(server).stats();
    assert!(
        before.dropped_duplicate > 0,
        "duplicated datagrams are counted"
    );

    let real = captured.borrow()[0].clone();
    let live = decode(&real).unwrap();
    let stranger: SocketAddr = "127.0.0.77:7000".parse().unwrap();
    let mut garbage: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
    // Truncated: inside the header, and inside the payload.
    garbage.push((client, real[..20].to_vec()));
    garbage.push((client, real[..real.len() - 1].to_vec()));
    // Bit flips in the header (the session id, the echo field), in the payload and in the MAC:
    // the MAC refuses all four (since format 4 it is the only integrity check).
    let payload_end = real.len() - tessera_datagram::TAG_LEN;
    for bit in [
        8 * 9 + 3,
        8 * 30,
        8 * (payload_end - 1) + 7,
        8 * real.len() - 1,
    ] {
        let mut flipped = real.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        garbage.push((client, flipped));
    }
    // Another version, correctly sealed.
    let mut version = real.clone();
    version[2] = tessera_datagram::packet::VERSION + 1;
    packet::seal(&mut version);
    garbage.push((client, version));
    // Not ours at all.
    garbage.push((client, vec![0xAB; 300]));
    // Valid packets for sessions nobody knows: an ACK, and DATA past the initial window
    // (which also earns the sender a RESET).
    let unknown = |kind, seq| Packet {
        kind,
        first: false,
        last: false,
        probe: false,
        session: 0xDEAD_BEEF,
        seq,
        ack: 0,
        window: 8,
        timestamp: 0,
        echo: 0,
        message_len: 0,
        ack_delay: 0,
        queue: 0,
        payload: if kind == PacketKind::Data {
            Bytes::from_static(b"x")
        } else {
            Bytes::new()
        },
    };
    garbage.push((client, unknown(PacketKind::Ack, 0).encode()));
    garbage.push((stranger, unknown(PacketKind::Data, 5).encode()));
    // The live session, but far outside its window.
    let far = Packet {
        seq: live.seq.wrapping_add(1_000_000),
        first: false,
        last: false,
        message_len: 0,
        window: 0,
        ..live.clone()
    };
    garbage.push((client, far.encode()));
    // The live session's id from another address.
    garbage.push((stranger, real.clone()));
    // An exact duplicate of an old datagram.
    garbage.push((client, real.clone()));
    for (from, datagram) in garbage {
        sim.inject(from, server, datagram);
    }
    sim.run_for(1_000);

    let after = sim.endpoint_ref(server).stats();
    let delta = |f: fn(&Stats) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.dropped_truncated), 2);
    assert_eq!(delta(|s| s.dropped_unauthentic), 4);
    assert_eq!(delta(|s| s.dropped_version), 1);
    assert_eq!(delta(|s| s.dropped_malformed), 1);
    assert_eq!(delta(|s| s.dropped_unknown_session), 3);
    assert_eq!(delta(|s| s.dropped_out_of_window), 1);
    assert!(delta(|s| s.dropped_duplicate) >= 1);
    assert_eq!(
        delta(|s| s.resets_sent),
        2,
        "the stranger's DATA packets earn RESETs"
    );
    assert_eq!(delta(|s| s.messages_delivered), 0);
    assert_eq!(delta(|s| s.sessions_lost), 0);
    assert_eq!(sim.stats().injected, 13);

    // The session is unharmed.
    exchange(&mut sim, client, server, session, 2);
    assert_eq!(sim.endpoint_ref(server).stats().sessions_lost, 0);
}

/// Adds `client` and a `server` that requires session keys, and opens `session` between
/// them keyed by `key` (as a handshake would), with 1,400-byte fragments.
fn connect_keyed_pair(
    sim: &mut Sim,
    (client, server): (SocketAddr, SocketAddr),
    session: SessionId,
    key: tessera_auth::Key,
) {
    sim.add_endpoint(client, Config::default());
    let server_config = Config {
        require_session_keys: true,
        ..Config::default()
    };
    sim.add_endpoint(server, server_config);
    sim.endpoint(server).admit(session, key);
    sim.endpoint(client)
        .connect_keyed(server, session, key, 1_400, 0)
        .unwrap();
}

/// A session keyed by a handshake (as the UDP driver keys every session) refuses datagrams
/// forged without its key: a packet of the session's own bytes re-tagged with the public key
/// or another key, a new payload tagged with the public key, a bit flipped under the real
/// tag; and a replay of a genuine datagram delivers nothing twice. The session goes on.
#[test]
fn a_keyed_session_drops_datagrams_forged_without_its_key_and_replays() {
    let (mut sim, captured) = capturing_sim(13, 0.0);
    let (client, server) = (addr(1), addr(2));
    let key = tessera_auth::Key([9; 32]);
    let session = SessionId(0x5EED);
    connect_keyed_pair(&mut sim, (client, server), session, key);
    exchange(&mut sim, client, server, session, 1);
    let before = sim.endpoint_ref(server).stats();

    let real = captured.borrow()[0].clone();
    let mut forged = Vec::new();
    let mut public = real.clone();
    packet::seal(&mut public);
    forged.push(public);
    let mut other_key = real.clone();
    packet::seal_with(
        &mut other_key,
        &tessera_auth::PacketMac::new(&tessera_auth::Key([8; 32])),
    );
    forged.push(other_key);
    let mut new_payload = decode(&real).unwrap();
    new_payload.payload = Bytes::from(vec![0xEE; new_payload.payload.len()]);
    forged.push(new_payload.encode());
    let mut flipped = real.clone();
    flipped[packet::HEADER_LEN + 3] ^= 0x10;
    forged.push(flipped);
    for datagram in forged {
        sim.inject(client, server, datagram);
    }
    sim.inject(client, server, real);
    sim.run_for(1_000);

    let after = sim.endpoint_ref(server).stats();
    let delta = |f: fn(&Stats) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.dropped_unauthentic), 4);
    assert_eq!(delta(|s| s.dropped_duplicate), 1, "the replay");
    assert_eq!(delta(|s| s.messages_delivered), 0);
    exchange(&mut sim, client, server, session, 2);
    assert_eq!(sim.endpoint_ref(server).stats().sessions_lost, 0);
}

#[test]
fn random_corruption_mid_transfer_never_panics_nor_stalls() {
    let mut sim = Sim::new(12);
    sim.set_default_link(LinkConfig {
        delay_us: 40,
        jitter_us: 20,
        loss: 0.02,
        duplicate: 0.02,
    });
    let (client, server) = (addr(1), addr(2));
    let mut state = 12u64;
    // Corrupt a fifth of all datagrams: the original is dropped and a damaged copy delivered.
    let damaged: Rc<RefCell<Vec<Datagram>>> = Rc::default();
    let queue = damaged.clone();
    sim.set_filter(move |_, from, to, contents| {
        let roll = splitmix(&mut state);
        if !roll.is_multiple_of(5) {
            return true;
        }
        let mut copy = contents.to_vec();
        match (roll >> 8) % 4 {
            0 => copy.truncate((roll >> 16) as usize % copy.len()),
            1 => {
                for k in 0..1 + (roll >> 20) % 3 {
                    let bit = (splitmix(&mut state) >> k) as usize % (copy.len() * 8);
                    copy[bit / 8] ^= 1 << (bit % 8);
                }
            }
            2 => copy.extend_from_slice(&roll.to_le_bytes()),
            _ => {
                for byte in copy.iter_mut().skip(8) {
                    *byte = splitmix(&mut state) as u8;
                }
            }
        }
        queue.borrow_mut().push((from, to, copy));
        false
    });
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    let count = 12;
    for i in 0..count {
        sim.endpoint(client)
            .send(session, message(4, i, 1 + i as usize * 9_000), 0)
            .unwrap();
    }
    let mut received = 0;
    sim.run_until(600_000_000, |sim| {
        for (from, to, datagram) in damaged.borrow_mut().drain(..) {
            sim.inject(from, to, datagram);
        }
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                assert!(m == message(4, received, 1 + received as usize * 9_000));
                received += 1;
            }
        }
        received == count
    })
    .unwrap_or_else(|error| panic!("{error}"));
    let stats = sim.endpoint_ref(server).stats();
    let refused = stats.dropped_truncated
        + stats.dropped_unauthentic
        + stats.dropped_malformed
        + stats.dropped_version;
    assert!(refused > 50, "{stats:?}");
}

// ---------------------------------------------------------------------------------------------
// 7. Vanished and restarted peers.

#[test]
fn a_vanished_peer_is_lost_after_peer_lost_after_us_of_silence() {
    let config = Config::default();
    let mut sim = Sim::new(21);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config.clone());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    sim.run_for(10_000);
    let timeouts_before = sim.endpoint_ref(client).stats().timeouts;

    sim.set_up(server, false);
    let vanished_at = sim.now();
    sim.endpoint(client)
        .send(session, message(9, 0, 10_000), vanished_at)
        .unwrap();
    let mut lost_at = None;
    sim.run_until(vanished_at + 60_000_000, |sim| {
        while let Some(event) = sim.endpoint(client).poll_event() {
            assert_eq!(
                event,
                Event::Lost {
                    session,
                    peer: server,
                    reason: LossReason::TimedOut
                }
            );
            lost_at = Some(sim.now());
        }
        lost_at.is_some()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    // Lost at the first timeout that finds the peer silent for peer_lost_after_us since the
    // first transmission went unanswered; the timers in between never pass the ceiling, so
    // the sender kept retransmitting about once a millisecond.
    let took = lost_at.unwrap() - vanished_at;
    let timer_max = config.retransmit_timer_max_us;
    println!("lost after {took} µs");
    assert!(
        (config.peer_lost_after_us..=config.peer_lost_after_us + timer_max).contains(&took),
        "took {took} µs"
    );
    let stats = sim.endpoint_ref(client).stats();
    assert!(stats.timer_us_max <= timer_max, "{stats:?}");
    assert_eq!(stats.long_timeouts, 0, "{stats:?}");
    assert!(
        stats.timeouts - timeouts_before >= config.peer_lost_after_us / timer_max,
        "{stats:?}"
    );
    assert_eq!(stats.sessions_lost, 1);
    assert_eq!(
        sim.endpoint(client)
            .send(session, Bytes::from_static(b"x"), 0),
        Err(SendError::Lost(session))
    );
    assert_eq!(sim.endpoint_ref(client).poll_timeout(), None);
}

#[test]
fn a_peer_that_vanishes_while_the_window_is_closed_is_lost_too() {
    // The receiver's window fills (its application does not drain), then it vanishes: the
    // sender's window probes go unanswered and the session is lost after the same bound.
    let config = Config {
        receive_window_packets: 4,
        ..Config::default()
    };
    let mut sim = Sim::new(22);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config.clone());
    let session = sim.endpoint(client).connect(server, 0);
    for i in 0..20 {
        sim.endpoint(client)
            .send(session, message(1, i, 1_000), 0)
            .unwrap();
    }
    sim.run_until(1_000_000, |sim| {
        sim.endpoint_ref(client).stats().window_limited > 0
            && sim
                .endpoint_ref(client)
                .session_info(session)
                .unwrap()
                .in_flight
                == 0
    })
    .unwrap_or_else(|error| panic!("{error}"));
    // While the peer answers the probes, the session stays up however long it takes.
    sim.run_for(5_000_000);
    assert!(sim.endpoint_ref(client).stats().probes_sent > 10);
    assert!(sim.endpoint_ref(client).session_info(session).is_some());
    sim.set_up(server, false);
    let vanished_at = sim.now();
    let rto_max = config.rto_max_us;
    sim.run_until(vanished_at + 60_000_000, |sim| {
        sim.endpoint_ref(client).session_info(session).is_none()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    let took = sim.now() - vanished_at;
    // Silence is counted from when the last probe timer was armed, before the peer vanished;
    // the probe interval had backed off to at most rto_max (spread by up to a quarter).
    assert!(
        took <= config.peer_lost_after_us + rto_max + rto_max / 4,
        "took {took} µs"
    );
    assert_eq!(
        sim.endpoint(client).poll_event(),
        Some(Event::Lost {
            session,
            peer: server,
            reason: LossReason::TimedOut
        })
    );
}

/// One round of the hand-stepped client and server of [`client_and_server`] at `now`: a
/// message out, its acknowledgement back 100 µs later.
fn one_round(endpoints: &mut [(SocketAddr, Endpoint)], session: SessionId, now: Micros) {
    endpoints[0]
        .1
        .send(session, Bytes::from_static(b"ping"), now)
        .unwrap();
    assert!(deliver_late(endpoints, (0, 1), now, now + 50, now + 50) > 0);
    while endpoints[1].1.poll_event().is_some() {}
    deliver_late(endpoints, (1, 0), now + 50, now + 100, now + 100);
    while endpoints[0].1.poll_event().is_some() {}
}

/// [`client_and_server`] after five rounds (the RTT is known), with `message` just sent by
/// the client at the returned time.
fn warmed_up_then_sent(
    message: &'static [u8],
) -> (Config, Vec<(SocketAddr, Endpoint)>, SessionId, Micros) {
    let (config, mut endpoints, session) = client_and_server();
    let mut now: Micros = 1_000;
    for _ in 0..5 {
        one_round(&mut endpoints, session, now);
        now += 1_000;
    }
    endpoints[0]
        .1
        .send(session, Bytes::from_static(message), now)
        .unwrap();
    (config, endpoints, session, now)
}

#[test]
fn a_host_kept_off_the_cpu_does_not_give_up_on_a_peer_that_answered() {
    // The client sends, the server acknowledges at once, but the client is not scheduled for
    // 1.5 s (a loaded machine, SIGSTOP): its timer expired long ago when it next runs, and in
    // the worst order it handles that timer before reading its socket. Its own lateness is
    // not the server's silence: it resends, reads the acknowledgement that waited, and keeps
    // the session (before, it reported the server lost at this first timeout).
    let (config, mut endpoints, session, now) = warmed_up_then_sent(b"late");
    assert!(deliver_late(&mut endpoints, (0, 1), now, now + 50, now + 50) > 0);
    while endpoints[1].1.poll_event().is_some() {}
    let mut acks = Vec::new();
    while let Some(transmit) = endpoints[1].1.poll_transmit(now + 50) {
        acks.push(transmit);
    }
    assert!(!acks.is_empty(), "the server acknowledges");
    let woke = now + config.peer_lost_after_us + 500_000;
    assert!(endpoints[0].1.poll_timeout().unwrap() < woke);
    endpoints[0].1.handle_timeout(woke);
    assert_eq!(
        endpoints[0].1.poll_event(),
        None,
        "no loss at the late timer"
    );
    assert!(
        endpoints[0].1.poll_transmit(woke).is_some(),
        "the late timer resends"
    );
    let server = endpoints[1].0;
    for ack in &acks {
        endpoints[0]
            .1
            .handle_datagram_arrived(server, &ack.contents(), now + 100, woke);
    }
    let info = endpoints[0].1.session_info(session).expect("session kept");
    assert_eq!(info.in_flight, 0, "{info:?}");
    assert_eq!(endpoints[0].1.stats().sessions_lost, 0);
}

#[test]
fn a_host_kept_off_the_cpu_still_finds_a_vanished_peer_lost() {
    // The same stall, but the server is gone: once the client runs on schedule again, it
    // resends for about `peer_lost_after_us` more and then reports the session lost.
    let (config, mut endpoints, _, now) = warmed_up_then_sent(b"lost");
    while endpoints[0].1.poll_transmit(now).is_some() {}
    let woke = now + config.peer_lost_after_us + 500_000;
    let mut at = woke;
    let lost_at = loop {
        endpoints[0].1.handle_timeout(at);
        while endpoints[0].1.poll_transmit(at).is_some() {}
        if let Some(event) = endpoints[0].1.poll_event() {
            assert!(matches!(
                event,
                Event::Lost {
                    reason: LossReason::TimedOut,
                    ..
                }
            ));
            break at;
        }
        at = endpoints[0]
            .1
            .poll_timeout()
            .expect("a timer while sending");
        assert!(at < woke + 10 * config.peer_lost_after_us, "never lost");
    };
    let after_waking = lost_at - woke;
    println!("lost {after_waking} µs after the host ran again");
    assert!(
        (config.peer_lost_after_us - 3 * config.retransmit_timer_max_us
            ..=config.peer_lost_after_us + 3 * config.retransmit_timer_max_us)
            .contains(&after_waking),
        "lost {after_waking} µs after waking"
    );
}

#[test]
fn a_partition_shorter_than_the_loss_bound_heals_without_losing_the_session() {
    let mut sim = Sim::new(25);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    // Cut both directions for 100 ms while data is in flight, then heal.
    let now = sim.now();
    sim.endpoint(client)
        .send(session, message(6, 0, 50_000), now)
        .unwrap();
    let cut = LinkConfig {
        loss: 1.0,
        ..LinkConfig::default()
    };
    sim.set_links_between(client, server, cut);
    sim.run_for(100_000);
    assert!(sim.endpoint_ref(client).stats().timeouts >= 5);
    sim.set_links_between(client, server, LinkConfig::default());
    let mut received = false;
    sim.run_until(sim.now() + 10_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                assert!(m == message(6, 0, 50_000));
                received = true;
            }
        }
        received
    })
    .unwrap_or_else(|error| panic!("{error}"));
    exchange(&mut sim, client, server, session, 2);
    assert_eq!(sim.endpoint_ref(client).stats().sessions_lost, 0);
    assert_eq!(sim.endpoint_ref(server).stats().sessions_lost, 0);
}

#[test]
fn a_reset_after_the_peer_restarted_yields_lost_promptly() {
    let mut sim = Sim::new(23);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    sim.run_for(10_000);

    sim.restart_endpoint(server);
    let restarted_at = sim.now();
    sim.endpoint(client)
        .send(session, message(9, 0, 100), restarted_at)
        .unwrap();
    let mut lost = false;
    let at = sim
        .run_until(restarted_at + 60_000_000, |sim| {
            while let Some(event) = sim.endpoint(client).poll_event() {
                assert_eq!(
                    event,
                    Event::Lost {
                        session,
                        peer: server,
                        reason: LossReason::Reset
                    }
                );
                lost = true;
            }
            lost
        })
        .unwrap_or_else(|error| panic!("{error}"));
    // One round trip on a 50 µs link, and no timeout.
    assert!(
        at - restarted_at <= 200,
        "lost after {} µs",
        at - restarted_at
    );
    let stats = sim.endpoint_ref(client).stats();
    assert_eq!(stats.resets_received, 1);
    assert_eq!(sim.endpoint_ref(server).stats().resets_sent, 1);
    assert_eq!(
        sim.endpoint(client).send(session, Bytes::new(), at),
        Err(SendError::Lost(session))
    );
    // A new session to the restarted server works.
    let fresh = sim.endpoint(client).connect(server, at);
    exchange(&mut sim, client, server, fresh, 2);
}

#[test]
fn close_resets_the_peer_which_reports_the_session_lost() {
    let mut sim = Sim::new(24);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    while sim.endpoint(server).poll_event().is_some() {}
    sim.endpoint(client).close(session);
    assert_eq!(
        sim.endpoint(client).send(session, Bytes::new(), 0),
        Err(SendError::UnknownSession(session))
    );
    let mut lost = false;
    sim.run_until(sim.now() + 1_000_000, |sim| {
        if let Some(event) = sim.endpoint(server).poll_event() {
            assert!(matches!(event, Event::Lost { .. }));
            lost = true;
        }
        lost
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(sim.endpoint_ref(server).session_count(), 0);
    assert_eq!(sim.endpoint_ref(client).session_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// 8. Retransmission on the first RESTART.

/// Section 4 of the paper: retransmission is triggered by the first RESTART, not by a timeout
/// nor by three duplicate acknowledgements.
#[test]
fn one_dropped_packet_is_recovered_by_the_first_restart_without_a_timeout() {
    let mut sim = Sim::new(31);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let dropped = Rc::new(RefCell::new(false));
    let once = dropped.clone();
    sim.set_filter(move |_, from, _, contents| {
        let packet = decode(contents).unwrap();
        if from == client && packet.kind == PacketKind::Data && packet.seq == 10 && !*once.borrow()
        {
            *once.borrow_mut() = true;
            return false;
        }
        true
    });
    let session = sim.endpoint(client).connect(server, 0);
    let len = 60 * Config::default().fragment_bytes_max();
    sim.endpoint(client)
        .send(session, message(8, 0, len), 0)
        .unwrap();
    let mut done = false;
    let end = sim
        .run_until(1_000_000, |sim| {
            while let Some(event) = sim.endpoint(server).poll_event() {
                if let Event::Message { message: m, .. } = event {
                    assert!(m == message(8, 0, len));
                    done = true;
                }
            }
            done
        })
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(*dropped.borrow());
    let client_stats = sim.endpoint_ref(client).stats();
    let server_stats = sim.endpoint_ref(server).stats();
    println!("recovered in {end} µs: {client_stats:?}");
    assert_eq!(client_stats.timeouts, 0, "recovered without a timeout");
    assert_eq!(server_stats.restarts_sent, 1, "one RESTART for one gap");
    assert_eq!(client_stats.restarts_honoured, 1);
    assert!(client_stats.retransmissions >= 1);
    assert!(end < Config::default().rto_initial_us * 2);
}

#[test]
fn a_packet_overtaken_by_two_others_is_waited_for_not_resent() {
    let mut sim = Sim::new(41);
    let (client, server) = (addr(1), addr(2));
    // Three packets in flight at a time, so the three below are all there is on the way.
    let fixed_3 = Config {
        congestion: CongestionKind::Fixed(3),
        ..Config::default()
    };
    sim.add_endpoint(client, fixed_3);
    sim.add_endpoint(server, Config::default());
    // Packets 9, 10 and 11 are held back, then delivered 20 us apart as 10, 11, 9.
    let held: Rc<RefCell<BTreeMap<u32, Vec<u8>>>> = Rc::new(RefCell::new(BTreeMap::new()));
    let hold = held.clone();
    let mut seen = [false; 3];
    sim.set_filter(move |_, from, _, contents| {
        let packet = decode(contents).unwrap();
        let first = from == client
            && packet.kind == PacketKind::Data
            && (9..12).contains(&packet.seq)
            && !std::mem::replace(&mut seen[packet.seq as usize - 9], true);
        if first {
            hold.borrow_mut().insert(packet.seq, contents.to_vec());
        }
        !first
    });
    let session = sim.endpoint(client).connect(server, 0);
    let len = 30 * Config::default().fragment_bytes_max();
    sim.endpoint(client)
        .send(session, message(5, 0, len), 0)
        .unwrap();
    let mut order = vec![9u32, 11, 10];
    let mut next_at = None;
    let mut done = false;
    sim.run_until(1_000_000, |sim| {
        let now = sim.now();
        if held.borrow().len() == 3 && next_at.is_none_or(|at| now >= at) {
            if let Some(seq) = order.pop() {
                let contents = held.borrow()[&seq].clone();
                sim.inject(client, server, contents);
                next_at = Some(now + 20);
                sim.wake_at(now + 20);
            }
        }
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                assert!(m == message(5, 0, len));
                done = true;
            }
        }
        done
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(order.is_empty(), "all three delivered late");
    let (sender, receiver) = (
        sim.endpoint_ref(client).stats(),
        sim.endpoint_ref(server).stats(),
    );
    println!("sender {sender:?}\nreceiver {receiver:?}");
    assert_eq!(receiver.held_out_of_order, 2, "{receiver:?}");
    assert_eq!(
        receiver.restarts_sent, 0,
        "two packets past a gap are not a loss"
    );
    assert_eq!(sender.retransmissions, 0);
    assert_eq!(sender.timeouts, 0);
    assert_eq!(receiver.dropped_duplicate, 0);
}

// ---------------------------------------------------------------------------------------------
// Limits and errors.

#[test]
fn send_refuses_oversized_messages_unknown_sessions_and_a_full_queue() {
    let config = Config {
        message_bytes_max: 40 << 20,
        ..Config::default()
    };
    let mut sim = Sim::new(41);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config.clone());
    let session = sim.endpoint(client).connect(server, 0);
    let endpoint = sim.endpoint(client);
    assert_eq!(
        endpoint.send(session, Bytes::from(vec![0; (40 << 20) + 1]), 0),
        Err(SendError::TooLarge {
            len: (40 << 20) + 1,
            max: 40 << 20
        })
    );
    assert_eq!(
        endpoint.send(SessionId(5), Bytes::new(), 0),
        Err(SendError::UnknownSession(SessionId(5)))
    );
    // One message larger than the queue's bound is accepted into an empty queue...
    let big = Bytes::from(vec![0; 40 << 20]);
    endpoint.send(session, big.clone(), 0).unwrap();
    endpoint.send(session, big.slice(..20 << 20), 0).unwrap();
    // ...but the queue stops at SEND_QUEUE_BYTES_MAX.
    assert_eq!(
        endpoint.send(session, big.slice(..5 << 20), 0),
        Err(SendError::QueueFull {
            session,
            queued_bytes: 60 << 20,
            max: SEND_QUEUE_BYTES_MAX
        })
    );
}

#[test]
fn sessions_beyond_sessions_max_are_refused_and_counted() {
    let server_config = Config {
        sessions_max: 2,
        ..Config::default()
    };
    let mut sim = Sim::new(42);
    let server = addr(2);
    sim.add_endpoint(server, server_config);
    let clients: Vec<SocketAddr> = (0..3).map(|i| addr(10 + i)).collect();
    let mut sessions = Vec::new();
    for &client in &clients {
        sim.add_endpoint(client, Config::default());
        let session = sim.endpoint(client).connect(server, 0);
        sim.endpoint(client)
            .send(session, Bytes::from_static(b"hello"), 0)
            .unwrap();
        sessions.push(session);
    }
    sim.run_for(2_000_000);
    assert_eq!(sim.endpoint_ref(server).session_count(), 2);
    assert!(sim.endpoint_ref(server).stats().dropped_sessions_full >= 1);
    let lost: usize = clients
        .iter()
        .map(|&c| sim.endpoint_ref(c).stats().sessions_lost as usize)
        .sum();
    assert_eq!(
        lost, 1,
        "the refused client gives up after a second of silence"
    );
}

#[test]
fn empty_and_jumbo_messages_are_delivered() {
    let config = Config {
        payload_bytes_max: 8972,
        ..Config::default()
    };
    let mut sim = Sim::new(43);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config);
    let session = sim.endpoint(client).connect(server, 0);
    let messages = [Bytes::new(), message(1, 1, 100_000), Bytes::new()];
    for m in &messages {
        sim.endpoint(client).send(session, m.clone(), 0).unwrap();
    }
    let mut received = Vec::new();
    sim.run_until(1_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message: m, .. } = event {
                received.push(m);
            }
        }
        received.len() == messages.len()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(received, messages);
    // 100 000 bytes in 8928-byte fragments, plus the two empty messages.
    assert_eq!(sim.endpoint_ref(client).stats().data_packets_sent, 12 + 2);
}

#[test]
fn a_window_probe_recovers_a_lost_window_update() {
    let config = Config {
        receive_window_packets: 4,
        ..Config::default()
    };
    let mut sim = Sim::new(44);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config);
    // Drop the first ACK that opens the server's window again after it had closed.
    let state = Rc::new(RefCell::new((false, false)));
    let filter_state = state.clone();
    sim.set_filter(move |_, from, _, contents| {
        let packet = decode(contents).unwrap();
        if from != server {
            return true;
        }
        let (closed, dropped) = &mut *filter_state.borrow_mut();
        if packet.window == 0 {
            *closed = true;
        } else if *closed && !*dropped && packet.kind == PacketKind::Ack && !packet.probe {
            *dropped = true;
            return false;
        }
        true
    });
    let session = sim.endpoint(client).connect(server, 0);
    let count = 10;
    for i in 0..count {
        sim.endpoint(client)
            .send(session, message(2, i, 1_000), 0)
            .unwrap();
    }
    // The application starts draining only after 5 ms.
    let drain_from = 5_000;
    sim.wake_at(drain_from);
    let mut received = 0;
    sim.run_until(10_000_000, |sim| {
        if sim.now() >= drain_from {
            while let Some(event) = sim.endpoint(server).poll_event() {
                if let Event::Message { message: m, .. } = event {
                    assert!(m == message(2, received, 1_000));
                    received += 1;
                }
            }
        }
        received == count
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(state.borrow().1, "a window update was dropped");
    let stats = sim.endpoint_ref(client).stats();
    assert!(stats.window_limited >= 1);
    assert!(stats.probes_sent >= 1);
    assert_eq!(stats.sessions_lost, 0);
}

#[test]
fn a_message_over_the_receivers_maximum_resets_the_session_on_both_sides() {
    let mut sim = Sim::new(45);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(
        server,
        Config {
            message_bytes_max: 10_000,
            ..Config::default()
        },
    );
    let session = sim.endpoint(client).connect(server, 0);
    sim.endpoint(client)
        .send(session, message(1, 0, 20_000), 0)
        .unwrap();
    let mut client_lost = false;
    sim.run_until(1_000_000, |sim| {
        // The session never delivered a message, so the server's application never heard of
        // it, neither opened nor lost.
        if let Some(event) = sim.endpoint(server).poll_event() {
            panic!("server: unexpected {event:?}");
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            assert_eq!(
                event,
                Event::Lost {
                    session,
                    peer: server,
                    reason: LossReason::Reset
                }
            );
            client_lost = true;
        }
        client_lost
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(sim.endpoint_ref(server).stats().protocol_violations, 1);
    assert_eq!(sim.endpoint_ref(server).session_count(), 0);
}

#[test]
fn resets_to_strangers_are_rate_limited() {
    let mut sim = Sim::new(46);
    let server = addr(2);
    sim.add_endpoint(server, Config::default());
    let stranger: SocketAddr = "127.0.0.99:7000".parse().unwrap();
    let count = 100;
    for i in 0..count {
        let packet = Packet {
            kind: PacketKind::Data,
            first: false,
            last: false,
            probe: false,
            session: 1_000 + i,
            seq: 7,
            ack: 0,
            window: 4,
            timestamp: 0,
            echo: 0,
            message_len: 0,
            ack_delay: 0,
            queue: 0,
            payload: Bytes::from_static(b"stale"),
        };
        sim.inject(stranger, server, packet.encode());
    }
    sim.run_for(100);
    let stats = sim.endpoint_ref(server).stats();
    assert_eq!(stats.dropped_unknown_session, count);
    assert_eq!(stats.resets_sent, tessera_datagram::RESET_BURST_MAX as u64);
    assert_eq!(stats.resets_suppressed, count - stats.resets_sent);
}

#[test]
fn a_late_duplicate_of_a_closed_sessions_first_packet_does_not_reopen_it() {
    let mut sim = Sim::new(47);
    let (client, server) = (addr(1), addr(2));
    let first: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let capture = first.clone();
    sim.set_tracer(move |event| {
        if event.kind == TraceKind::Sent && event.from == client && capture.borrow().is_none() {
            *capture.borrow_mut() = Some(event.contents.to_vec());
        }
    });
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect(server, 0);
    exchange(&mut sim, client, server, session, 1);
    sim.endpoint(server).close(session);
    sim.run_for(1_000);
    assert_eq!(
        sim.endpoint_ref(client).session_count(),
        0,
        "the close reset the client"
    );
    let opened_before = sim.endpoint_ref(server).stats().sessions_opened;
    let resets_before = sim.endpoint_ref(server).stats().resets_sent;
    let first = first.borrow().clone().unwrap();
    assert_eq!(decode(&first).unwrap().seq, 0);
    sim.inject(client, server, first);
    sim.run_for(1_000);
    let stats = sim.endpoint_ref(server).stats();
    assert_eq!(stats.sessions_opened, opened_before);
    assert_eq!(stats.resets_sent, resets_before + 1);
    assert_eq!(sim.endpoint_ref(server).session_count(), 0);
    assert_eq!(sim.endpoint(server).poll_event(), None);
}

/// Each path has its own MTU: a session opened with larger datagrams uses them in both
/// directions once the accepting side sets its size too, while the endpoint default stays.
#[test]
fn sessions_carry_datagrams_sized_to_their_path() {
    let config = Config::default();
    let mut sim = Sim::new(45);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(client, config.clone());
    sim.add_endpoint(server, config);
    let session = sim.endpoint(client).connect_with(server, 65_000, 0);
    let request = message(2, 1, 200_000);
    sim.endpoint(client)
        .send(session, request.clone(), 0)
        .unwrap();
    let mut got = None;
    sim.run_until(1_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            match event {
                Event::Opened { session, .. } => {
                    sim.endpoint(server).set_payload_bytes(session, 9_000)
                }
                Event::Message {
                    session, message, ..
                } => {
                    let now = sim.now();
                    sim.endpoint(server)
                        .send(session, message.clone(), now)
                        .unwrap();
                    got = Some(message);
                }
                Event::Lost { .. } => panic!("session lost"),
            }
        }
        got.is_some()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(got.as_ref(), Some(&request));
    // 200 000 bytes in fragments of 65 000 - 44 bytes: 4 data packets.
    assert_eq!(sim.endpoint_ref(client).stats().data_packets_sent, 4);
    let mut echoed = None;
    sim.run_until(2_000_000, |sim| {
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message { message, .. } = event {
                echoed = Some(message);
            }
        }
        echoed.is_some()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(echoed.as_ref(), Some(&request));
    // The answer went in fragments of 9 000 - 44 bytes: 23 data packets.
    assert_eq!(sim.endpoint_ref(server).stats().data_packets_sent, 23);
}

/// Three servers answer one client through one 200 Mbit/s port with fixed windows of 8 and 16:
/// the queue they build raises the round trip well above its early samples. The timeout must
/// follow (samples from retransmitted packets are taken: their timestamps make them
/// unambiguous), or every window times out and go-back-N resends it, which is how the lab saw
/// reads collapse at large windows with no packet lost.
/// One message from host 1 to host 2 while, from `stall_at` for `stall_us`, host 2's
/// acknowledgements take `stall_delay_us` to come back (a receiver that is not scheduled on a
/// busy host). Returns the sender's and the receiver's statistics once it is delivered.
fn transfer_with_late_acknowledgements(
    drop_seq: Option<u32>,
    stall_at: Micros,
    stall_us: Micros,
    stall_delay_us: Micros,
) -> (Stats, Stats) {
    let mut sim = Sim::new(77);
    let (sender, receiver) = (addr(1), addr(2));
    sim.add_endpoint(sender, Config::default());
    sim.add_endpoint(receiver, Config::default());
    // 400 packets take about 50 ms through a 100 Mbit/s port.
    sim.set_bottleneck(
        receiver,
        BottleneckConfig {
            rate_bits_per_s: 100_000_000,
            buffer_bytes: 1 << 20,
        },
    );
    if let Some(seq) = drop_seq {
        let dropped = Rc::new(RefCell::new(false));
        sim.set_filter(move |_, from, _, contents| {
            let packet = decode(contents).unwrap();
            let drop = from == sender
                && packet.kind == PacketKind::Data
                && packet.seq == seq
                && !*dropped.borrow();
            if drop {
                *dropped.borrow_mut() = true;
            }
            !drop
        });
    }
    let session = sim.endpoint(sender).connect(receiver, 0);
    let len = 400 * Config::default().fragment_bytes_max();
    sim.endpoint(sender)
        .send(session, message(9, 0, len), 0)
        .unwrap();
    sim.run_for(stall_at);
    let late = LinkConfig {
        delay_us: stall_delay_us,
        ..LinkConfig::default()
    };
    sim.set_link(receiver, sender, late);
    sim.run_for(stall_us);
    sim.set_link(receiver, sender, LinkConfig::default());
    let mut done = false;
    sim.run_until(sim.now() + 5_000_000, |sim| {
        while let Some(event) = sim.endpoint(receiver).poll_event() {
            if let Event::Message { message: m, .. } = event {
                assert!(m == message(9, 0, len));
                done = true;
            }
        }
        done
    })
    .unwrap_or_else(|error| panic!("{error}"));
    (
        sim.endpoint_ref(sender).stats(),
        sim.endpoint_ref(receiver).stats(),
    )
}

#[test]
fn a_timeout_on_a_late_acknowledgement_is_found_spurious_and_resends_one_packet() {
    // For 20 ms mid-transfer acknowledgements take 20 ms, twice the timeout (the
    // window of 64 packets queued at the port makes the round trip about 8 ms).
    let (sender, receiver) = transfer_with_late_acknowledgements(None, 10_000, 20_000, 20_000);
    println!("sender {sender:?}\nreceiver {receiver:?}");
    assert!(sender.timeouts >= 1, "the stall outlasts the timeout");
    // The round trip through the queue (about 8 ms) is past the 1 ms ceiling: the timers
    // follow the measured RTO instead.
    assert_eq!(sender.long_timeouts, sender.timeouts);
    assert_eq!(
        sender.spurious_timeouts, 1,
        "nothing was lost: the one run of timeouts was spurious"
    );
    // Each timeout resent the oldest packet only; the sender then went on from where it was
    // instead of going back over the window it had sent, which had all arrived.
    assert!(
        sender.retransmissions <= sender.timeouts,
        "{} retransmissions for {} timeouts",
        sender.retransmissions,
        sender.timeouts
    );
    assert_eq!(receiver.dropped_duplicate, sender.retransmissions);
}

#[test]
fn a_timeout_after_a_real_loss_is_not_found_spurious() {
    // The last packet is lost: nothing after it shows a gap, so only the timer finds it, and
    // what the receiver then acknowledges is the retransmission.
    let (sender, _) = transfer_with_late_acknowledgements(Some(399), 0, 0, 50);
    println!("sender {sender:?}");
    assert!(
        sender.timeouts >= 1,
        "a lost last packet is found by the timer"
    );
    assert_eq!(sender.spurious_timeouts, 0, "the loss was real");
}

#[test]
fn large_windows_into_one_port_do_not_time_out_spuriously() {
    for window in [8u32, 16] {
        let config = Config {
            congestion: CongestionKind::Fixed(window),
            ..Config::default()
        };
        let mut sim = Sim::new(7);
        let client = addr(1);
        let servers = [addr(2), addr(3), addr(4)];
        sim.add_endpoint(client, config.clone());
        for s in servers {
            sim.add_endpoint(s, config.clone());
        }
        sim.set_default_link(LinkConfig {
            delay_us: 30,
            jitter_us: 0,
            loss: 0.0,
            duplicate: 0.0,
        });
        let rate_bits_per_s = 200_000_000;
        sim.set_bottleneck(
            client,
            BottleneckConfig {
                rate_bits_per_s,
                buffer_bytes: 193_792,
            },
        );
        for s in servers {
            let id = sim.endpoint(client).connect(s, 0);
            sim.endpoint(client)
                .send(id, Bytes::from_static(b"go"), 0)
                .unwrap();
        }
        let response = Bytes::from(vec![7u8; 4 << 20]);
        let mut got = 0usize;
        let end = sim
            .run_until(60_000_000, |sim| {
                for s in servers {
                    while let Some(event) = sim.endpoint(s).poll_event() {
                        if let Event::Message { session, .. } = event {
                            let now = sim.now();
                            sim.endpoint(s)
                                .send(session, response.clone(), now)
                                .unwrap();
                        }
                    }
                }
                while let Some(event) = sim.endpoint(client).poll_event() {
                    if let Event::Message { message, .. } = event {
                        got += message.len();
                    }
                }
                got == 3 * response.len()
            })
            .unwrap_or_else(|error| panic!("{error}"));
        let timeouts: u64 = servers
            .iter()
            .map(|&s| sim.endpoint_ref(s).stats().timeouts)
            .sum();
        let port_bytes_per_us = rate_bits_per_s as f64 / 8.0 / 1e6;
        let fraction = got as f64 / end as f64 / port_bytes_per_us;
        assert!(
            fraction >= 0.9,
            "window {window}: {fraction:.2} of the port (timeouts {timeouts})"
        );
        // A sender learns that the round trip stays long (the queue of three windows) only
        // once the smallest of its latest samples is long; until then its timers keep to the
        // 1 ms ceiling, and the first round trips may time out, spuriously, once or twice.
        assert!(
            timeouts <= 3 * servers.len() as u64,
            "window {window}: {timeouts} timeouts"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Incast: synchronized answers from many senders into one small switch buffer.

/// A client, under a receive budget of `budget` packets if any, with a session to each of
/// `servers` servers, in a simulator of `seed`.
struct FanIn {
    sim: Sim,
    client: SocketAddr,
    servers: Vec<SocketAddr>,
    sessions: Vec<SessionId>,
}

fn fan_in(seed: u64, servers: u8, budget: Option<u32>) -> FanIn {
    let mut sim = Sim::new(seed);
    let client = addr(1);
    sim.add_endpoint(
        client,
        Config {
            receive_budget_packets: budget,
            ..Config::default()
        },
    );
    let servers: Vec<SocketAddr> = (0..servers).map(|i| addr(2 + i)).collect();
    for &s in &servers {
        sim.add_endpoint(s, Config::default());
    }
    let sessions = servers
        .iter()
        .map(|&s| sim.endpoint(client).connect(s, 0))
        .collect();
    FanIn {
        sim,
        client,
        servers,
        sessions,
    }
}

/// What one incast run saw.
#[derive(Debug)]
struct IncastRun {
    /// Goodput as a fraction of the client's port.
    fraction: f64,
    /// Packets the port's buffer dropped.
    queue_drops: u64,
    /// Retransmission timeouts at the senders, and the longest that expired (µs).
    timeouts: u64,
    timeout_us_max: u64,
    /// Timeouts proven spurious by Eifel detection (the packet had arrived, its ACK was late).
    spurious_timeouts: u64,
    /// Most packets granted and not yet arrived at the client, seen after any step.
    promised_max: u64,
}

/// `servers` senders each answer every round's request with `unit_bytes`, all at once, through
/// a 1 Gbit/s port with a 32 KiB buffer toward the client (the incast testbed of the issue);
/// the client asks for the next block only when the whole last one arrived.
fn incast(servers: u8, unit_bytes: usize, budget: Option<u32>, rounds: u32) -> IncastRun {
    let FanIn {
        mut sim,
        client,
        servers: server_addrs,
        sessions,
    } = fan_in(40 + servers as u64, servers, budget);
    sim.set_default_link(LinkConfig {
        delay_us: 10,
        // No jitter: a switch does not reorder the packets of one flow.
        jitter_us: 0,
        loss: 0.0,
        duplicate: 0.0,
    });
    let rate_bits_per_s = 1_000_000_000;
    sim.set_bottleneck(
        client,
        BottleneckConfig {
            rate_bits_per_s,
            buffer_bytes: 32 << 10,
        },
    );
    let answer = Bytes::from(vec![5u8; unit_bytes]);
    let ask = |sim: &mut Sim| {
        let now = sim.now();
        for &session in &sessions {
            sim.endpoint(client)
                .request(session, Bytes::from_static(b"read"), Some(unit_bytes), now)
                .unwrap();
        }
    };
    ask(&mut sim);
    let start = sim.now();
    let (mut round, mut got_in_round, mut got) = (0, 0, 0usize);
    let mut promised_max = 0;
    let end = sim
        .run_until(600_000_000, |sim| {
            for &s in &server_addrs {
                while let Some(event) = sim.endpoint(s).poll_event() {
                    if let Event::Message { session, .. } = event {
                        let now = sim.now();
                        sim.endpoint(s).send(session, answer.clone(), now).unwrap();
                    }
                }
            }
            let promised: u64 = sessions
                .iter()
                .filter_map(|&id| sim.endpoint_ref(client).session_info(id))
                .map(|info| info.receive_window as u64)
                .sum();
            promised_max = promised_max.max(promised);
            while let Some(event) = sim.endpoint(client).poll_event() {
                if let Event::Message { message, .. } = event {
                    assert_eq!(message.len(), unit_bytes);
                    got += message.len();
                    got_in_round += 1;
                }
            }
            if got_in_round == servers as u32 {
                got_in_round = 0;
                round += 1;
                if round < rounds {
                    ask(sim);
                }
            }
            round == rounds
        })
        .unwrap_or_else(|error| panic!("{error}"));
    let sender_stats: Vec<Stats> = server_addrs
        .iter()
        .map(|&s| sim.endpoint_ref(s).stats())
        .collect();
    let port_bytes_per_us = rate_bits_per_s as f64 / 8.0 / 1e6;
    IncastRun {
        fraction: got as f64 / (end - start) as f64 / port_bytes_per_us,
        queue_drops: sim.stats().queue_drops,
        timeouts: sender_stats.iter().map(|s| s.timeouts).sum(),
        spurious_timeouts: sender_stats.iter().map(|s| s.spurious_timeouts).sum(),
        timeout_us_max: sender_stats
            .iter()
            .map(|s| s.timeout_us_max)
            .max()
            .unwrap_or(0),
        promised_max,
    }
}

/// Packets the client may have granted and not yet received in the incast tests: under the
/// port's 32 KiB buffer (22 full frames) plus the path's bandwidth-delay product (2 frames).
const INCAST_BUDGET_PACKETS: u32 = 20;

#[test]
fn without_a_receive_budget_synchronized_answers_overflow_the_port() {
    // The problem the budget solves, reproduced: 64 senders' windows into one small buffer.
    let run = incast(64, 32 << 10, None, 4);
    assert!(run.queue_drops > 1_000, "{run:?}");
    assert!(run.timeouts > 100, "{run:?}");
    assert!(run.promised_max > 1_000, "{run:?}");
}

#[test]
fn with_a_receive_budget_incast_neither_drops_nor_times_out_at_any_fan_in() {
    for servers in [1u8, 4, 16, 64] {
        for (unit, rounds) in [(32 << 10, 6), (256 << 10, 2)] {
            let run = incast(servers, unit, Some(INCAST_BUDGET_PACKETS), rounds);
            let case = format!("{servers} senders of {} KiB: {run:?}", unit >> 10);
            assert!(run.promised_max <= INCAST_BUDGET_PACKETS as u64, "{case}");
            assert_eq!(run.queue_drops, 0, "{case}");
            // No loss to recover from: every timeout is proven spurious (the packet had
            // arrived) and armed for at most 1 ms, the lab's target. Since the datagrams carry
            // a 16-byte MAC, a 32 KiB answer takes 24 packets instead of 23, and 1-10 timers
            // per run at 16 and 64 senders (30 seeds probed) fire at 300-319 us, just past the
            // RTO floor, before a late ACK: all spurious; with 23 packets none fired.
            assert_eq!(run.timeouts, run.spurious_timeouts, "{case}");
            assert!(run.timeout_us_max <= 1_000, "{case}");
            // Measured 0.88 (one sender of 32 KiB: a round trip per block) to 0.95.
            assert!(run.fraction >= 0.85, "{case}");
        }
    }
}

/// A client with a receive budget of `budget` packets and one session to each of `servers`
/// servers, stepped by hand.
fn client_with_budget(budget: u32, servers: u8) -> (Endpoint, Vec<SessionId>) {
    let config = Config {
        receive_budget_packets: Some(budget),
        ..Config::default()
    };
    let mut client = Endpoint::new(config, 1);
    let sessions = (0..servers)
        .map(|i| client.connect(addr(2 + i), 0))
        .collect();
    (client, sessions)
}

/// Where the datagrams the client has to send now go.
fn destinations(client: &mut Endpoint, now: Micros) -> Vec<SocketAddr> {
    std::iter::from_fn(|| client.poll_transmit(now))
        .map(|t| t.destination)
        .collect()
}

#[test]
fn a_request_for_a_large_answer_waits_for_its_grant() {
    // A budget of 4 packets, all granted to the first server's 8 KiB answer: the second
    // server's request is held (it could not answer it yet), and so is a message sent after
    // it on that session (nothing overtakes); a request whose answer is one packet is not.
    let (mut client, sessions) = client_with_budget(4, 3);
    let now = 0;
    client
        .request(sessions[0], Bytes::from_static(b"read"), Some(8 << 10), now)
        .unwrap();
    client
        .request(sessions[1], Bytes::from_static(b"read"), Some(8 << 10), now)
        .unwrap();
    client
        .send(sessions[1], Bytes::from_static(b"after"), now)
        .unwrap();
    client
        .request(sessions[2], Bytes::from_static(b"small"), Some(100), now)
        .unwrap();
    assert_eq!(client.stats().requests_held, 1);
    assert_eq!(client.stats().messages_sent, 4);
    let sent = destinations(&mut client, now);
    assert!(
        sent.contains(&addr(2)) && sent.contains(&addr(4)),
        "{sent:?}"
    );
    assert!(
        !sent.contains(&addr(3)),
        "a held request went out: {sent:?}"
    );
    // Giving up on the only answer expected there releases what was held (no grant would
    // come for it): the request and the message after it, one packet each.
    client.expect_cancelled(sessions[1], now);
    assert_eq!(destinations(&mut client, now), vec![addr(3), addr(3)]);
}

/// Eight servers answer `requests` requests of 32 KiB each (sent all at once, as a client
/// reading ahead does) through a client's 4-packet budget. Returns the client's
/// `requests_held`; asserts that every answer arrives whole, and that nothing timed out,
/// was retransmitted or probed for window.
fn held_requests_run(requests: usize) -> u64 {
    let FanIn {
        mut sim,
        client,
        servers,
        sessions,
    } = fan_in(11, 8, Some(4));
    let now = sim.now();
    for _ in 0..requests {
        for &session in &sessions {
            sim.endpoint(client)
                .request(session, Bytes::from_static(b"read"), Some(32 << 10), now)
                .unwrap();
        }
    }
    let answer = Bytes::from(vec![9u8; 32 << 10]);
    let mut answers = 0;
    sim.run_until(10_000_000, |sim| {
        for &s in &servers {
            while let Some(event) = sim.endpoint(s).poll_event() {
                if let Event::Message { session, .. } = event {
                    // The request came with a grant that reaches into its answer: the
                    // answer's first packets can go as soon as what was asked before.
                    let info = sim.endpoint_ref(s).session_info(session).unwrap();
                    assert!(
                        info.peer_receive_window > 0,
                        "{s}: a request without a grant"
                    );
                    let now = sim.now();
                    sim.endpoint(s).send(session, answer.clone(), now).unwrap();
                }
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message { message, .. } = event {
                assert_eq!(message.len(), 32 << 10);
                answers += 1;
            }
        }
        answers == servers.len() * requests
    })
    .unwrap_or_else(|error| panic!("{error}"));
    let stats = sim.endpoint_ref(client).stats();
    assert_eq!((stats.timeouts, stats.retransmissions), (0, 0), "{stats:?}");
    for &s in &servers {
        let stats = sim.endpoint_ref(s).stats();
        assert_eq!(
            (stats.timeouts, stats.probes_sent),
            (0, 0),
            "{s}: {stats:?}"
        );
    }
    stats.requests_held
}

#[test]
fn held_requests_go_out_with_their_grant_and_every_answer_arrives() {
    // Every request but the first is held, and each server sees its request only once it
    // may answer it, so it sends its first packets at once rather than waiting for a grant
    // with nothing to do.
    assert_eq!(held_requests_run(1), 7);
}

#[test]
fn a_second_request_waits_until_the_grant_reaches_its_answer() {
    // Reading ahead, two requests per server at once. The first server's second request is
    // held too, although its session holds a grant: that grant is for the first answer, and
    // a server given the second request now would sit on it, probing for window.
    assert_eq!(held_requests_run(2), 15);
}

/// Delivers everything `from` sends at `sent` to `to`, as having arrived at `arrived` but
/// read only at `now`.
fn deliver_late(
    endpoints: &mut [(SocketAddr, Endpoint)],
    (from, to): (usize, usize),
    sent: Micros,
    arrived: Micros,
    now: Micros,
) -> usize {
    let mut transmits = Vec::new();
    while let Some(transmit) = endpoints[from].1.poll_transmit(sent) {
        transmits.push(transmit);
    }
    let sender = endpoints[from].0;
    for transmit in &transmits {
        assert_eq!(transmit.destination, endpoints[to].0);
        endpoints[to]
            .1
            .handle_datagram_arrived(sender, &transmit.contents(), arrived, now);
    }
    transmits.len()
}

/// A client (index 0) and a server (index 1) stepped by hand, each acknowledging every packet
/// at once, with their config and the client's session.
fn client_and_server() -> (Config, Vec<(SocketAddr, Endpoint)>, SessionId) {
    let config = Config {
        ack_every_packets: 1,
        ..Config::default()
    };
    let (client, server) = (addr(1), addr(2));
    let mut endpoints = vec![
        (client, Endpoint::new(config.clone(), 1)),
        (server, Endpoint::new(config.clone(), 2)),
    ];
    let session = endpoints[0].1.connect(server, 0);
    (config, endpoints, session)
}

/// Runs `endpoint`'s timers due before `arrives` (dropping what they send), then hands it
/// `acks` from `from` arriving at `arrives` and runs what is due then (dropped too).
fn acks_arrive_after_timers(
    (_, endpoint): &mut (SocketAddr, Endpoint),
    from: SocketAddr,
    acks: &[Transmit],
    arrives: Micros,
) {
    while let Some(deadline) = endpoint.poll_timeout().filter(|d| *d < arrives) {
        endpoint.handle_timeout(deadline);
        while endpoint.poll_transmit(deadline).is_some() {}
    }
    for ack in acks {
        endpoint.handle_datagram_arrived(from, &ack.contents(), arrives, arrives);
    }
    endpoint.handle_timeout(arrives);
    while endpoint.poll_transmit(arrives).is_some() {}
}

#[test]
fn late_acknowledgements_on_a_short_path_do_not_stretch_the_timers() {
    // Requests one at a time over a 100 µs round trip, but one acknowledgement in four takes
    // 2 to 3 ms to come back (what the client saw in `tessera lab incast` with 65 hosts on
    // two CPUs: the ACK path crosses hosts that were not scheduled). srtt + 4 rttvar
    // follows those samples to several milliseconds; the timers must not, since the smallest
    // recent round trip stays short: a timer that fires during a late ACK is found spurious,
    // and a real loss is still resent within the 1 ms ceiling.
    let (config, mut endpoints, session) = client_and_server();
    let server = endpoints[1].0;
    let ack_delays: [Micros; 8] = [50, 50, 2_500, 50, 50, 50, 3_000, 50];
    let mut now: Micros = 1_000;
    let mut max_rto = 0;
    for round in 0..200u32 {
        endpoints[0]
            .1
            .send(session, Bytes::from(vec![round as u8; 100]), now)
            .unwrap();
        assert!(deliver_late(&mut endpoints, (0, 1), now, now + 50, now + 50) > 0);
        now += 50;
        while endpoints[1].1.poll_event().is_some() {}
        // The ACK leaves now and arrives `arrives`; the client's timer may fire first,
        // and its retransmission is lost (the late original ACK must then show it spurious).
        let mut acks = Vec::new();
        while let Some(transmit) = endpoints[1].1.poll_transmit(now) {
            acks.push(transmit);
        }
        assert!(!acks.is_empty(), "round {round}: the server acknowledges");
        let arrives = now + ack_delays[round as usize % ack_delays.len()];
        acks_arrive_after_timers(&mut endpoints[0], server, &acks, arrives);
        now = arrives;
        max_rto = max_rto.max(endpoints[0].1.session_info(session).unwrap().rto_us);
    }
    let stats = endpoints[0].1.stats();
    println!("rto up to {max_rto} µs, client {stats:?}");
    assert!(
        max_rto > 2 * config.retransmit_timer_max_us,
        "rto {max_rto} µs"
    );
    assert!(stats.timeouts >= 10, "{stats:?}");
    assert!(
        stats.timer_us_max <= config.retransmit_timer_max_us,
        "{stats:?}"
    );
    assert_eq!(stats.long_timeouts, 0, "{stats:?}");
    let late_acks = (0..200)
        .filter(|round| ack_delays[round % ack_delays.len()] > config.retransmit_timer_max_us)
        .count() as u64;
    assert_eq!(
        stats.spurious_timeouts, late_acks,
        "nothing was lost: the run of timeouts during each late ACK was found spurious"
    );
}

/// Requests over a 100 µs round trip, each answered at once by the server, while the client
/// holds its ACK of every answer for `hold_us` (a client busy pushing a sequential write to
/// five servers from one I/O thread reads and acknowledges an answer milliseconds after it
/// arrived; it reports each hold in its ACK). Returns the server's statistics.
fn answers_acknowledged_after_a_hold(hold_us: Micros, rounds: u32) -> Stats {
    let (_, mut endpoints, session) = client_and_server();
    let client = endpoints[0].0;
    let mut now: Micros = 1_000;
    for round in 0..rounds {
        let request = Bytes::from(vec![round as u8; 100]);
        endpoints[0].1.send(session, request, now).unwrap();
        assert!(deliver_late(&mut endpoints, (0, 1), now, now + 50, now + 50) > 0);
        now += 50;
        let mut accepted = None;
        while let Some(event) = endpoints[1].1.poll_event() {
            if let Event::Message { session, .. } = event {
                accepted = Some(session);
            }
        }
        let accepted = accepted.expect("the request is delivered");
        let answer = Bytes::from(vec![round as u8; 64]);
        endpoints[1].1.send(accepted, answer, now).unwrap();
        // The answer arrives 50 µs later; the client acknowledges it `hold_us` after that.
        assert!(deliver_late(&mut endpoints, (1, 0), now, now + 50, now + 50) > 0);
        while endpoints[0].1.poll_event().is_some() {}
        let acked = now + 50 + hold_us;
        let mut acks = Vec::new();
        while let Some(transmit) = endpoints[0].1.poll_transmit(acked) {
            acks.push(transmit);
        }
        // The server's timers run while the ACK is held; what they resend would reach the
        // client as a duplicate and change nothing, so it is dropped.
        let arrives = acked + 50;
        acks_arrive_after_timers(&mut endpoints[1], client, &acks, arrives);
        now = arrives;
        let info = endpoints[1].1.session_info(accepted).unwrap();
        assert_eq!(
            info.messages_acknowledged,
            u64::from(round) + 1,
            "round {round}: the answer is acknowledged"
        );
        now += 100;
    }
    endpoints[1].1.stats()
}

#[test]
fn an_answer_is_not_resent_while_its_client_holds_the_ack_it_reported_holding() {
    // Holds of 2.5 ms, past the 1 ms ceiling of the timers: the server learns them from the
    // ACKs' reported delay after the first rounds, and its timer for an answer (a session's
    // tail: nothing follows it that could show a gap) then waits them out. Before, it fired
    // during every hold, 2-3 times, and resent the answer each time (found spurious).
    let rounds = 100;
    let held = answers_acknowledged_after_a_hold(2_500, rounds);
    println!("held 2.5 ms: server {held:?}");
    assert!(held.timeouts <= 5, "{held:?}");
    assert!(held.retransmissions <= 5, "{held:?}");
    // Acknowledged at once, the same exchange never times out.
    let prompt = answers_acknowledged_after_a_hold(0, rounds);
    assert_eq!(prompt.timeouts, 0, "{prompt:?}");
}

#[test]
fn time_a_packet_waited_to_be_read_is_left_out_of_the_round_trip() {
    // A receiver that was not scheduled reads a packet 5 ms after it arrived, and a sender
    // that was not scheduled reads the acknowledgement 3 ms late; the network's round trip
    // is 200 µs. The samples must measure the 200 µs: counting the hosts' scheduling would
    // make the timeout wait out every stall (and idle the link after a real loss).
    let (_, mut endpoints, session) = client_and_server();
    let mut now: Micros = 1_000;
    for round in 0..10u8 {
        endpoints[0]
            .1
            .send(session, Bytes::from(vec![round; 100]), now)
            .unwrap();
        // Sent at `now`, arrives 100 µs later, read 5 ms after that.
        let sent = deliver_late(&mut endpoints, (0, 1), now, now + 100, now + 5_100);
        assert!(sent > 0, "round {round}: the sender sends");
        now += 5_100;
        while endpoints[1].1.poll_event().is_some() {}
        // The acknowledgement goes out at once, arrives 100 µs later, is read 3 ms late.
        let acks = deliver_late(&mut endpoints, (1, 0), now, now + 100, now + 3_100);
        assert!(acks > 0, "round {round}: the receiver acknowledges");
        now += 3_100;
        endpoints[0].1.handle_timeout(now);
    }
    let info = endpoints[0].1.session_info(session).unwrap();
    println!("{info:?}");
    assert!(
        (150..=250).contains(&info.srtt_us),
        "srtt {} µs against a 200 µs network round trip",
        info.srtt_us
    );
    assert!(info.rto_us < 1_000, "rto {} µs", info.rto_us);
    assert_eq!(endpoints[0].1.stats().timeouts, 0);
}

/// How a client announces the size of an answer it asks for.
#[derive(Debug, Clone, Copy)]
enum Announced {
    /// The true size.
    Exact,
    /// Half of it (the grants run out before the answer ends).
    Half,
    /// Twice it (the grants outrun the answer).
    Double,
    /// No size.
    Unknown,
}

proptest! {
    #![proptest_config(scenario_config(48))]

    #[test]
    fn reading_ahead_under_a_budget_delivers_every_answer_in_order_whatever_was_announced(
        seed in any::<u64>(),
        servers in 1u8..7,
        depth in 1usize..4,
        budget in 2u32..24,
        loss in prop_oneof![Just(0.0f64), 0.0f64..0.08],
        jitter_us in prop_oneof![Just(0u64), 1u64..200],
        announced in prop_oneof![
            Just(Announced::Exact),
            Just(Announced::Half),
            Just(Announced::Double),
            Just(Announced::Unknown)
        ],
    ) {
        // A client keeps `depth` requests in flight on each server's session (its read-ahead);
        // each request names the size of its answer, which the client announces right, short,
        // long or not at all. Held requests and per-answer grants must never strand a request
        // (every answer arrives, in order) nor grant past the budget.
        let requests_per_server = depth + 3;
        let FanIn { mut sim, client, servers: server_addrs, sessions } =
            fan_in(seed, servers, Some(budget));
        sim.set_default_link(LinkConfig { delay_us: 20, jitter_us, loss, duplicate: 0.0 });
        let mut rng = seed;
        // Answer sizes per session, in the order asked; the next to ask and to receive.
        let sizes: Vec<Vec<usize>> = sessions
            .iter()
            .map(|_| {
                (0..requests_per_server)
                    .map(|_| 1 + (splitmix(&mut rng) % (64 << 10)) as usize)
                    .collect()
            })
            .collect();
        let mut asked = vec![0usize; sessions.len()];
        let mut received = vec![0usize; sessions.len()];
        let ask = |sim: &mut Sim, i: usize, asked: &mut Vec<usize>| {
            let size = sizes[i][asked[i]];
            let announce = match announced {
                Announced::Exact => Some(size),
                Announced::Half => Some(size / 2),
                Announced::Double => Some(size * 2),
                Announced::Unknown => None,
            };
            let now = sim.now();
            // The answer's size, and a tag its every byte depends on.
            let tag = (i * 1000 + asked[i]) as u64;
            let mut request = (size as u64).to_le_bytes().to_vec();
            request.extend_from_slice(&tag.to_le_bytes());
            sim.endpoint(client).request(sessions[i], Bytes::from(request), announce, now).unwrap();
            asked[i] += 1;
        };
        for i in 0..sessions.len() {
            for _ in 0..depth {
                ask(&mut sim, i, &mut asked);
            }
        }
        let mut promised_max = 0u64;
        sim.run_until(600_000_000, |sim| {
            for &s in &server_addrs {
                while let Some(event) = sim.endpoint(s).poll_event() {
                    if let Event::Message { session, message, .. } = event {
                        let size = u64::from_le_bytes(message[..8].try_into().unwrap()) as usize;
                        let tag = u64::from_le_bytes(message[8..16].try_into().unwrap());
                        let now = sim.now();
                        let answer = self::message(tag, 0, size);
                        sim.endpoint(s).send(session, answer, now).unwrap();
                    }
                }
            }
            let promised: u64 = sessions
                .iter()
                .filter_map(|&id| sim.endpoint_ref(client).session_info(id))
                .map(|info| info.receive_window as u64)
                .sum();
            promised_max = promised_max.max(promised);
            while let Some(event) = sim.endpoint(client).poll_event() {
                if let Event::Message { session, message, .. } = event {
                    let i = sessions.iter().position(|&s| s == session).unwrap();
                    let size = sizes[i][received[i]];
                    let tag = (i * 1000 + received[i]) as u64;
                    assert!(
                        message == self::message(tag, 0, size),
                        "seed {seed}: answer {} of server {i} is not the one asked for",
                        received[i]
                    );
                    received[i] += 1;
                    if asked[i] < requests_per_server {
                        ask(sim, i, &mut asked);
                    }
                }
            }
            received.iter().all(|&r| r == requests_per_server)
        })
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        prop_assert!(promised_max <= budget as u64, "seed {seed}: {promised_max} promised");
        for host in sim.addrs() {
            let stats = sim.endpoint_ref(host).stats();
            // In virtual time every timer runs when it is due: none later than its length
            // (the RTO and the wait for the peer's ACK holds).
            prop_assert!(
                stats.timeout_us_max <= stats.timer_us_max + stats.ack_hold_wait_us_max,
                "seed {seed}: {host} {stats:?}"
            );
        }
        let stats = sim.endpoint_ref(client).stats();
        prop_assert_eq!(stats.messages_delivered as usize, sessions.len() * requests_per_server);
    }
}

/// Bytes of whole answers each of two servers delivered to a client with a 20-packet receive
/// budget behind a 200 Mbit/s port (the lab's), over `duration_us`, when the client reads
/// 16 KiB answers from both as fast as it may, its session to the first reserved at
/// `reserved_bytes_per_s` (the second best effort).
fn reserved_and_best_effort_reads(reserved_bytes_per_s: u64, duration_us: Micros) -> [usize; 2] {
    let FanIn {
        mut sim,
        client,
        servers,
        sessions,
    } = fan_in(5, 2, Some(20));
    sim.set_bottleneck(
        client,
        BottleneckConfig {
            rate_bits_per_s: 200_000_000,
            buffer_bytes: 193_792,
        },
    );
    let now = sim.now();
    let reservation = tessera_datagram::Reservation {
        rate_bytes_per_s: reserved_bytes_per_s,
        period_us: 1_000_000,
    };
    sim.endpoint(client)
        .reserve(sessions[0], Some(reservation), now)
        .unwrap();
    // More requests than either server can answer in the run.
    for _ in 0..400 {
        for &session in &sessions {
            sim.endpoint(client)
                .request(session, Bytes::from_static(b"read"), Some(16 << 10), now)
                .unwrap();
        }
    }
    let answer = Bytes::from(vec![7u8; 16 << 10]);
    let mut received = [0usize; 2];
    let end = now + duration_us;
    sim.run_until(end + 100_000, |sim| {
        for &s in &servers {
            while let Some(event) = sim.endpoint(s).poll_event() {
                if let Event::Message { session, .. } = event {
                    let now = sim.now();
                    sim.endpoint(s).send(session, answer.clone(), now).unwrap();
                }
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message {
                session, message, ..
            } = event
            {
                let i = sessions.iter().position(|&s| s == session).unwrap();
                received[i] += message.len();
            }
        }
        sim.now() >= end
    })
    .unwrap_or_else(|error| panic!("{error}"));
    received
}

#[test]
fn a_reserved_read_is_answered_at_its_rate_and_best_effort_takes_the_rest() {
    // A tenth of the port reserved: its server answers at that rate (its grants' pace, a
    // sixteenth more), not at half the port as an equal share of the budget would (4.7
    // times its rate before grants were paced); the best effort session takes the rest, as
    // much of it as it takes of the whole port beside a reservation of almost nothing
    // (0.66 here: two sessions split the 20-packet budget, answers wait for their grants).
    let (rate, duration_us) = (2_500_000u64, 400_000);
    let [reserved, best_effort] = reserved_and_best_effort_reads(rate, duration_us);
    let [_, alone] = reserved_and_best_effort_reads(20_000, duration_us);
    let fraction = reserved as f64 / (rate as f64 * duration_us as f64 / 1e6);
    let port = 200e6 / 8.0 * duration_us as f64 / 1e6;
    let rest = best_effort as f64 / (port - reserved as f64);
    let alone = alone as f64 / port;
    eprintln!(
        "reserved {fraction:.3} of its rate, best effort {rest:.3} of the rest, {alone:.3} alone"
    );
    assert!(
        (0.97..=1.12).contains(&fraction),
        "reserved got {fraction:.3} of its rate"
    );
    assert!(
        rest >= 0.95 * alone,
        "best effort got {rest:.3} of the rest, {alone:.3} alone"
    );
}

/// How late the readers' host of `lab radon --mirror` woke on a busy machine (session 12's
/// full run: wake-ups over 1 ms late 42% of the time): up to 2 ms every time, and 2% of the
/// time stalled by up to 10 ms more.
const BUSY_READER_LATENESS: tessera_datagram::sim::Lateness = tessera_datagram::sim::Lateness {
    late_us_max: 500,
    stall: 0.01,
    stall_us_max: 5_000,
};

/// Each reserved period of a read on a late host: (periods, deadlines met, the worst period's
/// lateness µs, fraction of the reserved rate received).
struct PeriodicRead {
    periods: u64,
    met: u64,
    worst_late_us: Micros,
    fraction: f64,
}

/// A client with a 20-packet receive budget behind a 200 Mbit/s port (the lab's) reads from
/// two servers: from the first a reserved stream at `rate_bytes_per_s` over 100 ms periods,
/// each period's bytes asked for in 64 KiB answers at the period's start (the CLI's
/// `--rate` ledger); from the second best effort, as fast as it may. The client's host wakes
/// as late as `lateness`. Whether each period's answers all arrived by its end.
fn periodic_reserved_read(
    rate_bytes_per_s: u64,
    lateness: tessera_datagram::sim::Lateness,
    periods: u64,
    seed: u64,
) -> PeriodicRead {
    const PERIOD_US: Micros = 100_000;
    const ANSWER_BYTES: u64 = 64 << 10;
    let FanIn {
        mut sim,
        client,
        servers,
        sessions,
    } = fan_in(seed, 2, Some(20));
    sim.set_bottleneck(
        client,
        BottleneckConfig {
            rate_bits_per_s: 200_000_000,
            buffer_bytes: 193_792,
        },
    );
    sim.set_lateness(client, Some(lateness));
    let start = sim.now() + 10_000;
    let reservation = tessera_datagram::Reservation {
        rate_bytes_per_s,
        period_us: PERIOD_US,
    };
    let now = sim.now();
    sim.endpoint(client)
        .reserve(sessions[0], Some(reservation), now)
        .unwrap();
    for _ in 0..2_000 {
        sim.endpoint(client)
            .request(
                sessions[1],
                Bytes::from_static(b"read"),
                Some(16 << 10),
                now,
            )
            .unwrap();
    }
    let budget = rate_bytes_per_s * PERIOD_US / 1_000_000;
    for period in 0..periods {
        sim.wake_at(start + period * PERIOD_US);
    }
    let (mut released, mut received, mut counted) = (0u64, 0u64, 0u64);
    let mut started = false;
    let mut result = PeriodicRead {
        periods: 0,
        met: 0,
        worst_late_us: 0,
        fraction: 0.0,
    };
    let answer = |len: u64| Bytes::from(vec![7u8; len as usize]);
    let end = start + (periods + 1) * PERIOD_US;
    let _ = sim.run_until(end, |sim| {
        let now = sim.now();
        if !started && now >= start {
            started = true;
            sim.endpoint(client).start_periods(start, now);
        }
        let due = if now >= start {
            ((now - start) / PERIOD_US + 1).min(periods)
        } else {
            0
        };
        while released < due * budget {
            let len = ANSWER_BYTES.min(due * budget - released);
            let request = Bytes::from(len.to_le_bytes().to_vec());
            sim.endpoint(client)
                .request(sessions[0], request, Some(len as usize), now)
                .unwrap();
            released += len;
            sim.notify(client);
        }
        for &s in &servers {
            while let Some(event) = sim.endpoint(s).poll_event() {
                if let Event::Message {
                    session, message, ..
                } = event
                {
                    let len = match <[u8; 8]>::try_from(&message[..]) {
                        Ok(bytes) => u64::from_le_bytes(bytes),
                        Err(_) => 16 << 10,
                    };
                    sim.endpoint(s).send(session, answer(len), now).unwrap();
                }
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message {
                session, message, ..
            } = event
            {
                if session != sessions[0] {
                    continue;
                }
                received += message.len() as u64;
                while counted < periods && received >= (counted + 1) * budget {
                    let deadline = start + (counted + 1) * PERIOD_US;
                    result.periods += 1;
                    if now <= deadline {
                        result.met += 1;
                    } else {
                        result.worst_late_us = result.worst_late_us.max(now - deadline);
                    }
                    counted += 1;
                }
            }
        }
        counted == periods
    });
    result.fraction = received as f64 / (periods * budget) as f64;
    result
}

/// A reserved read on a host that wakes late (the busy lab's readers' host) gets each
/// period's answers by the period's end, give or take the host's own lateness, beside a
/// best-effort read of the same client: its grants are sized by what the period's
/// outstanding answers need by the period's end (Radon's percent budget on the receiving
/// side), and are served from the whole receive budget ahead of best effort. (Paced only
/// at its rate by a sixteenth more, from an equal share of the budget: 2 of 10 periods met
/// at 11.8 and 6 MB/s, the worst 18.5 and 19.8 ms late, later each period as the host's
/// late wake-ups cost it credit it never caught up.)
#[test]
fn a_reserved_read_on_a_late_host_gets_each_period_by_its_end() {
    let periods = 10;
    // Half the port's payload (`lab radon`'s unfair stream 1), and a quarter.
    for rate in [11_800_000, 6_000_000] {
        for seed in [11, 12] {
            let run = periodic_reserved_read(rate, BUSY_READER_LATENESS, periods, seed);
            eprintln!(
                "{rate} B/s, seed {seed}: {} of {} deadlines met, worst {} µs late, {:.3} of the rate",
                run.met, run.periods, run.worst_late_us, run.fraction
            );
            assert_eq!(
                run.periods, periods,
                "{rate} B/s, seed {seed}: periods missing"
            );
            // The reader itself wakes up to 0.5 ms late, and 1% of the time up to 5 ms more.
            assert!(
                run.worst_late_us <= 3_000,
                "{rate} B/s, seed {seed}: a period {} µs late",
                run.worst_late_us
            );
        }
    }
}

/// A message whose fragments the caller hashed (`Message::hash_fragments`, as the UDP
/// client's calling tasks do) arrives whole and authentic on a keyed session; so does one
/// hashed under a stale key or cut at another fragment size, whose hashes the endpoint
/// leaves unused: no datagram of any of them fails the server's MAC check.
#[test]
fn messages_with_caller_made_payload_hashes_arrive_authentic() {
    let (client, server) = (addr(1), addr(2));
    let mut sim = Sim::new(21);
    let key = tessera_auth::Key([3; 32]);
    let session = SessionId(0xBEEF);
    connect_keyed_pair(&mut sim, (client, server), session, key);
    let (mac, fragment_bytes) = sim.endpoint_ref(client).sender_of(session).unwrap();
    let stale = tessera_auth::PacketMac::new(&tessera_auth::Key([4; 32]));
    let guesses = [
        (&mac, fragment_bytes),
        (&stale, fragment_bytes),
        (&mac, 1_000),
    ];
    let mut sent = Vec::new();
    for (i, (mac, fragment_bytes)) in guesses.into_iter().enumerate() {
        let head = Bytes::from(vec![i as u8; 60]);
        let body = Bytes::from((0..50_000u32).map(|b| (b % 251) as u8).collect::<Vec<_>>());
        let mut message = tessera_datagram::Message::new(head, body);
        message.hash_fragments(mac, fragment_bytes);
        sent.push(message.to_bytes());
        let now = sim.now();
        sim.endpoint(client).send(session, message, now).unwrap();
    }
    let mut received = Vec::new();
    sim.run_until(sim.now() + 10_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { message, .. } = event {
                received.push(message);
            }
        }
        received.len() == sent.len()
    })
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(received, sent);
    assert_eq!(sim.endpoint_ref(server).stats().dropped_unauthentic, 0);
}

/// Virtual time for a client with a receive budget of 20 packets, whose own path carries
/// `client_payload` bytes per datagram, to read eight 1 MiB answers one after another from a
/// server that sends 1,472-byte datagrams.
fn budgeted_reads_us(client_payload: usize) -> Micros {
    let mut sim = Sim::new(77);
    let (client, server) = (addr(1), addr(2));
    sim.add_endpoint(
        client,
        Config {
            receive_budget_packets: Some(20),
            ..Config::default()
        },
    );
    sim.add_endpoint(server, Config::default());
    let session = sim.endpoint(client).connect_with(server, client_payload, 0);
    let answer_bytes = 1 << 20;
    let answer = Bytes::from(vec![3u8; answer_bytes]);
    let ask = |sim: &mut Sim| {
        let now = sim.now();
        (sim.endpoint(client))
            .request(
                session,
                Bytes::from_static(b"read"),
                Some(answer_bytes),
                now,
            )
            .unwrap();
    };
    ask(&mut sim);
    let mut answers = 0;
    sim.run_until(60_000_000, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            match event {
                Event::Opened { session, .. } => {
                    sim.endpoint(server).set_payload_bytes(session, 1_472)
                }
                Event::Message { session, .. } => {
                    let now = sim.now();
                    (sim.endpoint(server))
                        .send(session, answer.clone(), now)
                        .unwrap();
                }
                Event::Lost { .. } => panic!("session lost"),
            }
        }
        while let Some(event) = sim.endpoint(client).poll_event() {
            if let Event::Message { message, .. } = event {
                assert_eq!(message.len(), answer_bytes);
                answers += 1;
                if answers < 8 {
                    ask(sim);
                }
            }
        }
        answers == 8
    })
    .unwrap_or_else(|error| panic!("{error}"))
}

/// A client whose path carries larger datagrams than its server's answers (its own 64 KiB
/// against 1,472 bytes) learns the server's size from the first full-size fragment and
/// counts the answers it expects again: it reads as fast as a client that assumed the right
/// size from the start. Before, the size it kept was the largest seen, its own; each 1 MiB
/// answer was expected as 17 packets where it took 713, and the rest was granted a little
/// at a time.
#[test]
fn a_client_learns_a_smaller_peer_datagram_size_and_counts_its_answers_again() {
    let same = budgeted_reads_us(1_472);
    let larger = budgeted_reads_us(65_000);
    eprintln!("eight 1 MiB reads: {larger} us with the client at 64 KiB, {same} us at 1,472");
    assert!(
        larger * 10 <= same * 12,
        "client at 64 KiB: {larger} us against {same} us at the server's size"
    );
}
