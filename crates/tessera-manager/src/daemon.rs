//! The manager as a network daemon: the [`Manager`] state machine behind a mutex, fed by a
//! transport and ticked by a timer. This is the only part of the crate that does I/O beyond
//! the embedded store. It authenticates every connection (admin and server keys derived from
//! the cluster secret, client access keys from its store) and refuses each request the
//! connection's role may not make (see [`crate::authorize`]).
//!
//! Started without `init` on a directory with no store, the daemon serves anyway but refuses
//! every request ([`refuse_without_store`]), and opens the store as soon as one appears there
//! (written by `tessera manager recover`); every tick it also checks that its store's file is
//! still there ([`Manager::check_store`]). Without a store it knows no access keys, so only
//! the admin and the servers (keys derived from the secret) can connect.

use crate::metrics::ManagerMetrics;
use crate::replica::{Replica, ReplicaConfig};
use crate::replica_core::{StageClock, StageTimes, SINGLE_STAGES};
use crate::{refuse_without_store, Manager, ManagerConfig, ManagerOpenError};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Key, Secret};
use tessera_transport::{
    serve_tcp_limited, Accepted, BoxFuture, ConnectionId, FrameHandler, TcpLimits,
};
use tessera_wire::{encode_message, ManagerError, ManagerRequest, ManagerResponse};

/// How often liveness is re-evaluated when nothing else happens.
const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Requests a single manager handles between two logs of its counters.
const COUNTERS_EVERY: u64 = 1000;

/// Errors starting the manager daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The metadata store could not be opened.
    #[error(transparent)]
    Open(#[from] ManagerOpenError),
    /// The replica could not join its group.
    #[error(transparent)]
    Replica(#[from] crate::replica::ReplicaError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {detail}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        detail: String,
    },
}

/// The manager, or where its store should appear.
pub(crate) enum Served {
    /// The store is open.
    Running(Box<Manager>),
    /// No store at this path yet: every request is refused.
    NoStore(PathBuf),
}

impl Served {
    fn handle(&mut self, request: ManagerRequest, now: Instant) -> tessera_wire::ManagerResponse {
        self.handle_from(request, None, now)
    }

    /// [`Manager::handle_from`]: a request from the client host `peer`, if known.
    fn handle_from(
        &mut self,
        request: ManagerRequest,
        peer: Option<IpAddr>,
        now: Instant,
    ) -> tessera_wire::ManagerResponse {
        match self {
            Served::Running(manager) => manager.handle_from(request, peer, now),
            Served::NoStore(path) => refuse_without_store(path, &request),
        }
    }

    /// Ticks the manager and checks its store's file; without a store, opens one that has
    /// appeared.
    /// The manager, if its store is open.
    pub(crate) fn manager(&mut self) -> Option<&mut Manager> {
        match self {
            Served::Running(manager) => Some(manager),
            Served::NoStore(_) => None,
        }
    }

    /// The access key `id`'s secret; none without a store.
    fn access_key(&self, id: tessera_auth::KeyId) -> Option<Key> {
        match self {
            Served::Running(manager) => manager.access_key(id),
            Served::NoStore(_) => None,
        }
    }

    /// Ticks the manager and checks its store's file; without a store, opens one that has
    /// appeared.
    fn tick(&mut self, dir: &Path, config: ManagerConfig, now: Instant) {
        match self {
            Served::Running(manager) => {
                manager.tick(now);
                let _ = manager.check_store();
            }
            Served::NoStore(path) if path.exists() => match Manager::open_existing(dir, config) {
                Ok(manager) => {
                    tracing::warn!(
                        "metadata store {} appeared (recovered); serving cluster {:#x}",
                        path.display(),
                        manager.cluster()
                    );
                    *self = Served::Running(Box::new(manager));
                }
                Err(e) => tracing::error!("cannot open the store that appeared: {e}"),
            },
            Served::NoStore(_) => {}
        }
    }
}

/// A running manager daemon.
pub struct RunningManager {
    /// The address it listens on.
    pub addr: SocketAddr,
    pub(crate) manager: Arc<Mutex<Served>>,
    serve: tokio::task::JoinHandle<()>,
    ticker: tokio::task::JoinHandle<()>,
    /// Its replica, if it is one of several.
    pub(crate) replica: Option<Arc<Replica>>,
    metrics: Arc<ManagerMetrics>,
    /// A single manager's stages ([`SINGLE_STAGES`]); a replica keeps its own.
    stages: Arc<StageClock>,
}

impl RunningManager {
    /// Commits of its store synced so far (a replica's batch syncs, a single manager's
    /// durable commits).
    pub fn synced_commits(&self) -> u64 {
        match &*self.manager.lock().unwrap() {
            Served::Running(manager) => manager.synced_commits(),
            Served::NoStore(_) => 0,
        }
    }

    /// Where the time of its requests went so far: a replica's ordered requests
    /// ([`crate::replica_core::REPLICA_STAGES`]), or a single manager's requests.
    pub fn stage_times(&self) -> StageTimes {
        match &self.replica {
            Some(replica) => replica.stage_times(),
            None => self.stages.times(),
        }
    }

    /// A handle on its metrics, for a scrape endpoint.
    pub fn metrics(&self) -> MetricsHandle {
        MetricsHandle {
            manager: self.manager.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Run until the serving task ends.
    pub async fn wait(self) {
        let _ = self.serve.await;
        self.ticker.abort();
    }

    /// Stop serving (the store is closed when the last request finishes); a replica leaves
    /// the order.
    pub fn stop(self) {
        self.serve.abort();
        self.ticker.abort();
        if let Some(replica) = &self.replica {
            replica.stop("stopped by its daemon".into());
        }
    }

    /// Stop serving and make every metadata change durable.
    pub async fn shutdown(self) -> Result<(), tessera_wire::ManagerError> {
        self.serve.abort();
        self.ticker.abort();
        let manager = self.manager;
        tokio::task::spawn_blocking(move || match &mut *manager.lock().unwrap() {
            Served::Running(manager) => manager.flush(),
            Served::NoStore(_) => Ok(()),
        })
        .await
        .unwrap_or_else(|e| Err(tessera_wire::ManagerError::Store(e.to_string())))
    }
}

/// A running manager's metrics, cheap to clone.
#[derive(Clone)]
pub struct MetricsHandle {
    manager: Arc<Mutex<Served>>,
    metrics: Arc<ManagerMetrics>,
}

impl MetricsHandle {
    /// The metrics in Prometheus's text format, with the servers by state and what they owe
    /// as of now.
    pub async fn text(&self) -> String {
        let manager = self.manager.clone();
        let (servers, owed) = tokio::task::spawn_blocking(move || {
            let mut manager = manager.lock().unwrap();
            let servers = match manager.handle(ManagerRequest::Status, Instant::now()) {
                ManagerResponse::Servers(servers) => servers,
                _ => Vec::new(),
            };
            let owed = match &*manager {
                Served::Running(manager) => manager.owed().unwrap_or_else(|e| {
                    tracing::warn!("metrics: what servers owe: {e}");
                    Default::default()
                }),
                Served::NoStore(_) => Default::default(),
            };
            (servers, owed)
        })
        .await
        .unwrap_or_default();
        self.metrics.render(&servers, &owed)
    }
}

struct ManagerHandler {
    manager: Arc<Mutex<Served>>,
    /// This manager's replica, if it is one of several.
    replica: Option<Arc<Replica>>,
    /// The manager's directory (a replica sends its store from there).
    dir: PathBuf,
    /// The admin's and the servers' keys, derived from the cluster secret.
    admin_key: Key,
    server_key: Key,
    /// The claim each open connection authenticated as.
    claims: Mutex<HashMap<ConnectionId, (Claim, Option<IpAddr>)>>,
    metrics: Arc<ManagerMetrics>,
    /// Requests a single manager handled, for its counters' log (see [`log_counters`]).
    handled: Arc<AtomicU64>,
    /// Where a single manager's time went ([`SINGLE_STAGES`]).
    stages: Arc<StageClock>,
}

/// Indexes of [`SINGLE_STAGES`].
mod stage {
    pub const QUEUE: usize = 0;
    pub const LOCK: usize = 1;
    pub const HANDLE: usize = 2;
    pub const WAKE: usize = 3;
    pub const TOTAL: usize = 4;
}

impl FrameHandler for ManagerHandler {
    fn peer_key(&self, claim: &Claim) -> Option<Key> {
        match claim {
            Claim::Admin => Some(self.admin_key),
            Claim::Server => Some(self.server_key),
            Claim::Client(id) => self.manager.lock().unwrap().access_key(*id),
        }
    }

    fn opened(&self, connection: ConnectionId, accepted: &Accepted) {
        self.claims
            .lock()
            .unwrap()
            .insert(connection, (accepted.claim, accepted.peer));
        if let Some(replica) = &self.replica {
            replica.opened(connection);
        }
    }

    fn closed(&self, connection: ConnectionId) {
        self.claims.lock().unwrap().remove(&connection);
        if let Some(replica) = &self.replica {
            replica.closed(connection);
        }
    }

    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let request: ManagerRequest = match tessera_wire::decode_message(&message) {
            Ok(request) => request,
            Err(e) => {
                tracing::info!("undecodable manager request: {e}");
                return Box::pin(async { None });
            }
        };
        let (started, kind) = (Instant::now(), crate::metrics::kind_of(&request));
        let received = message.len() + payload.len();
        let metrics = self.metrics.clone();
        let answer = self.serve(connection, request);
        Box::pin(async move {
            let answer = answer.await;
            let (sent, error) = answer.as_ref().map_or((0, true), |(message, payload)| {
                let refused = matches!(
                    tessera_wire::decode_message(message),
                    Ok(ManagerResponse::Error(_))
                );
                (message.len() + payload.len(), refused)
            });
            metrics.observe(kind, received, sent, error, started.elapsed());
            answer
        })
    }
}

impl ManagerHandler {
    /// Answers a decoded request (`None`: drop the connection).
    fn serve(
        &self,
        connection: ConnectionId,
        request: ManagerRequest,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        // Every connection is authenticated before its first request; one without a role
        // would be a transport bug, and is dropped rather than served.
        let Some((claim, peer)) = self.claims.lock().unwrap().get(&connection).copied() else {
            return Box::pin(async { None });
        };
        let role = claim.role();
        if let Err(refused) = crate::authorize(&request, role) {
            tracing::info!("refused {request:?} from a {role}: {refused}");
            let response = ManagerResponse::Error(refused);
            return Box::pin(async move {
                Some((Bytes::from(encode_message(&response)), Bytes::new()))
            });
        }
        if let Some(replica) = &self.replica {
            return self.replicated(replica.clone(), connection, (claim, peer), request);
        }
        let (manager, handled) = (self.manager.clone(), self.handled.clone());
        let (stages, began) = (self.stages.clone(), Instant::now());
        Box::pin(async move {
            // Mutations commit to the store (an fsync): keep them off the async workers.
            let timing = stages.clone();
            let (response, answered) = tokio::task::spawn_blocking(move || {
                let running = Instant::now();
                let mut manager = manager.lock().unwrap();
                let locked = Instant::now();
                let response = match claim {
                    // A key revoked while its connection was open is refused from then on.
                    Claim::Client(id) if manager.access_key(id).is_none() => {
                        ManagerResponse::Error(ManagerError::UnknownKey(id))
                    }
                    _ => manager.handle_from(request, peer, Instant::now()),
                };
                timing.add(stage::QUEUE, running - began);
                timing.add(stage::LOCK, locked - running);
                timing.add(stage::HANDLE, locked.elapsed());
                log_counters(&handled, &manager, &timing);
                (response, Instant::now())
            })
            .await
            .ok()?;
            stages.add(stage::WAKE, answered.elapsed());
            stages.add(stage::TOTAL, began.elapsed());
            Some((Bytes::from(encode_message(&response)), Bytes::new()))
        })
    }

    /// Serves `request` at a replica: ordered through the group, or from its own state.
    fn replicated(
        &self,
        replica: Arc<Replica>,
        connection: ConnectionId,
        (claim, peer): (Claim, Option<IpAddr>),
        request: ManagerRequest,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let manager = self.manager.clone();
        let dir = self.dir.clone();
        Box::pin(async move {
            if let Claim::Client(id) = claim {
                if manager.lock().unwrap().access_key(id).is_none() {
                    let refused = ManagerResponse::Error(ManagerError::UnknownKey(id));
                    return Some((Bytes::from(encode_message(&refused)), Bytes::new()));
                }
            }
            let (response, payload) = match request {
                ManagerRequest::Replica => {
                    (ManagerResponse::Replica(replica.status()), Bytes::new())
                }
                ManagerRequest::ReplicaGroup => (replica.group_answer(), Bytes::new()),
                ManagerRequest::ReplicaChange { id, addr } => {
                    (replica.change_group(id, addr).await, Bytes::new())
                }
                ManagerRequest::Snapshot {
                    at,
                    offset,
                    max_bytes,
                } => {
                    let copied = tokio::task::spawn_blocking(move || {
                        replica.snapshot_piece(&manager, &dir, at, offset, max_bytes)
                    })
                    .await
                    .ok()?;
                    match copied {
                        Ok((position, total_bytes, piece)) => (
                            ManagerResponse::Snapshot {
                                position,
                                total_bytes,
                                offset,
                            },
                            Bytes::from(piece),
                        ),
                        Err(error) => (ManagerResponse::Error(error), Bytes::new()),
                    }
                }
                request if crate::replica::is_local(&request) => {
                    let answer = tokio::task::spawn_blocking(move || {
                        manager
                            .lock()
                            .unwrap()
                            .handle_from(request, peer, Instant::now())
                    })
                    .await
                    .ok()?;
                    (answer, Bytes::new())
                }
                request if crate::command::is_read(&request) => (
                    read(replica, manager, connection, request).await?,
                    Bytes::new(),
                ),
                request => (
                    replica.order_from(connection, &manager, request).await,
                    Bytes::new(),
                ),
            };
            Some((Bytes::from(encode_message(&response)), payload))
        })
    }
}

/// Counts one request a single manager handled and logs, every [`COUNTERS_EVERY`] of them,
/// how many it handled, how many commits of `served`'s store synced, the process's CPU time
/// and the mean time of each of `stages` (target `tessera_manager::counters`, at debug: the
/// throughput measurement reads it).
fn log_counters(handled: &AtomicU64, served: &Served, stages: &StageClock) {
    let handled = handled.fetch_add(1, Ordering::Relaxed) + 1;
    if handled.is_multiple_of(COUNTERS_EVERY) {
        if let Served::Running(manager) = served {
            tracing::debug!(
                target: "tessera_manager::counters",
                "manager: requests {handled} synced_commits {} cpu_ms {} mean_us({})",
                manager.synced_commits(),
                process_cpu_ms(),
                stages.times(),
            );
        }
    }
}

/// CPU time (user and system) this process used so far, in milliseconds, from
/// `/proc/self/stat` (0 where there is none): the throughput measurement divides it by the
/// operations done.
pub fn process_cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (in parentheses, which may hold spaces): utime and
    // stime are the 12th and 13th, in clock ticks of 10 ms (USER_HZ is 100 on Linux).
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|field| field.parse::<u64>().ok())
        .sum();
    ticks * 10
}

/// A read at a replica: answered from its own store if `connection` is synced and the
/// replica has applied what any replica may have acknowledged before the read came, else
/// ordered (see [`crate::replica`]); `None` if the blocking task failed.
async fn read(
    replica: Arc<Replica>,
    manager: Arc<Mutex<Served>>,
    connection: ConnectionId,
    request: ManagerRequest,
) -> Option<ManagerResponse> {
    let local = replica.may_read_locally(connection, &request) && replica.caught_up_to_now().await;
    let (answer, request) = if local {
        let (reading, store) = (replica.clone(), manager.clone());
        tokio::task::spawn_blocking(move || {
            (reading.read_locally(connection, &store, &request), request)
        })
        .await
        .ok()?
    } else {
        replica.count_ordered_read();
        (None, request)
    };
    Some(match answer {
        Some(answer) => answer,
        None => replica.order_from(connection, &manager, request).await,
    })
}

/// Open the metadata store in `dir` and serve it on `listen`, within the default
/// [`TcpLimits`], authenticating every peer with keys derived from `secret` (admin, servers)
/// or issued by this manager (clients). With `init`, a missing store is created (a new
/// cluster); without, the daemon waits for one, refusing every request (see the module doc).
pub async fn start(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    init: bool,
    secret: &Secret,
) -> Result<RunningManager, DaemonError> {
    start_limited(listen, dir, config, init, TcpLimits::default(), secret).await
}

/// Open the metadata store in `dir` and serve it on `listen`; what TCP peers may hold
/// (connections, idle time, memory for requests in flight) is bounded by `limits`; `init` as
/// for [`start`].
pub async fn start_limited(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    init: bool,
    limits: TcpLimits,
    secret: &Secret,
) -> Result<RunningManager, DaemonError> {
    start_with(listen, dir, config, init, limits, secret, None).await
}

/// As [`start_limited`], as replica `replica.id` of a replicated manager (see
/// [`crate::replica`]); it listens at its address in `replica.peers`. Replicas created
/// together (`init`) share a cluster id derived from the secret.
pub async fn start_replica(
    replica: ReplicaConfig,
    dir: &Path,
    mut config: ManagerConfig,
    init: bool,
    limits: TcpLimits,
    secret: &Secret,
) -> Result<RunningManager, DaemonError> {
    replica.validate()?;
    if config.cluster_id.is_none() {
        config.cluster_id = Some(crate::replica::replicated_cluster_id(secret));
    }
    let listen = replica.addr();
    start_with(listen, dir, config, init, limits, secret, Some(replica)).await
}

async fn start_with(
    listen: SocketAddr,
    dir: &Path,
    config: ManagerConfig,
    init: bool,
    limits: TcpLimits,
    secret: &Secret,
    replica: Option<ReplicaConfig>,
) -> Result<RunningManager, DaemonError> {
    let opening = dir.to_path_buf();
    let replica_key = replica.as_ref().map(|_| secret.replica_key());
    let opened = tokio::task::spawn_blocking(move || {
        let mut manager = if init {
            Manager::open(&opening, config)
        } else {
            Manager::open_existing(&opening, config)
        }?;
        if let Some(key) = replica_key {
            manager.set_replicated(key);
        }
        Ok(manager)
    })
    .await
    .expect("open does not panic");
    let served = match opened {
        Ok(manager) => Served::Running(Box::new(manager)),
        Err(ManagerOpenError::NoStore { path }) => {
            tracing::error!(
                "no metadata store at {}: refusing every request until one is there. If servers \
                 hold this cluster's data, rebuild it with `tessera manager recover --dir {} \
                 --servers ADDR,...`; for a new, empty cluster, start with --init",
                path.display(),
                dir.display()
            );
            for rescued in rescued_copies(dir) {
                tracing::error!(
                    "{} is a whole copy a manager made when it found its store deleted or \
                     replaced; if it is this cluster's latest, move it to {} instead of \
                     recovering (it keeps what servers owe, which recovery cannot know)",
                    rescued.display(),
                    path.display()
                );
            }
            Served::NoStore(path)
        }
        Err(e) => return Err(e.into()),
    };
    let manager = Arc::new(Mutex::new(served));
    let listener = tessera_transport::listen(listen).map_err(|e| DaemonError::Listen {
        addr: listen,
        detail: e.to_string(),
    })?;
    let addr = listener.local_addr().map_err(|e| DaemonError::Listen {
        addr: listen,
        detail: e.to_string(),
    })?;
    let replica = match replica {
        Some(replica) => {
            Some(crate::replica::start(replica, dir, config, manager.clone(), secret).await?)
        }
        None => None,
    };
    let ticking = manager.clone();
    let dir = dir.to_path_buf();
    let handler_dir = dir.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK_INTERVAL).await;
            let ticking = ticking.clone();
            let dir = dir.clone();
            // A stat of the store's file, or opening it: off the async workers.
            let _ = tokio::task::spawn_blocking(move || {
                ticking.lock().unwrap().tick(&dir, config, Instant::now())
            })
            .await;
        }
    });
    let metrics = Arc::new(ManagerMetrics::default());
    let stages = Arc::new(StageClock::new(&SINGLE_STAGES));
    let serve = tokio::spawn(serve_tcp_limited(
        listener,
        Arc::new(ManagerHandler {
            manager: manager.clone(),
            replica: replica.clone(),
            dir: handler_dir,
            admin_key: secret.admin_key(),
            server_key: secret.server_key(),
            claims: Mutex::new(HashMap::new()),
            metrics: metrics.clone(),
            handled: Arc::default(),
            stages: stages.clone(),
        }),
        limits,
    ));
    Ok(RunningManager {
        addr,
        manager,
        serve,
        ticker,
        replica,
        metrics,
        stages,
    })
}

/// The copies a manager made of its store when it found the store's file lost.
fn rescued_copies(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("manager.redb.rescued-"))
        })
        .collect();
    found.sort();
    found
}
