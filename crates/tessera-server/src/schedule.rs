//! Deadline-ordered service of the disk (Radon, issue 18 item 4).
//!
//! Requests that wait for the disk (reads, writes, overflow writes) take one of a server's
//! disk slots; the rest wait in [`Scheduler`], which decides who goes next:
//!
//! - reserved requests ([`Service::Reserved`]) earliest deadline first, ties in arrival order;
//! - then best effort ([`Service::BestEffort`]) and rebuild/scrub ([`Service::Background`])
//!   together in arrival order, except that background requests wait while they are over the
//!   server's rebuild rate (a token bucket in time: at most `rate` bytes/s, bursts of
//!   [`BACKGROUND_BURST_US`] of it).
//!
//! Best effort never starves forever: while an unreserved request is eligible, at most
//! [`RESERVED_RUN_MAX`] reserved requests go in a row before the oldest eligible unreserved
//! one does. So a best-effort request with `k` eligible unreserved requests ahead of it is
//! dispatched within `(k + 1) * (RESERVED_RUN_MAX + 1)` dispatches, whatever reserved traffic
//! arrives. (A reserved request may so wait behind one unreserved request per
//! [`RESERVED_RUN_MAX`] reserved ones: the price of that rule.)
//!
//! [`Scheduler`] is pure (time passed in as µs, tickets out); [`DiskQueue`] runs it for the
//! async handler, waking each request when its slot comes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tessera_wire::{Service, StorageRequest};
use tokio::sync::oneshot;

/// Reserved requests dispatched in a row while an unreserved one is eligible to go.
pub const RESERVED_RUN_MAX: u32 = 8;
/// Disk requests served at once by default: enough to keep a disk's queue busy, few enough
/// that a reserved request arriving behind a bulk scan waits for at most these.
pub const DISK_SLOTS_DEFAULT: u32 = 8;
/// How far background work may run ahead of its rate after a pause: 100 ms of it.
pub const BACKGROUND_BURST_US: u64 = 100_000;

/// How a server orders its disk work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Disk requests served at once (at least 1).
    pub disk_slots: u32,
    /// Most bytes/s of rebuild and scrub traffic (`None`: no cap).
    pub rebuild_bytes_per_s: Option<u64>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            disk_slots: DISK_SLOTS_DEFAULT,
            rebuild_bytes_per_s: None,
        }
    }
}

/// A request waiting in (or dispatched by) a [`Scheduler`], in arrival order.
pub type Ticket = u64;

/// What a scheduler has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Reserved requests dispatched.
    pub reserved: u64,
    /// Best-effort requests dispatched.
    pub best_effort: u64,
    /// Rebuild and scrub requests dispatched.
    pub background: u64,
    /// Unreserved requests dispatched while a reserved one waited (the starvation rule's turns).
    pub unreserved_ahead_of_reserved: u64,
    /// Requests waiting now.
    pub waiting: u64,
}

/// The pure queue: requests with deadlines in, dispatch order out.
#[derive(Debug)]
pub struct Scheduler {
    config: ScheduleConfig,
    slots_busy: u32,
    next_ticket: Ticket,
    /// Reserved requests by (absolute deadline µs, ticket).
    reserved: BinaryHeap<Reverse<(u64, Ticket)>>,
    best_effort: VecDeque<Ticket>,
    /// Background requests and their bytes.
    background: VecDeque<(Ticket, u64)>,
    /// Reserved requests dispatched since an unreserved one last went while one was eligible.
    reserved_run: u32,
    /// The background token bucket as a time: background may go once the clock reaches it.
    background_free_at_us: u64,
    stats: ScheduleStats,
}

impl Scheduler {
    /// An empty queue with all slots free.
    pub fn new(config: ScheduleConfig) -> Scheduler {
        assert!(config.disk_slots >= 1, "a server needs a disk slot");
        Scheduler {
            config,
            slots_busy: 0,
            next_ticket: 0,
            reserved: BinaryHeap::new(),
            best_effort: VecDeque::new(),
            background: VecDeque::new(),
            reserved_run: 0,
            background_free_at_us: 0,
            stats: ScheduleStats::default(),
        }
    }

    /// A request of `bytes` arrives at `now_us` to be served as `service` asks.
    pub fn enqueue(&mut self, service: Service, bytes: u64, now_us: u64) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        match service {
            Service::Reserved { deadline_us } => {
                let deadline = now_us.saturating_add(deadline_us);
                self.reserved.push(Reverse((deadline, ticket)));
            }
            Service::BestEffort => self.best_effort.push_back(ticket),
            Service::Background => self.background.push_back((ticket, bytes)),
        }
        self.stats.waiting += 1;
        ticket
    }

    /// The next request to take a free slot at `now_us`, if a slot is free and one may go.
    pub fn dispatch(&mut self, now_us: u64) -> Option<Ticket> {
        if self.slots_busy >= self.config.disk_slots {
            return None;
        }
        let unreserved = self.unreserved_head(now_us);
        if unreserved.is_none() {
            // Nobody unreserved is kept waiting: the run counts from the next one's arrival.
            self.reserved_run = 0;
        }
        let reserved_turn = unreserved.is_none() || self.reserved_run < RESERVED_RUN_MAX;
        let ticket = match self.reserved.peek() {
            Some(&Reverse((_, ticket))) if reserved_turn => {
                self.reserved.pop();
                self.stats.reserved += 1;
                if unreserved.is_some() {
                    self.reserved_run += 1;
                }
                ticket
            }
            _ => {
                let (ticket, background) = unreserved?;
                if !self.reserved.is_empty() {
                    self.stats.unreserved_ahead_of_reserved += 1;
                }
                self.reserved_run = 0;
                self.take_unreserved(background, now_us);
                ticket
            }
        };
        self.slots_busy += 1;
        self.stats.waiting -= 1;
        Some(ticket)
    }

    /// The oldest unreserved request that may go at `now_us`, and whether it is background.
    fn unreserved_head(&self, now_us: u64) -> Option<(Ticket, bool)> {
        let best_effort = self.best_effort.front().copied();
        let background = self
            .background
            .front()
            .filter(|_| self.background_free_at_us <= now_us)
            .map(|&(ticket, _)| ticket);
        match (best_effort, background) {
            (Some(b), Some(g)) if g < b => Some((g, true)),
            (Some(b), _) => Some((b, false)),
            (None, Some(g)) => Some((g, true)),
            (None, None) => None,
        }
    }

    fn take_unreserved(&mut self, background: bool, now_us: u64) {
        if !background {
            self.best_effort.pop_front();
            self.stats.best_effort += 1;
            return;
        }
        let (_, bytes) = self.background.pop_front().expect("a head was found");
        self.stats.background += 1;
        if let Some(rate) = self.config.rebuild_bytes_per_s {
            let rate = rate.max(1);
            let cost_us =
                u64::try_from(u128::from(bytes) * 1_000_000 / u128::from(rate)).unwrap_or(u64::MAX);
            let start = self
                .background_free_at_us
                .max(now_us.saturating_sub(BACKGROUND_BURST_US));
            self.background_free_at_us = start.saturating_add(cost_us);
        }
    }

    /// A dispatched request is done: its slot is free.
    pub fn finish(&mut self) {
        assert!(self.slots_busy > 0, "finish without a dispatch");
        self.slots_busy -= 1;
    }

    /// When a background request held back by the rebuild rate may go, if one waits.
    pub fn background_ready_at_us(&self) -> Option<u64> {
        self.background.front().map(|_| self.background_free_at_us)
    }

    /// What it has done so far.
    pub fn stats(&self) -> ScheduleStats {
        self.stats
    }
}

/// The bytes a request moves to or from the disk, if it waits for a disk slot: reads,
/// writes, overflow writes. Everything else is small, waits on locks (a lock holder must
/// never wait for a slot a lock waiter holds), or is answered from memory.
pub fn queued_bytes(request: &StorageRequest, payload_bytes: usize) -> Option<u64> {
    match request {
        StorageRequest::Read { len, .. } => Some(u64::from(*len)),
        StorageRequest::Write { .. } | StorageRequest::OverflowWrite { .. } => {
            Some(payload_bytes as u64)
        }
        _ => None,
    }
}

/// The scheduler of a running server: a request awaits [`DiskQueue::slot`] before it goes to
/// the disk and holds the slot until done.
pub struct DiskQueue {
    epoch: std::time::Instant,
    state: Mutex<QueueState>,
}

struct QueueState {
    scheduler: Scheduler,
    /// Wakers of the requests still waiting.
    waiting: HashMap<Ticket, oneshot::Sender<()>>,
    /// A wake-up for rate-held background work is pending.
    timer_armed: bool,
}

/// A disk slot held (or waited for): given back when dropped.
pub struct DiskSlot {
    queue: Arc<DiskQueue>,
    ticket: Ticket,
}

impl DiskQueue {
    /// A queue ordering a server's disk work as `config` says.
    pub fn new(config: ScheduleConfig) -> Arc<DiskQueue> {
        Arc::new(DiskQueue {
            epoch: std::time::Instant::now(),
            state: Mutex::new(QueueState {
                scheduler: Scheduler::new(config),
                waiting: HashMap::new(),
                timer_armed: false,
            }),
        })
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Waits for a disk slot for a request of `bytes` served as `service`.
    pub async fn slot(self: &Arc<Self>, service: Service, bytes: u64) -> DiskSlot {
        let (wake, woken) = oneshot::channel();
        let ticket = {
            let mut state = self.state.lock().expect("queue lock");
            let ticket = state.scheduler.enqueue(service, bytes, self.now_us());
            state.waiting.insert(ticket, wake);
            self.pump(&mut state);
            ticket
        };
        // Made before the wait, so that a request dropped while waiting gives its turn back.
        let slot = DiskSlot {
            queue: self.clone(),
            ticket,
        };
        let _ = woken.await;
        slot
    }

    /// What the scheduler has done so far.
    pub fn stats(&self) -> ScheduleStats {
        self.state.lock().expect("queue lock").scheduler.stats()
    }

    /// Hands free slots to the requests next in order.
    fn pump(self: &Arc<Self>, state: &mut QueueState) {
        let now_us = self.now_us();
        while let Some(ticket) = state.scheduler.dispatch(now_us) {
            let woken = state.waiting.remove(&ticket).map(|wake| wake.send(()));
            if !matches!(woken, Some(Ok(()))) {
                // Its request was dropped while it waited: the slot is free again.
                state.scheduler.finish();
            }
        }
        let held = state.scheduler.background_ready_at_us();
        if let Some(at_us) = held.filter(|&at| at > now_us && !state.timer_armed) {
            state.timer_armed = true;
            let queue = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_micros(at_us - now_us)).await;
                let mut state = queue.state.lock().expect("queue lock");
                state.timer_armed = false;
                queue.pump(&mut state);
            });
        }
    }
}

impl Drop for DiskSlot {
    fn drop(&mut self) {
        let mut state = self.queue.state.lock().expect("queue lock");
        // Still waiting: its turn is given back when it comes (see `pump`).
        if state.waiting.remove(&self.ticket).is_none() {
            state.scheduler.finish();
            self.queue.pump(&mut state);
        }
    }
}

#[cfg(test)]
mod tests;
