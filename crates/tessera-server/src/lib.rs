//! Tessera's storage server daemon.
//!
//! This crate owns the glue between a transport and a [`tessera_store::Store`]: it decodes
//! [`StorageRequest`]s, refuses those meant for another store (see [`StorageCall`]), runs the
//! rest against the store, keeps the CSAR parity locks per connection (leased and fenced:
//! released when the connection goes, or broken when their holder stays silent past
//! [`PARITY_LEASE`] while another locker waits; see `tessera_store`'s intent records for what
//! happens to the holder's half-done write), and keeps the server registered and heartbeating with the metadata
//! manager. Small reads the page cache holds are answered on the transport's network thread
//! ([`Store::read_cached`]); everything that may wait for the disk runs on the blocking pool,
//! reads and writes after waiting for a disk slot in [`schedule`]'s order (reserved streams
//! earliest deadline first, then best effort and rate-capped rebuild).
//! It holds no layout knowledge: the client tells it byte offsets in its data, redundancy and
//! overflow files. It keeps the file records clients describe (`StorageRequest::Describe`,
//! stamped with its cluster) and lists them for `tessera manager recover`
//! (`StorageRequest::Records`, answered whatever store the call names, since recovery does not
//! know the incarnations yet; a record stamped with another cluster is listed as damaged). A
//! manager without a store refuses it ([`ManagerError::NoStore`]); it logs why once and keeps
//! asking, so that it joins as soon as the store is recovered. Every peer is authenticated when
//! it connects (`keys.rs`: the admin and the servers by keys derived from the cluster secret,
//! clients by the storage keys of their access keys, which the manager hands out), and the
//! server proves itself to the manager with the servers' key.

use bytes::Bytes;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tessera_store::{ParityLocks, Region, StaleState, Store};
use tessera_transport::{
    serve_tcp_limited, serve_udp, BoxFuture, ConnectionId, DatagramConfig, FrameHandler,
    ManagerReplicas, TcpConfig, TcpLimits, TcpTransport, Transport, TransportKind, UdpCounters,
    UdpServer,
};
use tessera_wire::{
    encode_message, IndexRange, ManagerError, ManagerRequest, ManagerResponse, OverflowExtent,
    ServerId, StorageCall, StorageError, StorageRequest, StorageResponse, RECORDS_PER_PAGE,
};
use tokio::time::Instant;

mod inline;
mod keys;
pub mod metrics;
mod mirror_fence;
pub mod schedule;
mod snapshot;
pub use keys::{STORAGE_KEYS_INTERVAL, STORAGE_KEYS_REFRESH_MIN};
pub use schedule::ScheduleConfig;

/// Largest read or write answered on the network thread when the page cache holds or takes
/// it (see [`Store::read_cached`], [`Store::write_cached`]); a larger copy goes to the
/// blocking pool, so that the network thread
/// is never busy long enough to delay ACKs and retransmissions (256 KiB is ~50 us of copying
/// and checksumming, ~2 ms on a 1 Gbit/s wire).
pub const INLINE_BYTES_MAX: u32 = 256 << 10;

/// How long a parity lock lasts past its holder's last request to this server (grant,
/// intent, renewal, parity write): a few retransmission timeouts and request round trips, so
/// that the lock of a client that died is broken well within a second, while a live holder
/// renews it (the client renews every third of it while its data requests are out).
pub const PARITY_LEASE: Duration = Duration::from_millis(600);

/// Longest a `LockParity` waits in the queue before it is answered `LockBusy`: well inside a
/// client's request timeout, so that waiting for a lock is never taken for a dead server.
pub const PARITY_LOCK_WAIT_MAX: Duration = Duration::from_secs(2);
/// Longest a `ReadIntent` waits for a live stale-parity record before it answers `waited`
/// (the client then reads the stripe and asks again): below any client's request timeout.
pub const READ_INTENT_WAIT_MAX: Duration = Duration::from_millis(500);

/// How often the server tells the manager it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(300);

/// Heartbeats between two askings of the manager for orphans (removed files whose data this
/// server still holds): every 3 s.
pub const ORPHAN_POLL_HEARTBEATS: u32 = 10;

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory could not be opened as a store.
    #[error("cannot open store at {dir}: {error}")]
    Store {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: StorageError,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {detail}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        detail: String,
    },
}

/// What a server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The manager's address.
    pub manager: SocketAddr,
    /// Every replica of a replicated manager, `manager` among them (empty: `manager` only).
    /// Registration and heartbeats go to one, and to the next when it does not answer.
    pub manager_replicas: Vec<SocketAddr>,
    /// Address to listen on (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Address to advertise to clients; defaults to the bound address.
    pub advertise: Option<SocketAddr>,
    /// Data directory.
    pub dir: PathBuf,
    /// Id to claim at registration if the store has none yet.
    pub id: Option<ServerId>,
    /// What clients reach it over (the manager is always reached over TCP).
    pub transport: TransportKind,
    /// The datagram protocol's settings, when `transport` is UDP.
    pub datagram: DatagramConfig,
    /// What TCP peers may hold: connections, idle time, memory for frames in flight.
    pub tcp: TcpLimits,
    /// The cluster secret: the server authenticates to the manager, and accepts the admin,
    /// with keys derived from it.
    pub secret: tessera_auth::Secret,
    /// How disk work is ordered: disk slots, the rebuild rate cap (see [`schedule`]).
    pub schedule: ScheduleConfig,
}

/// A running server.
pub struct RunningServer {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its id, once registered (0 until then).
    id: Arc<AtomicU32>,
    store: Arc<Store>,
    /// Its metrics, and the counters read at each scrape.
    metrics: (Arc<metrics::ServerMetrics>, Counters),
    serve: tokio::task::JoinHandle<()>,
    /// The datagram server's I/O thread, stopped when this is dropped.
    _udp: Option<UdpServer>,
    heartbeat: tokio::task::JoinHandle<()>,
    /// Keeps the client access keys up to date.
    fetch_keys: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// The id the manager knows this server by, once registered.
    pub fn id(&self) -> Option<ServerId> {
        match self.id.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// A handle on its metrics, for a scrape endpoint.
    pub fn metrics(&self) -> MetricsHandle {
        MetricsHandle(self.metrics.0.clone(), self.metrics.1.clone())
    }

    /// Wait until the server has registered with the manager.
    pub async fn registered(&self) -> ServerId {
        loop {
            if let Some(id) = self.id() {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Run until the serving task ends (it does not, short of a panic).
    pub async fn wait(self) {
        let _ = self.serve.await;
        self.heartbeat.abort();
        self.fetch_keys.abort();
    }

    /// Stop serving at once (as a crash would, but for the page cache).
    pub fn stop(self) {
        self.serve.abort();
        self.heartbeat.abort();
        self.fetch_keys.abort();
    }

    /// Stop serving, then make everything written durable.
    pub async fn shutdown(self) -> Result<(), StorageError> {
        self.serve.abort();
        self.heartbeat.abort();
        self.fetch_keys.abort();
        let store = self.store;
        blocking(move || store.sync()).await
    }
}

/// A running server's metrics, cheap to clone.
#[derive(Clone)]
pub struct MetricsHandle(Arc<metrics::ServerMetrics>, Counters);

impl MetricsHandle {
    /// The metrics in Prometheus's text format.
    pub async fn text(&self) -> String {
        self.0
            .render(&self.1.counters().await, self.1.disk.get().await)
    }
}

/// Open the store, start serving and keep registered with the manager.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let dir = config.dir.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&dir))
        .await
        .expect("store open does not panic")
        .map_err(|error| ServerError::Store {
            dir: config.dir.clone(),
            error,
        })?;
    let store = Arc::new(store);
    let listen_error = |e: std::io::Error| ServerError::Listen {
        addr: config.listen,
        detail: e.to_string(),
    };
    let id = Arc::new(AtomicU32::new(0));
    let managers = if config.manager_replicas.is_empty() {
        vec![config.manager]
    } else {
        config.manager_replicas.clone()
    };
    let managers = Arc::new(ManagerReplicas::new(managers));
    let keys = Arc::new(keys::ServerKeys::new(&config.secret, managers.clone()));
    let metrics = Arc::new(metrics::ServerMetrics::default());
    let handler = Arc::new(StorageHandler {
        queue: schedule::DiskQueue::new(config.schedule),
        keys: keys.clone(),
        store: store.clone(),
        locks: Arc::new(ParityLocks::new(PARITY_LEASE, rand::random::<u64>() >> 16)),
        fences: Arc::default(),
        id: id.clone(),
        counters: Arc::new(OnceLock::new()),
        reads: Arc::new(ReadCounts::default()),
        inline_writes: Arc::default(),
        metrics: metrics.clone(),
        disk: Arc::new(metrics::DiskGauge::new(store.clone())),
    });
    // TCP is always served; with the datagram transport, UDP is served on the same port number
    // too, so clients of either kind (and benchmarks comparing them) reach the same server.
    let listener = tessera_transport::listen(config.listen).map_err(listen_error)?;
    let addr = listener.local_addr().map_err(listen_error)?;
    let udp_counters = OnceLock::new();
    let udp = match config.transport {
        TransportKind::Tcp => None,
        TransportKind::Udp => {
            let socket = std::net::UdpSocket::bind(addr).map_err(listen_error)?;
            // Every session is keyed by a handshake over TCP first (see `keys.rs`).
            let datagram = DatagramConfig {
                require_session_keys: true,
                ..config.datagram.clone()
            };
            let server = serve_udp(socket, handler.clone(), datagram).map_err(listen_error)?;
            let _ = handler.counters.set(server.counters());
            let _ = udp_counters.set(server.counters());
            Some(server)
        }
    };
    let serve = tokio::spawn(serve_tcp_limited(
        listener,
        handler.clone(),
        config.tcp.clone(),
    ));
    let advertise = config.advertise.unwrap_or(addr);
    let fetch_keys = tokio::spawn(keys::keep_keys(keys.clone()));
    let heartbeat = tokio::spawn(keep_registered(
        keys.credential,
        managers,
        advertise,
        store.clone(),
        config.id,
        id.clone(),
    ));
    let scrape = Counters {
        udp: udp_counters.get().cloned(),
        reads: handler.reads.clone(),
        inline_writes: handler.inline_writes.clone(),
        metrics: metrics.clone(),
        queue: handler.queue.clone(),
        disk: handler.disk.clone(),
    };
    Ok(RunningServer {
        addr,
        id,
        store,
        metrics: (metrics, scrape),
        serve,
        _udp: udp,
        heartbeat,
        fetch_keys,
    })
}

/// The request handling of a server with id `id` (0: not registered yet) over `store`, without
/// sockets, heartbeats or registration: what [`start`] serves, for a caller that moves the
/// frames itself (a simulator's in-memory network). Its parity locks are its own, so a handler
/// dropped and made anew for a reopened store is a restarted server.
pub fn handler(store: Arc<Store>, id: ServerId) -> Arc<dyn FrameHandler> {
    handler_scheduled(store, id, ScheduleConfig::default())
}

/// [`handler`], its disk work ordered as `schedule` says.
pub fn handler_scheduled(
    store: Arc<Store>,
    id: ServerId,
    schedule: ScheduleConfig,
) -> Arc<dyn FrameHandler> {
    Arc::new(StorageHandler {
        queue: schedule::DiskQueue::new(schedule),
        disk: Arc::new(metrics::DiskGauge::new(store.clone())),
        store,
        // Tokens start at random, as in `start`, so that a holder from before a restart is
        // never mistaken for a new one.
        locks: Arc::new(ParityLocks::new(PARITY_LEASE, rand::random::<u64>() >> 16)),
        fences: Arc::default(),
        id: Arc::new(AtomicU32::new(id)),
        counters: Arc::new(OnceLock::new()),
        reads: Arc::new(ReadCounts::default()),
        inline_writes: Arc::default(),
        metrics: Arc::default(),
        // Nothing authenticates through this handler (its caller moves the frames itself, past
        // any handshake), so its keys come from a random secret no peer holds and are never
        // fetched.
        keys: Arc::new(keys::ServerKeys::new(
            &tessera_auth::Secret::from_bytes(rand::random()),
            Arc::new(ManagerReplicas::new(vec![SocketAddr::from((
                [0, 0, 0, 0],
                0,
            ))])),
        )),
    })
}

/// Register (once an id is known, re-register whenever the manager forgets us) and heartbeat.
async fn keep_registered(
    credential: tessera_auth::Credential,
    managers: Arc<ManagerReplicas>,
    advertise: SocketAddr,
    store: Arc<Store>,
    wanted_id: Option<ServerId>,
    id: Arc<AtomicU32>,
) {
    let transport: Arc<TcpTransport> = Arc::new(TcpTransport::with_credential(
        TcpConfig {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(3),
        },
        Some(credential),
    ));
    let incarnation = store.incarnation();
    let mut registered = false;
    // Said once per run of refusals, not every heartbeat interval.
    let mut refusal_logged = false;
    let mut beats = 0u32;
    loop {
        // The replica heartbeats go to; the next one when it does not answer or cannot
        // order, and the group learned from the replicas as it changes.
        let (current, manager) = managers.current();
        let request = match (registered, store.cluster_id()) {
            (true, Some(cluster)) => ManagerRequest::Heartbeat {
                server: id.load(Ordering::Acquire),
                incarnation,
                cluster,
            },
            (_, cluster) => ManagerRequest::Register {
                server: store.server_id().or(wanted_id),
                addr: advertise.to_string(),
                incarnation,
                cluster,
            },
        };
        let answer = tessera_transport::call::<_, ManagerResponse>(
            &transport as &dyn Transport,
            manager,
            &request,
            Bytes::new(),
        )
        .await;
        // Only a replica that answered is asked for the group: one that did not would keep
        // the heartbeats waiting for it a second time.
        let answered = match &answer {
            Ok((ManagerResponse::Error(ManagerError::Unordered(_)), _)) | Err(_) => false,
            Ok(_) => true,
        };
        match answer {
            Ok((
                ManagerResponse::Registered {
                    server, cluster, ..
                },
                _,
            )) => {
                if (store.server_id(), store.cluster_id()) != (Some(server), Some(cluster)) {
                    let store = store.clone();
                    let saved =
                        tokio::task::spawn_blocking(move || store.set_membership(cluster, server))
                            .await;
                    if !matches!(saved, Ok(Ok(()))) {
                        // Not registered until it is remembered: a heartbeat needs the cluster.
                        tracing::error!(
                            "cannot persist server id {server} of cluster {cluster:#x}"
                        );
                        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
                        continue;
                    }
                }
                id.store(server, Ordering::Release);
                registered = true;
                refusal_logged = false;
            }
            Ok((ManagerResponse::Error(ManagerError::UnknownServer(_)), _)) => registered = false,
            Ok((ManagerResponse::Error(e @ ManagerError::NoStore { .. }), _)) => {
                // The manager lost its store: it must not hand this server's files to a new,
                // empty cluster. Wait, saying why once, until its store is recovered.
                if !refusal_logged {
                    tracing::error!("manager {manager} refused this server: {e}");
                    refusal_logged = true;
                }
                registered = false;
            }
            Ok((ManagerResponse::Error(e @ ManagerError::WrongCluster { .. }), _)) => {
                // The manager's address now belongs to another cluster's manager. Stay out of
                // it (serving its clients would hand them this cluster's bytes) and keep asking,
                // in case ours comes back there.
                if !refusal_logged {
                    tracing::error!("manager {manager} refused this server: {e}");
                    refusal_logged = true;
                }
                registered = false;
            }
            Ok((ManagerResponse::Error(ManagerError::Unordered(why)), _)) => {
                tracing::debug!("manager replica {manager} cannot order now: {why}");
                managers.fail_over(current);
            }
            Ok((other, _)) => tracing::warn!("manager answered {other:?}"),
            Err(
                e @ (tessera_transport::TransportError::Refused { .. }
                | tessera_transport::TransportError::NotAuthentic { .. }),
            ) => {
                // A manager of another cluster (or a wrong secret): the handshake failed.
                if !refusal_logged {
                    tracing::error!(
                        "manager {manager} refused this server (the handshake failed): {e}"
                    );
                    refusal_logged = true;
                }
                registered = false;
            }
            Err(e) => {
                tracing::debug!("manager {manager} unreachable: {e}");
                managers.fail_over(current);
                if current + 1 == managers.len() {
                    managers.learn_from_any(&transport as &dyn Transport).await;
                }
            }
        }
        if registered && answered && managers.begin_learning(Instant::now()) {
            managers.learn(&transport as &dyn Transport, manager).await;
        }
        beats = beats.wrapping_add(1);
        if registered && beats.is_multiple_of(ORPHAN_POLL_HEARTBEATS) {
            let server = id.load(Ordering::Acquire);
            remove_orphans(&transport as &dyn Transport, manager, &store, server).await;
        }
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
    }
}

/// Deletes the data of files the manager has removed (a replaced file, a pending file whose
/// writer died, a file removed while this server was down), makes that durable, and tells the
/// manager which are gone. The manager never calls servers, so servers ask; a failure here is
/// tried again at the next poll.
async fn remove_orphans(
    transport: &dyn Transport,
    manager: SocketAddr,
    store: &Arc<Store>,
    server: ServerId,
) {
    let ask = ManagerRequest::Orphans { server };
    let files = match tessera_transport::call(transport, manager, &ask, Bytes::new()).await {
        Ok((ManagerResponse::Orphans(files), _)) if !files.is_empty() => files,
        _ => return,
    };
    let store = store.clone();
    let removed = tokio::task::spawn_blocking(move || {
        // Tombstones first: a late write from a writer stalled past the file's lease is then
        // refused, never made again here after the manager has forgotten the file.
        let removed = store.bury(&files)?;
        // Gone for good before the manager forgets them.
        store.sync().map(|()| removed)
    })
    .await;
    let Ok(Ok(files)) = removed else {
        tracing::warn!("cannot remove orphaned files");
        return;
    };
    let told = ManagerRequest::OrphansRemoved { server, files };
    let _ = tessera_transport::call::<_, ManagerResponse>(transport, manager, &told, Bytes::new())
        .await;
}

struct StorageHandler {
    /// The keys peers are authenticated with.
    keys: Arc<keys::ServerKeys>,
    store: Arc<Store>,
    locks: Arc<ParityLocks>,
    /// Writes held back while a scrub repairs a copy here.
    fences: Arc<mirror_fence::MirrorFences>,
    id: Arc<AtomicU32>,
    /// The datagram transport's counters, once it serves.
    counters: Arc<OnceLock<UdpCounters>>,
    reads: Arc<ReadCounts>,
    /// Writes answered on the network thread, and whether they are paused.
    inline_writes: Arc<inline::InlineWrites>,
    metrics: Arc<metrics::ServerMetrics>,
    /// Orders the requests that wait for the disk.
    queue: Arc<schedule::DiskQueue>,
    /// The store's disk usage, walked now and then.
    disk: Arc<metrics::DiskGauge>,
}

/// Reads answered, by where: reported with the transport's counters.
#[derive(Debug, Default)]
struct ReadCounts {
    /// On the network thread, from the page cache.
    inline: AtomicU64,
    /// On the blocking pool.
    waited: AtomicU64,
}

/// What a `TransportCounters` request reports.
#[derive(Clone)]
struct Counters {
    udp: Option<UdpCounters>,
    reads: Arc<ReadCounts>,
    inline_writes: Arc<inline::InlineWrites>,
    /// Requests and payload bytes served, in total (`tessera top` turns them into rates).
    metrics: Arc<metrics::ServerMetrics>,
    queue: Arc<schedule::DiskQueue>,
    disk: Arc<metrics::DiskGauge>,
}

impl Counters {
    /// Everything: [`Counters::counters`] and the disk's usage.
    async fn all(&self) -> Vec<(String, u64)> {
        let mut all = self.counters().await;
        if let Some(disk) = self.disk.get().await {
            all.extend(metrics::disk_counters(&disk));
        }
        all
    }

    /// The transport's counters, reads by where, request totals and the disk queue's.
    async fn counters(&self) -> Vec<(String, u64)> {
        let mut all = match &self.udp {
            Some(udp) => udp.get().await,
            None => Vec::new(),
        };
        all.push((
            "reads_inline".into(),
            self.reads.inline.load(Ordering::Relaxed),
        ));
        all.push((
            "reads_waited".into(),
            self.reads.waited.load(Ordering::Relaxed),
        ));
        let writes = &self.inline_writes;
        all.extend([
            ("writes_inline".into(), writes.done.load(Ordering::Relaxed)),
            (
                "writes_inline_slow".into(),
                writes.slow.load(Ordering::Relaxed),
            ),
        ]);
        all.extend(self.metrics.totals());
        let queue = self.queue.stats();
        all.extend([
            ("queue_reserved".into(), queue.reserved),
            ("queue_best_effort".into(), queue.best_effort),
            ("queue_background".into(), queue.background),
            (
                "queue_unreserved_ahead_of_reserved".into(),
                queue.unreserved_ahead_of_reserved,
            ),
            ("queue_waiting".into(), queue.waiting),
        ]);
        all
    }
}

impl FrameHandler for StorageHandler {
    fn peer_key(&self, claim: &tessera_auth::Claim) -> Option<tessera_auth::Key> {
        self.keys.key(claim)
    }

    fn datagram_keyed(&self, session: u64, key: tessera_auth::Key) {
        self.keys.datagram_keyed(session, key);
    }

    fn datagram_key(&self, session: u64) -> Option<tessera_auth::Key> {
        self.keys.take_datagram_key(session)
    }

    fn refresh_keys(&self) -> BoxFuture<'static, bool> {
        let keys = self.keys.clone();
        Box::pin(async move { keys.fetch(keys::STORAGE_KEYS_REFRESH_MIN).await })
    }

    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let (request, service) = match self.admit(&message) {
            Ok(admitted) => admitted,
            Err(answer) => return Box::pin(async move { answer }),
        };
        let store = self.store.clone();
        let locks = self.locks.clone();
        let fences = self.fences.clone();
        let id = self.id.load(Ordering::Acquire);
        let counters = Counters {
            udp: self.counters.get().cloned(),
            reads: self.reads.clone(),
            inline_writes: self.inline_writes.clone(),
            metrics: self.metrics.clone(),
            queue: self.queue.clone(),
            disk: self.disk.clone(),
        };
        let queued = schedule::queued_bytes(&request, payload.len())
            .filter(|_| !DISK_INLINE.with(|cell| cell.get()))
            .map(|bytes| (self.queue.clone(), bytes));
        let (metrics, kind, received) = (
            self.metrics.clone(),
            metrics::kind_of(&request),
            payload.len(),
        );
        let started = std::time::Instant::now();
        Box::pin(async move {
            // Held back by a mirror fence before a disk slot is taken, so that the writes
            // waiting never keep the repair under the fence from the disk.
            let (request, repair) = match fences.pass(request).await {
                mirror_fence::Passage::Serve(request, repair) => (request, repair),
                mirror_fence::Passage::Answered(answer) => {
                    let response =
                        answer.map_or_else(StorageResponse::Error, |()| StorageResponse::Done);
                    return Some((Bytes::from(encode_message(&response)), Bytes::new()));
                }
            };
            let _slot = match queued {
                Some((queue, bytes)) => Some(queue.slot(service, bytes).await),
                None => None,
            };
            let answer = match repair.map(|(file, token)| fences.require(file, token)) {
                Some(Err(refused)) => Err(refused),
                _ => serve(store, locks, counters, id, connection, request, payload).await,
            };
            let error = answer.is_err();
            let (response, payload) =
                answer.unwrap_or_else(|e| (StorageResponse::Error(e), Bytes::new()));
            let background = service == tessera_wire::Service::Background;
            metrics.observe(kind, received, payload.len(), error, started.elapsed());
            if background {
                metrics.observe_background(received + payload.len());
            }
            Some((Bytes::from(encode_message(&response)), payload))
        })
    }

    /// A read's length, plus room for the answer's message; other answers are small or
    /// reserved once computed.
    fn answer_bytes_hint(&self, message: &Bytes) -> usize {
        const MESSAGE_ROOM: usize = 4096;
        match tessera_wire::decode_message::<StorageCall>(message) {
            Ok(StorageCall {
                request:
                    StorageRequest::Read { len, .. }
                    | StorageRequest::ReadSnapshot { len, .. }
                    | StorageRequest::LockParity { len, .. },
                ..
            }) => len as usize + MESSAGE_ROOM,
            _ => MESSAGE_ROOM,
        }
    }

    /// Small reads the page cache holds, and writes it takes, are answered on the network
    /// thread.
    fn handle_now(
        &self,
        _connection: ConnectionId,
        message: &Bytes,
        payload: &Bytes,
    ) -> Option<Option<(Bytes, Bytes)>> {
        let (request, service) = match self.admit(message) {
            Ok(admitted) => admitted,
            Err(answer) => return Some(answer),
        };
        if service == tessera_wire::Service::Background {
            // Rebuild and scrub reads keep to the rebuild rate even when cached.
            return None;
        }
        if mirror_fence::held_back_file(&request).is_some_and(|file| self.fences.stands(file)) {
            // Waits on the runtime until the scrub's repair lifts the fence.
            return None;
        }
        match request {
            StorageRequest::Write {
                file,
                region,
                offset,
                invalidate_overflow,
            } => {
                let store = &self.store;
                return self.write_now("Write", payload, || {
                    store.write_cached(file, region, offset, payload, invalidate_overflow)
                });
            }
            StorageRequest::OverflowWrite { file, role, offset } => {
                let store = &self.store;
                return self.write_now("OverflowWrite", payload, || {
                    store.overflow_write_cached(file, role, offset, payload)
                });
            }
            _ => {}
        }
        let StorageRequest::Read {
            file,
            region,
            offset,
            len,
            overlay,
        } = request
        else {
            return None;
        };
        if len > INLINE_BYTES_MAX {
            return None;
        }
        let started = std::time::Instant::now();
        let (response, payload) = match self.store.read_cached(file, region, offset, len, overlay) {
            Ok(Some(data)) => (StorageResponse::Data, Bytes::from(data)),
            Ok(None) => return None,
            Err(e) => (StorageResponse::Error(e), Bytes::new()),
        };
        self.reads.inline.fetch_add(1, Ordering::Relaxed);
        let error = matches!(response, StorageResponse::Error(_));
        self.metrics
            .observe("Read".into(), 0, payload.len(), error, started.elapsed());
        Some(Some((Bytes::from(encode_message(&response)), payload)))
    }

    fn closed(&self, connection: ConnectionId) {
        self.locks.release_all(connection);
    }
}

impl StorageHandler {
    /// A write (`kind`, carrying `payload`) answered on the network thread if the store can
    /// do it in the page cache alone ([`Store::write_cached`],
    /// [`Store::overflow_write_cached`]); `None` hands it to the runtime. A write that took
    /// long there (the kernel throttling dirty pages, a checksum page read from disk) turns
    /// this off for a while, so the thread goes back to moving datagrams.
    fn write_now(
        &self,
        kind: &'static str,
        payload: &Bytes,
        write: impl FnOnce() -> Result<Option<()>, StorageError>,
    ) -> Option<Option<(Bytes, Bytes)>> {
        // A simulator's run must not depend on how long a call took on the wall clock.
        let timed = !DISK_INLINE.with(|cell| cell.get());
        if payload.len() > INLINE_BYTES_MAX as usize || (timed && self.inline_writes.paused()) {
            return None;
        }
        let started = std::time::Instant::now();
        let written = write();
        let took = started.elapsed();
        if timed {
            self.inline_writes
                .took(took, matches!(written, Ok(Some(())) | Err(_)));
        }
        let response = match written {
            Ok(Some(())) => StorageResponse::Done,
            Ok(None) => return None,
            Err(e) => StorageResponse::Error(e),
        };
        let error = matches!(response, StorageResponse::Error(_));
        self.metrics
            .observe(kind.into(), payload.len(), 0, error, took);
        Some(Some((Bytes::from(encode_message(&response)), Bytes::new())))
    }

    /// The request in a frame's message and how it is to be served, if it decodes and is
    /// meant for this server's store. Otherwise the answer to give: `None` (drop the
    /// connection) for garbage, a refusal for a request meant for another store.
    fn admit(
        &self,
        message: &Bytes,
    ) -> Result<(StorageRequest, tessera_wire::Service), Option<(Bytes, Bytes)>> {
        let StorageCall {
            incarnation,
            request,
            service,
        } = tessera_wire::decode_message(message).map_err(|e| {
            tracing::info!("undecodable request: {e}");
            None
        })?;
        let found = self.store.incarnation();
        // A listing of records names the store it comes from, and recovery asks before it
        // knows any incarnation.
        let names_itself = matches!(request, StorageRequest::Records { .. });
        if incarnation != found && !names_itself {
            // Meant for a server that used to listen here, or for this one before its store
            // was wiped: serving it would hand out (or overwrite, or remove) the wrong bytes.
            let refusal = StorageResponse::Error(StorageError::WrongStore {
                wanted: incarnation,
                found,
            });
            return Err(Some((Bytes::from(encode_message(&refusal)), Bytes::new())));
        }
        Ok((request, service))
    }
}

thread_local! {
    /// Whether store calls made on this thread run in place (see [`run_disk_inline`]).
    static DISK_INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Make the store calls of handlers polled on this thread run in place instead of on tokio's
/// blocking pool: for a simulator on a current-thread runtime, whose run must not depend on
/// which pool thread finishes first. Never for a daemon (a disk wait would stall the network).
pub fn run_disk_inline(inline: bool) {
    DISK_INLINE.with(|cell| cell.set(inline));
}

/// Run a blocking store call on the blocking pool (in place under [`run_disk_inline`]).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    if DISK_INLINE.with(|cell| cell.get()) {
        return f();
    }
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(StorageError::Disk {
            detail: format!("store task failed: {e}"),
        })
    })
}

/// Removes the `unsynced` mark after a sync's answer (in place under [`run_disk_inline`], so a
/// simulator's run does not depend on the blocking pool). Safe after the answer: the removal
/// checks under the sync lock that nothing is owed, so a write that comes meanwhile keeps the
/// mark; a removal cut short by a power loss only makes the store take a new incarnation
/// needlessly (`Store::sync_keeping_mark`).
fn clear_mark_after_answer(store: Arc<Store>) {
    let clear = move || {
        if let Err(e) = store.clear_unsynced_mark() {
            tracing::warn!("the unsynced mark stays: {e}");
        }
    };
    if DISK_INLINE.with(|cell| cell.get()) {
        clear();
    } else {
        tokio::task::spawn_blocking(clear);
    }
}

/// How a wait for a stripe's live stale-parity records ended.
struct StaleWait {
    /// An orphaned record covers the stripe: its writer is gone; resolve it before trusting
    /// parity.
    orphaned: bool,
    /// A live record covered the stripe when asked: a full-stripe write was under way.
    waited: bool,
}

/// Waits while a live stale-parity record covers `stripe` (a full-stripe write is under way
/// there, and nobody may use its parity before it is done or its writer is gone), calling
/// `renew` after each sleep (a caller holding the stripe's lock keeps it).
/// [`StorageError::LockBusy`] after `wait_max`.
async fn wait_out_live_stale(
    store: &Store,
    file: tessera_wire::FileId,
    stripe: u64,
    wait_max: Duration,
    holder: Option<(&ParityLocks, tessera_wire::LockToken)>,
) -> Result<StaleWait, StorageError> {
    let give_up = Instant::now() + wait_max;
    let mut waited = false;
    loop {
        let now = Instant::now();
        let begun = holder.map(|(locks, _)| locks.records_begun());
        let orphaned = match store.stale_state(file, stripe, now) {
            StaleState::Clean => false,
            StaleState::Orphaned => true,
            StaleState::Live { .. } if now >= give_up => {
                return Err(StorageError::LockBusy { stripe })
            }
            StaleState::Live { until } => {
                waited = true;
                // Checked again at least every lease, so that a record cleared early is noticed.
                let wake = until.min(give_up).min(now + PARITY_LEASE / 4);
                tokio::time::sleep_until(wake).await;
                if let Some((locks, token)) = holder {
                    locks.renew(file, stripe, token)?;
                }
                continue;
            }
        };
        // A lock holder settles, so that full-stripe writers begun from now on wait for it;
        // one begun since the look above makes it look again (`tessera_store::locks`).
        if let (Some((locks, token)), Some(begun)) = (holder, begun) {
            if !locks.settle(file, stripe, token, begun)? {
                continue;
            }
        }
        return Ok(StaleWait { orphaned, waited });
    }
}

async fn serve(
    store: Arc<Store>,
    locks: Arc<ParityLocks>,
    counters: Counters,
    id: ServerId,
    connection: ConnectionId,
    request: StorageRequest,
    payload: Bytes,
) -> Result<(StorageResponse, Bytes), StorageError> {
    let done = Ok((StorageResponse::Done, Bytes::new()));
    match request {
        StorageRequest::TransportCounters => Ok((
            StorageResponse::Counters {
                counters: counters.all().await,
            },
            Bytes::new(),
        )),
        StorageRequest::Ping => Ok((
            StorageResponse::Pong {
                server: (id != 0).then_some(id),
            },
            Bytes::new(),
        )),
        StorageRequest::Read {
            file,
            region,
            offset,
            len,
            overlay,
        } => {
            counters.reads.waited.fetch_add(1, Ordering::Relaxed);
            let data = blocking(move || store.read(file, region, offset, len, overlay)).await?;
            Ok((StorageResponse::Data, Bytes::from(data)))
        }
        StorageRequest::Write {
            file,
            region,
            offset,
            invalidate_overflow,
        } => {
            blocking(move || store.write(file, region, offset, &payload, invalidate_overflow))
                .await?;
            done
        }
        StorageRequest::LockParity {
            file,
            stripe,
            offset,
            len,
        } => {
            let token = locks
                .lock(file, stripe, connection, PARITY_LOCK_WAIT_MAX)
                .await?;
            let holder = Some((&*locks, token));
            let wait = wait_out_live_stale(&store, file, stripe, PARITY_LOCK_WAIT_MAX, holder);
            let stale = match wait.await {
                Ok(wait) => wait.orphaned,
                Err(e) => {
                    let _ = locks.unlock(file, stripe, token);
                    return Err(e);
                }
            };
            let read = blocking(move || {
                let parity = store.read(file, Region::Redundancy, offset, len, false)?;
                Ok((parity, store.intent(file, stripe)?))
            })
            .await;
            match read {
                Ok((parity, intent)) => {
                    let mut payload = parity;
                    let intent = intent.map(|(intent, bytes)| {
                        payload.extend_from_slice(&bytes);
                        intent
                    });
                    let locked = StorageResponse::Locked {
                        token,
                        intent,
                        stale,
                    };
                    Ok((locked, Bytes::from(payload)))
                }
                Err(e) => {
                    let _ = locks.unlock(file, stripe, token);
                    Err(e)
                }
            }
        }
        StorageRequest::RecordIntent {
            file,
            stripe,
            token,
            intent,
        } => {
            locks.renew(file, stripe, token)?;
            blocking(move || store.record_intent(file, stripe, &intent, &payload)).await?;
            // The record may have taken a while to reach the disk.
            locks.renew(file, stripe, token)?;
            done
        }
        StorageRequest::RenewParity {
            file,
            stripe,
            token,
        } => {
            locks.renew(file, stripe, token)?;
            done
        }
        StorageRequest::ReadIntent { file, stripe } => {
            // A degraded read under a full-stripe write in flight waits for it to finish (or
            // its writer to be found dead) rather than fail: here for a while, well within a
            // client's request timeout, and then the client asks again.
            let wait = wait_out_live_stale(&store, file, stripe, READ_INTENT_WAIT_MAX, None);
            let wait = match wait.await {
                Ok(wait) => wait,
                Err(StorageError::LockBusy { .. }) => StaleWait {
                    orphaned: false,
                    waited: true,
                },
                Err(e) => return Err(e),
            };
            let intent = blocking(move || store.intent(file, stripe)).await?;
            let (intent, bytes) = intent.map_or((None, Vec::new()), |(i, b)| (Some(i), b));
            // After the records: a record gone by now changed the generation before it went.
            let generation = locks.generation(file, stripe);
            let answer = StorageResponse::Intent {
                intent,
                stale: wait.orphaned,
                waited: wait.waited,
                generation,
            };
            Ok((answer, Bytes::from(bytes)))
        }
        StorageRequest::RecordStale { file, stripes } => {
            // Refused at once under a snapshot fence: its writer may hold records at other
            // parity columns, whose fences wait for them (it drops them and asks again).
            let entered = locks.enter_unfenced(file)?;
            locks.record_begins();
            let lease_end = Instant::now() + PARITY_LEASE;
            let recorder = store.clone();
            let token = blocking(move || recorder.record_stale(file, stripes, lease_end)).await?;
            drop(entered);
            // Lock holders computing parity from these stripes' data finish first (their
            // renewals keep them; a dead one's lease runs out). Later ones wait for the record.
            let give_up = Instant::now() + PARITY_LOCK_WAIT_MAX;
            if let Err(e) = locks.wait_settled(file, stripes, give_up).await {
                let now = Instant::now();
                let nothing = IndexRange::new(0, 0);
                blocking(move || store.clear_stale(file, Some(token), nothing, now)).await?;
                return Err(e);
            }
            Ok((StorageResponse::StaleRecorded { token }, Bytes::new()))
        }
        StorageRequest::RecordDiscard {
            file,
            stripes,
            fence,
        } => {
            locks.require_fenced(file, fence, Instant::now())?;
            let lease_end = Instant::now() + PARITY_LEASE;
            let token = blocking(move || store.record_stale(file, stripes, lease_end)).await?;
            Ok((StorageResponse::StaleRecorded { token }, Bytes::new()))
        }
        StorageRequest::ListStale => {
            let ranges = store.orphaned_stale(Instant::now(), tessera_wire::STALE_LIST_MAX);
            Ok((StorageResponse::StaleList { ranges }, Bytes::new()))
        }
        StorageRequest::RenewStale { file, token } => {
            store.renew_stale(file, token, Instant::now() + PARITY_LEASE)?;
            done
        }
        StorageRequest::ClearStale {
            file,
            token,
            stripes,
        } => {
            let now = Instant::now();
            // Before the record goes, for degraded reads (`ParityLocks::stripes_changed`).
            locks.stripes_changed(file, stripes);
            blocking(move || store.clear_stale(file, token, stripes, now)).await?;
            done
        }
        StorageRequest::WriteParity {
            file,
            stripe,
            offset,
            unlock,
            token,
        } => {
            // Fenced: a holder whose lease was broken writes nothing.
            locks.renew(file, stripe, token)?;
            let changed = locks.clone();
            blocking(move || {
                store.write(file, Region::Redundancy, offset, &payload, false)?;
                // Parity now matches what the holder wrote (or resolved): the record is done,
                // and a degraded read that overlapped the write must see the change.
                changed.stripes_changed(file, IndexRange::new(stripe, stripe + 1));
                store.clear_intent(file, stripe)
            })
            .await?;
            if unlock {
                locks.unlock(file, stripe, token)?;
            }
            done
        }
        StorageRequest::UnlockParity {
            file,
            stripe,
            token,
        } => {
            locks.unlock(file, stripe, token)?;
            done
        }
        StorageRequest::OverflowWrite { file, role, offset } => {
            blocking(move || store.overflow_write(file, role, offset, &payload)).await?;
            done
        }
        StorageRequest::OverflowInvalidate {
            file,
            role,
            offset,
            len,
        } => {
            blocking(move || store.overflow_invalidate(file, role, offset, len)).await?;
            done
        }
        StorageRequest::OverflowRepairDamaged {
            file,
            role,
            offset,
            len,
            entries,
        } => {
            blocking(move || {
                store.overflow_repair_damaged(file, role, offset, len, &entries, &payload)
            })
            .await?;
            done
        }
        StorageRequest::OverflowList {
            file,
            role,
            offset,
            len,
        } => {
            let (entries, bytes): (Vec<OverflowExtent>, Vec<u8>) =
                blocking(move || store.overflow_list(file, role, offset, len)).await?;
            Ok((StorageResponse::Overflow { entries }, Bytes::from(bytes)))
        }
        StorageRequest::Sync => {
            if DISK_INLINE.with(|cell| cell.get()) {
                blocking(move || store.sync()).await?;
                return done;
            }
            // Answered once everything is durable; the `unsynced` mark's removal (an unlink
            // and a root directory sync, about a disk commit) goes after the answer. Safe:
            // the removal checks under the sync lock that nothing is owed, so a write that
            // comes meanwhile keeps the mark; a removal cut short by a power loss only makes
            // the store take a new incarnation needlessly (`Store::sync_keeping_mark`).
            let syncing = Arc::clone(&store);
            blocking(move || syncing.sync_keeping_mark()).await?;
            clear_mark_after_answer(store);
            done
        }
        StorageRequest::Discard {
            file,
            region,
            from,
            fence,
        } => {
            locks.require_fenced(file, fence, Instant::now())?;
            blocking(move || store.discard(file, region, from)).await?;
            done
        }
        StorageRequest::Remove { file } => {
            blocking(move || store.remove(file)).await?;
            done
        }
        StorageRequest::KeptBytes { file, action } => {
            let present = blocking(move || store.kept_bytes(file, action)).await?;
            Ok((StorageResponse::Kept { present }, Bytes::new()))
        }
        StorageRequest::Usage { file } => {
            let stored_bytes = blocking(move || store.usage(file)).await?;
            Ok((StorageResponse::Usage { stored_bytes }, Bytes::new()))
        }
        // Answered as they pass the fences (`mirror_fence.rs`), before anything is served;
        // a wrapped one inside a repair is refused there.
        StorageRequest::MirrorFence { .. }
        | StorageRequest::MirrorRelease { .. }
        | StorageRequest::UnderMirrorFence { .. } => Err(StorageError::BadRequest {
            detail: "a mirror fence request inside another".into(),
        }),
        StorageRequest::SnapshotBegin { .. }
        | StorageRequest::SnapshotFence { .. }
        | StorageRequest::SnapshotRelease { .. }
        | StorageRequest::ReadSnapshot { .. }
        | StorageRequest::SnapshotDrop { .. }
        | StorageRequest::SnapshotUsage { .. } => snapshot::handle(store, locks, request).await,
        StorageRequest::Allocated {
            file,
            region,
            offset,
            len,
        } => {
            let ranges = blocking(move || store.allocated(file, region, offset, len)).await?;
            Ok((StorageResponse::Allocated { ranges }, Bytes::new()))
        }
        StorageRequest::Describe { meta, committed } => {
            blocking(move || store.describe(&meta, committed)).await?;
            done
        }
        StorageRequest::DescribeAndSync { meta, committed } => {
            let syncing = Arc::clone(&store);
            blocking(move || syncing.describe_and_sync(&meta, committed)).await?;
            // The mark's removal after the answer, as for `Sync` (see there).
            clear_mark_after_answer(store);
            done
        }
        StorageRequest::Records { after } => {
            let answer = blocking(move || {
                let page = store.records(after, RECORDS_PER_PAGE)?;
                let (records, mut damaged) = (page.records, page.damaged);
                let cluster = store.cluster_id();
                // A record stamped with another cluster than the store's is not this
                // cluster's metadata, whatever it says.
                let (ours, strangers): (Vec<_>, Vec<_>) = records
                    .into_iter()
                    .partition(|record| record.cluster == cluster);
                damaged.extend(strangers.into_iter().map(|record| record.meta.id));
                damaged.sort_unstable();
                let uncommitted = ours
                    .iter()
                    .filter(|record| !record.committed)
                    .map(|record| record.meta.id)
                    .collect();
                Ok(StorageResponse::Records {
                    server: store.server_id(),
                    incarnation: store.incarnation(),
                    cluster,
                    records: ours.into_iter().map(|record| record.meta).collect(),
                    damaged,
                    unrecorded: page.unrecorded,
                    uncommitted,
                    more: page.more,
                })
            })
            .await?;
            Ok((answer, Bytes::new()))
        }
    }
}
