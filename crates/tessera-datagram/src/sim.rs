//! A deterministic network simulator for [`Endpoint`]s, usable by any crate's tests.
//!
//! Several endpoints, each at a `127.0.0.x` address, exchange datagrams over a seeded network
//! in virtual time. Each directed link has a one-way delay, jitter (uniform extra delay, which
//! reorders), a loss probability and a duplication probability. A destination host may sit
//! behind a bottleneck: a switch port that serializes datagrams at a fixed rate into a buffer of
//! fixed size and drops at the tail when it is full; endpoints at one IP address with
//! different ports (processes of one host) share it. [`Sim::run_until`] jumps virtual time from
//! one event to the next (a datagram reaching a port or an endpoint, an endpoint's timer, a
//! wake-up the test asked for) and calls the test's closure, which plays the applications,
//! after every step.
//!
//! A host may run late ([`Sim::set_lateness`]): like a driver thread on a busy machine, it
//! acts only when it wakes, some time after its timer or a datagram called it, and then
//! reads every datagram that came meanwhile (with its arrival time, as the kernel stamps it),
//! runs its timers and sends what it may.
//!
//! Everything is drawn from the seed given to [`Sim::new`]: the same seed replays the same
//! run. If a test panics while a `Sim` is alive, the seed is printed.
//!
//! ```
//! use bytes::Bytes;
//! use tessera_datagram::sim::{addr, LinkConfig, Sim};
//! use tessera_datagram::{Config, Event};
//!
//! let mut sim = Sim::new(7);
//! sim.set_default_link(LinkConfig { delay_us: 100, jitter_us: 50, loss: 0.1, duplicate: 0.05 });
//! let (client, server) = (addr(1), addr(2));
//! sim.add_endpoint(client, Config::default());
//! sim.add_endpoint(server, Config::default());
//! let session = sim.endpoint(client).connect(server, 0);
//! sim.endpoint(client).send(session, Bytes::from(vec![1u8; 100_000]), 0).unwrap();
//! let mut delivered = 0;
//! sim.run_until(10_000_000, |sim| {
//!     while let Some(event) = sim.endpoint(server).poll_event() {
//!         if let Event::Message { message, .. } = event {
//!             delivered += message.len();
//!         }
//!     }
//!     delivered == 100_000
//! })
//! .unwrap();
//! ```

use crate::{Config, Endpoint, Micros};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Bytes of IPv4 and UDP headers, charged for every datagram at a bottleneck.
pub const DATAGRAM_OVERHEAD_BYTES: usize = 28;
/// Steps without virtual time advancing after which the run is declared a livelock.
pub const STEPS_AT_ONE_TIME_MAX: u64 = 1_000_000;

/// The address of simulated host `host`: `127.0.0.host:7000`.
pub fn addr(host: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 7000)
}

/// One direction of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Fixed one-way delay.
    pub delay_us: Micros,
    /// Extra delay drawn uniformly from `0..=jitter_us` per datagram; reorders datagrams.
    pub jitter_us: Micros,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice (each copy with its own delay).
    pub duplicate: f64,
}

impl Default for LinkConfig {
    /// A clean LAN link: 50 µs one way.
    fn default() -> LinkConfig {
        LinkConfig {
            delay_us: 50,
            jitter_us: 0,
            loss: 0.0,
            duplicate: 0.0,
        }
    }
}

/// A switch port in front of a destination: serializes at `rate_bits_per_s` from a buffer of
/// `buffer_bytes`, dropping arrivals that do not fit (tail drop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BottleneckConfig {
    /// The port's line rate.
    pub rate_bits_per_s: u64,
    /// The port's buffer.
    pub buffer_bytes: usize,
}

/// What the network did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Datagrams endpoints sent.
    pub datagrams_sent: u64,
    /// Datagrams handed to endpoints (injected ones included).
    pub delivered: u64,
    /// Bytes of the datagrams handed to endpoints.
    pub bytes_delivered: u64,
    /// Datagrams lost at random.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams dropped at a full bottleneck buffer.
    pub queue_drops: u64,
    /// The same, by the address that sent them.
    pub queue_drops_from: std::collections::BTreeMap<SocketAddr, u64>,
    /// Datagrams for an address with no endpoint, or one that is down.
    pub unroutable: u64,
    /// Datagrams the test's filter dropped.
    pub filtered: u64,
    /// Datagrams the test injected.
    pub injected: u64,
}

/// Why a run stopped before its condition held. Each carries the seed that replays it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Virtual time reached the deadline.
    #[error("deadline of {deadline} µs reached before the condition held (seed {seed})")]
    Deadline {
        /// The seed of the run.
        seed: u64,
        /// The deadline.
        deadline: Micros,
    },
    /// Nothing is left to happen: no datagram in flight, no timer, no wake-up.
    #[error("network idle at {now} µs before the condition held (seed {seed})")]
    Idle {
        /// The seed of the run.
        seed: u64,
        /// Virtual time when it went idle.
        now: Micros,
    },
    /// Too many steps without virtual time advancing.
    #[error(
        "livelock at {now} µs: {STEPS_AT_ONE_TIME_MAX} steps without time advancing (seed {seed})"
    )]
    Livelock {
        /// The seed of the run.
        seed: u64,
        /// Virtual time it got stuck at.
        now: Micros,
    },
}

/// Which point of a datagram's life a trace event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// An endpoint sent it (before any loss).
    Sent,
    /// It reached an endpoint.
    Delivered,
}

/// One datagram as the tracer sees it.
#[derive(Clone, Copy, Debug)]
pub struct TraceEvent<'a> {
    /// Virtual time.
    pub now: Micros,
    /// Sent or delivered.
    pub kind: TraceKind,
    /// The sender.
    pub from: SocketAddr,
    /// The destination.
    pub to: SocketAddr,
    /// The datagram.
    pub contents: &'a [u8],
}

/// Decides whether a sent datagram enters the network: `(now, from, to, contents) -> keep`.
pub type Filter = Box<dyn FnMut(Micros, SocketAddr, SocketAddr, &[u8]) -> bool>;
/// Sees every datagram sent and delivered.
pub type Tracer = Box<dyn FnMut(&TraceEvent<'_>)>;

#[derive(Debug)]
enum Stage {
    /// Reaches the destination's bottleneck port.
    Port,
    /// Reaches the destination endpoint.
    Endpoint,
}

#[derive(Debug)]
struct InTransit {
    from: SocketAddr,
    to: SocketAddr,
    contents: Vec<u8>,
    stage: Stage,
}

#[derive(Debug)]
struct Port {
    config: BottleneckConfig,
    /// When the port finishes serializing everything accepted so far, in nanoseconds.
    busy_until_ns: u128,
}

#[derive(Debug)]
struct Host {
    addr: SocketAddr,
    config: Config,
    endpoint: Endpoint,
    up: bool,
    incarnation: u64,
    /// How late the host wakes; `None`: at once.
    lateness: Option<Lateness>,
    /// Datagrams that reached a late host while it slept, with their arrival times.
    inbox: Vec<(Micros, InTransit)>,
    /// When a late host, called, wakes next.
    wake_at: Option<Micros>,
    /// Whether a late host is awake in the current step (it sends only then).
    awake: bool,
}

/// How late a host wakes each time something calls it (a timer, a datagram, the
/// application): uniformly `0..=late_us_max`, and with probability `stall` longer, by up to
/// `stall_us_max` more (a host that was not scheduled for a while).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lateness {
    /// The most a wake-up is late in the common case, µs.
    pub late_us_max: Micros,
    /// The chance that a wake-up stalls.
    pub stall: f64,
    /// The most a stall adds, µs.
    pub stall_us_max: Micros,
}

/// The simulated network and its endpoints.
pub struct Sim {
    seed: u64,
    now: Micros,
    rng: StdRng,
    hosts: Vec<Host>,
    index: BTreeMap<SocketAddr, usize>,
    default_link: LinkConfig,
    links: BTreeMap<(SocketAddr, SocketAddr), LinkConfig>,
    /// By the host (IP address) they are in front of: endpoints at one address with
    /// different ports (processes on one host) share it.
    ports: BTreeMap<IpAddr, Port>,
    /// Datagrams in flight, by arrival time, then by the order they were scheduled in.
    queue: BTreeMap<(Micros, u64), InTransit>,
    scheduled: u64,
    wakeups: BTreeSet<Micros>,
    stats: NetworkStats,
    filter: Option<Filter>,
    tracer: Option<Tracer>,
}

/// SplitMix64: spreads the simulation seed over the endpoints' seeds.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Sim {
    /// An empty network at virtual time 0, with clean default links.
    pub fn new(seed: u64) -> Sim {
        Sim {
            seed,
            now: 0,
            rng: StdRng::seed_from_u64(mix(seed)),
            hosts: Vec::new(),
            index: BTreeMap::new(),
            default_link: LinkConfig::default(),
            links: BTreeMap::new(),
            ports: BTreeMap::new(),
            queue: BTreeMap::new(),
            scheduled: 0,
            wakeups: BTreeSet::new(),
            stats: NetworkStats::default(),
            filter: None,
            tracer: None,
        }
    }

    /// The seed that replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time, µs.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// What the network did so far.
    pub fn stats(&self) -> &NetworkStats {
        &self.stats
    }

    fn endpoint_seed(&self, host: usize, incarnation: u64) -> u64 {
        mix(self.seed ^ mix(host as u64 + 1) ^ mix(incarnation.wrapping_mul(0x1000_0001)))
    }

    /// Adds an endpoint at `addr`, which must be a `127.0.0.x` address not yet taken.
    pub fn add_endpoint(&mut self, addr: SocketAddr, config: Config) {
        let loopback = matches!(addr.ip(), IpAddr::V4(ip) if ip.octets()[..3] == [127, 0, 0]);
        assert!(loopback, "simulated hosts live at 127.0.0.x, not {addr}");
        assert!(!self.index.contains_key(&addr), "{addr} is taken");
        let host = self.hosts.len();
        let endpoint = Endpoint::new(config.clone(), self.endpoint_seed(host, 0));
        self.index.insert(addr, host);
        self.hosts.push(Host {
            addr,
            config,
            endpoint,
            up: true,
            incarnation: 0,
            lateness: None,
            inbox: Vec::new(),
            wake_at: None,
            awake: false,
        });
    }

    fn host(&self, addr: SocketAddr) -> usize {
        *self
            .index
            .get(&addr)
            .unwrap_or_else(|| panic!("no simulated host at {addr}"))
    }

    /// The endpoint at `addr`.
    pub fn endpoint(&mut self, addr: SocketAddr) -> &mut Endpoint {
        let host = self.host(addr);
        &mut self.hosts[host].endpoint
    }

    /// The endpoint at `addr`, read-only.
    pub fn endpoint_ref(&self, addr: SocketAddr) -> &Endpoint {
        &self.hosts[self.host(addr)].endpoint
    }

    /// The addresses of all hosts, in the order they were added.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.hosts.iter().map(|host| host.addr).collect()
    }

    /// Takes a host off the network (`false`: it receives nothing, sends nothing and its
    /// timers stand still) or puts it back.
    pub fn set_up(&mut self, addr: SocketAddr, up: bool) {
        let host = self.host(addr);
        self.hosts[host].up = up;
    }

    /// Replaces the endpoint at `addr` with a fresh one (same config, new seed): the process
    /// restarted and forgot every session.
    pub fn restart_endpoint(&mut self, addr: SocketAddr) {
        let host = self.host(addr);
        let incarnation = self.hosts[host].incarnation + 1;
        let seed = self.endpoint_seed(host, incarnation);
        let entry = &mut self.hosts[host];
        entry.incarnation = incarnation;
        entry.endpoint = Endpoint::new(entry.config.clone(), seed);
        entry.up = true;
    }

    fn check_link(link: &LinkConfig) {
        assert!(
            (0.0..=1.0).contains(&link.loss),
            "loss {} is no probability",
            link.loss
        );
        assert!(
            (0.0..=1.0).contains(&link.duplicate),
            "duplicate {} is no probability",
            link.duplicate
        );
    }

    /// The link used between hosts that have no link of their own.
    pub fn set_default_link(&mut self, link: LinkConfig) {
        Self::check_link(&link);
        self.default_link = link;
    }

    /// The link from `from` to `to` (one direction).
    pub fn set_link(&mut self, from: SocketAddr, to: SocketAddr, link: LinkConfig) {
        Self::check_link(&link);
        self.links.insert((from, to), link);
    }

    /// The same link in both directions between `a` and `b`.
    pub fn set_links_between(&mut self, a: SocketAddr, b: SocketAddr, link: LinkConfig) {
        self.set_link(a, b, link);
        self.set_link(b, a, link);
    }

    /// Puts a bottleneck port in front of `to`'s host: every datagram to it, or to any
    /// endpoint at its IP address, from anyone, queues there after its link delay.
    pub fn set_bottleneck(&mut self, to: SocketAddr, config: BottleneckConfig) {
        assert!(config.rate_bits_per_s > 0);
        self.ports.insert(
            to.ip(),
            Port {
                config,
                busy_until_ns: 0,
            },
        );
    }

    /// The queue of the bottleneck port in front of `to` now, µs of its rate (`None`: no
    /// port there).
    pub fn port_queue_us(&self, to: SocketAddr) -> Option<Micros> {
        let port = self.ports.get(&to.ip())?;
        let now_ns = u128::from(self.now) * 1_000;
        Some((port.busy_until_ns.saturating_sub(now_ns) / 1_000) as Micros)
    }

    /// Drops the datagrams for which `filter` returns false (after tracing, before loss).
    pub fn set_filter(
        &mut self,
        filter: impl FnMut(Micros, SocketAddr, SocketAddr, &[u8]) -> bool + 'static,
    ) {
        self.filter = Some(Box::new(filter));
    }

    /// Removes the filter.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Shows every datagram sent and delivered to `tracer`.
    pub fn set_tracer(&mut self, tracer: impl FnMut(&TraceEvent<'_>) + 'static) {
        self.tracer = Some(Box::new(tracer));
    }

    /// Sends raw bytes from `from` (which need not be a host) to `to`, after the link's delay
    /// and bypassing loss, duplication and the filter.
    pub fn inject(&mut self, from: SocketAddr, to: SocketAddr, contents: Vec<u8>) {
        self.stats.injected += 1;
        let link = self.link(from, to);
        let at = self.now + link.delay_us;
        self.schedule(at, from, to, contents);
    }

    /// Makes the host at `addr` wake late ([`Lateness`]; `None`: at once, the default).
    pub fn set_lateness(&mut self, addr: SocketAddr, lateness: Option<Lateness>) {
        let host = self.host(addr);
        self.hosts[host].lateness = lateness;
    }

    /// The application gave the host at `addr` something to do (a message to send): a late
    /// host wakes for it, late; any other sends it at once.
    pub fn notify(&mut self, addr: SocketAddr) {
        let host = self.host(addr);
        self.call(host);
    }

    /// Something calls a late host: it wakes after its lateness, unless already called.
    fn call(&mut self, host: usize) {
        let Some(lateness) = self.hosts[host].lateness else {
            return;
        };
        if self.hosts[host].wake_at.is_some() {
            return;
        }
        let mut late = self.rng.gen_range(0..=lateness.late_us_max);
        if lateness.stall > 0.0 && self.rng.gen_bool(lateness.stall) {
            late += self.rng.gen_range(0..=lateness.stall_us_max);
        }
        self.hosts[host].wake_at = Some(self.now + late);
    }

    /// Makes `run_until` step at `at` even if nothing else happens then, so that the
    /// closure runs (an application that acts later, like one slow to drain its events).
    pub fn wake_at(&mut self, at: Micros) {
        if at > self.now {
            self.wakeups.insert(at);
        }
    }

    fn link(&self, from: SocketAddr, to: SocketAddr) -> LinkConfig {
        *self.links.get(&(from, to)).unwrap_or(&self.default_link)
    }

    fn schedule(&mut self, at: Micros, from: SocketAddr, to: SocketAddr, contents: Vec<u8>) {
        let stage = if self.ports.contains_key(&to.ip()) {
            Stage::Port
        } else {
            Stage::Endpoint
        };
        self.scheduled += 1;
        self.queue.insert(
            (at, self.scheduled),
            InTransit {
                from,
                to,
                contents,
                stage,
            },
        );
    }

    fn route(&mut self, from: SocketAddr, to: SocketAddr, contents: Vec<u8>) {
        let now = self.now;
        self.stats.datagrams_sent += 1;
        if let Some(tracer) = self.tracer.as_mut() {
            tracer(&TraceEvent {
                now,
                kind: TraceKind::Sent,
                from,
                to,
                contents: &contents,
            });
        }
        if let Some(filter) = self.filter.as_mut() {
            if !filter(now, from, to, &contents) {
                self.stats.filtered += 1;
                return;
            }
        }
        let link = self.link(from, to);
        if link.loss > 0.0 && self.rng.gen_bool(link.loss) {
            self.stats.lost += 1;
            return;
        }
        if link.duplicate > 0.0 && self.rng.gen_bool(link.duplicate) {
            self.stats.duplicated += 1;
            let at = now + link.delay_us + self.jitter(&link);
            self.schedule(at, from, to, contents.clone());
        }
        let at = now + link.delay_us + self.jitter(&link);
        self.schedule(at, from, to, contents);
    }

    fn jitter(&mut self, link: &LinkConfig) -> Micros {
        if link.jitter_us > 0 {
            self.rng.gen_range(0..=link.jitter_us)
        } else {
            0
        }
    }

    /// Sends everything every live endpoint has to send.
    fn flush(&mut self) {
        let now = self.now;
        for host in 0..self.hosts.len() {
            if !self.hosts[host].up {
                continue;
            }
            if self.hosts[host].lateness.is_some() && !self.hosts[host].awake {
                continue;
            }
            let from = self.hosts[host].addr;
            while let Some(transmit) = self.hosts[host].endpoint.poll_transmit(now) {
                self.route(from, transmit.destination, transmit.contents());
            }
        }
    }

    fn next_time(&self) -> Option<Micros> {
        let datagram = self.queue.keys().next().map(|&(at, _)| at);
        // A late host's timer calls it; it acts when it wakes.
        let timer = self
            .hosts
            .iter()
            .filter(|host| host.up)
            .filter_map(|host| match host.wake_at {
                Some(wake_at) => Some(wake_at),
                None => host.endpoint.poll_timeout(),
            })
            .min();
        let wakeup = self.wakeups.first().copied();
        [datagram, timer, wakeup].into_iter().flatten().min()
    }

    fn on_port(&mut self, datagram: InTransit) {
        let now_ns = self.now as u128 * 1_000;
        let port = self
            .ports
            .get_mut(&datagram.to.ip())
            .expect("scheduled for a port");
        let rate = port.config.rate_bits_per_s as u128;
        let wire_bytes = (datagram.contents.len() + DATAGRAM_OVERHEAD_BYTES) as u128;
        let backlog_ns = port.busy_until_ns.saturating_sub(now_ns);
        let backlog_bytes = backlog_ns * rate / 8 / 1_000_000_000;
        if backlog_bytes + wire_bytes > port.config.buffer_bytes as u128 {
            self.stats.queue_drops += 1;
            *self
                .stats
                .queue_drops_from
                .entry(datagram.from)
                .or_default() += 1;
            return;
        }
        let start_ns = port.busy_until_ns.max(now_ns);
        let serialization_ns = (wire_bytes * 8 * 1_000_000_000).div_ceil(rate);
        port.busy_until_ns = start_ns + serialization_ns;
        let at = port.busy_until_ns.div_ceil(1_000) as Micros;
        self.scheduled += 1;
        self.queue.insert(
            (at, self.scheduled),
            InTransit {
                stage: Stage::Endpoint,
                ..datagram
            },
        );
    }

    fn deliver(&mut self, datagram: InTransit) {
        let now = self.now;
        let Some(&host) = self.index.get(&datagram.to) else {
            self.stats.unroutable += 1;
            return;
        };
        if !self.hosts[host].up {
            self.stats.unroutable += 1;
            return;
        }
        if self.hosts[host].lateness.is_some() {
            self.hosts[host].inbox.push((now, datagram));
            self.call(host);
            return;
        }
        self.receive(host, datagram, now);
    }

    /// The host reads a datagram that arrived at `arrived`.
    fn receive(&mut self, host: usize, datagram: InTransit, arrived: Micros) {
        let now = self.now;
        if let Some(tracer) = self.tracer.as_mut() {
            tracer(&TraceEvent {
                now,
                kind: TraceKind::Delivered,
                from: datagram.from,
                to: datagram.to,
                contents: &datagram.contents,
            });
        }
        self.stats.delivered += 1;
        self.stats.bytes_delivered += datagram.contents.len() as u64;
        self.hosts[host].endpoint.handle_datagram_bytes(
            datagram.from,
            Bytes::from(datagram.contents),
            arrived,
            now,
        );
    }

    /// Handles everything due at the current virtual time.
    fn step(&mut self) {
        let now = self.now;
        for host in &mut self.hosts {
            host.awake = false;
        }
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let datagram = entry.remove();
            match datagram.stage {
                Stage::Port => self.on_port(datagram),
                Stage::Endpoint => self.deliver(datagram),
            }
        }
        for host in 0..self.hosts.len() {
            if self.hosts[host].lateness.is_some() {
                self.step_late_host(host);
                continue;
            }
            let host = &mut self.hosts[host];
            if host.up && host.endpoint.poll_timeout().is_some_and(|at| at <= now) {
                host.endpoint.handle_timeout(now);
            }
        }
        while self.wakeups.first().is_some_and(|&at| at <= now) {
            self.wakeups.pop_first();
        }
    }

    /// A late host: its due timer calls it; once awake it reads what came and runs its timers.
    fn step_late_host(&mut self, host: usize) {
        let now = self.now;
        if !self.hosts[host].up {
            self.hosts[host].wake_at = None;
            self.hosts[host].inbox.clear();
            return;
        }
        if self.hosts[host]
            .endpoint
            .poll_timeout()
            .is_some_and(|at| at <= now)
        {
            self.call(host);
        }
        if self.hosts[host].wake_at.is_none_or(|at| at > now) {
            return;
        }
        self.hosts[host].wake_at = None;
        self.hosts[host].awake = true;
        for (arrived, datagram) in std::mem::take(&mut self.hosts[host].inbox) {
            self.receive(host, datagram, arrived);
        }
        if self.hosts[host]
            .endpoint
            .poll_timeout()
            .is_some_and(|at| at <= now)
        {
            self.hosts[host].endpoint.handle_timeout(now);
        }
    }

    /// Runs the network until `done` returns true (checked before the first step and after
    /// every one, once all endpoints have sent what they had), or until virtual time would
    /// pass `deadline`. `done` plays the applications: it may poll events, send, connect,
    /// close, and change the network. Returns the virtual time at which `done` held.
    pub fn run_until(
        &mut self,
        deadline: Micros,
        mut done: impl FnMut(&mut Sim) -> bool,
    ) -> Result<Micros, SimError> {
        let mut steps_at_one_time = 0;
        loop {
            self.flush();
            if done(self) {
                return Ok(self.now);
            }
            self.flush();
            let Some(next) = self.next_time() else {
                return Err(SimError::Idle {
                    seed: self.seed,
                    now: self.now,
                });
            };
            if next > deadline {
                self.now = self.now.max(deadline);
                return Err(SimError::Deadline {
                    seed: self.seed,
                    deadline,
                });
            }
            if next <= self.now {
                steps_at_one_time += 1;
                if steps_at_one_time > STEPS_AT_ONE_TIME_MAX {
                    return Err(SimError::Livelock {
                        seed: self.seed,
                        now: self.now,
                    });
                }
            } else {
                steps_at_one_time = 0;
                self.now = next;
            }
            self.step();
        }
    }

    /// Runs the network for `duration` µs of virtual time, or until nothing is left to
    /// happen.
    pub fn run_for(&mut self, duration: Micros) {
        let deadline = self.now + duration;
        match self.run_until(deadline, |_| false) {
            Err(SimError::Deadline { .. }) | Err(SimError::Idle { .. }) => {}
            Err(error) => panic!("{error}"),
            Ok(_) => unreachable!("the condition never holds"),
        }
        self.now = self.now.max(deadline);
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "simulation seed {} (virtual time {} µs): replay with Sim::new({})",
                self.seed, self.now, self.seed
            );
        }
    }
}
