//! A whole cluster in one process: the manager's state machine and N storage servers behind a
//! [`MemNetwork`], clients over [`MemTransport`]s, and the faults a simulator plays on them.

use crate::replicas::{OrderFaults, SimReplicas};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tessera_client::Client;
use tessera_manager::{Manager, ManagerConfig};
use tessera_store::{BitFlip, MemDisk, PowerLoss, Store};
use tessera_transport::{BoxFuture, ConnectionId, FrameHandler, MemNetwork};
use tessera_wire::{encode_message, ManagerError, ManagerRequest, ManagerResponse, ServerId};

/// How often a running server heartbeats (as `tessera_server::HEARTBEAT_INTERVAL`).
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(300);

/// How often a running server resolves the torn stripes it holds parity of (as the
/// `tessera server` daemon's `TORN_RESOLVE_EVERY`).
const TORN_RESOLVE_EVERY: Duration = Duration::from_secs(2);
/// How long the simulated manager keeps a client's `once` answers after its last change.
pub const ONCE_EXPIRY: Duration = Duration::from_secs(120);

/// The manager's state machine as a daemon on the in-memory network: every request is handled
/// at once with tokio's (virtual) clock as `now`.
struct ManagerHost {
    manager: Arc<Mutex<Manager>>,
}

/// The (virtual) time now, as the manager takes it.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl FrameHandler for ManagerHost {
    fn handle(
        &self,
        _connection: ConnectionId,
        message: Bytes,
        _payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        let answer = tessera_wire::decode_message::<ManagerRequest>(&message)
            .ok()
            .map(|request| {
                let response = self.manager.lock().unwrap().handle(request, now());
                (Bytes::from(encode_message(&response)), Bytes::new())
            });
        Box::pin(async move { answer })
    }
}

/// The cluster's manager: one state machine, or replicas ([`SimReplicas`]).
#[derive(Clone)]
enum Metadata {
    Single(Arc<Mutex<Manager>>),
    Replicated(Arc<SimReplicas>),
}

impl Metadata {
    /// Sends `request` as a storage server does: straight into the single manager, or to the
    /// replicas in turn until one answers (at most [`REPLICA_ROUNDS_MAX`] rounds).
    async fn call(&self, network: &Arc<MemNetwork>, request: ManagerRequest) -> ManagerResponse {
        let replicas = match self {
            Metadata::Single(manager) => return manager.lock().unwrap().handle(request, now()),
            Metadata::Replicated(replicas) => replicas.addrs(),
        };
        let transport = network.transport(Duration::from_secs(5));
        let mut last = None;
        for _ in 0..REPLICA_ROUNDS_MAX {
            for &addr in &replicas {
                let answer = tessera_transport::call::<_, ManagerResponse>(
                    &transport,
                    addr,
                    &request,
                    Bytes::new(),
                )
                .await;
                match answer {
                    Ok((ManagerResponse::Error(ManagerError::Unordered(why)), _)) => {
                        last = Some(why);
                    }
                    Ok((answer, _)) => return answer,
                    Err(error) => last = Some(error.to_string()),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let why = last.unwrap_or_default();
        ManagerResponse::Error(ManagerError::Unordered(why))
    }
}

/// Rounds over the replicas a server's request to the manager makes before it gives up.
const REPLICA_ROUNDS_MAX: usize = 20;

/// One storage server of the simulated cluster.
struct SimServer {
    addr: SocketAddr,
    /// Its disk, in memory: a blank one when it is wiped.
    disk: MemDisk,
    /// Its store's directory on that disk.
    dir: PathBuf,
    /// Id the manager gave it (0 before its first start).
    id: ServerId,
    running: Option<Running>,
    /// The last store it ran on, to wait until every request still holding it has finished
    /// before the directory is opened again.
    last_store: Weak<Store>,
}

struct Running {
    store: Arc<Store>,
    heartbeat: tokio::task::JoinHandle<()>,
    /// Resolves the torn stripes of its store, as each `tessera server` daemon does.
    resolver: tokio::task::JoinHandle<()>,
}

impl Running {
    /// The process dies: its background tasks with it.
    fn stop(self) {
        self.heartbeat.abort();
        self.resolver.abort();
    }
}

/// The cluster: manager, servers, network and their directories.
pub struct SimCluster {
    /// The network everything talks over.
    pub network: Arc<MemNetwork>,
    /// The manager's address.
    pub manager_addr: SocketAddr,
    metadata: Metadata,
    servers: Vec<SimServer>,
    request_timeout: Duration,
    /// Whether the servers' background torn-stripe resolvers act (on unless a test that
    /// resolves by hand pauses them).
    resolving: Arc<AtomicBool>,
    /// Holds the manager's store; removed when the cluster is dropped.
    _root: tempfile::TempDir,
}

impl SimCluster {
    /// A manager and `servers` storage servers, all started and registered: servers on
    /// in-memory disks, the manager's store under `/dev/shm` when it exists (fsync costs
    /// nothing there), else the system's temp dir.
    pub async fn start(seed: u64, servers: usize) -> SimCluster {
        Self::start_with(seed, servers, None).await
    }

    /// As [`SimCluster::start`], with `replicas` manager replicas ([`SimReplicas`]) whose
    /// order datagrams meet `faults`; clients and servers fail over between them.
    pub async fn start_replicated(
        seed: u64,
        servers: usize,
        replicas: usize,
        faults: OrderFaults,
    ) -> SimCluster {
        Self::start_with(seed, servers, Some((replicas, 0, faults))).await
    }

    /// As [`SimCluster::start_replicated`], with `spares` replicas that may be added to the
    /// group later ([`SimReplicas::add`]).
    pub async fn start_replicated_with_spares(
        seed: u64,
        servers: usize,
        replicas: usize,
        spares: usize,
        faults: OrderFaults,
    ) -> SimCluster {
        Self::start_with(seed, servers, Some((replicas, spares, faults))).await
    }

    async fn start_with(
        seed: u64,
        servers: usize,
        replicated: Option<(usize, usize, OrderFaults)>,
    ) -> SimCluster {
        let shm = std::path::Path::new("/dev/shm");
        let root = match shm.is_dir() {
            true => tempfile::Builder::new()
                .prefix("tessera-sim")
                .tempdir_in(shm),
            false => tempfile::Builder::new().prefix("tessera-sim").tempdir(),
        }
        .expect("a temporary directory");
        // Replicas wait for the order while handling a request: deliveries run concurrently.
        let network = MemNetwork::with_order(seed, replicated.is_none());
        let config = ManagerConfig {
            cluster_id: Some(seed | 1),
            // Longer than a client retries one request (3 rounds over 5 replicas of at most
            // 5 s each), short enough that a run's idle end sees `ExpireOnce` applied.
            once_expiry: ONCE_EXPIRY,
            ..ManagerConfig::default()
        };
        let manager_addr: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let metadata = match replicated {
            None => {
                let manager =
                    Manager::open(&root.path().join("manager"), config).expect("manager store");
                let manager = Arc::new(Mutex::new(manager));
                let host = ManagerHost {
                    manager: manager.clone(),
                };
                network.listen(manager_addr, Arc::new(host));
                Metadata::Single(manager)
            }
            Some((count, spares, faults)) => {
                Metadata::Replicated(Arc::new(SimReplicas::start_with_spares(
                    seed,
                    count,
                    spares,
                    root.path(),
                    config,
                    network.clone(),
                    faults,
                )))
            }
        };
        let servers = (0..servers)
            .map(|i| SimServer {
                addr: SocketAddr::from(([10, 0, 1, i as u8 + 1], 7100)),
                disk: MemDisk::new(),
                dir: PathBuf::from(format!("/server{}", i + 1)),
                id: 0,
                running: None,
                last_store: Weak::new(),
            })
            .collect();
        let mut cluster = SimCluster {
            network,
            manager_addr,
            request_timeout: match metadata {
                Metadata::Single(_) => Duration::from_secs(1),
                // As the real client's: longer than a replica's order timeout.
                Metadata::Replicated(_) => Duration::from_secs(5),
            },
            metadata,
            servers,
            resolving: Arc::new(AtomicBool::new(true)),
            _root: root,
        };
        for index in 0..cluster.servers.len() {
            cluster.start_server(index).await;
        }
        cluster
    }

    /// A new client process.
    pub fn client(&self) -> Client {
        let transport = Arc::new(self.network.transport(self.request_timeout));
        match &self.metadata {
            Metadata::Single(_) => Client::with_transport(self.manager_addr, transport),
            Metadata::Replicated(replicas) => {
                Client::with_transport_replicated(replicas.addrs(), transport)
            }
        }
    }

    /// The manager's replicas, if it is replicated.
    pub fn replicas(&self) -> Option<&SimReplicas> {
        match &self.metadata {
            Metadata::Single(_) => None,
            Metadata::Replicated(replicas) => Some(replicas),
        }
    }

    /// Pauses (or resumes) every server's background torn-stripe resolver, for tests that
    /// look at a torn stripe before anyone resolves it.
    pub fn set_torn_resolver(&self, on: bool) {
        self.resolving.store(on, Ordering::SeqCst);
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// The manager's id for server `index`.
    pub fn server_id(&self, index: usize) -> ServerId {
        self.servers[index].id
    }

    /// Creates `/f`, a RAID-5 file of `stripe_unit`-byte units over four columns, writes
    /// `bytes` at its start with `client` and syncs it; returns the file and its servers'
    /// indexes in column order (RAID-5 puts stripe 0's parity on the last).
    pub async fn raid5_file(
        &self,
        client: &Client,
        stripe_unit: u32,
        bytes: &[u8],
    ) -> (tessera_client::File, Vec<usize>) {
        let layout = tessera_client::LayoutRequest {
            scheme: tessera_client::Scheme::Raid5,
            stripe_unit,
            width: Some(4),
        };
        let file = client.create("/f", layout).await.expect("create");
        client.write_at(&file, 0, bytes).await.expect("write");
        client.sync(&file).await.expect("sync");
        let meta = client.stat("/f").await.expect("stat").meta;
        let columns = meta.servers.iter().map(|&id| self.index_of(id)).collect();
        (file, columns)
    }

    /// The index of the server the manager knows as `id`.
    pub fn index_of(&self, id: ServerId) -> usize {
        let found = self.servers.iter().position(|server| server.id == id);
        found.expect("a server of the cluster")
    }

    /// Server `index`'s address.
    pub fn server_addr(&self, index: usize) -> SocketAddr {
        self.servers[index].addr
    }

    /// Whether server `index` runs.
    pub fn is_running(&self, index: usize) -> bool {
        self.servers[index].running.is_some()
    }

    /// Open server `index`'s store (its directory as the last run left it), register it and
    /// serve it. Does nothing if it runs. A store that refuses to open (a damaged
    /// `store.toml`) is moved away, as its doc tells the operator: the server starts on a
    /// blank disk (then returns `Some(why)`).
    pub async fn start_server(&mut self, index: usize) -> Option<String> {
        if self.is_running(index) {
            return None;
        }
        // Requests the crashed server had begun may still hold its store (and the directory's
        // lock); they finish on their own, as disk writes already issued do.
        while self.servers[index].last_store.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let server = &mut self.servers[index];
        let (store, refused) = match Store::open_on(server.disk.shared(), &server.dir) {
            Ok(store) => (store, None),
            Err(error) => {
                server.disk = MemDisk::new();
                let store = Store::open_on(server.disk.shared(), &server.dir)
                    .expect("a store opens on a blank disk");
                (store, Some(error.to_string()))
            }
        };
        let store = Arc::new(store);
        let incarnation = store.incarnation();
        let request = ManagerRequest::Register {
            server: store.server_id().or((server.id != 0).then_some(server.id)),
            addr: server.addr.to_string(),
            incarnation,
            cluster: store.cluster_id(),
        };
        let answer = self.metadata.call(&self.network, request).await;
        let ManagerResponse::Registered {
            server: id,
            cluster,
            ..
        } = answer
        else {
            panic!("the manager refused server {}: {answer:?}", index + 1);
        };
        if (store.server_id(), store.cluster_id()) != (Some(id), Some(cluster)) {
            store
                .set_membership(cluster, id)
                .expect("membership persists");
        }
        server.id = id;
        server.last_store = Arc::downgrade(&store);
        let handler = tessera_server::handler(store.clone(), id);
        self.network.listen(server.addr, handler);
        let heartbeat = tokio::spawn(heartbeat(
            self.metadata.clone(),
            self.network.clone(),
            server.addr,
            [id as u64, incarnation, cluster],
        ));
        let addr = server.addr;
        let resolver = tokio::spawn(resolve_torn_stripes(
            self.client(),
            self.network.clone(),
            addr,
            id,
            self.resolving.clone(),
        ));
        self.servers[index].running = Some(Running {
            store,
            heartbeat,
            resolver,
        });
        refused
    }

    /// Server `index`'s process dies: its connections close, it stops heartbeating, its store
    /// is closed once the requests it had begun are done. The page cache survives (what it
    /// wrote stays written); losing unsynced writes is the in-memory disk's job (crate docs).
    pub fn crash_server(&mut self, index: usize) {
        let server = &mut self.servers[index];
        if let Some(running) = server.running.take() {
            self.network.crash(server.addr);
            running.stop();
        }
    }

    /// Crash server `index` and empty its directory: a disk replaced by a blank one.
    pub async fn wipe_server(&mut self, index: usize) {
        self.crash_server(index);
        while self.servers[index].last_store.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.servers[index].disk = MemDisk::new();
    }

    /// Server `index` loses power: its process dies, and its disk keeps, drops or tears each
    /// write not synced, by `seed` ([`MemDisk::power_loss`]).
    pub fn power_loss(&mut self, index: usize, seed: u64) -> PowerLoss {
        self.crash_server(index);
        self.servers[index].disk.power_loss(seed)
    }

    /// One bit, chosen by `seed`, flips in one of server `index`'s files.
    pub fn flip_bit(&self, index: usize, seed: u64) -> Option<BitFlip> {
        let server = &self.servers[index];
        server.disk.flip_bit(&server.dir, seed)
    }

    /// One bit, chosen by `seed`, flips in one of the files under `sub` of server `index`'s
    /// directory (`None` if it holds no file there).
    pub fn flip_bit_under(&self, index: usize, sub: &str, seed: u64) -> Option<BitFlip> {
        let server = &self.servers[index];
        server.disk.flip_bit(&server.dir.join(sub), seed)
    }

    /// Flips bit `bit` of byte `offset` of file `file`'s `name` file (`data`, `data.crc`,
    /// `redundancy`, ...) on server `index`: whether that byte exists.
    pub fn flip_bit_in(&self, index: usize, file: u64, name: &str, offset: u64, bit: u8) -> bool {
        let server = &self.servers[index];
        let path = server.dir.join("files").join(file.to_string()).join(name);
        server.disk.flip_bit_at(&path, offset, bit)
    }

    /// What every server owes, as the manager holds it: `server id: path [stripes) ...`, for
    /// traces (read from the state machine, not over the network).
    pub fn debts(&self) -> String {
        let mut out = Vec::new();
        for server in &self.servers {
            let request = ManagerRequest::FilesOnServer { server: server.id };
            let answer = match &self.metadata {
                Metadata::Single(manager) => manager.lock().unwrap().handle(request, now()),
                Metadata::Replicated(replicas) => {
                    let answer = replicas.with_manager(|manager| manager.handle(request, now()));
                    answer.unwrap_or(ManagerResponse::Done)
                }
            };
            let ManagerResponse::Debts(debts) = answer else {
                continue;
            };
            for debt in debts.iter().filter(|d| !d.missed.is_empty()) {
                let ranges: Vec<String> = debt
                    .missed
                    .iter()
                    .map(|r| format!("[{}, {})", r.start, r.end))
                    .collect();
                out.push(format!(
                    "{}: {} {}",
                    server.id,
                    debt.meta.path,
                    ranges.join(" ")
                ));
            }
        }
        out.join("; ")
    }

    /// Sync every running server's store (as SIGTERM does).
    pub fn sync_all(&self) {
        for server in &self.servers {
            if let Some(running) = &server.running {
                running.store.sync().expect("sync");
            }
        }
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(running) = server.running.take() {
                running.stop();
            }
        }
    }
}

/// Heartbeat as `tessera_server` does, straight into the manager's state machine, while the
/// server's address is served (a server killed in the middle of an operation falls silent at
/// once, before the simulator reaps it).
async fn heartbeat(
    metadata: Metadata,
    network: Arc<MemNetwork>,
    addr: SocketAddr,
    [server, incarnation, cluster]: [u64; 3],
) {
    let server = server as ServerId;
    loop {
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        if !network.is_listening(addr) {
            return;
        }
        let request = ManagerRequest::Heartbeat {
            server,
            incarnation,
            cluster,
        };
        metadata.call(&network, request).await;
    }
}

/// Resolve the torn stripes of interrupted full-stripe writes whose parity the server at
/// `addr` holds, every [`TORN_RESOLVE_EVERY`] while it is served, as the `tessera server`
/// daemon does (a client of the cluster of its own).
async fn resolve_torn_stripes(
    client: Client,
    network: Arc<MemNetwork>,
    addr: SocketAddr,
    server: ServerId,
    resolving: Arc<AtomicBool>,
) {
    loop {
        tokio::time::sleep(TORN_RESOLVE_EVERY).await;
        if !network.is_listening(addr) {
            return;
        }
        if !resolving.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(e) = client.resolve_torn(server).await {
            tracing::debug!("server {server}: torn stripes not looked at: {e}");
        }
    }
}
