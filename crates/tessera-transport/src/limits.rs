//! Limits on what peers may hold of a TCP server: connections (per source address and in
//! total, the idle ones evicted first), time (idle connections and frames half-sent), and
//! memory (a budget of bytes buffered for frames received and not yet answered).
//!
//! Without them, 2,000 idle connections to the manager locked every client out, and 40
//! connections that each sent the header of an almost-24 MiB frame and nothing more took a
//! server from 70 MB to 1 GB of memory (the numbers). The rules:
//!
//! - **Connections.** At most `connections_max` in total and `connections_per_peer_max` per
//!   source IP address. A newcomer beyond either cap evicts the connection (of that peer, or
//!   of anyone) that has no request at the handler and has been silent longest, taking one
//!   still in its handshake before any authenticated one; only when every candidate is busy
//!   is the newcomer refused. Someone who holds connections open without using them
//!   therefore cannot keep out a client who comes to ask something, and a stranger who
//!   opens connections without a key (newcomers are strangers until their handshake
//!   completes) evicts only other strangers while there are any, however many it opens:
//!   clients that share its address (behind one NAT, or on 127.0.0.1) keep their sessions.
//! - **Time.** A connection with no request in progress and no byte for `idle_timeout` is
//!   closed. Once a frame has begun, its header must be complete within `header_timeout`
//!   and its body within `body_timeout_base` plus its length at `body_bytes_per_second_min`.
//! - **Memory.** A server-wide budget of `frame_bytes_budget` bytes for frames received and
//!   not yet answered. A frame's length is reserved from it once its header has been read
//!   (twice that for frames under 256 KiB, whose buffers come from the allocator, which
//!   keeps what growing them frees; larger ones get pages of their own), and released when
//!   the handler has answered; the buffer itself grows as the bytes arrive, so a header that
//!   announces megabytes and is followed by nothing costs no memory. Reserving the whole frame up front (rather than charging each chunk as it comes)
//!   is what keeps the budget free of deadlock: a frame that holds a reservation can always
//!   complete, whereas frames holding parts each could all wait for the rest. A frame that
//!   does not fit waits, its connection unread (TCP flow control stops its sender); smaller
//!   frames that fit go past it. While a frame waits, the reservation of the connection
//!   that has been silent longest in the middle of a frame is taken back (that connection
//!   is closed), so frames begun and stalled hold the budget only while nobody needs it.
//! - **Answers.** An answer's bytes come from the same budget: reserved before the request
//!   is handled, as far as the handler can tell its size
//!   ([`crate::FrameHandler::answer_bytes_hint`], a read's length), else once it is
//!   computed, and held until the answer is written; a request holds its place among the
//!   connection's 256 in progress until then too. Each answer must be taken by the peer
//!   within the time a frame of its length may take, and while anyone waits for the budget,
//!   a connection whose answers have not moved for [`BUDGET_HOLDER_SILENT_MIN`] is closed
//!   and its answers dropped. Without this, 8 connections asking for 256 reads of 1 MiB each
//!   and reading nothing made the server compute and hold all 2 GiB.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_wire::{FRAME_HEADER_BYTES, MESSAGE_BYTES_MAX, PAYLOAD_BYTES_MAX};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Largest frame a peer may send, header included.
pub const FRAME_BYTES_MAX: usize =
    FRAME_HEADER_BYTES + MESSAGE_BYTES_MAX as usize + PAYLOAD_BYTES_MAX as usize;

/// How long a connection waits for the frame budget before evicting a stalled holder.
pub const BUDGET_WAIT_EVICT: Duration = Duration::from_millis(200);
/// A connection evicted to free budget has been silent at least this long.
pub const BUDGET_HOLDER_SILENT_MIN: Duration = Duration::from_millis(100);

/// Limits of a TCP server. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpLimits {
    /// Connections open at once, in total.
    pub connections_max: usize,
    /// Connections open at once from one source IP address.
    pub connections_per_peer_max: usize,
    /// A connection with no request in progress and no byte for this long is closed.
    pub idle_timeout: Duration,
    /// A frame's header must be complete this long after its first byte.
    pub header_timeout: Duration,
    /// A frame's body must be complete this long after its header, plus its length at
    /// `body_bytes_per_second_min`.
    pub body_timeout_base: Duration,
    /// The slowest a frame's body may arrive.
    pub body_bytes_per_second_min: u64,
    /// Bytes buffered for frames received and not yet answered, across all connections.
    pub frame_bytes_budget: usize,
}

impl Default for TcpLimits {
    fn default() -> Self {
        TcpLimits {
            connections_max: 1024,
            connections_per_peer_max: 256,
            idle_timeout: Duration::from_secs(300),
            header_timeout: Duration::from_secs(5),
            body_timeout_base: Duration::from_secs(5),
            body_bytes_per_second_min: 1 << 20,
            frame_bytes_budget: 256 << 20,
        }
    }
}

/// Why a [`TcpLimits`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// A connection cap is zero, or the per-peer cap exceeds the total.
    #[error("connection caps must satisfy 1 <= per peer ({per_peer}) <= total ({total})")]
    Connections {
        /// `connections_per_peer_max`.
        per_peer: usize,
        /// `connections_max`.
        total: usize,
    },
    /// The budget cannot hold one frame of the largest size, which would then never be read.
    #[error("frame_bytes_budget {0} must hold the largest frame ({FRAME_BYTES_MAX} bytes)")]
    Budget(usize),
    /// A timeout or the minimum rate is zero.
    #[error("timeouts and body_bytes_per_second_min must be above zero")]
    Zero,
}

impl TcpLimits {
    /// Checks that the limits let a client through.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.connections_per_peer_max == 0
            || self.connections_per_peer_max > self.connections_max
        {
            return Err(LimitsError::Connections {
                per_peer: self.connections_per_peer_max,
                total: self.connections_max,
            });
        }
        if self.frame_bytes_budget < FRAME_BYTES_MAX {
            return Err(LimitsError::Budget(self.frame_bytes_budget));
        }
        let zero = Duration::ZERO;
        if self.idle_timeout == zero
            || self.header_timeout == zero
            || self.body_timeout_base == zero
            || self.body_bytes_per_second_min == 0
        {
            return Err(LimitsError::Zero);
        }
        Ok(())
    }

    /// How long the body of a frame of `body_bytes` may take to arrive.
    pub fn body_timeout(&self, body_bytes: usize) -> Duration {
        let per_second = self.body_bytes_per_second_min.max(1);
        self.body_timeout_base + Duration::from_millis(body_bytes as u64 * 1000 / per_second)
    }
}

/// One connection's entry in the table.
struct Entry {
    peer: IpAddr,
    /// Its handshake succeeded: evicted for a newcomer only when no stranger is left.
    authenticated: bool,
    /// When its last byte arrived or its last request was answered.
    active_at: Instant,
    /// Requests read and not yet answered.
    requests: u32,
    /// Bytes reserved for the frame being received.
    partial_bytes: usize,
    /// Waiting for a reservation: not silent by its own doing.
    waiting: bool,
    /// Bytes of answers handed to the connection's writer and not yet written.
    queued_bytes: usize,
    /// When the writer last made progress, or when its queue last became non-empty.
    written_at: Instant,
    /// Told to close when evicted.
    evicted: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Table {
    /// The idle connection (of `peer`, if given) to evict for a newcomer: one still in its
    /// handshake if there is any, the one silent longest among them.
    fn victim(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.requests == 0 && peer.is_none_or(|p| e.peer == p))
            .min_by_key(|(_, e)| (e.authenticated, e.active_at))
            .map(|(id, _)| *id)
    }

    /// The connections other than `except` that hold budget they do not use and have been
    /// stalled since `silent_since` at least: a half-received frame whose sender went silent
    /// (unless it waits for the budget itself), or answers whose reader stopped reading them
    /// (whether or not it also waits: a peer that does not read what it asked for has no
    /// claim to ask for more).
    fn budget_victims(&self, except: u64, silent_since: Instant, answers_only: bool) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(id, e)| {
                let frame_stalled = !answers_only
                    && e.requests == 0
                    && e.partial_bytes > 0
                    && !e.waiting
                    && e.active_at <= silent_since;
                let answers_stalled = e.queued_bytes > 0 && e.written_at <= silent_since;
                **id != except && (frame_stalled || answers_stalled)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        let count = self
            .per_peer
            .get_mut(&entry.peer)
            .expect("every entry is counted under its peer");
        *count -= 1;
        if *count == 0 {
            self.per_peer.remove(&entry.peer);
        }
        Some(entry)
    }

    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.remove(id) {
            entry.evicted.notify_one();
        }
    }
}

/// Bytes that frames in flight may reserve. Not a FIFO semaphore on purpose: a frame that
/// fits goes ahead of a larger one that waits, so that a queue of the largest frames cannot
/// hold up the small requests of everyone else.
struct Budget {
    free: Mutex<usize>,
    released: Notify,
}

impl Budget {
    fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let mut free = self.free.lock().unwrap();
        if *free < bytes {
            return None;
        }
        *free -= bytes;
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes of the frame budget held for one frame, given back when dropped.
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Reservation {
    /// The bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        *self.budget.free.lock().unwrap() += self.bytes;
        self.budget.released.notify_waiters();
    }
}

/// The connections of one server and its budget for frames in flight.
pub(crate) struct Limiter {
    limits: TcpLimits,
    table: Mutex<Table>,
    budget: Arc<Budget>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its peer has `connections_per_peer_max` connections, all busy.
    PeerFull,
    /// The server has `connections_max` connections, all busy.
    Full,
}

impl Limiter {
    /// Panics if the limits are invalid ([`TcpLimits::validate`]).
    pub(crate) fn new(limits: TcpLimits) -> Arc<Limiter> {
        if let Err(error) = limits.validate() {
            panic!("invalid TCP limits: {error}");
        }
        let budget = Arc::new(Budget {
            free: Mutex::new(limits.frame_bytes_budget),
            released: Notify::new(),
        });
        Arc::new(Limiter {
            limits,
            table: Mutex::new(Table::default()),
            budget,
        })
    }

    /// Admits a connection from `peer`, evicting an idle one if a cap is reached.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refused> {
        let mut table = self.table.lock().unwrap();
        if table.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.connections_per_peer_max {
            let victim = table.victim(Some(peer)).ok_or(Refused::PeerFull)?;
            table.evict(victim);
        }
        if table.entries.len() >= self.limits.connections_max {
            let victim = table.victim(None).ok_or(Refused::Full)?;
            table.evict(victim);
        }
        let id = table.next_id;
        table.next_id += 1;
        let evicted = Arc::new(Notify::new());
        table.entries.insert(
            id,
            Entry {
                peer,
                authenticated: false,
                active_at: Instant::now(),
                requests: 0,
                partial_bytes: 0,
                waiting: false,
                queued_bytes: 0,
                written_at: Instant::now(),
                evicted: evicted.clone(),
            },
        );
        *table.per_peer.entry(peer).or_insert(0) += 1;
        assert!(table.entries.len() <= self.limits.connections_max);
        Ok(Slot {
            limiter: self.clone(),
            id,
            evicted,
        })
    }

    /// Bytes of the frame budget free now.
    #[cfg(test)]
    fn budget_free(&self) -> usize {
        *self.budget.free.lock().unwrap()
    }
}

/// A connection's place in the table; leaving it (drop) frees the place.
pub(crate) struct Slot {
    limiter: Arc<Limiter>,
    id: u64,
    evicted: Arc<Notify>,
}

impl Slot {
    /// Completes when the connection was evicted for a newcomer.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await
    }

    /// The peer completed its handshake: from now on a newcomer evicts it only when no
    /// connection still in its handshake is left to evict.
    pub(crate) fn authenticated(&self) {
        self.limiter.update(self.id, |entry| {
            entry.authenticated = true;
            entry.active_at = Instant::now();
        });
    }

    /// Bytes arrived (or an answer went out).
    pub(crate) fn touch(&self) {
        if let Some(entry) = self.limiter.table.lock().unwrap().entries.get_mut(&self.id) {
            entry.active_at = Instant::now();
        }
    }

    /// Whether requests of this connection are at the handler.
    pub(crate) fn busy(&self) -> bool {
        let table = self.limiter.table.lock().unwrap();
        table.entries.get(&self.id).is_some_and(|e| e.requests > 0)
    }

    /// A request was read; it is in progress until the returned guard is dropped.
    pub(crate) fn request(&self) -> RequestGuard {
        if let Some(entry) = self.limiter.table.lock().unwrap().entries.get_mut(&self.id) {
            entry.requests += 1;
        }
        RequestGuard {
            limiter: self.limiter.clone(),
            id: self.id,
        }
    }

    pub(crate) fn limits(&self) -> &TcpLimits {
        &self.limiter.limits
    }

    /// Reserves `bytes` of the frame budget for the frame being received, waiting until they
    /// fit, and evicting stalled holders meanwhile ([`Limiter::take_budget`]), so that peers
    /// who begin frames and stop, or ask for answers and do not read them, cannot keep the
    /// budget from those who send.
    pub(crate) async fn reserve(&self, bytes: usize) -> Reservation {
        let reservation = self.limiter.take_budget(self.id, bytes).await;
        self.limiter.update(self.id, |entry| {
            entry.partial_bytes = bytes;
            entry.active_at = Instant::now();
        });
        reservation
    }

    /// The budget of this connection's answers, for the tasks that compute and write them.
    pub(crate) fn answers(&self) -> AnswerBudget {
        AnswerBudget {
            limiter: self.limiter.clone(),
            id: self.id,
        }
    }

    /// The frame being received is complete: its bytes go to the handler with it.
    pub(crate) fn frame_read(&self) {
        self.limiter.update(self.id, |entry| {
            entry.partial_bytes = 0;
            entry.active_at = Instant::now();
        });
    }
}

impl Limiter {
    /// Runs `change` on connection `id`'s entry, if it is still in the table.
    fn update(&self, id: u64, change: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.table.lock().unwrap().entries.get_mut(&id) {
            change(entry);
        }
    }

    /// Takes `bytes` of the budget for connection `id`, waiting until they fit. While it
    /// waits, every [`BUDGET_WAIT_EVICT`] it evicts the connections that hold budget they
    /// do not use and have been stalled for [`BUDGET_HOLDER_SILENT_MIN`] at least
    /// ([`Table::budget_victims`]).
    async fn take_budget(&self, id: u64, bytes: usize) -> Reservation {
        let budget = &self.budget;
        loop {
            let released = budget.released.notified();
            tokio::pin!(released);
            // Registered before looking, so that a release in between is not missed.
            released.as_mut().enable();
            if let Some(reservation) = budget.try_take(bytes) {
                self.update(id, |entry| entry.waiting = false);
                return reservation;
            }
            self.update(id, |entry| entry.waiting = true);
            // Peers not reading their answers go at once; frames stalled midway are given
            // the time of a wait first (a sender may be slow rather than gone).
            self.evict_stalled(id, true);
            if tokio::time::timeout(BUDGET_WAIT_EVICT, released)
                .await
                .is_err()
            {
                self.evict_stalled(id, false);
            }
        }
    }

    /// Evicts the connections other than `id` stalled for [`BUDGET_HOLDER_SILENT_MIN`] at
    /// least ([`Table::budget_victims`]), or only those with answers unread.
    fn evict_stalled(&self, id: u64, answers_only: bool) {
        let mut table = self.table.lock().unwrap();
        let silent_since = Instant::now() - BUDGET_HOLDER_SILENT_MIN;
        for victim in table.budget_victims(id, silent_since, answers_only) {
            tracing::info!("evicting a stalled connection to free the frame budget");
            table.evict(victim);
        }
    }
}

/// The budget of one connection's answers: an answer's bytes are reserved (from the budget
/// frames use) before it is computed, as far as the handler can tell its size, and held until
/// it is written. Without it, a peer that sends requests for large answers and never reads
/// them makes the server hold every answer: 256 requests in progress of 24 MiB each per
/// connection. A connection whose answers wait unwritten while others wait for the budget is
/// evicted like one that stalls in the middle of a frame.
#[derive(Clone)]
pub(crate) struct AnswerBudget {
    limiter: Arc<Limiter>,
    id: u64,
}

impl AnswerBudget {
    /// Reserves `bytes` for an answer, waiting until they fit (see [`Limiter::take_budget`]).
    pub(crate) async fn reserve(&self, bytes: usize) -> Reservation {
        self.limiter.take_budget(self.id, bytes).await
    }

    /// An answer of `bytes` was handed to the writer.
    pub(crate) fn queued(&self, bytes: usize) {
        self.limiter.update(self.id, |entry| {
            if entry.queued_bytes == 0 {
                entry.written_at = Instant::now();
            }
            entry.queued_bytes += bytes;
        });
    }

    /// The writer wrote part of an answer.
    pub(crate) fn progressed(&self) {
        self.limiter
            .update(self.id, |entry| entry.written_at = Instant::now());
    }

    /// The writer finished (or dropped) an answer of `bytes`.
    pub(crate) fn written(&self, bytes: usize) {
        self.limiter.update(self.id, |entry| {
            entry.queued_bytes = entry.queued_bytes.saturating_sub(bytes);
            entry.written_at = Instant::now();
            entry.active_at = Instant::now();
        });
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter.table.lock().unwrap().remove(self.id);
    }
}

/// A request at the handler; its connection is busy (not evicted) until this is dropped.
pub(crate) struct RequestGuard {
    limiter: Arc<Limiter>,
    id: u64,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(entry) = self.limiter.table.lock().unwrap().entries.get_mut(&self.id) {
            entry.requests -= 1;
            entry.active_at = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize) -> TcpLimits {
        TcpLimits {
            connections_max: total,
            connections_per_peer_max: per_peer,
            ..TcpLimits::default()
        }
    }

    #[tokio::test]
    async fn a_newcomer_evicts_the_idle_connection_silent_longest() {
        let limiter = Limiter::new(limits(3, 3));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limiter.admit(a).unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let second = limiter.admit(a).unwrap();
        let third = limiter.admit(a).unwrap();
        let _busy = first.request();
        second.touch();
        // The first is busy, the second touched since: the third goes.
        let _fourth = limiter.admit(b).unwrap();
        tokio::time::timeout(Duration::from_secs(1), third.evicted())
            .await
            .expect("the idle connection silent longest is told to go");
        assert!(!limiter
            .table
            .lock()
            .unwrap()
            .entries
            .contains_key(&third.id));
    }

    #[tokio::test]
    async fn strangers_evict_strangers_not_authenticated_sessions_of_their_address() {
        // One address for all, as on 127.0.0.1 or behind a NAT: the per-peer cap cannot
        // tell the client from the attacker, the handshake can.
        let limiter = Limiter::new(limits(8, 4));
        let shared: IpAddr = "10.0.0.1".parse().unwrap();
        let client = limiter.admit(shared).unwrap();
        client.authenticated();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut strangers: Vec<Slot> = Vec::new();
        for _ in 0..2_000 {
            strangers.push(limiter.admit(shared).unwrap());
        }
        let evicted = tokio::time::timeout(Duration::from_millis(50), client.evicted()).await;
        assert!(
            evicted.is_err(),
            "a stranger evicted an authenticated session"
        );
        {
            let table = limiter.table.lock().unwrap();
            assert!(table.entries.contains_key(&client.id));
            assert_eq!(table.per_peer[&shared], 4);
        }
        // With no stranger left to take, a newcomer still finds room (the session silent
        // longest goes), so idle sessions cannot lock clients out either.
        let sessions: Vec<Slot> = strangers.drain(..).rev().take(3).collect();
        for session in &sessions {
            session.authenticated();
        }
        let _newcomer = limiter.admit(shared).unwrap();
        tokio::time::timeout(Duration::from_secs(1), client.evicted())
            .await
            .expect("the session silent longest makes room once no stranger is left");
    }

    #[tokio::test]
    async fn when_every_connection_is_busy_the_newcomer_is_refused() {
        let limiter = Limiter::new(limits(2, 1));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limiter.admit(a).unwrap();
        let _guard = first.request();
        assert_eq!(limiter.admit(a).err(), Some(Refused::PeerFull));
        let second = limiter.admit(b).unwrap();
        let _guard = second.request();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        assert_eq!(limiter.admit(c).err(), Some(Refused::Full));
        drop(_guard);
        // Once idle, it makes room.
        assert!(limiter.admit(c).is_ok());
    }

    #[tokio::test]
    async fn one_peer_is_held_to_its_cap_without_touching_the_others() {
        let limiter = Limiter::new(limits(10, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let other = limiter.admit(b).unwrap();
        let slots: Vec<Slot> = (0..50).map(|_| limiter.admit(a).unwrap()).collect();
        let table = limiter.table.lock().unwrap();
        assert_eq!(table.per_peer[&a], 2);
        assert!(table.entries.contains_key(&other.id));
        drop(table);
        drop(slots);
        assert_eq!(limiter.table.lock().unwrap().entries.len(), 1);
    }

    #[tokio::test]
    async fn a_frame_waits_for_the_budget_and_smaller_ones_go_past_it() {
        let limiter = Limiter::new(TcpLimits {
            frame_bytes_budget: 2 * FRAME_BYTES_MAX,
            ..TcpLimits::default()
        });
        let slot = limiter.admit("10.0.0.1".parse().unwrap()).unwrap();
        let held = slot.reserve(2 * FRAME_BYTES_MAX - 100).await;
        assert_eq!(limiter.budget_free(), 100);
        let other = limiter.admit("10.0.0.2".parse().unwrap()).unwrap();
        let large = other.reserve(1_000);
        tokio::pin!(large);
        let waited = tokio::time::timeout(Duration::from_millis(50), large.as_mut()).await;
        assert!(waited.is_err(), "a frame past the budget waits");
        let third = limiter.admit("10.0.0.3".parse().unwrap()).unwrap();
        let small = tokio::time::timeout(Duration::from_millis(50), third.reserve(100)).await;
        assert!(small.is_ok(), "a frame that fits goes past the waiting one");
        drop(small);
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), large)
            .await
            .expect("released bytes admit it");
    }

    #[tokio::test]
    async fn a_waiting_frame_evicts_the_stalled_holder_not_another_waiter() {
        let limiter = Limiter::new(TcpLimits {
            frame_bytes_budget: 2 * FRAME_BYTES_MAX,
            ..TcpLimits::default()
        });
        let stalled = limiter.admit("10.0.0.1".parse().unwrap()).unwrap();
        let _held = stalled.reserve(2 * FRAME_BYTES_MAX).await;
        let first = limiter.admit("10.0.0.2".parse().unwrap()).unwrap();
        let second = limiter.admit("10.0.0.3".parse().unwrap()).unwrap();
        let waiting = tokio::spawn(async move {
            let _ = second.reserve(10).await;
            second
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The stalled holder is told to go once a waiter has waited long enough.
        let evicted = tokio::time::timeout(Duration::from_secs(2), stalled.evicted()).await;
        assert!(evicted.is_ok(), "the stalled holder was not evicted");
        let table = limiter.table.lock().unwrap();
        assert!(table.entries.contains_key(&first.id));
        drop(table);
        waiting.abort();
    }

    #[test]
    fn invalid_limits_are_refused() {
        assert!(TcpLimits::default().validate().is_ok());
        assert!(limits(4, 5).validate().is_err());
        assert!(limits(4, 0).validate().is_err());
        let small = TcpLimits {
            frame_bytes_budget: FRAME_BYTES_MAX - 1,
            ..TcpLimits::default()
        };
        assert_eq!(
            small.validate(),
            Err(LimitsError::Budget(FRAME_BYTES_MAX - 1))
        );
    }
}
