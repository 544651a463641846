//! A node's application in a total-order run: proposes by a [`Load`] until the window's
//! end and records what is delivered. It runs one of two ways ([`AppMode`]): on the node's
//! driver thread ([`tessera_order_udp::Application`], the latency runs' default: no hand-off
//! between the node and the application), or on a thread of its own behind the driver's
//! channels (every delivery and proposal a wake-up of the other thread; the throughput
//! runs' default).

use super::load::{Load, NodeLog};
use bytes::Bytes;
use std::time::{Duration, Instant};
use tessera_order::Event;
use tessera_order_udp::{Application, Control, Handle};

/// Bytes at the start of every message: the proposer's clock (microseconds since the run's
/// origin, shared by every thread of the process) and the proposing node.
pub const STAMP_BYTES: usize = 10;
/// Deliveries between two checkpoints of a node's order (a running hash of the identities).
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
    order_hash: u64,
    positions: u64,
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
            order_hash: 0,
            positions: 0,
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
        for _ in 0..self.want(Instant::now()) {
            let stamp = self.origin.elapsed().as_micros() as u64;
            self.message[..8].copy_from_slice(&stamp.to_be_bytes());
            if !propose(Bytes::copy_from_slice(&self.message)) {
                break;
            }
            self.proposed += 1;
        }
    }

    /// Records one event of the node.
    fn record(&mut self, event: Event) {
        let now_us = self.origin.elapsed().as_micros() as f64;
        let measuring = Instant::now() >= self.window.0;
        let log = &mut self.log;
        match event {
            Event::Optimistic { message, .. }
                if measuring && log.po_us.len() < LATENCY_SAMPLES_MAX =>
            {
                log.po_us.push(now_us - stamp_us(&message));
            }
            Event::Deliver { id, message, .. } => {
                if id.sender.node.0 as usize == self.node {
                    self.own_delivered += 1;
                }
                if measuring {
                    log.delivered_in_window += 1;
                    if log.uto_us.len() < LATENCY_SAMPLES_MAX {
                        log.uto_us.push(now_us - stamp_us(&message));
                    }
                }
                self.order_hash = tessera_order::log::chain(self.order_hash, id);
                self.positions += 1;
                if self.positions.is_multiple_of(CHECKPOINT_EVERY) {
                    log.checkpoints.push(self.order_hash);
                }
            }
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
            let mut next = Some(event);
            while let Some(event) = next {
                self.record(event);
                next = handle.events().try_recv().ok();
            }
        }
        self.log
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
        self.record(event);
        // A closed loop proposes again as soon as its own message is delivered, as the
        // thread's loop does after each batch of events.
        if closed && own {
            self.propose_wanted(|message| node.propose(message).is_ok());
        }
    }
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
