//! What runs on the two-switch network: a raw multicast UDP stream (the yardstick), and
//! `tessera-order` nodes over `tessera-order-udp` driven by a closed-loop or paced load,
//! each node's driver and application in threads whose sockets live in its namespace.

use super::app::{
    compare_orders, AppMode, Disagreement, NodeApp, OrderBlocks, CHECKPOINT_EVERY, STAMP_BYTES,
};
use super::net::{rx_addr, tx_addr, TwoSwitch, GROUP, RX_INTERFACE, TX_INTERFACE};
use crate::net::run_in_namespace;
use crate::LabError;
use serde::Serialize;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_order::{Config, Group, NodeId, Start, Stats};
use tessera_order_udp::{
    spawn_inline, spawn_split_lossy, two_switch_sockets, Broadcast, DriverConfig, DriverStats,
    Handle, InlineHandle, Loss,
};

/// The environment variable that sets the protocol's `ack_delay_us` for an experiment
/// (microseconds; 20 if unset or not a number).
pub const ACK_DELAY_VARIABLE: &str = "TESSERA_LAB_ORDER_ACK_DELAY_US";

/// The environment variable that sets the protocol's `rtt_floor_us` for an experiment
/// (microseconds; 1,000 if unset or not a number).
pub const RTT_FLOOR_VARIABLE: &str = "TESSERA_LAB_ORDER_RTT_FLOOR_US";

/// The environment variable that sets the protocol's `ack_queue_divisor` for an experiment
/// (8 if unset or not a number; 0: an ACK never waits for the queue).
pub const ACK_QUEUE_VARIABLE: &str = "TESSERA_LAB_ORDER_ACK_QUEUE_DIVISOR";

/// The environment variable that sets the protocol's `ack_at_once_when_idle` for an
/// experiment (`0`: every ACK waits `ack_delay_us`, as before session 14; else the default,
/// an idle receiver ACKs at once).
pub const ACK_IDLE_VARIABLE: &str = "TESSERA_LAB_ORDER_ACK_IDLE";

/// The environment variable that sets the protocol's `window_packets_min` for an
/// experiment (2 if unset or not a number, at most the window of 16; 16: a fixed window).
pub const WINDOW_MIN_VARIABLE: &str = "TESSERA_LAB_ORDER_WINDOW_MIN";

/// Own DATA packets a sender may have in flight (`Config::window_packets`).
const WINDOW_PACKETS: u32 = 16;

fn variable_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

/// The raw streams' group: another port, so that their datagrams still queued in the
/// switches when a total-order run starts reach no node of it.
const RAW_GROUP: SocketAddrV4 = SocketAddrV4::new(*GROUP.ip(), GROUP.port() + 1);

/// Sockets of node `i` in its namespace, for `group`.
pub(super) fn sockets(
    network: &TwoSwitch,
    node: usize,
    group: SocketAddrV4,
) -> Result<(UdpSocket, UdpSocket), LabError> {
    run_in_namespace(&network.namespace(node), || {
        two_switch_sockets(
            tx_addr(node),
            TX_INTERFACE,
            rx_addr(node),
            RX_INTERFACE,
            group,
        )
        .map_err(|error| LabError::Io {
            action: format!("open node {node}'s sockets"),
            source: std::io::Error::other(error.to_string()),
        })
    })
}

/// A raw stream's result: every node multicasts datagrams as fast as it can.
#[derive(Debug, Clone, Serialize)]
pub struct RawStream {
    /// Bytes of each datagram's payload.
    pub message_bytes: usize,
    /// Datagrams per second received by the slowest receiver.
    pub messages_per_s: f64,
    /// Payload bits per second at the slowest receiver.
    pub bits_per_s: f64,
    /// Datagrams sent, summed over nodes.
    pub sent: u64,
}

/// Every sender of `group` multicasts `message_bytes` datagrams through the two switches for
/// `seconds`; every receiver counts what it gets.
pub fn raw_stream(
    network: &TwoSwitch,
    group: &Group,
    message_bytes: usize,
    seconds: f64,
) -> Result<RawStream, LabError> {
    let nodes = network.nodes();
    assert_eq!(group.roles.len(), nodes, "a role per node");
    let pairs = (0..nodes)
        .map(|node| sockets(network, node, RAW_GROUP))
        .collect::<Result<Vec<_>, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let duration = Duration::from_secs_f64(seconds);
    let (received, sent) = std::thread::scope(|scope| {
        let mut receivers = Vec::new();
        let mut senders = Vec::new();
        for ((tx, rx), role) in pairs.iter().zip(&group.roles) {
            let stop_rx = stop.clone();
            let receiving = role.receiver;
            let sending = role.sender;
            receivers.push(scope.spawn(move || {
                if !receiving {
                    return None;
                }
                rx.set_read_timeout(Some(Duration::from_millis(50))).ok();
                let mut buffer = vec![0u8; 65_536];
                let began = Instant::now();
                let mut count = 0u64;
                while !stop_rx.load(Ordering::Relaxed) {
                    if rx.recv(&mut buffer).is_ok() && began.elapsed() < duration {
                        count += 1;
                    }
                }
                Some(count)
            }));
            let stop_tx = stop.clone();
            senders.push(scope.spawn(move || {
                let payload = vec![0x5Au8; message_bytes];
                let mut sent = 0u64;
                while sending && !stop_tx.load(Ordering::Relaxed) {
                    if tx.send_to(&payload, RAW_GROUP).is_ok() {
                        sent += 1;
                    }
                }
                sent
            }));
        }
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let received: Vec<u64> = receivers
            .into_iter()
            .filter_map(|h| h.join().unwrap_or(Some(0)))
            .collect();
        let sent: u64 = senders.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        (received, sent)
    });
    let slowest = received.iter().copied().min().unwrap_or(0) as f64 / seconds;
    Ok(RawStream {
        message_bytes,
        messages_per_s: slowest,
        bits_per_s: slowest * message_bytes as f64 * 8.0,
        sent,
    })
}

/// Round trips of a small datagram from node 0 to node 1 and back, each way through both
/// switches and the trunk (unicast out of TX, in on RX), the unit of the latency
/// targets: median and 99th percentile in microseconds.
pub fn echo(network: &TwoSwitch, count: usize) -> Result<(f64, f64), LabError> {
    echo_paced(network, count, Duration::ZERO)
}

/// As [`echo`], with `gap` between the answer to one datagram and the next one sent: a
/// paced latency run's messages find the CPUs idle (a virtual CPU that halted must be woken
/// by the host), a back-to-back echo keeps them polling.
pub fn echo_paced(
    network: &TwoSwitch,
    count: usize,
    gap: Duration,
) -> Result<(f64, f64), LabError> {
    let echo_group = SocketAddrV4::new(*GROUP.ip(), GROUP.port() + 2);
    let (tx0, rx0) = sockets(network, 0, echo_group)?;
    let (tx1, rx1) = sockets(network, 1, echo_group)?;
    let to_node1 = SocketAddrV4::new(rx_addr(1), echo_group.port());
    let to_node0 = SocketAddrV4::new(rx_addr(0), echo_group.port());
    let timeout = Some(Duration::from_millis(200));
    for socket in [&rx0, &rx1] {
        socket
            .set_read_timeout(timeout)
            .map_err(LabError::io("set a timeout"))?;
    }
    let mut rtts_us = std::thread::scope(|scope| {
        let answer = scope.spawn(move || {
            let mut buffer = [0u8; 64];
            while let Ok(n) = rx1.recv(&mut buffer) {
                if tx1.send_to(&buffer[..n], to_node0).is_err() || n == 1 {
                    break;
                }
            }
        });
        let mut rtts_us = Vec::new();
        let mut buffer = [0u8; 64];
        for seq in 0..count as u64 {
            std::thread::sleep(gap);
            let sent = Instant::now();
            if tx0.send_to(&seq.to_be_bytes(), to_node1).is_err() {
                continue;
            }
            while let Ok(n) = rx0.recv(&mut buffer) {
                if buffer[..n] == seq.to_be_bytes() {
                    rtts_us.push(sent.elapsed().as_secs_f64() * 1e6);
                    break;
                }
            }
        }
        let _ = tx0.send_to(&[0], to_node1);
        let _ = answer.join();
        rtts_us
    });
    Ok((
        percentile(&mut rtts_us, 0.5),
        percentile(&mut rtts_us, 0.99),
    ))
}

/// How the application at each node proposes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Keep this many own messages proposed and not yet UTO-delivered (the paper's "as many
    /// as possible after each ACK").
    Closed {
        /// Messages outstanding per node.
        outstanding: u64,
    },
    /// Propose at this many messages per second per node, every millisecond a batch.
    Paced {
        /// Messages per second per node.
        per_node_per_s: f64,
    },
}

/// One total-order run's result.
#[derive(Debug, Clone, Serialize)]
pub struct OrderRun {
    /// Bytes of each message.
    pub message_bytes: usize,
    /// The protocol's packet size (the MTU it packs to); `None`: aggregation off.
    pub mtu_bytes: Option<usize>,
    /// Messages UTO-delivered per second by the slowest node over the measured time.
    pub messages_per_s: f64,
    /// Their payload bits per second.
    pub bits_per_s: f64,
    /// PO latency (propose to optimistic delivery, every node), median, microseconds.
    pub po_latency_us_median: f64,
    /// PO latency, 99th percentile.
    pub po_latency_us_p99: f64,
    /// UTO latency (propose to UTO delivery, every node), median, microseconds.
    pub uto_latency_us_median: f64,
    /// UTO latency, 99th percentile.
    pub uto_latency_us_p99: f64,
    /// UTO latency samples taken (0: nothing was UTO-delivered in the measured window, and
    /// the latencies are NaN, "n/a" in the tables).
    pub uto_samples: u64,
    /// Datagrams sent per message delivered (every kind, every node).
    pub datagrams_per_message: f64,
    /// Every receiver delivered the same order (their hashes of every block that two or
    /// more delivered whole agree) and none jumped a position without a gap.
    pub orders_agree: bool,
    /// Positions compared across receivers.
    pub positions_compared: u64,
    /// Where the orders differ, if they do.
    #[serde(skip)]
    pub disagreement: Option<Disagreement>,
    /// Gaps the receivers reported (state transfers: positions not delivered), summed.
    pub gaps: u64,
    /// Messages sent again, summed over nodes.
    pub retransmitted: u64,
    /// Positions replaced by the leader's order, summed over nodes.
    pub positions_replaced: u64,
    /// View changes, summed over nodes.
    pub view_changes: u64,
    /// Datagrams the drivers dropped on purpose (artificial loss), summed over nodes.
    pub dropped: u64,
    /// Share of the machine's CPU time busy over the measured window (every process and
    /// the kernel; 0 if `/proc/stat` could not be read).
    pub cpu_busy_share: f64,
    /// CPUs of the machine (0 if not read).
    pub cpus: usize,
    /// Share of the machine's CPU time this process used over the measured window (the
    /// nodes' threads and the kernel work charged to them; not other processes).
    pub process_cpu_share: f64,
    /// What the nodes did over the whole run (warm-up included), summed over nodes.
    pub work: Work,
    /// Messages UTO-delivered over the whole run, mean over receivers (the measure of
    /// `work`).
    pub delivered_total: u64,
}

/// The nodes' protocol and driver counters over a run, summed over nodes: where a loss's
/// cost goes (each datagram is a wake-up and a copy at every receiver, each replaced
/// position a PO reported again).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Work {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub data_packets_sent: u64,
    pub ack_packets_sent: u64,
    pub nacks_sent: u64,
    pub repairs_sent: u64,
    pub repair_entries: u64,
    pub pauses: u64,
    pub pauses_timed_out: u64,
    pub duplicates: u64,
    pub window_full_us: u64,
    pub send_errors: u64,
    /// Times a sender halved its window (an own packet did not come back).
    pub window_cuts: u64,
    /// Frames the network's `tbf` queues dropped over the run (full queues: mostly the
    /// sequencer link's), read from the switches, not summed over nodes.
    pub queue_drops: u64,
    /// Datagrams the nodes' sockets dropped over the run for a full receive buffer.
    pub socket_drops: u64,
    /// Frames the machine's per-CPU input queues dropped over the run (every veth's
    /// delivery goes through one; the machine's count, other work's included).
    pub backlog_drops: u64,
    /// Messages sent again on a NACK, for an own packet that did not come back, and on
    /// the timeout (summed over nodes; `OrderRun::retransmitted` is their sum).
    pub retransmitted_nacked: u64,
    /// See `retransmitted_nacked`.
    pub retransmitted_unreturned: u64,
    /// See `retransmitted_nacked`.
    pub retransmitted_timeout: u64,
}

impl Work {
    fn add(&mut self, stats: &Stats, driver: &DriverStats) {
        self.datagrams_sent += driver.datagrams_sent;
        self.datagrams_received += driver.datagrams_received;
        self.send_errors += driver.send_errors;
        self.data_packets_sent += stats.data_packets_sent;
        self.ack_packets_sent += stats.ack_packets_sent;
        self.nacks_sent += stats.nacks_sent;
        self.repairs_sent += stats.repairs_sent;
        self.repair_entries += stats.repair_entries;
        self.pauses += stats.pauses;
        self.pauses_timed_out += stats.pauses_timed_out;
        self.duplicates += stats.duplicates;
        self.window_full_us += stats.window_full_us;
        self.window_cuts += stats.window_cuts;
        self.retransmitted_nacked += stats.retransmitted_nacked;
        self.retransmitted_unreturned += stats.retransmitted_unreturned;
        self.retransmitted_timeout += stats.retransmitted_timeout;
    }

    fn merge(&mut self, other: &Work) {
        let pairs = [
            (&mut self.datagrams_sent, other.datagrams_sent),
            (&mut self.datagrams_received, other.datagrams_received),
            (&mut self.data_packets_sent, other.data_packets_sent),
            (&mut self.ack_packets_sent, other.ack_packets_sent),
            (&mut self.nacks_sent, other.nacks_sent),
            (&mut self.repairs_sent, other.repairs_sent),
            (&mut self.repair_entries, other.repair_entries),
            (&mut self.pauses, other.pauses),
            (&mut self.pauses_timed_out, other.pauses_timed_out),
            (&mut self.duplicates, other.duplicates),
            (&mut self.window_full_us, other.window_full_us),
            (&mut self.send_errors, other.send_errors),
            (&mut self.window_cuts, other.window_cuts),
            (&mut self.queue_drops, other.queue_drops),
            (&mut self.socket_drops, other.socket_drops),
            (&mut self.backlog_drops, other.backlog_drops),
            (&mut self.retransmitted_nacked, other.retransmitted_nacked),
            (
                &mut self.retransmitted_unreturned,
                other.retransmitted_unreturned,
            ),
            (&mut self.retransmitted_timeout, other.retransmitted_timeout),
        ];
        for (sum, n) in pairs {
            *sum += n;
        }
    }

    /// One line for the run's log: counts per message delivered (`delivered`).
    pub fn per_message(&self, delivered: u64, replaced: u64) -> String {
        let per = |n: u64| n as f64 / delivered.max(1) as f64;
        format!(
            "per message: datagrams sent {:.3} received {:.3} (DATA {:.3}, ACK {:.3}, NACK \
             {:.4}, ENTRIES {:.4}), positions replaced {:.3}; pauses {} ({} timed out), \
             duplicates {}, window full {} ms, send errors {}; window cuts {}, frames \
             dropped by full queues {}, by full socket buffers {}, by full input queues {} \
             (the machine's); messages sent again {} on NACK, {} unreturned, {} on timeout",
            per(self.datagrams_sent),
            per(self.datagrams_received),
            per(self.data_packets_sent),
            per(self.ack_packets_sent),
            per(self.nacks_sent),
            per(self.repairs_sent),
            per(replaced),
            self.pauses,
            self.pauses_timed_out,
            self.duplicates,
            self.window_full_us / 1000,
            self.send_errors,
            self.window_cuts,
            self.queue_drops,
            self.socket_drops,
            self.backlog_drops,
            self.retransmitted_nacked,
            self.retransmitted_unreturned,
            self.retransmitted_timeout,
        )
    }
}

/// What one node's application saw.
#[derive(Default)]
pub struct NodeLog {
    pub(super) receiver: bool,
    pub(super) delivered_in_window: u64,
    pub(super) po_us: Vec<f64>,
    pub(super) uto_us: Vec<f64>,
    pub(super) order: OrderBlocks,
    datagrams_sent: u64,
    retransmitted: u64,
    positions_replaced: u64,
    view_changes: u64,
    dropped: u64,
    work: Work,
}

/// Which drivers drop datagrams in a run: every node as `loss` says (each seeded apart:
/// its seed plus the node's number), or one node only.
#[derive(Debug, Clone, Copy)]
pub struct NodeLoss {
    /// What a dropping driver drops.
    pub loss: Loss,
    /// The one node that drops; `None`: every node.
    pub only: Option<usize>,
}

impl NodeLoss {
    /// Node `node`'s driver setting.
    pub fn at(&self, node: usize) -> Loss {
        let loss = match self.only {
            Some(only) if only != node => Loss::NONE,
            _ => self.loss,
        };
        Loss {
            seed: self.loss.seed.wrapping_add(node as u64),
            ..loss
        }
    }
}

impl From<Loss> for NodeLoss {
    fn from(loss: Loss) -> NodeLoss {
        NodeLoss { loss, only: None }
    }
}

/// The protocol's settings for a run: packing to `mtu_bytes` (or off), a window and ACK
/// threshold that keep a closed loop busy.
pub fn protocol_config(mtu_bytes: Option<usize>) -> Config {
    let ack_delay_us = variable_or(ACK_DELAY_VARIABLE, 20);
    Config {
        mtu_bytes: mtu_bytes.unwrap_or(1500),
        aggregate: mtu_bytes.is_some(),
        window_packets: WINDOW_PACKETS,
        // The trunk's `tbf` queue (128 frames) holds less than five senders' windows of
        // jumbo packets: a sender halves its window when an own packet does not come back
        // (drop-tail there), down to this.
        window_packets_min: (variable_or(WINDOW_MIN_VARIABLE, 2) as u32).clamp(1, WINDOW_PACKETS),
        ack_every_messages: 64,
        // Under load the threshold sends ACKs (a packet carries ~100 small messages); at low
        // load this delay is the floor of the UTO latency.
        ack_delay_us,
        // Under load an ACK also waits an eighth of the sequencer link's queue (the
        // protocol's default); `TESSERA_LAB_ORDER_ACK_QUEUE_DIVISOR` sets it, 0: never.
        ack_queue_divisor: variable_or(ACK_QUEUE_VARIABLE, 8),
        ack_at_once_when_idle: variable_or(ACK_IDLE_VARIABLE, 1) != 0,
        // Loss here is a full socket buffer at one receiver, which its NACK reports at once;
        // the timeout is for the tail, and one shorter than a CPU-bound UTO latency makes
        // the sender retransmit whole windows that were only slow (a collapse seen at 20 ms
        // in a debug build). It also paces the leader's repairs (a quarter of it).
        retransmit_after_us: 50_000,
        // NACKs and repairs are paced by the measured round trip (about 150 us here), but
        // with a debug build on 2 shared CPUs a repair round of up to 1 MB every few
        // hundred microseconds costs more CPU than the loss: receivers' 1% fell from 0.18
        // to 0.08 of the no-loss rate with the default floor of 50 us. Repairs carry
        // identities only since (session 6); in the simulator's lab-like 5-node run the
        // 1 ms floor costs (1% at the receivers, 24 seeds: worst 0.868, mean 0.950 of no
        // loss, against 0.949 and 0.968 with 50 us). `TESSERA_LAB_ORDER_RTT_FLOOR_US`
        // sets it for a run.
        rtt_floor_us: variable_or(RTT_FLOOR_VARIABLE, 1_000),
        // One ENTRIES packet or view-change part must fit a datagram (the default does;
        // said here as a limit).
        repair_bytes_max: 60 << 10,
        heartbeat_interval_us: 5_000,
        // A CPU-starved node on shared CPUs can be silent for tens of milliseconds: a
        // needless view change would stall the measurement (view changes under load work
        // at 80 ms: `tessera-order-udp`'s loopback test).
        suspect_after_us: 500_000,
        view_change_timeout_us: 200_000,
        send_queue_messages_max: 1 << 14,
        ..Config::default()
    }
}

/// Runs every node of `network` in `group` over UDP multicast with `load` at each sender
/// for `warmup + seconds`, measuring over the last `seconds` at the receivers; every
/// driver drops datagrams as `loss` says (its seed plus the node's number).
pub fn order_run(
    network: &TwoSwitch,
    group: &Group,
    message_bytes: usize,
    mtu_bytes: Option<usize>,
    load: Load,
    seconds: f64,
    loss: impl Into<NodeLoss>,
) -> Result<OrderRun, LabError> {
    let loss = loss.into();
    assert!(message_bytes >= STAMP_BYTES, "messages carry a stamp");
    // A port of its own per run: datagrams of the run before, still queued in the switches,
    // would otherwise reach this run's nodes as packets of the same nodes and incarnation.
    static RUNS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed) % 1000;
    let multicast = SocketAddrV4::new(*GROUP.ip(), GROUP.port() + 100 + run);
    let nodes = network.nodes();
    assert_eq!(group.roles.len(), nodes, "a role per node");
    let origin = Instant::now();
    let peers: Vec<SocketAddr> = (0..nodes)
        .map(|i| SocketAddrV4::new(rx_addr(i), multicast.port()).into())
        .collect();
    let warmup = Duration::from_secs_f64((seconds / 4.0).clamp(0.3, 2.0));
    let window = (
        origin + warmup,
        origin + warmup + Duration::from_secs_f64(seconds),
    );
    let mode = AppMode::for_load(load);
    let queue_drops_before = network.tbf_drops()?;
    let socket_drops_before = network.socket_drops()?;
    let backlog_drops_before = super::net::backlog_drops();
    let mut apps = Vec::new();
    for node in 0..nodes {
        let (tx, rx) = sockets(network, node, multicast)?;
        let driver = DriverConfig {
            config: protocol_config(mtu_bytes),
            group: group.clone(),
            node: NodeId(node as u16),
            incarnation: 0,
            start: Start::Initial,
            seed: node as u64 + 1,
            peers: peers.clone(),
            broadcast: Broadcast::Multicast(multicast),
        };
        let loss = loss.at(node);
        let role = group.roles[node];
        // A node that only receives proposes nothing.
        let load = if role.sender { Some(load) } else { None };
        let app = NodeApp::new(node, message_bytes, load, origin, window, role.receiver)
            .paced_offset(node, nodes);
        let started = match mode {
            AppMode::Driver => spawn_inline(driver, tx, rx, loss, app).map(RunningNode::Inline),
            AppMode::Thread => spawn_split_lossy(driver, tx, rx, loss).map(|handle| {
                RunningNode::Thread(std::thread::spawn(move || {
                    (app.run_on_thread(&handle), handle)
                }))
            }),
        };
        apps.push(started.map_err(|error| LabError::Io {
            action: format!("start node {node}"),
            source: std::io::Error::other(error.to_string()),
        })?);
    }
    let (cpu_busy_share, process_cpu_share, cpus) = cpu_over(window);
    std::thread::sleep(window.1.saturating_duration_since(Instant::now()));
    let logs = stop_nodes(apps, group)?;
    let mut run = summarize(logs, message_bytes, mtu_bytes, seconds);
    run.work.queue_drops = network.tbf_drops()?.saturating_sub(queue_drops_before);
    run.work.socket_drops = network.socket_drops()?.saturating_sub(socket_drops_before);
    run.work.backlog_drops = super::net::backlog_drops().saturating_sub(backlog_drops_before);
    Ok(OrderRun {
        cpu_busy_share,
        process_cpu_share,
        cpus,
        ..run
    })
}

/// A started node: its application on the driver's thread, or on a thread of its own.
enum RunningNode {
    Inline(InlineHandle<NodeApp>),
    Thread(std::thread::JoinHandle<(NodeLog, Handle)>),
}

impl RunningNode {
    /// Stops the node after its window: the application's log and the node's counters.
    fn stop(self) -> Result<(NodeLog, Stats, DriverStats), tessera_order_udp::DriverError> {
        match self {
            RunningNode::Inline(handle) => {
                let (stats, driver, app) = handle.stop()?;
                Ok((app.log, stats, driver))
            }
            RunningNode::Thread(app) => {
                let (log, handle) = app.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                let (stats, driver) = handle.stop()?;
                Ok((log, stats, driver))
            }
        }
    }
}

/// Stops every node after its application's window and adds the node's counters to its
/// log.
fn stop_nodes(apps: Vec<RunningNode>, group: &Group) -> Result<Vec<NodeLog>, LabError> {
    let mut logs = Vec::new();
    for app in apps {
        let (mut log, stats, driver) = app.stop().map_err(|error| LabError::Io {
            action: "stop a node".into(),
            source: std::io::Error::other(error.to_string()),
        })?;
        log.datagrams_sent = driver.datagrams_sent;
        log.retransmitted = stats.retransmitted;
        log.positions_replaced = stats.positions_replaced;
        log.view_changes = stats.view_changes;
        log.dropped = driver.dropped_at_send + driver.dropped_at_receive;
        log.work.add(&stats, &driver);
        log.receiver = group.roles[logs.len()].receiver;
        logs.push(log);
    }
    Ok(logs)
}

/// Sleeps through `window`; the share of the machine's CPU time busy over it (every
/// process: the nodes, the kernel's bridges, whatever else runs), the share this process
/// used, and the CPUs (zeros where `/proc/stat` cannot be read).
fn cpu_over(window: (Instant, Instant)) -> (f64, f64, usize) {
    std::thread::sleep(window.0.saturating_duration_since(Instant::now()));
    let (before, process_before) = (cpu_times(), process_cpu_s());
    std::thread::sleep(window.1.saturating_duration_since(Instant::now()));
    let (after, process_after) = (cpu_times(), process_cpu_s());
    let (Some(before), Some(after)) = (before, after) else {
        return (0.0, 0.0, 0);
    };
    let seconds = (window.1 - window.0).as_secs_f64();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total = after.1.saturating_sub(before.1).max(1) as f64;
    (
        after.0.saturating_sub(before.0) as f64 / total,
        (process_after - process_before) / seconds / cpus as f64,
        cpus,
    )
}

/// CPU seconds this process (every node's driver and application thread) used so far,
/// user and system.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF needs nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Busy and total CPU time of the machine so far, summed over CPUs, in clock ticks (the
/// first line of `/proc/stat`; idle and I/O wait count as not busy); `None` where it
/// cannot be read.
fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((total - idle, total))
}

/// CPU core-seconds the whole machine spent per million messages delivered at every
/// receiver in `run` (NaN if nothing was delivered or the CPU time was not read).
pub fn core_seconds_per_million(run: &OrderRun) -> f64 {
    per_million(run, run.cpu_busy_share)
}

/// The same for the nodes alone (this process: drivers, applications and the kernel work
/// charged to them): what a message costs them, whatever else the machine runs.
pub fn process_core_seconds_per_million(run: &OrderRun) -> f64 {
    per_million(run, run.process_cpu_share)
}

fn per_million(run: &OrderRun, share: f64) -> f64 {
    if run.messages_per_s <= 0.0 || run.cpus == 0 {
        return f64::NAN;
    }
    share * run.cpus as f64 / run.messages_per_s * 1e6
}

fn summarize(
    mut logs: Vec<NodeLog>,
    message_bytes: usize,
    mtu_bytes: Option<usize>,
    seconds: f64,
) -> OrderRun {
    let datagrams: u64 = logs.iter().map(|l| l.datagrams_sent).sum();
    let retransmitted = logs.iter().map(|l| l.retransmitted).sum();
    let positions_replaced = logs.iter().map(|l| l.positions_replaced).sum();
    let view_changes = logs.iter().map(|l| l.view_changes).sum();
    let dropped = logs.iter().map(|l| l.dropped).sum();
    let mut work = Work::default();
    for log in &logs {
        work.merge(&log.work);
    }
    // Deliveries, orders and latencies are the receivers'.
    logs.retain(|l| l.receiver);
    let slowest = logs
        .iter()
        .map(|l| l.delivered_in_window)
        .min()
        .unwrap_or(0) as f64
        / seconds;
    let orders: Vec<&OrderBlocks> = logs.iter().map(|l| &l.order).collect();
    let compared = compare_orders(&orders);
    let gaps = orders.iter().map(|o| o.gaps).sum();
    let mut po: Vec<f64> = logs.iter().flat_map(|l| l.po_us.iter().copied()).collect();
    let mut uto: Vec<f64> = logs.iter().flat_map(|l| l.uto_us.iter().copied()).collect();
    let total_delivered: u64 =
        orders.iter().map(|o| o.delivered).sum::<u64>() / orders.len().max(1) as u64;
    OrderRun {
        message_bytes,
        mtu_bytes,
        messages_per_s: slowest,
        bits_per_s: slowest * message_bytes as f64 * 8.0,
        po_latency_us_median: percentile(&mut po, 0.5),
        po_latency_us_p99: percentile(&mut po, 0.99),
        uto_samples: uto.len() as u64,
        uto_latency_us_median: percentile(&mut uto, 0.5),
        uto_latency_us_p99: percentile(&mut uto, 0.99),
        datagrams_per_message: datagrams as f64 / total_delivered.max(1) as f64,
        orders_agree: compared.is_ok(),
        positions_compared: compared
            .as_ref()
            .map_or(0, |blocks| blocks * CHECKPOINT_EVERY),
        disagreement: compared.err(),
        gaps,
        retransmitted,
        positions_replaced,
        view_changes,
        dropped,
        cpu_busy_share: 0.0,
        cpus: 0,
        process_cpu_share: 0.0,
        work,
        delivered_total: total_delivered,
    }
}

/// The error of a run whose receivers' orders differ: where (the block's positions and two
/// receivers, or a receiver that jumped a position with no gap), with the run's gaps and
/// view changes.
pub fn order_fault(run: &OrderRun, size: usize, mtu: Option<usize>) -> LabError {
    let place = match &run.disagreement {
        Some(Disagreement {
            block: Some(block),
            nodes: (a, b),
        }) => format!(
            "receivers {a} and {b} differ at positions {}..{}",
            block * CHECKPOINT_EVERY,
            (block + 1) * CHECKPOINT_EVERY
        ),
        Some(Disagreement {
            block: None,
            nodes: (a, _),
        }) => format!("receiver {a} skipped positions without a gap"),
        None => "orders agree".into(),
    };
    LabError::BadValue {
        what: "total order",
        text: format!(
            "{size}-byte messages, packing {}: {place} ({} gaps, {} view changes)",
            super::packing_name(mtu),
            run.gaps,
            run.view_changes
        ),
        expected: "every node delivering the same order",
    }
}

/// A latency for the tables: "n/a" where nothing was delivered to measure it (NaN).
pub fn latency_cell(us: f64) -> crate::results::Cell {
    if us.is_nan() {
        crate::results::Cell::text("n/a")
    } else {
        crate::results::Cell::float(us, 0)
    }
}

/// A latency for a line of text, as [`latency_cell`].
pub fn latency_text(us: f64) -> String {
    if us.is_nan() {
        "n/a".into()
    } else {
        format!("{us:.0}")
    }
}

/// The `q` quantile of `values` (sorted here); NaN if there are none.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::total_order::app::paced_batch;

    /// A paced rate below one message a millisecond offers that rate, not one a millisecond
    /// (the batches used to be rounded up).
    #[test]
    fn paced_batches_carry_fractions_over() {
        for per_node_per_s in [393.0, 1_000.0, 5_700.0] {
            let mut credit = 0.0;
            let sent: u64 = (0..1000)
                .map(|_| paced_batch(&mut credit, per_node_per_s))
                .sum();
            assert!(
                (sent as f64 - per_node_per_s).abs() <= 1.0,
                "{sent} in a second at {per_node_per_s}/s"
            );
        }
    }

    /// A run that delivered nothing to time has no latency: the tables say "n/a", not NaN.
    #[test]
    fn an_unmeasured_latency_reads_n_a() {
        let none = percentile(&mut [], 0.5);
        assert!(none.is_nan());
        assert_eq!(latency_cell(none).render(), "n/a");
        assert_eq!(latency_text(none), "n/a");
        assert_eq!(latency_cell(241.6).render(), "242");
        assert_eq!(latency_text(241.6), "242");
    }
}
