//! openraft nodes on 127.0.0.1, or each in a namespace of the lab's two-switch network
//! ([`Place`]): a log and a state machine in memory (the state machine counts what it
//! applies), RPCs as postcard frames over one TCP connection per peer.
//!
//! Memory storage is the fair match: tessera-order keeps its log in memory too and syncs
//! nothing to disk. Snapshots are never built (the runs are short).

use crate::Latencies;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    SnapshotPolicy, StorageError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::io::Cursor;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_lab::net::run_in_namespace;
use tessera_lab::LabError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

openraft::declare_raft_types!(
    /// Messages are bytes, and so is the answer to applying one: none for the ordering
    /// bench, the encoded answer for the manager's state machine ([`crate::manager`]).
    pub TypeConfig:
        D = Vec<u8>,
        R = Vec<u8>,
);

/// A node's id.
pub type NodeId = u64;
/// A node.
pub type Raft = openraft::Raft<TypeConfig>;

/// The log, shared by the store and its readers.
#[derive(Default)]
struct LogInner {
    vote: Option<Vote<NodeId>>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<LogId<NodeId>>,
}

#[derive(Clone, Default)]
struct LogStore(Arc<Mutex<LogInner>>);

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<R: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: R,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let inner = self.0.lock().expect("log lock");
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = self.0.lock().expect("log lock");
        let last = inner.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last.or(inner.purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.0.lock().expect("log lock").vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.0.lock().expect("log lock").vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        {
            let mut inner = self.0.lock().expect("log lock");
            for entry in entries {
                inner.entries.insert(entry.log_id.index, entry);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.0.lock().expect("log lock");
        inner.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.0.lock().expect("log lock");
        inner.entries = inner.entries.split_off(&(log_id.index + 1));
        inner.purged = Some(log_id);
        Ok(())
    }
}

/// Counts the entries it applies.
#[derive(Clone, Default)]
pub struct StateMachine(Arc<Mutex<MachineInner>>);

#[derive(Default)]
struct MachineInner {
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    normal_entries: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let inner = self.0.lock().expect("machine lock");
        Ok(Snapshot {
            meta: SnapshotMeta {
                last_log_id: inner.applied,
                last_membership: inner.membership.clone(),
                snapshot_id: format!("{:?}", inner.applied),
            },
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let inner = self.0.lock().expect("machine lock");
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<u8>>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.0.lock().expect("machine lock");
        let mut out = Vec::new();
        for entry in entries {
            inner.applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Normal(_) => inner.normal_entries += 1,
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m)
                }
                EntryPayload::Blank => {}
            }
            out.push(Vec::new());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.0.lock().expect("machine lock");
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(None)
    }
}

/// An RPC on the wire.
#[derive(Serialize, Deserialize)]
enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// Its answer.
#[derive(Serialize, Deserialize)]
enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
}

async fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    stream
        .write_all(&(bytes.len() as u32).to_be_bytes())
        .await?;
    stream.write_all(bytes).await
}

async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u32().await? as usize;
    let mut bytes = vec![0; len];
    stream.read_exact(&mut bytes).await?;
    Ok(bytes)
}

fn invalid(error: postcard::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error)
}

/// Answers RPCs on one connection until it closes.
async fn serve(raft: Raft, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    loop {
        let request: Request =
            postcard::from_bytes(&read_frame(&mut stream).await?).map_err(invalid)?;
        let response = match request {
            Request::Append(rpc) => Response::Append(raft.append_entries(rpc).await),
            Request::Vote(rpc) => Response::Vote(raft.vote(rpc).await),
            Request::Snapshot(rpc) => Response::Snapshot(raft.install_snapshot(rpc).await),
        };
        write_frame(
            &mut stream,
            &postcard::to_allocvec(&response).map_err(invalid)?,
        )
        .await?;
    }
}

/// Where a node lives in the lab: its namespace, and the address it listens on and sends
/// from (its RX address: RX interfaces only receive, and the others reach it through both
/// switches; TCP's answers come back the same way).
#[derive(Clone, Debug)]
pub struct Place {
    /// The node's network namespace.
    pub namespace: String,
    /// Its RX address.
    pub addr: Ipv4Addr,
}

/// Connections to peers, made on first use, from this node's namespace if it has one.
///
/// Idle connections are kept per peer address and reused: openraft makes a client per
/// replication stream, which lives long, but also one per peer for every
/// `ensure_linearizable` (a heartbeat round per read), which it drops at once; without the
/// pool each linearizable read would open a TCP connection to every follower.
#[derive(Clone)]
struct Network {
    place: Option<Place>,
    idle: Arc<Mutex<BTreeMap<String, Vec<TcpStream>>>>,
}

struct Peer {
    target: NodeId,
    addr: String,
    place: Option<Place>,
    stream: Option<TcpStream>,
    idle: Arc<Mutex<BTreeMap<String, Vec<TcpStream>>>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;
    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let reused = self
            .idle
            .lock()
            .expect("idle connections lock")
            .get_mut(&node.addr)
            .and_then(Vec::pop);
        Peer {
            target,
            addr: node.addr.clone(),
            place: self.place.clone(),
            stream: reused,
            idle: self.idle.clone(),
        }
    }
}

impl Drop for Peer {
    /// A connection between calls holds no half-read frame (a failed call dropped its
    /// stream), so the next client of this peer may take it.
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            let mut idle = self.idle.lock().expect("idle connections lock");
            idle.entry(self.addr.clone()).or_default().push(stream);
        }
    }
}

impl Peer {
    /// One request and its answer. The stream is out of `self` while in use, so a call
    /// cancelled half-way (openraft times out its heartbeats) drops it rather than leaving
    /// a half-read frame for the pool.
    async fn call(&mut self, request: &Request) -> std::io::Result<Response> {
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let stream = match &self.place {
                    None => TcpStream::connect(&self.addr).await?,
                    Some(place) => connect_from(place.clone(), self.addr.clone()).await?,
                };
                stream.set_nodelay(true)?;
                stream
            }
        };
        write_frame(
            &mut stream,
            &postcard::to_allocvec(request).map_err(invalid)?,
        )
        .await?;
        let response = postcard::from_bytes(&read_frame(&mut stream).await?).map_err(invalid)?;
        self.stream = Some(stream);
        Ok(response)
    }
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        match self.call(&Request::Append(rpc)).await {
            Ok(Response::Append(Ok(r))) => Ok(r),
            Ok(Response::Append(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(RPCError::Unreachable(Unreachable::new(&mismatch()))),
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        match self.call(&Request::Snapshot(rpc)).await {
            Ok(Response::Snapshot(Ok(r))) => Ok(r),
            Ok(Response::Snapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(RPCError::Unreachable(Unreachable::new(&mismatch()))),
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        match self.call(&Request::Vote(rpc)).await {
            Ok(Response::Vote(Ok(r))) => Ok(r),
            Ok(Response::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(RPCError::Unreachable(Unreachable::new(&mismatch()))),
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }
}

/// A connection to `addr` made in `place`'s namespace from its address (a thread of its
/// own enters the namespace: a socket belongs to the namespace it was made in).
async fn connect_from(place: Place, addr: String) -> std::io::Result<TcpStream> {
    let stream = tokio::task::spawn_blocking(move || {
        let target: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
        run_in_namespace(&place.namespace, || {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
                .map_err(lab_io("make a socket"))?;
            socket
                .bind(&SocketAddr::from((place.addr, 0)).into())
                .map_err(lab_io("bind"))?;
            socket
                .connect_timeout(&target.into(), Duration::from_secs(1))
                .map_err(lab_io(format!("connect to {target}")))?;
            socket
                .set_nonblocking(true)
                .map_err(lab_io("set non-blocking"))?;
            Ok(std::net::TcpStream::from(socket))
        })
        .map_err(std::io::Error::other)
    })
    .await
    .map_err(std::io::Error::other)??;
    TcpStream::from_std(stream)
}

fn lab_io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let action = action.into();
    move |source| LabError::Io { action, source }
}

/// A listener on `place`'s address, made in its namespace.
fn listen_in(place: &Place) -> anyhow::Result<TcpListener> {
    let listener = run_in_namespace(&place.namespace, || {
        let listener = std::net::TcpListener::bind((place.addr, 0)).map_err(lab_io("listen"))?;
        listener
            .set_nonblocking(true)
            .map_err(lab_io("set non-blocking"))?;
        Ok(listener)
    })?;
    Ok(TcpListener::from_std(listener)?)
}

fn mismatch() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, "answer of another kind")
}

/// A cluster of nodes, its leader elected, each with a state machine `M`.
pub struct Cluster<M = StateMachine> {
    rafts: Vec<Raft>,
    machines: Vec<M>,
    leader: usize,
    /// The nodes' accept loops, stopped with the cluster.
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Starts `nodes` nodes on 127.0.0.1, initializes the cluster and waits for a leader.
    pub async fn start(nodes: usize, max_payload_entries: u64) -> anyhow::Result<Cluster> {
        Cluster::start_at(vec![None; nodes], max_payload_entries).await
    }

    /// As [`Cluster::start`], a node per place (`None`: on 127.0.0.1).
    pub async fn start_at(
        places: Vec<Option<Place>>,
        max_payload_entries: u64,
    ) -> anyhow::Result<Cluster> {
        let machines = vec![StateMachine::default(); places.len()];
        Cluster::start_with(places, machines, max_payload_entries).await
    }
}

impl<M> Cluster<M>
where
    M: RaftStateMachine<TypeConfig> + Clone,
{
    /// Starts a node per place (`None`: on 127.0.0.1), node `i` with `machines[i]`,
    /// initializes the cluster and waits for a leader.
    pub async fn start_with(
        places: Vec<Option<Place>>,
        machines: Vec<M>,
        max_payload_entries: u64,
    ) -> anyhow::Result<Cluster<M>> {
        anyhow::ensure!(places.len() == machines.len(), "a machine per node");
        let config = Arc::new(
            openraft::Config {
                cluster_name: "bench".into(),
                heartbeat_interval: 50,
                election_timeout_min: 300,
                election_timeout_max: 600,
                max_payload_entries,
                snapshot_policy: SnapshotPolicy::Never,
                ..Default::default()
            }
            .validate()?,
        );
        let mut members = BTreeMap::new();
        let (mut rafts, mut listeners) = (Vec::new(), Vec::new());
        for ((id, place), machine) in (0u64..).zip(places).zip(&machines) {
            let listener = match &place {
                None => TcpListener::bind("127.0.0.1:0").await?,
                Some(place) => listen_in(place)?,
            };
            let addr = listener.local_addr()?.to_string();
            members.insert(id, BasicNode { addr });
            let raft = Raft::new(
                id,
                config.clone(),
                Network {
                    place,
                    idle: Arc::default(),
                },
                LogStore::default(),
                machine.clone(),
            )
            .await?;
            let server = raft.clone();
            listeners.push(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(server.clone(), stream));
                }
            }));
            rafts.push(raft);
        }
        rafts[0].initialize(members).await?;
        let began = Instant::now();
        let leader = loop {
            if let Some(leader) = rafts[0].metrics().borrow().current_leader {
                break leader as usize;
            }
            anyhow::ensure!(
                began.elapsed() < Duration::from_secs(10),
                "no leader after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        Ok(Cluster {
            rafts,
            machines,
            leader,
            listeners,
        })
    }

    /// The leader's Raft, through which every write goes.
    pub fn leader(&self) -> &Raft {
        &self.rafts[self.leader]
    }

    /// Node `i`'s state machine.
    pub fn machine(&self, i: usize) -> &M {
        &self.machines[i]
    }

    /// Stops every node.
    pub async fn shutdown(self) {
        for listener in self.listeners {
            listener.abort();
        }
        for raft in self.rafts {
            let _ = raft.shutdown().await;
        }
    }
}

impl Cluster {
    /// Writes `message_bytes`-byte entries through the leader, `outstanding` at a time, for
    /// `seconds`; entries committed per second and each write's latency.
    pub async fn closed_loop(
        &self,
        message_bytes: usize,
        outstanding: usize,
        seconds: f64,
    ) -> anyhow::Result<(f64, Latencies)> {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let began = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..outstanding {
            let raft = self.rafts[self.leader].clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies_us = Vec::new();
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    raft.client_write(vec![0x5A; message_bytes]).await?;
                    latencies_us.push(sent.elapsed().as_secs_f64() * 1e6);
                }
                anyhow::Ok(latencies_us)
            }));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await??);
        }
        let committed = all.len() as f64 / began.elapsed().as_secs_f64();
        Ok((committed, Latencies::of(all)))
    }

    /// Entries applied by every node's state machine, least first.
    pub fn applied(&self) -> Vec<u64> {
        let mut applied: Vec<u64> = self
            .machines
            .iter()
            .map(|m| m.0.lock().expect("machine lock").normal_entries)
            .collect();
        applied.sort_unstable();
        applied
    }
}
