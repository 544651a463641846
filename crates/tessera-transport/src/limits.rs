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
//!   of anyone) that has no request at the handler and has been silent longest; only when
//!   every candidate is busy is the newcomer refused. Someone who holds connections open
//!   without using them therefore cannot keep out a client who comes to ask something.
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
    /// When its last byte arrived or its last request was answered.
    active_at: Instant,
    /// Requests read and not yet answered.
    requests: u32,
    /// Bytes reserved for the frame being received.
    partial_bytes: usize,
    /// Waiting for a reservation: not silent by its own doing.
    waiting: bool,
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
    /// The idle connection (of `peer`, if given) silent longest.
    fn victim(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.requests == 0 && peer.is_none_or(|p| e.peer == p))
            .min_by_key(|(_, e)| e.active_at)
            .map(|(id, _)| *id)
    }

    /// The connection other than `except` whose half-received frame holds a reservation and
    /// that has been silent longest, if silent since `silent_since` at least.
    fn budget_victim(&self, except: u64, silent_since: Instant) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(id, e)| {
                **id != except
                    && e.requests == 0
                    && e.partial_bytes > 0
                    && !e.waiting
                    && e.active_at <= silent_since
            })
            .min_by_key(|(_, e)| e.active_at)
            .map(|(id, _)| *id)
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
                active_at: Instant::now(),
                requests: 0,
                partial_bytes: 0,
                waiting: false,
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
    /// fit. While it waits, every [`BUDGET_WAIT_EVICT`] it evicts the connection whose
    /// half-received frame holds a reservation and that has been silent longest (at least
    /// [`BUDGET_HOLDER_SILENT_MIN`]; connections waiting themselves are not silent by their
    /// own doing), so that peers who begin frames and stop cannot keep the budget from those
    /// who send.
    pub(crate) async fn reserve(&self, bytes: usize) -> Reservation {
        let budget = &self.limiter.budget;
        loop {
            let released = budget.released.notified();
            tokio::pin!(released);
            // Registered before looking, so that a release in between is not missed.
            released.as_mut().enable();
            if let Some(reservation) = budget.try_take(bytes) {
                self.set_reserved(bytes, false);
                return reservation;
            }
            self.set_reserved(0, true);
            if tokio::time::timeout(BUDGET_WAIT_EVICT, released)
                .await
                .is_err()
            {
                let mut table = self.limiter.table.lock().unwrap();
                let silent_since = Instant::now() - BUDGET_HOLDER_SILENT_MIN;
                if let Some(victim) = table.budget_victim(self.id, silent_since) {
                    tracing::info!("evicting a stalled frame to free the frame budget");
                    table.evict(victim);
                }
            }
        }
    }

    fn set_reserved(&self, bytes: usize, waiting: bool) {
        if let Some(entry) = self.limiter.table.lock().unwrap().entries.get_mut(&self.id) {
            entry.partial_bytes = bytes;
            entry.waiting = waiting;
            if !waiting {
                entry.active_at = Instant::now();
            }
        }
    }

    /// The frame being received is complete: its bytes go to the handler with it.
    pub(crate) fn frame_read(&self) {
        self.set_reserved(0, false);
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
