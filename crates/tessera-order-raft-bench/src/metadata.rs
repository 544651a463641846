//! `--manager`: the manager's metadata workload against three systems in one process, in
//! interleaved rounds: Tessera's 3 replicas (`tessera_manager::daemon::start_replica`, the
//! real daemon: tessera-order over UDP, the applier, the TCP front), the same state machine
//! replicated by openraft on 3 nodes ([`crate::manager`]), and one manager alone
//! (`daemon::start`), all on 127.0.0.1 with their stores in one temporary directory.
//!
//! Every system gets the same requests from the same client code: 3 storage servers
//! registered and heartbeating (fake ones: nothing but their manager requests), and
//! `clients` tasks each repeating one kind of operation at a time ([`Kind`]): create (a
//! raid5 file on the 3 servers), stat (lookup, then lookup by id, of a file the round's
//! creates made) and small-file put (the manager's part of `tessera_client`'s create, a
//! 4 KiB write and `sync`: create, grow its size, sync it with that size); every change is
//! wrapped in `Once`, as a client of several managers sends it. The servers' part of a
//! stat and a put (reading and writing the data) is left out: this measures the metadata
//! path only. Each round times every kind on every system in turn, the order of the
//! systems turning each round. Stats are timed on openraft twice, with the leader's reads
//! local and linearizable ([`crate::manager::Reads`]: the first weaker than Tessera's local
//! read, the second stronger), on the same cluster through a second front.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Credential, Key, Secret};
use tessera_layout::Scheme;
use tessera_manager::daemon::RunningManager;
use tessera_manager::replica::{order_config, replicated_cluster_id, ReplicaConfig};
use tessera_manager::{Manager, ManagerConfig};
use tessera_transport::{TcpConfig, TcpLimits, TcpTransport};
use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse};

use crate::manager::{Front, ManagerMachine, Reads};
use crate::raft::Cluster;

/// How often the fake servers heartbeat (the manager's timeout is 2 s).
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// Servers registered.
const SERVERS: u64 = 3;
/// The size a small-file put gives its file (the throughput test's 4 KiB write).
const PUT_BYTES: u64 = 4096;

/// The kinds of metadata operation timed apart, as `metadata_throughput_one_and_three_managers`
/// (the `tessera` crate's test) times them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Create` of a new file.
    Create,
    /// `Lookup` then `LookupId` of a file the round's creates made.
    Stat,
    /// `Create`, `SetSize { grow_only }` to [`PUT_BYTES`], then `SyncFile` with that size.
    SmallPut,
}

/// Every kind, in the order a round times them (stats look up what creates made).
pub const KINDS: [Kind; 3] = [Kind::Create, Kind::Stat, Kind::SmallPut];

/// One system under test: where its clients and servers send requests, and the kinds of
/// operation timed on it.
struct System {
    name: &'static str,
    addr: SocketAddr,
    /// Its fake servers' heartbeats (none for a second front of a system that has them).
    heartbeats: Option<tokio::task::JoinHandle<()>>,
    kinds: &'static [Kind],
}

/// The system names, as the table prints them.
pub const TESSERA: &str = "tessera 3 replicas";
/// openraft with the leader's reads local.
pub const OPENRAFT: &str = "openraft 3 nodes";
/// openraft with the leader's reads linearizable (stats only: writes are the same).
pub const OPENRAFT_LINEARIZABLE: &str = "openraft linearizable";
/// One manager alone.
pub const SINGLE: &str = "1 manager";

/// Per system, its name and the operations per second of each round.
pub type SystemRates = Vec<(&'static str, Vec<f64>)>;

/// What `run` measured.
pub struct Measured {
    /// Per kind, the rates of every system.
    pub rates: Vec<(Kind, SystemRates)>,
    /// The load average before each round.
    pub loads: Vec<String>,
}

fn transport(claim: Claim, key: Key) -> Arc<TcpTransport> {
    let config = TcpConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
    };
    Arc::new(TcpTransport::with_credential(
        config,
        Some(Credential { claim, key }),
    ))
}

async fn ask(
    transport: &Arc<TcpTransport>,
    addr: SocketAddr,
    request: &ManagerRequest,
) -> Result<ManagerResponse> {
    let (answer, _) = tessera_transport::call(transport, addr, request, Bytes::new())
        .await
        .with_context(|| format!("{addr}: {request:?}"))?;
    Ok(answer)
}

/// `count` ports free for TCP and UDP alike (a replica's order runs on UDP at its port).
fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    while addrs.len() < count {
        let Ok(tcp) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = tcp.local_addr() else { continue };
        if std::net::UdpSocket::bind(addr).is_ok() && !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    addrs
}

fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Tessera's 3 replicas, the group running: the address of replica 1 (every request goes
/// there, as the throughput test's clients do).
async fn start_tessera(dir: &Path, secret: &Secret) -> Result<(Vec<RunningManager>, SocketAddr)> {
    let peers = free_addrs(3);
    let mut running = Vec::new();
    for id in 1..=3u16 {
        let config = ReplicaConfig {
            id,
            peers: peers.clone(),
            order: order_config(),
            catch_up_piece_bytes: tessera_manager::replica::SNAPSHOT_PIECE_BYTES_MAX as u32,
            join: false,
        };
        let replica_dir = dir.join(format!("tessera-{id}"));
        running.push(
            tessera_manager::daemon::start_replica(
                config,
                &replica_dir,
                ManagerConfig::default(),
                true,
                TcpLimits::default(),
                secret,
            )
            .await?,
        );
    }
    Ok((running, peers[0]))
}

/// The same state machine on 3 openraft nodes, and the leader's two fronts on TCP (reads
/// local, reads linearizable): their addresses, and the tasks serving them.
async fn start_openraft(
    dir: &Path,
    secret: &Secret,
) -> Result<(
    Cluster<ManagerMachine>,
    [SocketAddr; 2],
    Vec<tokio::task::JoinHandle<()>>,
)> {
    let config = ManagerConfig {
        cluster_id: Some(replicated_cluster_id(secret)),
        ..ManagerConfig::default()
    };
    let mut machines = Vec::new();
    for id in 1..=3 {
        let mut manager = Manager::open(&dir.join(format!("openraft-{id}")), config)?;
        manager.set_replicated(secret.replica_key());
        machines.push(ManagerMachine::new(manager));
    }
    // openraft's default batch of entries per append (300 would do; the bench's 4096 too).
    let cluster = Cluster::start_with(vec![None; 3], machines, 300).await?;
    let leader = cluster.leader().clone();
    let leader_id = leader.metrics().borrow().id as usize;
    let mut addrs = Vec::new();
    let mut serving = Vec::new();
    for reads in [Reads::Local, Reads::Linearizable] {
        let manager = cluster.machine(leader_id).manager();
        let front = Front::new(leader.clone(), manager, secret, reads);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        serving.push(tokio::spawn(tessera_transport::serve_tcp_limited(
            listener,
            Arc::new(front),
            TcpLimits::default(),
        )));
    }
    Ok((cluster, [addrs[0], addrs[1]], serving))
}

/// Registers the fake servers at `addr` (retrying while the group forms) and keeps them
/// heartbeating until the returned task is aborted.
async fn servers(name: &'static str, addr: SocketAddr, secret: &Secret) -> Result<System> {
    let server = transport(Claim::Server, secret.server_key());
    let mut beats = Vec::new();
    for index in 0..SERVERS {
        let register = ManagerRequest::Register {
            server: None,
            addr: format!("127.0.0.1:{}", 9000 + index),
            incarnation: index + 1,
            cluster: None,
        };
        let began = Instant::now();
        loop {
            match ask(&server, addr, &register).await {
                Ok(ManagerResponse::Registered {
                    server: id,
                    cluster,
                    ..
                }) => {
                    beats.push(ManagerRequest::Heartbeat {
                        server: id,
                        incarnation: index + 1,
                        cluster,
                    });
                    break;
                }
                answer if began.elapsed() > Duration::from_secs(30) => {
                    bail!("{name}: registering a server: {answer:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    let heartbeats = tokio::spawn(async move {
        loop {
            for beat in &beats {
                let _ = ask(&server, addr, beat).await;
            }
            tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        }
    });
    Ok(System {
        name,
        addr,
        heartbeats: Some(heartbeats),
        kinds: &KINDS,
    })
}

/// One client's changes, each wrapped in `Once` with the next number of `client`.
struct Changes {
    client: u64,
    sequence: Arc<AtomicU64>,
}

impl Changes {
    fn once(&self, request: ManagerRequest) -> ManagerRequest {
        ManagerRequest::Once {
            client: self.client,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            request: Box::new(request),
        }
    }
}

fn layout() -> LayoutRequest {
    LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 65536,
        width: Some(3),
    }
}

/// The file operation number `n` of a client task makes or looks up, in round `round`.
fn file_name(round: usize, task: usize, n: u64) -> String {
    format!("/bench/{round}/{task}/{n}")
}

/// `request` at `addr`, wrapped in `Once`: its answer.
async fn change(
    admin: &Arc<TcpTransport>,
    addr: SocketAddr,
    changes: &Changes,
    request: ManagerRequest,
) -> Result<ManagerResponse> {
    ask(admin, addr, &changes.once(request)).await
}

/// A create of `path` at `addr`: the new file's id.
async fn create(
    admin: &Arc<TcpTransport>,
    addr: SocketAddr,
    changes: &Changes,
    path: &str,
) -> Result<tessera_wire::FileId> {
    let create = ManagerRequest::Create {
        path: path.to_string(),
        layout: layout(),
        replace: false,
    };
    match change(admin, addr, changes, create).await? {
        ManagerResponse::File(view) => Ok(view.meta.id),
        other => bail!("create {path}: {other:?}"),
    }
}

/// A stat of `path` at `addr`: lookup, then lookup by id.
async fn stat(admin: &Arc<TcpTransport>, addr: SocketAddr, path: &str) -> Result<()> {
    let lookup = ask(admin, addr, &ManagerRequest::Lookup { path: path.into() }).await?;
    let ManagerResponse::File(view) = &lookup else {
        bail!("stat {path}: {lookup:?}");
    };
    let by_id = ManagerRequest::LookupId { file: view.meta.id };
    match ask(admin, addr, &by_id).await? {
        ManagerResponse::File(again) if again.meta == view.meta => Ok(()),
        other => bail!("stat {path}: lookup by id answered {other:?}"),
    }
}

/// The manager's part of a small-file put of `path` at `addr`.
async fn small_put(
    admin: &Arc<TcpTransport>,
    addr: SocketAddr,
    changes: &Changes,
    path: &str,
) -> Result<()> {
    let file = create(admin, addr, changes, path).await?;
    let grow = ManagerRequest::SetSize {
        file,
        size: PUT_BYTES,
        grow_only: true,
    };
    let sync = ManagerRequest::SyncFile {
        file,
        size: PUT_BYTES,
    };
    for request in [grow, sync] {
        let answer = change(admin, addr, changes, request.clone()).await?;
        if answer != ManagerResponse::Done {
            bail!("put {path}: {request:?} answered {answer:?}");
        }
    }
    Ok(())
}

/// Operation number `n` of `kind` by client task `task` in `round` at `addr`.
async fn operation(
    admin: &Arc<TcpTransport>,
    addr: SocketAddr,
    changes: &Changes,
    kind: Kind,
    (round, task, n): (usize, usize, u64),
) -> Result<()> {
    match kind {
        Kind::Create => create(admin, addr, changes, &file_name(round, task, n))
            .await
            .map(drop),
        Kind::Stat => stat(admin, addr, &file_name(round, task, 0)).await,
        Kind::SmallPut => {
            let path = format!("{}-put", file_name(round, task, n));
            small_put(admin, addr, changes, &path).await
        }
    }
}

/// `clients` tasks doing operations of `kind` at `system` for `time`: operations done and
/// the seconds they took.
async fn round(
    system: &System,
    secret: &Secret,
    (clients, time): (usize, Duration),
    round: usize,
    kind: Kind,
) -> Result<(u64, f64)> {
    let admin = transport(Claim::Admin, secret.admin_key());
    let sequence = Arc::new(AtomicU64::new(0));
    let client = u64::from(std::process::id()) << 32 | (round as u64) << 8 | (kind as u64 + 1);
    let began = Instant::now();
    let deadline = began + time;
    let tasks: Vec<_> = (0..clients)
        .map(|task| {
            let (admin, addr) = (admin.clone(), system.addr);
            let changes = Changes {
                client,
                sequence: sequence.clone(),
            };
            tokio::spawn(async move {
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    operation(&admin, addr, &changes, kind, (round, task, ops)).await?;
                    ops += 1;
                }
                anyhow::Ok(ops)
            })
        })
        .collect();
    let mut ops = 0;
    for task in tasks {
        ops += task.await??;
    }
    Ok((ops, began.elapsed().as_secs_f64()))
}

/// Waits until the 3 openraft nodes' stores print alike (they applied the same entries),
/// for at most 10 s.
async fn openraft_stores_agree(cluster: &Cluster<ManagerMachine>) -> Result<()> {
    let began = Instant::now();
    loop {
        let dumps: Vec<Vec<String>> = (0..3)
            .map(|i| {
                cluster
                    .machine(i)
                    .manager()
                    .lock()
                    .expect("manager lock")
                    .state_dump()
            })
            .collect();
        if dumps.iter().all(|dump| *dump == dumps[0]) {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(10) {
            let applied: Vec<u64> = (0..3).map(|i| cluster.machine(i).applied_index()).collect();
            bail!("openraft nodes' stores differ after 10 s (applied {applied:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the three systems in `dir` and runs `rounds` rounds of `seconds` each against each,
/// interleaved (the order within a round turns each round).
pub async fn run(dir: &Path, rounds: usize, seconds: f64, clients: usize) -> Result<Measured> {
    let secret = Secret::from_bytes(rand_bytes());
    let (tessera, tessera_addr) = start_tessera(dir, &secret).await?;
    let (openraft, [openraft_addr, linearizable_addr], fronts) =
        start_openraft(dir, &secret).await?;
    let single = tessera_manager::daemon::start(
        "127.0.0.1:0".parse()?,
        &dir.join("single"),
        ManagerConfig::default(),
        true,
        &secret,
    )
    .await?;
    let systems = [
        servers(TESSERA, tessera_addr, &secret).await?,
        servers(OPENRAFT, openraft_addr, &secret).await?,
        servers(SINGLE, single.addr, &secret).await?,
        System {
            name: OPENRAFT_LINEARIZABLE,
            addr: linearizable_addr,
            heartbeats: None,
            kinds: &[Kind::Stat],
        },
    ];
    let timed = |kind: Kind| -> Vec<usize> {
        (0..systems.len())
            .filter(|&i| systems[i].kinds.contains(&kind))
            .collect()
    };
    let mut rates: Vec<(Kind, SystemRates)> = KINDS
        .iter()
        .map(|&kind| {
            let names = timed(kind).into_iter();
            (kind, names.map(|i| (systems[i].name, Vec::new())).collect())
        })
        .collect();
    let mut loads = Vec::new();
    let time = Duration::from_secs_f64(seconds);
    // Where the time of Tessera's replica 1 (which every request goes to) and of the single
    // manager went; openraft's is not timed.
    let stages = |i: usize| match i {
        0 => Some((tessera[0].stage_times(), tessera[0].synced_commits())),
        2 => Some((single.stage_times(), single.synced_commits())),
        _ => None,
    };
    for r in 0..rounds {
        loads.push(load_average());
        for (kind, rates) in &mut rates {
            let on = timed(*kind);
            for k in 0..on.len() {
                let (i, at) = (on[(k + r) % on.len()], (k + r) % on.len());
                let (before, cpu_ms) = (stages(i), tessera_manager::daemon::process_cpu_ms());
                let (ops, elapsed) = round(&systems[i], &secret, (clients, time), r, *kind).await?;
                let cpu_us = (tessera_manager::daemon::process_cpu_ms() - cpu_ms) * 1000;
                let spent = stages(i)
                    .zip(before)
                    .map(|((after, synced), (before, was))| {
                        let syncs = (synced - was) as f64 / ops.max(1) as f64;
                        let spent = after.since(&before);
                        format!(", syncs/op {syncs:.2}, mean us: {spent}")
                    });
                eprintln!(
                    "round {r}: {kind:?}: {}: {:.0} ops/s, cpu {} us/op{}",
                    systems[i].name,
                    ops as f64 / elapsed,
                    cpu_us / ops.max(1),
                    spent.unwrap_or_default()
                );
                rates[at].1.push(ops as f64 / elapsed);
            }
        }
    }
    for heartbeats in systems.iter().filter_map(|s| s.heartbeats.as_ref()) {
        heartbeats.abort();
    }
    openraft_stores_agree(&openraft).await?;
    for front in fronts {
        front.abort();
    }
    openraft.shutdown().await;
    for replica in tessera {
        replica.stop();
    }
    single.stop();
    Ok(Measured { rates, loads })
}

/// A secret for this run, from the clock (no store outlives the run).
fn rand_bytes() -> [u8; 32] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut bytes = [0; 32];
    bytes[..16].copy_from_slice(&nanos.to_le_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every system answers every request of every kind as expected (a wrong answer fails
    /// the round), and the openraft nodes end with the same store.
    #[test]
    fn each_system_serves_the_workload_and_openraft_replicas_agree() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let measured = runtime
            .block_on(run(dir.path(), 1, 0.5, 2))
            .expect("the workload runs");
        assert_eq!(measured.rates.len(), KINDS.len());
        for (kind, systems) in &measured.rates {
            assert_eq!(systems.len(), if *kind == Kind::Stat { 4 } else { 3 });
            for (name, rates) in systems {
                assert!(
                    rates.len() == 1 && rates[0] > 0.0,
                    "{kind:?}, {name}: {rates:?}"
                );
            }
        }
    }
}
