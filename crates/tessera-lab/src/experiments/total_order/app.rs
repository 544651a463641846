//! A node's application in a total-order run: proposes by a [`Load`] until the window's
//! end and records what is delivered. It runs one of two ways ([`AppMode`]): on the node's
//! driver thread ([`tessera_order_udp::Application`], the latency runs' default: no hand-off
//! between the node and the application), or on a thread of its own behind the driver's
//! channels (every delivery and proposal a wake-up of the other thread; the throughput
//! runs' default).

use super::load::{Load, NodeLog};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tessera_order::{Event, MsgId};
use tessera_order_udp::{Application, Control, Handle};

/// Bytes at the start of every message: the proposer's clock (microseconds since the run's
/// origin, shared by every thread of the process) and the proposing node.
pub const STAMP_BYTES: usize = 10;
/// Positions in one block of a node's order: each block whose positions the node delivered
/// one after another is hashed (the identities' chain), and receivers' hashes of one block
/// are compared.
pub const CHECKPOINT_EVERY: u64 = 1024;
/// Most latency samples kept per node (the rest are counted, not kept).
const LATENCY_SAMPLES_MAX: usize = 1 << 20;

/// The environment variable that picks where the application runs: `driver` (on the
/// driver's thread), `thread` (its own thread, behind channels); unset or anything else:
/// on the driver's thread for paced runs (the latencies) and on threads for closed loops
/// (the throughputs), see [`AppMode::for_load`].
pub const APP_VARIABLE: &str = "TESSERA_LAB_ORDER_APP";

/// The environment variable that sets how long each driver polls its socket before it
/// sleeps, microseconds ([`tessera_order_udp::Application::spin`]; 0, the default, when
/// unset; only where the application runs on the driver's thread).
pub const SPIN_VARIABLE: &str = "TESSERA_LAB_ORDER_SPIN_US";

/// Where a node's application runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppMode {
    /// On the driver's thread, called by it.
    Driver,
    /// On a thread of its own, behind channels.
    Thread,
}

impl AppMode {
    /// The mode for a run with `load`: what [`APP_VARIABLE`] says, else on the driver's
    /// thread for a paced load and on threads for a closed loop. Inline, the paced runs'
    /// latencies fell to a third (PO) and two thirds (UTO); the closed loops delivered less
    /// on the busy 2-CPU machine (more datagrams lost to full socket buffers, resent after
    /// the 50 ms timeout), so the throughput runs stay as earlier sessions measured them.
    pub fn for_load(load: Load) -> AppMode {
        match std::env::var(APP_VARIABLE).as_deref() {
            Ok("thread") => AppMode::Thread,
            Ok("driver") => AppMode::Driver,
            _ => match load {
                Load::Paced { .. } => AppMode::Driver,
                Load::Closed { .. } => AppMode::Thread,
            },
        }
    }
}

/// The environment variable that makes every node of a paced run propose on the same
/// millisecond (`1`), as before session 17; unset or anything else: node `i` of `n`
/// proposes `i/n` of a millisecond after node 0 ([`NodeApp::paced_offset`]).
pub const PACED_ALIGNED_VARIABLE: &str = "TESSERA_LAB_ORDER_PACED_ALIGNED";

/// Events recorded with one clock read, at most: a read per event (two per message and
/// node) cost the 5-node closed loops of 64-byte messages ~12% of the machine. A batch of
/// this many takes a few microseconds, well under the latencies measured.
const MOMENT_EVENTS: u32 = 256;

/// When a batch of events is recorded: microseconds since the run's origin, and whether
/// that is in the measured window.
#[derive(Debug, Clone, Copy)]
struct Moment {
    now_us: f64,
    measuring: bool,
}

/// One node's application state.
pub struct NodeApp {
    node: usize,
    load: Option<Load>,
    origin: Instant,
    window: (Instant, Instant),
    receiver: bool,
    /// What it saw.
    pub log: NodeLog,
    proposed: u64,
    own_delivered: u64,
    next_batch: Instant,
    paced_credit: f64,
    message: Vec<u8>,
    spin: Duration,
}

impl NodeApp {
    /// Node `node`'s application, proposing `message_bytes` messages by `load` (nothing if
    /// `None`) and measuring within `window`.
    pub fn new(
        node: usize,
        message_bytes: usize,
        load: Option<Load>,
        origin: Instant,
        window: (Instant, Instant),
        receiver: bool,
    ) -> NodeApp {
        let mut message = vec![0u8; message_bytes];
        message[8..10].copy_from_slice(&(node as u16).to_be_bytes());
        NodeApp {
            node,
            load,
            origin,
            window,
            receiver,
            log: NodeLog::default(),
            proposed: 0,
            own_delivered: 0,
            next_batch: Instant::now(),
            paced_credit: 0.0,
            message,
            spin: Duration::from_micros(
                std::env::var(SPIN_VARIABLE)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .unwrap_or(0),
            ),
        }
    }

    /// Spreads the paced batches of `nodes` nodes over the millisecond: this node's first
    /// batch `node / nodes` of a millisecond after the run's start. Every node's
    /// application started within microseconds of the others, so every node proposed on
    /// the same microsecond of every millisecond: five DATA packets, then five rounds of
    /// ACKs, at once on the machine's two CPUs, each message waiting for the others'
    /// threads, where a load of 10% has a sender every 200 us (the simulator's latency
    /// test and the lab's raw floor send one at a time). [`PACED_ALIGNED_VARIABLE`] keeps
    /// them aligned.
    pub fn paced_offset(mut self, node: usize, nodes: usize) -> NodeApp {
        if std::env::var(PACED_ALIGNED_VARIABLE).as_deref() != Ok("1") {
            let offset_us = 1_000 * node as u64 / nodes.max(1) as u64;
            self.next_batch += Duration::from_micros(offset_us);
        }
        self
    }

    /// Messages to propose now.
    fn want(&mut self, now: Instant) -> u64 {
        if now >= self.window.1 {
            return 0;
        }
        match self.load {
            // A node that only sends hears of no delivery: the driver's backlog bounds it.
            Some(Load::Closed { .. }) if !self.receiver => u64::MAX,
            Some(Load::Closed { outstanding }) => {
                (self.own_delivered + outstanding).saturating_sub(self.proposed)
            }
            Some(Load::Paced { per_node_per_s }) if now >= self.next_batch => {
                self.next_batch += Duration::from_millis(1);
                paced_batch(&mut self.paced_credit, per_node_per_s)
            }
            Some(Load::Paced { .. }) | None => 0,
        }
    }

    /// Proposes what is wanted now through `propose` until it refuses.
    fn propose_wanted(&mut self, mut propose: impl FnMut(Bytes) -> bool) {
        let now = Instant::now();
        // One clock read for the messages proposed together.
        let stamp = now.duration_since(self.origin).as_micros() as u64;
        self.message[..8].copy_from_slice(&stamp.to_be_bytes());
        // One copy for the messages proposed together (they are alike), each a reference
        // to it: an allocation per message, freed on the driver's thread, was ~7% of a
        // 64-byte closed loop at 5 nodes (mimalloc's cross-thread frees included).
        let message = Bytes::copy_from_slice(&self.message);
        for _ in 0..self.want(now) {
            if !propose(message.clone()) {
                break;
            }
            self.proposed += 1;
        }
    }

    /// Records one event of the node.
    fn record(&mut self, event: Event, moment: Moment) {
        let Moment { now_us, measuring } = moment;
        let log = &mut self.log;
        match event {
            Event::Optimistic { message, .. }
                if measuring && log.po_us.len() < LATENCY_SAMPLES_MAX =>
            {
                log.po_us.push(now_us - stamp_us(&message));
            }
            Event::Deliver {
                position,
                id,
                message,
            } => {
                if id.sender.node.0 as usize == self.node {
                    self.own_delivered += 1;
                }
                if measuring {
                    log.delivered_in_window += 1;
                    if log.uto_us.len() < LATENCY_SAMPLES_MAX {
                        log.uto_us.push(now_us - stamp_us(&message));
                    }
                }
                log.order.deliver(position, id);
            }
            Event::Gap { from, to } => log.order.gap(from, to),
            _ => {}
        }
    }

    /// Runs on this thread against `handle`'s channels until the window's end.
    pub fn run_on_thread(mut self, handle: &Handle) -> NodeLog {
        while Instant::now() < self.window.1 {
            self.propose_wanted(|message| handle.propose(message).is_ok());
            let Ok(event) = handle.events().recv_timeout(Duration::from_micros(500)) else {
                continue;
            };
            let mut moment = self.moment();
            self.record(event, moment);
            let mut recorded = 1u32;
            // Every event ready at once, not a receive call each.
            handle.events().drain_ready(|event| {
                if recorded.is_multiple_of(MOMENT_EVENTS) {
                    moment = self.moment();
                }
                self.record(event, moment);
                recorded += 1;
            });
        }
        self.log
    }

    /// The time now, for the events recorded next.
    fn moment(&self) -> Moment {
        let now = Instant::now();
        Moment {
            now_us: now.duration_since(self.origin).as_secs_f64() * 1e6,
            measuring: now >= self.window.0,
        }
    }
}

impl Application for NodeApp {
    fn turn(&mut self, node: &mut Control<'_>) -> Option<Duration> {
        self.propose_wanted(|message| node.propose(message).is_ok());
        match self.load {
            Some(Load::Paced { .. }) => {
                Some(self.next_batch.saturating_duration_since(Instant::now()))
            }
            _ => None,
        }
    }

    fn spin(&self) -> Duration {
        self.spin
    }

    fn event(&mut self, event: Event, node: &mut Control<'_>) {
        let closed = matches!(self.load, Some(Load::Closed { .. }));
        let own =
            matches!(&event, Event::Deliver { id, .. } if id.sender.node.0 as usize == self.node);
        self.record(event, self.moment());
        // A closed loop proposes again as soon as its own message is delivered, as the
        // thread's loop does after each batch of events.
        if closed && own {
            self.propose_wanted(|message| node.propose(message).is_ok());
        }
    }
}

/// A node's UTO-delivered order in blocks of [`CHECKPOINT_EVERY`] positions.
///
/// A node delivers consecutive positions except after [`Event::Gap`] (a state transfer:
/// it fell further behind than the members retained, or a view change cut its fetch
/// short), when it goes on at the gap's end. A block that a gap cut is not hashed, so that
/// a node's later blocks still compare with the others'; a jump with no gap reported is
/// itself a fault ([`OrderBlocks::jumps`]).
#[derive(Debug, Default)]
pub struct OrderBlocks {
    next: u64,
    hash: u64,
    cut: bool,
    gap_to: Option<u64>,
    /// Hash of each block the node delivered whole, by block number.
    pub blocks: BTreeMap<u64, u64>,
    /// Positions delivered.
    pub delivered: u64,
    /// Gaps reported.
    pub gaps: u64,
    /// Deliveries at another position than the next one, with no gap reported to it.
    pub jumps: u64,
}

impl OrderBlocks {
    /// Message `id` was delivered at `position`.
    pub fn deliver(&mut self, position: u64, id: MsgId) {
        if position != self.next && self.gap_to != Some(position) {
            self.jumps += 1;
        }
        self.gap_to = None;
        if position.is_multiple_of(CHECKPOINT_EVERY) {
            self.hash = 0;
            self.cut = false;
        } else if position != self.next {
            self.cut = true;
        }
        self.hash = tessera_order::log::chain(self.hash, id);
        self.next = position + 1;
        self.delivered += 1;
        if self.next.is_multiple_of(CHECKPOINT_EVERY) && !self.cut {
            self.blocks.insert(position / CHECKPOINT_EVERY, self.hash);
        }
    }

    /// The node reported a gap: it delivers from `to` on.
    pub fn gap(&mut self, from: u64, to: u64) {
        // Gaps may follow each other with nothing delivered between.
        if from != self.gap_to.unwrap_or(self.next) {
            self.jumps += 1;
        }
        self.gaps += 1;
        self.gap_to = Some(to);
    }
}

/// Where receivers' orders differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// The first block whose hashes differ (`None`: none differs, but a node jumped).
    pub block: Option<u64>,
    /// Two receivers (indices into the compared list) that differ there.
    pub nodes: (usize, usize),
}

/// Compares receivers' orders block by block: every block that two or more delivered
/// whole must hash alike, and no receiver may have jumped. The blocks compared (held by
/// two or more), or where they differ.
pub fn compare_orders(orders: &[&OrderBlocks]) -> Result<u64, Disagreement> {
    if let Some(node) = orders.iter().position(|o| o.jumps > 0) {
        return Err(Disagreement {
            block: None,
            nodes: (node, node),
        });
    }
    let mut first: BTreeMap<u64, (usize, u64, bool)> = BTreeMap::new();
    for (node, order) in orders.iter().enumerate() {
        for (&block, &hash) in &order.blocks {
            let seen = first.entry(block).or_insert((node, hash, false));
            if seen.1 != hash {
                return Err(Disagreement {
                    block: Some(block),
                    nodes: (seen.0, node),
                });
            }
            seen.2 |= seen.0 != node;
        }
    }
    Ok(first.values().filter(|seen| seen.2).count() as u64)
}

/// Messages of one millisecond's batch at `per_node_per_s`; fractions carry over in
/// `credit`, so that a rate under 1,000/s is not rounded up to one every millisecond.
pub fn paced_batch(credit: &mut f64, per_node_per_s: f64) -> u64 {
    *credit += per_node_per_s / 1000.0;
    let batch = credit.floor();
    *credit -= batch;
    batch as u64
}

fn stamp_us(message: &[u8]) -> f64 {
    u64::from_be_bytes(message[..8].try_into().expect("a stamp")) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_order::{NodeId, SenderId};

    fn id(seq: u64) -> MsgId {
        MsgId {
            sender: SenderId {
                node: NodeId((seq % 3) as u16),
                incarnation: 0,
            },
            seq,
        }
    }

    fn delivered(positions: impl Iterator<Item = u64>, order: &mut OrderBlocks) {
        for position in positions {
            order.deliver(position, id(position));
        }
    }

    /// A receiver that took a state transfer (two gaps in a row, as a view change can cut
    /// the first short) in its third block still compares with the others from its fourth
    /// block on; the cut block is not compared. (The lab's
    /// running hash over every delivery called such a run a bad order.)
    #[test]
    fn a_gap_cuts_one_block_and_later_blocks_still_compare() {
        let n = CHECKPOINT_EVERY;
        let mut whole = OrderBlocks::default();
        delivered(0..6 * n, &mut whole);
        let mut gapped = OrderBlocks::default();
        delivered(0..2 * n + 5, &mut gapped);
        gapped.gap(2 * n + 5, 2 * n + 300);
        gapped.gap(2 * n + 300, 2 * n + 700);
        delivered(2 * n + 700..6 * n, &mut gapped);
        assert_eq!(gapped.gaps, 2);
        assert_eq!(gapped.jumps, 0);
        assert_eq!(gapped.blocks.len(), 5);
        assert_eq!(compare_orders(&[&whole, &gapped]), Ok(5));
    }

    /// One message at another position, or a skip with no gap reported, is a disagreement.
    #[test]
    fn a_different_message_or_an_unexplained_skip_disagrees() {
        let n = CHECKPOINT_EVERY;
        let mut a = OrderBlocks::default();
        delivered(0..3 * n, &mut a);
        let mut b = OrderBlocks::default();
        delivered(0..n + 17, &mut b);
        b.deliver(n + 17, id(9_999_999));
        delivered(n + 18..3 * n, &mut b);
        let wrong = compare_orders(&[&a, &b]).unwrap_err();
        assert_eq!(wrong.block, Some(1));
        assert_eq!(wrong.nodes, (0, 1));
        let mut skipped = OrderBlocks::default();
        delivered(0..n, &mut skipped);
        delivered(n + 1..3 * n, &mut skipped);
        assert_eq!(skipped.jumps, 1);
        assert_eq!(compare_orders(&[&a, &skipped]).unwrap_err().block, None);
    }
}
