//! Tessera's client library.
//!
//! This crate owns the client's half of every operation: it asks the manager for a file's
//! [`FileView`](tessera_wire::FileView) (layout, servers, what counts as lost), turns reads and
//! writes into per-server requests with `tessera-layout`'s transfer plans, and runs them in
//! parallel and pipelined over a [`Transport`]. It carries out the redundancy schemes
//! (parity computed here, read-modify-write under the servers' parity locks, Hybrid overflow
//! writes), degraded mode (reconstruction from survivors, writes that go on without a lost
//! server and record what it missed at the manager), repair of corrupt blocks, rebuild and scrub.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tessera_client::ClientError> {
//! use tessera_client::{Client, LayoutRequest, Scheme};
//! let client = Client::connect("127.0.0.1:7000".parse().unwrap()).await?;
//! let file = client
//!     .create("logs/day1", LayoutRequest { scheme: Scheme::Hybrid, stripe_unit: 65536, width: None })
//!     .await?;
//! client.write_at(&file, 0, b"hello").await?;
//! client.sync(&file).await?;
//! assert_eq!(client.read_at(&file, 0, 5).await?, b"hello");
//! # Ok(()) }
//! ```

mod context;
mod intent;
mod keys;
mod maintain;
mod mirror_repair;
mod namespace;
mod pieces;
mod read;
mod restore;
mod snapshot;
pub mod stream;
mod transfer;
mod truncate;
mod write;

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_transport::{
    ManagerReplicas, TcpConfig, TcpTransport, Transport, TransportError, UdpConfig, UdpTransport,
};
use tessera_wire::{
    FileId, FileMeta, ManagerError, ManagerRequest, ManagerResponse, ServerId, ServerStatus,
    StorageError,
};

pub use maintain::{RebuildProgress, ScrubReport, TornResolution};
pub use pieces::Pieces;
pub use snapshot::{SnapshotHandle, SnapshotRemoval};
pub use tessera_auth::{
    format_access_key, parse_access_key, Claim, Credential, Key, KeyId, Secret,
};
pub use tessera_datagram::RadonConfig;
pub use tessera_layout::COLUMN_BYTES_MAX;
pub use tessera_layout::{Layout, Scheme};
pub use tessera_transport::{CongestionKind, DatagramConfig, TransportKind};
pub use tessera_wire::{AccessKeyInfo, ReplicaStatus};
pub use tessera_wire::{DirListing, LayoutRequest, NamespaceEntry, ServerState};
pub use transfer::{
    OpenFile, StreamUploadError, SYNC_AHEAD_BYTES, TRANSFERS_IN_FLIGHT, TRANSFER_CHUNK_BYTES,
};
pub use truncate::Truncation;

/// Requests one operation keeps in flight at once: a whole stripe of 64 servers goes out
/// together. What they answer does not all come at once: the datagram transport's receive
/// budget grants it toward the client's port a little at a time.
pub(crate) const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Largest single request a read or write is coalesced into.
pub(crate) const REQUEST_BYTES_MAX: usize = 1 << 20;

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The manager could not be reached.
    #[error("cannot reach the manager at {addr}: {error}")]
    ManagerUnreachable {
        /// The manager's address.
        addr: SocketAddr,
        /// Why.
        error: TransportError,
    },
    /// The manager refused the request.
    #[error("{0}")]
    Metadata(#[from] ManagerError),
    /// Too many servers are lost for the file's scheme.
    #[error("{scheme} file '{path}' is unavailable: {}", describe_servers(.servers))]
    Unavailable {
        /// The file.
        path: String,
        /// Its scheme.
        scheme: Scheme,
        /// The lost servers (id and address).
        servers: Vec<(ServerId, SocketAddr)>,
    },
    /// A storage server refused a request in a way redundancy cannot cover.
    #[error("server {server} ({addr}): {error}")]
    Storage {
        /// Server id.
        server: ServerId,
        /// Its address.
        addr: SocketAddr,
        /// What it said.
        error: StorageError,
    },
    /// A peer answered with something that makes no sense for the request.
    #[error("unexpected answer from {peer}: {detail}")]
    Protocol {
        /// Who.
        peer: String,
        /// What.
        detail: String,
    },
    /// The server to rebuild is not running.
    #[error("server {0} is down; start it before rebuilding")]
    ServerDown(ServerId),
    /// No server with that id.
    #[error("no server with id {0}")]
    NoSuchServer(ServerId),
    /// Some files could not be rebuilt on the server (no redundancy, or too many servers
    /// lost); every other file was.
    #[error("server {server} was rebuilt except {} of {files_total} files, which could not be: {}", .failed.len(), describe_failures(.failed))]
    Unrebuildable {
        /// The server.
        server: ServerId,
        /// Files the rebuild tried.
        files_total: u64,
        /// Path of each file that could not be rebuilt, and why.
        failed: Vec<(String, Unrebuildable)>,
    },
    /// Bytes of a stripe whose full-stripe write was interrupted (its parity is under a
    /// stale-parity record, not yet resolved) are on a lost or corrupt column: its parity
    /// and the other columns imply neither their old nor their new value, so they cannot be
    /// recovered (or, for a write, the stripe cannot be made consistent first).
    #[error("stripe {stripe} of '{path}' was left half-written by a client that died (its parity is stale) and server {server} ({addr}) is lost or damaged there: those bytes cannot be recovered until it is back")]
    TornStripe {
        /// The file.
        path: String,
        /// The stripe.
        stripe: u64,
        /// The server of the column that cannot be read.
        server: ServerId,
        /// Its address.
        addr: SocketAddr,
    },
    /// A byte range passes the largest size a file of its layout can have (or `u64`).
    #[error("bytes {offset}+{len} of '{path}' pass its maximum size of {max} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's maximum size ([`Layout::file_bytes_max`]).
        max: u64,
    },
    /// The local end of a transfer failed: its source could not be read, or its sink
    /// written (see [`Client::upload`], [`Client::download`]).
    #[error("cannot {action}: {error}")]
    Local {
        /// What failed: "read input" or "write output".
        action: &'static str,
        /// Why.
        error: std::io::Error,
    },
    /// Taking a snapshot took longer than its servers' fences stand, so a begin may have
    /// run after a fence lapsed: the snapshot is not taken (take it again).
    #[error("snapshot {name} was not begun everywhere within {within_ms} ms; take it again")]
    SnapshotTooSlow {
        /// The snapshot.
        name: String,
        /// The bound, in milliseconds.
        within_ms: u64,
    },
}

/// Why a rebuild left one file owed ([`ClientError::Unrebuildable`]), for callers that treat
/// the reasons differently: torn stripes stay owed by design, the others are failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrebuildable {
    /// A RAID-0 file: nothing to rebuild from.
    #[error("raid0 has no redundancy to rebuild from")]
    NoRedundancy,
    /// Stripes left torn by an interrupted full-stripe write ([`ClientError::TornStripe`]):
    /// they stay owed (reading as an error there) until their record is resolved; the rest
    /// of the file was rebuilt.
    #[error("{0}")]
    TornStripes(String),
    /// Any other error (another server lost too, a server refused, ...).
    #[error("{0}")]
    Failed(String),
}

fn describe_failures(failed: &[(String, Unrebuildable)]) -> String {
    let lines: Vec<String> = failed
        .iter()
        .map(|(path, why)| format!("{path} ({why})"))
        .collect();
    lines.join("; ")
}

fn describe_servers(servers: &[(ServerId, SocketAddr)]) -> String {
    let names: Vec<String> = servers
        .iter()
        .map(|(id, addr)| format!("server {id} ({addr})"))
        .collect();
    format!("{} unavailable", names.join(" and "))
}

/// The up servers' disks, summed ([`Client::capacity`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Their file systems' sizes in bytes.
    pub total: u64,
    /// Bytes still free for their stores.
    pub available: u64,
    /// Bytes their stores occupy.
    pub stored: u64,
    /// How many servers reported.
    pub servers: u32,
}

/// An open file: its id and path. Every operation refreshes its view from the manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// File id.
    pub id: FileId,
    /// Path.
    pub path: String,
}

/// A file being written to take a path atomically: no path names it until
/// [`Client::commit_pending`], and the manager removes it (and its servers its data) if it is
/// neither committed nor renewed within its lease.
#[derive(Debug, Clone)]
pub struct PendingFile {
    /// The new file (its path is the one it will take).
    pub file: File,
    /// Its metadata when created: the servers that hold its data.
    pub meta: FileMeta,
    /// How long it lives without a renewal.
    pub lease: Duration,
}

/// A file's metadata and the bytes it occupies.
#[derive(Debug, Clone)]
pub struct FileStat {
    /// Layout, servers, size.
    pub meta: FileMeta,
    /// Bytes on all reachable servers: data, parity, mirrors, overflow.
    pub stored_bytes: u64,
    /// Servers that could not be asked for their usage.
    pub unreachable: Vec<ServerId>,
    /// Bytes the reachable servers keep as copies for snapshots of the file.
    pub snapshot_bytes: u64,
}

/// Tunables of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// How long a server may take to answer before it counts as down.
    pub request_timeout: Duration,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// What carries traffic to the storage servers (the manager is always reached over TCP).
    pub transport: TransportKind,
    /// The datagram protocol's settings, when `transport` is UDP.
    pub datagram: DatagramConfig,
    /// What the client proves at the manager (an access key, or the admin's key); toward
    /// storage servers it proves the matching storage key. `None` is refused by every daemon.
    pub credential: Option<tessera_auth::Credential>,
    /// A reserved rate for this client's traffic (one reserved stream, [`stream`]): over the
    /// datagram transport every session to a server is paced at this rate by Radon's percent
    /// budget (an upper bound per server; the transfer loop's [`stream::StreamLedger`] holds
    /// the total). Over TCP nothing below the transfer loop paces.
    pub reservation: Option<stream::Reservation>,
}

/// Packets of answers a client may have granted and not yet received, across all servers
/// (the datagram transport's receive budget): under the 32 KiB buffer of a switch port
/// (22 full-size frames), so that servers answering at once cannot overflow it whatever
/// their number, and above the bandwidth-delay product of a LAN link up to 1 Gbit/s with
/// about 100 µs round trips (9 frames), so that the link stays busy. See
/// `tessera_datagram::grants`.
pub const RECEIVE_BUDGET_PACKETS: u32 = 20;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            transport: TransportKind::default(),
            datagram: DatagramConfig {
                receive_budget_packets: Some(RECEIVE_BUDGET_PACKETS),
                ..DatagramConfig::default()
            },
            credential: None,
            reservation: None,
        }
    }
}

/// A connection to a Tessera cluster.
#[derive(Clone)]
pub struct Client {
    /// Carries requests to storage servers.
    pub(crate) transport: Arc<dyn Transport>,
    /// Carries requests to the manager.
    pub(crate) manager_transport: Arc<dyn Transport>,
    /// The manager, or the replicas of a replicated one, and which is tried first.
    pub(crate) managers: Arc<Managers>,
    /// Files this client created pending and has not committed or abandoned: their
    /// full-stripe writes take no stale-parity record (if the client dies, the whole file is
    /// discarded; see `tessera-store`'s `stale` module).
    pub(crate) pending: Arc<Mutex<HashSet<FileId>>>,
    /// Pending files made here for fresh writes ([`Client::create_pending_open`]): whether
    /// their maker is still their only context in this client, and their stripes written
    /// fresh and still in flight, which every context of the file shares (see
    /// `FileContext::take_fresh`).
    pub(crate) fresh: Arc<Mutex<HashMap<FileId, context::FreshFile>>>,
    /// Sizes this client's writes gave files by growing them (`SetSize { grow_only }`, which
    /// the manager commits without sync), until a sync restates them durably.
    pub(crate) grown: Arc<Mutex<HashMap<FileId, u64>>>,
    /// How the servers are asked to order this client's requests (see [`stream::ServiceClock`]).
    pub(crate) service: stream::ServiceClock,
}

/// Requests to a replicated manager go round its replicas at most this many times before the
/// client gives up: each replica answers, refuses or times out within its request timeout.
pub const MANAGER_ROUNDS_MAX: usize = 3;
/// Pause after a round in which no replica answered.
const MANAGER_ROUND_PAUSE: Duration = Duration::from_millis(200);

/// The manager's replicas (one address for a manager that is not replicated), the one
/// requests go to now (kept up to date from the group: [`ManagerReplicas`]), and this
/// client's numbering of its changes (see [`ManagerRequest::Once`]).
pub(crate) struct Managers {
    replicas: ManagerReplicas,
    client: u64,
    sequence: std::sync::atomic::AtomicU64,
}

impl Managers {
    fn new(replicas: ManagerReplicas) -> Managers {
        Managers {
            replicas,
            client: rand::random(),
            sequence: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn replicated(&self) -> bool {
        self.replicas.replicated()
    }

    /// The replica requests go to now.
    fn current(&self) -> (usize, SocketAddr) {
        self.replicas.current()
    }

    /// Moves on from replica `index` (unless another request already did).
    fn fail_over(&self, index: usize) {
        self.replicas.fail_over(index);
    }

    /// `request` numbered for at-most-once application, if it changes state and the manager
    /// is replicated (a retry at another replica must not apply it again).
    fn wrap(&self, request: ManagerRequest) -> ManagerRequest {
        use ManagerRequest as R;
        let read_only = matches!(
            request,
            R::Lookup { .. }
                | R::List { .. }
                | R::Status
                | R::FilesOnServer { .. }
                | R::KeyList
                // A change of the replica group made already is answered as made: a retry
                // needs no record.
                | R::ReplicaChange { .. }
                | R::ReplicaGroup
                | R::Namespace(
                    tessera_wire::NamespaceRequest::ListDir { .. }
                        | tessera_wire::NamespaceRequest::Entry { .. }
                )
        );
        if !self.replicated() || read_only {
            return request;
        }
        let sequence = 1 + self
            .sequence
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        R::Once {
            client: self.client,
            sequence,
            request: Box::new(request),
        }
    }
}

impl Client {
    /// Connect with default settings (the datagram transport to servers), checking that the
    /// manager answers.
    pub async fn connect(manager: SocketAddr) -> Result<Client, ClientError> {
        Self::connect_with(manager, ClientConfig::default()).await
    }

    /// Connect with the given settings, checking that the manager answers.
    pub async fn connect_with(
        manager: SocketAddr,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        Self::connect_replicated(vec![manager], config).await
    }

    /// Connect to a manager given by the addresses of its replicas (one for a manager that is
    /// not replicated): a request goes to one replica, and to the next when it does not
    /// answer within the request timeout or says it cannot order requests now.
    pub async fn connect_replicated(
        managers: Vec<SocketAddr>,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let client = Self::new_replicated(managers, config)?;
        client.status().await?;
        Ok(client)
    }

    /// As [`Client::connect_replicated`], without the check: no request goes to the manager
    /// until the first operation, which fails as the check would if the manager does not
    /// answer or refuses the credential (a command that makes few requests saves one).
    pub fn new_replicated(
        managers: Vec<SocketAddr>,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let tcp = TcpConfig {
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
        };
        let credential = config.credential;
        let storage_credential = credential.map(|c| c.for_storage());
        let manager_transport: Arc<dyn Transport> =
            Arc::new(Arc::new(TcpTransport::with_credential(tcp, credential)));
        let transport: Arc<dyn Transport> = match config.transport {
            TransportKind::Tcp => Arc::new(Arc::new(TcpTransport::with_credential(
                tcp,
                storage_credential,
            ))),
            TransportKind::Udp => {
                let udp = UdpTransport::new(UdpConfig {
                    datagram: DatagramConfig {
                        connect_reservation: config.reservation,
                        ..config.datagram.clone()
                    },
                    request_timeout: config.request_timeout,
                    credential: storage_credential,
                })
                .map_err(|e| ClientError::Protocol {
                    peer: "local UDP socket".into(),
                    detail: e.to_string(),
                })?;
                Arc::new(udp)
            }
        };
        Ok(Client {
            transport,
            manager_transport,
            managers: Arc::new(Managers::new(ManagerReplicas::new(managers))),
            pending: Arc::default(),
            fresh: Arc::default(),
            grown: Arc::default(),
            service: stream::ServiceClock::of(config.reservation),
        })
    }

    /// A client over any transport, used for servers and manager alike (no check that the
    /// manager answers).
    pub fn with_transport(manager: SocketAddr, transport: Arc<dyn Transport>) -> Client {
        Client {
            manager_transport: transport.clone(),
            transport,
            managers: Arc::new(Managers::new(ManagerReplicas::new(vec![manager]))),
            pending: Arc::default(),
            fresh: Arc::default(),
            grown: Arc::default(),
            service: stream::ServiceClock::BestEffort,
        }
    }

    /// As [`Client::with_transport`], to a manager given by the addresses of its replicas:
    /// requests fail over between them and the list follows the group, as
    /// [`Client::connect_replicated`]'s do.
    pub fn with_transport_replicated(
        managers: Vec<SocketAddr>,
        transport: Arc<dyn Transport>,
    ) -> Client {
        Client {
            managers: Arc::new(Managers::new(ManagerReplicas::new(managers))),
            ..Client::with_transport(SocketAddr::from(([0, 0, 0, 0], 0)), transport)
        }
    }

    /// The manager replica requests go to now.
    pub(crate) fn manager(&self) -> SocketAddr {
        self.managers.current().1
    }

    /// The manager's replicas as this client knows them now (learned from the group: see
    /// [`ManagerReplicas`]).
    pub fn manager_addrs(&self) -> Vec<SocketAddr> {
        self.managers.replicas.addrs()
    }

    /// Sends `request` to the current replica, failing over round the replicas (at most
    /// [`MANAGER_ROUNDS_MAX`] rounds, learning the group between rounds), and learns the
    /// group after an answer when it is due.
    pub(crate) async fn manager_call(
        &self,
        request: ManagerRequest,
    ) -> Result<ManagerResponse, ClientError> {
        let request = self.managers.wrap(request);
        let replicas = &self.managers.replicas;
        let transport = self.manager_transport.as_ref();
        let mut failed = None;
        for round in 0..MANAGER_ROUNDS_MAX {
            if round > 0 {
                replicas.learn_from_any(transport).await;
                tokio::time::sleep(MANAGER_ROUND_PAUSE).await;
            }
            for _ in 0..replicas.len() {
                let (index, addr) = self.managers.current();
                let answer = tessera_transport::call::<_, ManagerResponse>(
                    transport,
                    addr,
                    &request,
                    Bytes::new(),
                )
                .await;
                let answer = match answer {
                    Ok((ManagerResponse::Error(ManagerError::Unordered(why)), _))
                        if self.managers.replicated() =>
                    {
                        failed = Some(ClientError::Metadata(ManagerError::Unordered(why)));
                        self.managers.fail_over(index);
                        continue;
                    }
                    Ok((ManagerResponse::Error(e), _)) => Err(ClientError::Metadata(e)),
                    Ok((other, _)) => Ok(other),
                    Err(error) => {
                        failed = Some(ClientError::ManagerUnreachable { addr, error });
                        if !self.managers.replicated() {
                            return Err(failed.expect("just set"));
                        }
                        // The replica may still hold this connection as synced (reads
                        // answered from its own store) while this client writes elsewhere:
                        // the next request there comes on a new connection, ordered again.
                        transport.reset(addr).await;
                        self.managers.fail_over(index);
                        continue;
                    }
                };
                if replicas.begin_learning(tokio::time::Instant::now()) {
                    replicas.learn(transport, addr).await;
                }
                return answer;
            }
        }
        Err(failed.expect("at least one attempt"))
    }

    pub(crate) fn unexpected(&self, what: &str, got: ManagerResponse) -> ClientError {
        ClientError::Protocol {
            peer: format!("manager {}", self.manager()),
            detail: format!("expected {what}, got {got:?}"),
        }
    }

    /// The servers and their states.
    pub async fn status(&self) -> Result<Vec<ServerStatus>, ClientError> {
        match self.manager_call(ManagerRequest::Status).await? {
            ManagerResponse::Servers(servers) => Ok(servers),
            other => Err(self.unexpected("servers", other)),
        }
    }

    /// The state of every replica of a replicated manager (role, view, applied position), or
    /// of the one manager; a replica that does not answer is listed with the error. The
    /// replicas are those this client knows now (the group learned as it changes).
    pub async fn replicas(&self) -> Vec<(SocketAddr, Result<ReplicaStatus, ClientError>)> {
        let mut out = Vec::new();
        for addr in self.managers.replicas.addrs() {
            out.push((addr, self.replica_at(addr).await));
        }
        out
    }

    /// The state of the manager replica at `addr` (role, view, applied position), whether
    /// or not it is a member of the group.
    pub async fn replica_at(&self, addr: SocketAddr) -> Result<ReplicaStatus, ClientError> {
        let answer = tessera_transport::call::<_, ManagerResponse>(
            self.manager_transport.as_ref(),
            addr,
            &ManagerRequest::Replica,
            Bytes::new(),
        )
        .await;
        match answer {
            Ok((ManagerResponse::Replica(status), _)) => Ok(status),
            Ok((ManagerResponse::Error(e), _)) => Err(ClientError::Metadata(e)),
            Ok((other, _)) => Err(self.unexpected("replica", other)),
            Err(error) => Err(ClientError::ManagerUnreachable { addr, error }),
        }
    }

    /// Adds manager replica `id` at `addr` to the replicated manager's group, or removes it
    /// (`addr` empty), as one ordered change (admin only): the group after it, as the
    /// group's epoch and its members' ids and addresses.
    pub async fn replica_change(
        &self,
        id: u16,
        addr: Option<String>,
    ) -> Result<(u32, Vec<(u16, String)>), ClientError> {
        match self
            .manager_call(ManagerRequest::ReplicaChange { id, addr })
            .await?
        {
            ManagerResponse::ReplicaGroup { epoch, members } => Ok((epoch, members)),
            other => Err(self.unexpected("replica group", other)),
        }
    }

    /// The replicated manager's group as the replica asked records it: its epoch and its
    /// members' ids and addresses.
    pub async fn replica_group(&self) -> Result<(u32, Vec<(u16, String)>), ClientError> {
        match self.manager_call(ManagerRequest::ReplicaGroup).await? {
            ManagerResponse::ReplicaGroup { epoch, members } => Ok((epoch, members)),
            other => Err(self.unexpected("replica group", other)),
        }
    }

    /// This client's transport counters by name (the datagram endpoint's statistics:
    /// "retransmissions", "timeouts", "timeout_us_max", "grants", ...); empty over TCP.
    pub async fn transport_counters(&self) -> BTreeMap<String, u64> {
        self.transport.counters().await.into_iter().collect()
    }

    /// Every up server's transport counters by name, with its id (the datagram endpoint's
    /// statistics; empty for a server that serves TCP only). A server that does not answer
    /// is left out.
    pub async fn server_counters(
        &self,
    ) -> Result<Vec<(ServerId, BTreeMap<String, u64>)>, ClientError> {
        Ok(self.counters_of(self.status().await?).await)
    }

    /// As [`Client::server_counters`], of the up servers among `servers` (a status the
    /// caller already has).
    pub async fn counters_of(
        &self,
        servers: Vec<ServerStatus>,
    ) -> Vec<(ServerId, BTreeMap<String, u64>)> {
        let asks = servers
            .into_iter()
            .filter(|s| s.state == tessera_wire::ServerState::Up)
            .filter_map(|s| Some((s.id, s.addr.parse::<SocketAddr>().ok()?, s.incarnation)))
            .map(|(id, addr, incarnation)| async move {
                let request = tessera_wire::StorageRequest::TransportCounters;
                let answer =
                    context::call_store(self, addr, incarnation, request, Bytes::new()).await;
                match answer {
                    Ok((tessera_wire::StorageResponse::Counters { counters }, _)) => {
                        Some((id, counters.into_iter().collect()))
                    }
                    _ => None,
                }
            });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The raw capacity of the up servers' disks, summed: what a mount's `statfs` (`df`)
    /// shows. Raw: a RAID-5 file over 5 servers costs 5/4 of its bytes, a RAID-1 file twice.
    pub async fn capacity(&self) -> Result<Capacity, ClientError> {
        let mut capacity = Capacity::default();
        for (_, counters) in self.server_counters().await? {
            let Some(&total) = counters.get("disk_total_bytes") else {
                continue;
            };
            let value = |name: &str| counters.get(name).copied().unwrap_or(0);
            capacity.total = capacity.total.saturating_add(total);
            capacity.available = (capacity.available).saturating_add(value("disk_available_bytes"));
            capacity.stored = capacity.stored.saturating_add(value("disk_stored_bytes"));
            capacity.servers += 1;
        }
        Ok(capacity)
    }

    /// Create a file (an existing file of that path is an error).
    pub async fn create(&self, path: &str, layout: LayoutRequest) -> Result<File, ClientError> {
        let request = ManagerRequest::Create {
            path: path.to_string(),
            layout,
            replace: false,
        };
        let view = match self.manager_call(request).await? {
            ManagerResponse::File(view) => view,
            other => return Err(self.unexpected("file", other)),
        };
        let file = File {
            id: view.meta.id,
            path: view.meta.path.clone(),
        };
        // Each column's server keeps the file's record from the start, so that the file is
        // found again if the manager's store is lost.
        self.context_from(view)?.describe(self, true).await;
        Ok(file)
    }

    /// Start writing a new file that will take `path` when committed, replacing any file that
    /// has it then (an atomic replace: readers see the old file whole until the commit, and
    /// the new one whole after it).
    pub async fn create_pending(
        &self,
        path: &str,
        layout: LayoutRequest,
    ) -> Result<PendingFile, ClientError> {
        Ok(self.create_pending_view(path, layout).await?.0)
    }

    /// [`Client::create_pending`], with the file's view as the manager gave it.
    pub(crate) async fn create_pending_view(
        &self,
        path: &str,
        layout: LayoutRequest,
    ) -> Result<(PendingFile, tessera_wire::FileView), ClientError> {
        let request = ManagerRequest::CreatePending {
            path: path.to_string(),
            layout,
        };
        match self.manager_call(request).await? {
            ManagerResponse::Pending { view, lease_ms } => {
                self.pending_files().insert(view.meta.id);
                let pending = PendingFile {
                    file: File {
                        id: view.meta.id,
                        path: view.meta.path.clone(),
                    },
                    meta: view.meta.clone(),
                    lease: Duration::from_millis(lease_ms),
                };
                Ok((pending, view))
            }
            other => Err(self.unexpected("pending file", other)),
        }
    }

    /// Pending files made here for fresh writes (see [`Client::fresh`]).
    pub(crate) fn fresh_files(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<FileId, context::FreshFile>> {
        self.fresh
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `file` is no longer pending at this client (committed, or given up): out of
    /// [`Client::pending`] and [`Client::fresh`] together, so the second never holds a file
    /// the first does not.
    pub(crate) fn end_pending(&self, file: FileId) {
        self.pending_files().remove(&file);
        self.fresh_files().remove(&file);
    }

    /// The sizes this client's writes gave files and no sync has restated yet.
    pub(crate) fn grown_sizes(&self) -> std::sync::MutexGuard<'_, HashMap<FileId, u64>> {
        self.grown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers that this client's writes grew `file` to at least `size`.
    pub(crate) fn note_grown(&self, file: FileId, size: u64) {
        let mut grown = self.grown_sizes();
        let at_least = grown.entry(file).or_insert(size);
        *at_least = (*at_least).max(size);
    }

    /// The request that makes the manager's changes durable for a sync of `file`: with the
    /// size this client's writes gave it, if any, so that a grow lost in a crash of the
    /// manager is granted again rather than acknowledged as synced.
    pub(crate) fn sync_request(&self, file: FileId) -> ManagerRequest {
        match self.grown_sizes().get(&file) {
            Some(&size) => ManagerRequest::SyncFile { file, size },
            None => ManagerRequest::Sync,
        }
    }

    /// After `request` (from [`Client::sync_request`]) was answered: the size it restated
    /// is durable, unless a write grew the file further meanwhile.
    pub(crate) fn synced(&self, request: &ManagerRequest) {
        if let ManagerRequest::SyncFile { file, size } = *request {
            let mut grown = self.grown_sizes();
            if grown.get(&file).is_some_and(|&now| now <= size) {
                grown.remove(&file);
            }
        }
    }

    /// The pending files this client writes.
    pub(crate) fn pending_files(&self) -> std::sync::MutexGuard<'_, HashSet<FileId>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keep a pending file alive for another lease.
    pub async fn renew_pending(&self, file: &File) -> Result<(), ClientError> {
        let request = ManagerRequest::RenewPending { file: file.id };
        self.manager_call(request).await.map(|_| ())
    }

    /// Run `work` (the writing of a pending file) while renewing the file's lease at a third
    /// of its length, so that a long write or sync does not outlive it. The renewals run as a
    /// task of their own, so that they go on while `work` waits for its source (even in a
    /// blocking read); they stop when `work` is done.
    pub async fn keep_pending<T>(
        &self,
        pending: &PendingFile,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let (client, file, every) = (self.clone(), pending.file.clone(), pending.lease / 3);
        let renewals = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = client.renew_pending(&file).await {
                    // The commit will say so, if the lease is lost.
                    tracing::warn!("cannot renew pending file {}: {e}", file.id);
                }
            }
        });
        let done = work.await;
        renewals.abort();
        done
    }

    /// Give a pending file its path. The file that had the path is removed in the same step;
    /// its data is deleted now on the servers that are up, and by the others when they learn
    /// of it from the manager. Sync the file first: the commit is what makes it visible.
    pub async fn commit_pending(&self, file: &File) -> Result<(), ClientError> {
        // Once the commit may have been applied, a torn write could no longer be discarded.
        self.end_pending(file.id);
        let request = ManagerRequest::CommitPending { file: file.id };
        match self.manager_call(request).await? {
            ManagerResponse::Committed { replaced } => match self.context_of(file.id).await {
                Ok(ctx) => self.committed(&ctx, replaced).await,
                // Best effort, like every record: only the old file's data is left to go.
                Err(_) => match replaced {
                    Some(old) => self.delete_data(&old, None).await,
                    None => Ok(()),
                },
            },
            other => Err(self.unexpected("committed", other)),
        }
    }

    /// After a commit of a file pending at this client: the new file's servers' records say
    /// it took its path (recovery gives a file only ever recorded uncommitted no path; best
    /// effort, like every record), and the data of the file it replaced is deleted. Only the
    /// servers holding its bytes keep records of such a file (`holding_columns`).
    pub(crate) async fn committed(
        &self,
        ctx: &context::FileContext,
        replaced: Option<FileMeta>,
    ) -> Result<(), ClientError> {
        ctx.describe_columns(self, ctx.holding_columns(), true)
            .await;
        match replaced {
            Some(old) => self.delete_data(&old, Some(ctx)).await,
            None => Ok(()),
        }
    }

    /// Give up a pending file: it is removed, and its data deleted. If its lease already ran
    /// out, its data is deleted all the same (the servers may have deleted it as an orphan
    /// before this client wrote its last bytes); if it was committed, it stays.
    pub async fn abandon_pending(&self, pending: &PendingFile) -> Result<(), ClientError> {
        let id = pending.file.id;
        self.end_pending(id);
        match self
            .manager_call(ManagerRequest::AbandonPending { file: id })
            .await
        {
            Ok(ManagerResponse::Meta(meta)) => self.delete_data(&meta, None).await,
            Ok(other) => Err(self.unexpected("meta", other)),
            Err(ClientError::Metadata(ManagerError::NotPending(_))) => {
                // Ids are never reused: a file the manager does not know is gone for good.
                match self.context_of(id).await {
                    Ok(_) => Ok(()),
                    Err(ClientError::Metadata(ManagerError::NotFound(_))) => {
                        self.delete_data(&pending.meta, None).await
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Create a file, first removing any existing file of that path and its data.
    pub async fn create_replacing(
        &self,
        path: &str,
        layout: LayoutRequest,
    ) -> Result<File, ClientError> {
        match self.remove(path).await {
            Ok(()) | Err(ClientError::Metadata(ManagerError::NotFound(_))) => {}
            Err(e) => return Err(e),
        }
        self.create(path, layout).await
    }

    /// Open an existing file.
    pub async fn open(&self, path: &str) -> Result<File, ClientError> {
        let meta = self.lookup(path).await?;
        Ok(File {
            id: meta.id,
            path: meta.path,
        })
    }

    async fn lookup(&self, path: &str) -> Result<FileMeta, ClientError> {
        let request = ManagerRequest::Lookup {
            path: path.to_string(),
        };
        match self.manager_call(request).await? {
            ManagerResponse::File(view) => Ok(view.meta),
            other => Err(self.unexpected("file", other)),
        }
    }

    /// Files whose path starts with `prefix`, sorted by path.
    pub async fn list(&self, prefix: &str) -> Result<Vec<FileMeta>, ClientError> {
        let request = ManagerRequest::List {
            prefix: prefix.to_string(),
        };
        match self.manager_call(request).await? {
            ManagerResponse::Files(files) => Ok(files),
            other => Err(self.unexpected("files", other)),
        }
    }

    /// A file's metadata, by id (a pending file's too).
    pub async fn meta(&self, file: &File) -> Result<FileMeta, ClientError> {
        Ok(self.context_of(file.id).await?.meta)
    }

    /// Refuse a byte range that passes the largest size a file of this layout can have, or
    /// whose end does not fit in a `u64`.
    pub async fn check_range(&self, file: &File, offset: u64, len: u64) -> Result<(), ClientError> {
        self.context_of(file.id).await?.check_range(offset, len)
    }

    /// Metadata and stored bytes of a file.
    pub async fn stat(&self, path: &str) -> Result<FileStat, ClientError> {
        let meta = self.lookup(path).await?;
        let ctx = self.context_of(meta.id).await?;
        let (stored_bytes, unreachable) = ctx.usage(self).await;
        let snapshot_bytes = self.snapshot_usage(meta.id, &ctx.meta.servers).await;
        Ok(FileStat {
            meta: ctx.meta.clone(),
            stored_bytes,
            unreachable,
            snapshot_bytes,
        })
    }

    /// Remove a file from the namespace and delete its data on the servers that are up.
    pub async fn remove(&self, path: &str) -> Result<(), ClientError> {
        let request = ManagerRequest::Remove {
            path: path.to_string(),
        };
        let meta = match self.manager_call(request).await? {
            ManagerResponse::Meta(meta) => meta,
            // Snapshots still hold it: its data stays until the last of them is removed.
            ManagerResponse::Retained(meta) => {
                self.grown_sizes().remove(&meta.id);
                return Ok(());
            }
            other => return Err(self.unexpected("meta", other)),
        };
        // Nothing of it is left to sync.
        self.grown_sizes().remove(&meta.id);
        self.delete_data(&meta, None).await
    }

    /// Delete a removed file's data on the servers that are up now. Best effort: a server down
    /// now deletes it when it next asks the manager for orphans.
    /// `near` is a fresh view of another file: if it has a column on every server of the
    /// removed file, their addresses come from it and the manager is not asked.
    pub(crate) async fn delete_data(
        &self,
        meta: &FileMeta,
        near: Option<&context::FileContext>,
    ) -> Result<(), ClientError> {
        let known = near.and_then(|ctx| ctx.stores_of(&meta.servers));
        let servers = match known {
            Some(servers) => servers,
            None => self
                .status()
                .await?
                .into_iter()
                .filter(|s| meta.servers.contains(&s.id))
                .filter_map(|s| Some((s.addr.parse::<SocketAddr>().ok()?, s.incarnation)))
                .collect(),
        };
        let deletions = servers.into_iter().map(|(addr, incarnation)| {
            let request = tessera_wire::StorageRequest::Remove { file: meta.id };
            // Only the store that holds the file: another at a reused address keeps its own.
            context::call_store(self, addr, incarnation, request, Bytes::new())
        });
        let _ = futures::future::join_all(deletions).await;
        Ok(())
    }

    /// Write `data` at `offset`, extending the file if needed. A range past the file's maximum
    /// size ([`Layout::file_bytes_max`]) is refused with [`ClientError::TooLarge`] before
    /// anything is written.
    pub async fn write_at(&self, file: &File, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let ctx = self.context_of(file.id).await?;
        let end = ctx
            .check_range(offset, data.len() as u64)
            .map(|()| offset + data.len() as u64)?;
        ctx.write(self, offset, data).await?;
        if end > ctx.meta.size {
            self.manager_call(ManagerRequest::SetSize {
                file: file.id,
                size: end,
                grow_only: true,
            })
            .await?;
            self.note_grown(file.id, end);
        }
        Ok(())
    }

    /// Set a file's size to exactly `size`. Shrinking hides the bytes past it without
    /// erasing them (a later write that grows the file past a hole may show them again):
    /// meant for a file being assembled, such as a multipart upload's, before it is
    /// committed.
    pub async fn set_size(&self, file: &File, size: u64) -> Result<(), ClientError> {
        self.manager_call(ManagerRequest::SetSize {
            file: file.id,
            size,
            grow_only: false,
        })
        .await?;
        // Committed durably, and it supersedes the sizes earlier writes gave the file: a
        // sync must not grow it back to them.
        self.grown_sizes().remove(&file.id);
        Ok(())
    }

    /// Read up to `len` bytes at `offset` (fewer at the end of the file). A range past the
    /// file's maximum size is refused with [`ClientError::TooLarge`].
    pub async fn read_at(
        &self,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let ctx = self.context_of(file.id).await?;
        ctx.check_range(offset, len)?;
        let available = ctx.meta.size.saturating_sub(offset).min(len);
        let mut out = vec![0u8; available as usize];
        let n = ctx.read_into(self, offset, &mut out).await?;
        out.truncate(n);
        Ok(out)
    }

    /// Read into `buf` from `offset`; returns the bytes read (fewer at the end of the file).
    pub async fn read_into(
        &self,
        file: &File,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, ClientError> {
        let ctx = self.context_of(file.id).await?;
        ctx.check_range(offset, buf.len() as u64)?;
        ctx.read_into(self, offset, buf).await
    }

    /// Read the blocks of `block_bytes` that start at each of `offsets`, keeping up to
    /// `read_ahead` of them in flight, and yield them in order, each with how long it took from
    /// its requests going out to its last byte arriving. A block is shorter than `block_bytes`
    /// (empty past the end) where the file is.
    ///
    /// This is read-ahead for sequential (or otherwise known) access: the requests for the next
    /// block go out while the current one arrives, so the link does not idle for a round trip
    /// between blocks. The file is looked up once, not per block; a server that fails
    /// meanwhile counts as lost for the blocks after, which are read degraded.
    pub async fn read_blocks(
        &self,
        file: &File,
        offsets: impl IntoIterator<Item = u64, IntoIter: Send + 'static>,
        block_bytes: usize,
        read_ahead: usize,
    ) -> Result<impl futures::Stream<Item = Result<(Vec<u8>, Duration), ClientError>>, ClientError>
    {
        let ctx = Arc::new(self.context_of(file.id).await?);
        // No end of its own: every block is `block_bytes` (fewer past the end of the file).
        let end = u64::MAX;
        Ok(transfer::blocks(
            self.clone(),
            ctx,
            offsets,
            end,
            block_bytes,
            read_ahead,
        ))
    }

    /// The file's size.
    pub async fn size(&self, file: &File) -> Result<u64, ClientError> {
        Ok(self.context_of(file.id).await?.meta.size)
    }

    /// Make everything written to the file durable on its servers. A server that cannot sync
    /// is recorded as owing the whole file, so it is resynced before it serves it again.
    pub async fn sync(&self, file: &File) -> Result<(), ClientError> {
        let ctx = self.context_of(file.id).await?;
        ctx.sync(self, true).await
    }
}
