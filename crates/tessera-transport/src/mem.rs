//! An in-memory network for simulations: addresses map to [`FrameHandler`]s in the same
//! process, and a [`MemTransport`] calls them directly, with seeded faults.
//!
//! A [`MemNetwork`] is what the sockets are for the other transports. Daemons
//! [`listen`](MemNetwork::listen) on an address with their handler; clients get a
//! [`MemTransport`] from [`MemNetwork::transport`]. Each (transport, address) pair is one
//! *connection* with its own [`ConnectionId`], as a TCP connection is: parity locks belong to
//! it, and it is closed ([`FrameHandler::closed`]) when the transport is dropped (the client
//! process died) or the daemon [`crash`](MemNetwork::crash)es.
//!
//! Faults come from one seeded generator, so a run replays from its seed: a request or its
//! answer dropped (the caller waits out its timeout, as it would for a lost datagram or a
//! silent peer), a delay before delivery, an address partitioned (every call to it times out),
//! a daemon crashed (calls to it are refused until it listens again; requests it had not
//! started are lost, those it had started finish, as a disk write already issued does).
//!
//! Deliveries are serialized network-wide by default: one handler runs at a time, in the order
//! requests arrive (one that waits for another request, such as a parity lock, gives up its
//! turn after [`TURN_MAX`] of virtual time). The storage server runs disk calls on tokio's blocking pool, whose threads
//! finish in any order; with one delivery at a time, what the servers see, and so the whole
//! run on a current-thread runtime, follows from the seed alone. Time is tokio's clock, so a
//! runtime started paused makes every timeout and delay virtual.

use crate::{BoxFuture, ConnectionId, FrameHandler, Reply, Transport, TransportError};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a request keeps the network's turn while its handler waits. Disk calls on tokio's
/// blocking pool stop a paused clock from advancing, so only a handler waiting for another
/// request (a parity lock) ever reaches this, in virtual time.
const TURN_MAX: Duration = Duration::from_millis(1);

/// Probabilities and bounds of the faults a [`MemNetwork`] injects into every call.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MemFaults {
    /// Chance that a request is lost on the way (never handled).
    pub drop_request: f64,
    /// Chance that an answer is lost on the way back (the request *was* handled).
    pub drop_answer: f64,
    /// Chance that a request waits before delivery.
    pub delay: f64,
    /// Longest such wait (uniform from 0).
    pub delay_max: Duration,
}

/// What the network did, for reports and for tests that the faults were exercised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Calls made.
    pub calls: u64,
    /// Requests handed to a handler.
    pub delivered: u64,
    /// Requests dropped by a fault.
    pub requests_dropped: u64,
    /// Answers dropped by a fault.
    pub answers_dropped: u64,
    /// Requests delayed.
    pub delayed: u64,
    /// Calls to an address nobody listens on.
    pub refused: u64,
    /// Calls to a partitioned address.
    pub partitioned: u64,
    /// Requests never started because their connection closed first.
    pub discarded: u64,
}

/// A daemon listening on an address.
struct Host {
    handler: Arc<dyn FrameHandler>,
    /// Which incarnation of the daemon at this address: bumped by every crash.
    epoch: u64,
    /// Open connections: (transport, connection).
    connections: BTreeMap<u64, ConnectionId>,
}

struct Inner {
    rng: StdRng,
    faults: MemFaults,
    hosts: BTreeMap<SocketAddr, Host>,
    /// Epochs survive a host's absence, so a restarted daemon never reuses one.
    epochs: BTreeMap<SocketAddr, u64>,
    partitioned: BTreeSet<SocketAddr>,
    /// Live transports.
    transports: BTreeSet<u64>,
    next_transport: u64,
    next_connection: ConnectionId,
    stats: MemStats,
    /// Requests being handled, by delivery: address, connection and how long the request is.
    handling: BTreeMap<u64, (SocketAddr, ConnectionId, usize)>,
    next_delivery: u64,
}

/// What a call decided before it was sent.
struct Plan {
    drop_request: bool,
    drop_answer: bool,
    delay: Option<Duration>,
}

/// The network: hosts by address, the fault generator, the delivery order.
pub struct MemNetwork {
    inner: Mutex<Inner>,
    /// Held while a handler runs, when deliveries are serialized.
    serial: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Calls so far, watched by [`MemNetwork::calls_reached`].
    calls: tokio::sync::watch::Sender<u64>,
    /// Requests sent and not yet answered or discarded by their daemon.
    in_flight: tokio::sync::watch::Sender<u64>,
}

impl MemNetwork {
    /// A network without faults whose generator starts from `seed`, delivering one request at
    /// a time.
    pub fn new(seed: u64) -> Arc<MemNetwork> {
        Self::with_order(seed, true)
    }

    /// A network whose deliveries are serialized (`serial`) or run concurrently.
    pub fn with_order(seed: u64, serial: bool) -> Arc<MemNetwork> {
        Arc::new(MemNetwork {
            inner: Mutex::new(Inner {
                rng: StdRng::seed_from_u64(seed),
                faults: MemFaults::default(),
                hosts: BTreeMap::new(),
                epochs: BTreeMap::new(),
                partitioned: BTreeSet::new(),
                transports: BTreeSet::new(),
                next_transport: 1,
                next_connection: 1,
                stats: MemStats::default(),
                handling: BTreeMap::new(),
                next_delivery: 0,
            }),
            serial: serial.then(|| Arc::new(tokio::sync::Mutex::new(()))),
            calls: tokio::sync::watch::channel(0).0,
            in_flight: tokio::sync::watch::channel(0).0,
        })
    }

    /// Set the faults injected from now on.
    pub fn set_faults(&self, faults: MemFaults) {
        self.inner.lock().unwrap().faults = faults;
    }

    /// Serve `addr` with `handler` (a daemon starts or restarts there).
    pub fn listen(&self, addr: SocketAddr, handler: Arc<dyn FrameHandler>) {
        let mut inner = self.inner.lock().unwrap();
        let epoch = *inner
            .epochs
            .entry(addr)
            .and_modify(|e| *e += 1)
            .or_insert(1);
        let old = inner.hosts.insert(
            addr,
            Host {
                handler,
                epoch,
                connections: BTreeMap::new(),
            },
        );
        assert!(old.is_none(), "{addr} is already served: crash it first");
    }

    /// The daemon at `addr` dies: its connections close (their locks are released), calls to
    /// it are refused until something listens there again. Returns whether one was there.
    pub fn crash(&self, addr: SocketAddr) -> bool {
        let host = self.inner.lock().unwrap().hosts.remove(&addr);
        let Some(host) = host else { return false };
        for connection in host.connections.values() {
            host.handler.closed(*connection);
        }
        true
    }

    /// Cut `addr` off (`true`: every call to it times out) or heal it.
    pub fn partition(&self, addr: SocketAddr, cut: bool) {
        let mut inner = self.inner.lock().unwrap();
        if cut {
            inner.partitioned.insert(addr);
        } else {
            inner.partitioned.remove(&addr);
        }
    }

    /// Heal every partition.
    pub fn heal(&self) {
        self.inner.lock().unwrap().partitioned.clear();
    }

    /// Whether something listens at `addr`.
    pub fn is_listening(&self, addr: SocketAddr) -> bool {
        self.inner.lock().unwrap().hosts.contains_key(&addr)
    }

    /// What the network has done so far.
    pub fn stats(&self) -> MemStats {
        self.inner.lock().unwrap().stats
    }

    /// A client's transport: its calls time out after `request_timeout`.
    pub fn transport(self: &Arc<Self>, request_timeout: Duration) -> MemTransport {
        let mut inner = self.inner.lock().unwrap();
        let id = inner.next_transport;
        inner.next_transport += 1;
        inner.transports.insert(id);
        MemTransport {
            network: self.clone(),
            id,
            request_timeout,
        }
    }

    /// Resolves once `n` calls have been made in all (a simulator cancels a client there).
    pub async fn calls_reached(&self, n: u64) {
        let mut calls = self.calls.subscribe();
        let _ = calls.wait_for(|&made| made >= n).await;
    }

    /// Resolves once every request sent has been answered or discarded by its daemon (those of
    /// a cancelled caller included), so that nothing more lands on a store.
    pub async fn quiesce(&self) {
        let mut in_flight = self.in_flight.subscribe();
        let _ = in_flight.wait_for(|&n| n == 0).await;
    }

    /// Requests being handled now: daemon, connection, request bytes (for a simulator's report
    /// of a request that never ends).
    pub fn waiting(&self) -> Vec<(SocketAddr, ConnectionId, usize)> {
        self.inner
            .lock()
            .unwrap()
            .handling
            .values()
            .copied()
            .collect()
    }

    /// Draw this call's faults, counting it.
    fn plan(&self) -> Plan {
        let mut inner = self.inner.lock().unwrap();
        inner.stats.calls += 1;
        let faults = inner.faults;
        let rng = &mut inner.rng;
        let drop_request = faults.drop_request > 0.0 && rng.gen_bool(faults.drop_request);
        let drop_answer = faults.drop_answer > 0.0 && rng.gen_bool(faults.drop_answer);
        let delay = (faults.delay > 0.0 && rng.gen_bool(faults.delay))
            .then(|| faults.delay_max.mul_f64(rng.gen::<f64>()));
        Plan {
            drop_request,
            drop_answer,
            delay,
        }
    }

    /// The handler, epoch and connection for a call from `transport` to `addr`, opening the
    /// connection if needed; `None` if nothing listens there or the transport is gone.
    fn connect(
        &self,
        transport: u64,
        addr: SocketAddr,
    ) -> Option<(Arc<dyn FrameHandler>, u64, ConnectionId)> {
        let mut inner = self.inner.lock().unwrap();
        if !inner.transports.contains(&transport) {
            return None;
        }
        let next = inner.next_connection;
        let host = inner.hosts.get_mut(&addr)?;
        let connection = *host.connections.entry(transport).or_insert(next);
        let handler = host.handler.clone();
        let epoch = host.epoch;
        if connection == next {
            inner.next_connection += 1;
        }
        Some((handler, epoch, connection))
    }

    /// Whether `connection` is still open at the daemon of `epoch` at `addr`.
    fn is_open(&self, addr: SocketAddr, epoch: u64, connection: ConnectionId) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.hosts.get(&addr).is_some_and(|host| {
            host.epoch == epoch && host.connections.values().any(|&c| c == connection)
        })
    }

    fn count(&self, what: impl FnOnce(&mut MemStats)) {
        what(&mut self.inner.lock().unwrap().stats);
    }

    /// A transport is gone (its process died): close its connections everywhere.
    fn drop_transport(&self, transport: u64) {
        let hosts: Vec<SocketAddr> = {
            let mut inner = self.inner.lock().unwrap();
            // Gone from the set first: no call of it opens a connection meanwhile.
            inner.transports.remove(&transport);
            inner.hosts.keys().copied().collect()
        };
        for addr in hosts {
            self.close_connection(transport, addr);
        }
    }

    /// `transport`'s connection to `addr` is closed (its caller reset it): the daemon hears
    /// so, and the next call opens another.
    fn close_connection(&self, transport: u64, addr: SocketAddr) {
        let closing = {
            let mut inner = self.inner.lock().unwrap();
            inner.hosts.get_mut(&addr).and_then(|host| {
                let connection = host.connections.remove(&transport)?;
                Some((host.handler.clone(), connection))
            })
        };
        if let Some((handler, connection)) = closing {
            handler.closed(connection);
        }
    }

    /// Hand one request to the daemon at `addr` and wait for its answer. Runs as a task of its
    /// own, so that a caller that gives up does not stop a request the daemon has begun.
    async fn deliver(
        self: Arc<Self>,
        addr: SocketAddr,
        (handler, epoch, connection): (Arc<dyn FrameHandler>, u64, ConnectionId),
        message: Bytes,
        payload: Bytes,
    ) -> Option<(Bytes, Bytes)> {
        let _pending = Pending(&self.in_flight);
        let turn = match &self.serial {
            Some(serial) => Some(serial.clone().lock_owned().await),
            None => None,
        };
        if !self.is_open(addr, epoch, connection) {
            self.count(|s| s.discarded += 1);
            return None;
        }
        let delivery = {
            let mut inner = self.inner.lock().unwrap();
            inner.stats.delivered += 1;
            inner.next_delivery += 1;
            let delivery = inner.next_delivery;
            let entry = (addr, connection, message.len() + payload.len());
            inner.handling.insert(delivery, entry);
            delivery
        };
        let answer = match handler.handle_now(connection, &message, &payload) {
            Some(answer) => answer,
            None => {
                let mut work = handler.handle(connection, message, payload);
                match tokio::time::timeout(TURN_MAX, &mut work).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        // Waiting for something other than the disk (a parity lock another
                        // connection holds): let the others go, or that wait never ends.
                        drop(turn);
                        work.await
                    }
                }
            }
        };
        self.inner.lock().unwrap().handling.remove(&delivery);
        if !self.is_open(addr, epoch, connection) {
            // Closed while the request ran: whatever it took (a parity lock) goes too, as the
            // daemon's connection reader would release it after its last request.
            handler.closed(connection);
            return None;
        }
        answer
    }
}

/// Counts a request as answered when its delivery ends, however it ends.
struct Pending<'a>(&'a tokio::sync::watch::Sender<u64>);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// A client's side of a [`MemNetwork`]: one connection per address, closed when dropped.
pub struct MemTransport {
    network: Arc<MemNetwork>,
    id: u64,
    request_timeout: Duration,
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        self.network.drop_transport(self.id);
    }
}

impl MemTransport {
    async fn call_inner(
        network: Arc<MemNetwork>,
        transport: u64,
        timeout: Duration,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> Result<Reply, TransportError> {
        let plan = network.plan();
        network.calls.send_modify(|n| *n += 1);
        let timed_out = TransportError::Timeout {
            addr,
            timeout_ms: timeout.as_millis() as u64,
        };
        let partitioned = network.inner.lock().unwrap().partitioned.contains(&addr);
        if partitioned || plan.drop_request {
            network.count(|s| match partitioned {
                true => s.partitioned += 1,
                false => s.requests_dropped += 1,
            });
            tokio::time::sleep(timeout).await;
            return Err(timed_out);
        }
        if let Some(delay) = plan.delay {
            network.count(|s| s.delayed += 1);
            tokio::time::sleep(delay).await;
        }
        let Some(peer) = network.connect(transport, addr) else {
            network.count(|s| s.refused += 1);
            return Err(TransportError::Connect {
                addr,
                detail: "nothing listens there (simulated)".into(),
            });
        };
        network.in_flight.send_modify(|n| *n += 1);
        let task = tokio::spawn(network.clone().deliver(addr, peer, message, payload));
        let answer = match tokio::time::timeout(timeout, task).await {
            Err(_) => return Err(timed_out),
            Ok(joined) => joined.expect("a handler does not panic"),
        };
        let Some((message, payload)) = answer else {
            return Err(TransportError::Disconnected {
                addr,
                detail: "connection closed (simulated)".into(),
            });
        };
        if plan.drop_answer {
            network.count(|s| s.answers_dropped += 1);
            tokio::time::sleep(timeout).await;
            return Err(timed_out);
        }
        Ok(Reply { message, payload })
    }
}

impl Transport for MemTransport {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        Box::pin(Self::call_inner(
            self.network.clone(),
            self.id,
            self.request_timeout,
            addr,
            message,
            payload,
        ))
    }

    fn reset(&self, addr: SocketAddr) -> BoxFuture<'static, ()> {
        self.network.close_connection(self.id, addr);
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Echoes the message and counts requests and closed connections.
    #[derive(Default)]
    struct Echo {
        handled: AtomicU64,
        closed: Mutex<Vec<ConnectionId>>,
    }

    impl FrameHandler for Echo {
        fn handle(
            &self,
            _connection: ConnectionId,
            message: Bytes,
            payload: Bytes,
        ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
            self.handled.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Some((message, payload)) })
        }

        fn closed(&self, connection: ConnectionId) {
            self.closed.lock().unwrap().push(connection);
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(1);

    fn addr() -> SocketAddr {
        "10.0.0.1:1".parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn calls_reach_the_handler_and_closing_reaches_it_too() {
        let network = MemNetwork::new(1);
        let echo = Arc::new(Echo::default());
        network.listen(addr(), echo.clone());
        let transport = network.transport(TIMEOUT);
        let reply = transport
            .call(addr(), Bytes::from_static(b"m"), Bytes::from_static(b"p"))
            .await
            .unwrap();
        assert_eq!(
            (&reply.message[..], &reply.payload[..]),
            (&b"m"[..], &b"p"[..])
        );
        drop(transport);
        assert_eq!(
            echo.closed.lock().unwrap().len(),
            1,
            "the dead client's connection"
        );
        // A crashed daemon refuses calls; its connections are closed.
        let transport = network.transport(TIMEOUT);
        transport
            .call(addr(), Bytes::new(), Bytes::new())
            .await
            .unwrap();
        assert!(network.crash(addr()));
        assert_eq!(echo.closed.lock().unwrap().len(), 2);
        let refused = transport.call(addr(), Bytes::new(), Bytes::new()).await;
        assert!(
            matches!(refused, Err(TransportError::Connect { .. })),
            "{refused:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_connection_is_closed_and_the_next_call_opens_another() {
        let network = MemNetwork::new(3);
        let echo = Arc::new(Echo::default());
        network.listen(addr(), echo.clone());
        let transport = network.transport(TIMEOUT);
        let call = || transport.call(addr(), Bytes::new(), Bytes::new());
        call().await.unwrap();
        transport.reset(addr()).await;
        let first = echo.closed.lock().unwrap().clone();
        assert_eq!(first.len(), 1, "the reset closed the connection");
        call().await.unwrap();
        drop(transport);
        let closed = echo.closed.lock().unwrap().clone();
        assert_eq!(closed.len(), 2);
        assert_ne!(
            closed[0], closed[1],
            "the call after the reset came on a new one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn partitions_and_lost_messages_time_out_and_lost_answers_were_handled() {
        let network = MemNetwork::new(7);
        let echo = Arc::new(Echo::default());
        network.listen(addr(), echo.clone());
        let transport = network.transport(TIMEOUT);
        network.partition(addr(), true);
        let start = tokio::time::Instant::now();
        let cut = transport.call(addr(), Bytes::new(), Bytes::new()).await;
        assert!(
            matches!(cut, Err(TransportError::Timeout { .. })),
            "{cut:?}"
        );
        assert_eq!(start.elapsed(), TIMEOUT, "virtual time");
        assert_eq!(echo.handled.load(Ordering::SeqCst), 0);
        network.heal();
        network.set_faults(MemFaults {
            drop_answer: 1.0,
            ..MemFaults::default()
        });
        let lost = transport.call(addr(), Bytes::new(), Bytes::new()).await;
        assert!(
            matches!(lost, Err(TransportError::Timeout { .. })),
            "{lost:?}"
        );
        assert_eq!(
            echo.handled.load(Ordering::SeqCst),
            1,
            "handled, answer lost"
        );
        let stats = network.stats();
        assert_eq!((stats.partitioned, stats.answers_dropped), (1, 1));
    }
}
