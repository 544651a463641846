//! Replicas of a replicated manager in one process, on 127.0.0.1: a replica that joins a
//! running group catches up from a peer's store in pieces, and takes every table with it.

use crate::daemon::{start_replica, RunningManager, Served};
use crate::replica::{order_config, ReplicaConfig};
use crate::ManagerConfig;
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Credential, Key, Secret};
use tessera_layout::Scheme;
use tessera_transport::{TcpConfig, TcpLimits, TcpTransport};
use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse};

/// Longest a replica may take to join and catch up here (debug build, loaded machine).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn secret() -> Secret {
    Secret::from_bytes([7; 32])
}

/// `count` ports free for TCP and UDP alike (the order runs on UDP at the replica's port).
pub(crate) fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    while addrs.len() < count {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        if std::net::UdpSocket::bind(addr).is_ok() && !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    addrs
}

/// Starts replica `id` of the group at `peers`, its store in `dir`.
pub(crate) async fn start(
    id: u16,
    peers: &[SocketAddr],
    dir: &Path,
    piece_bytes: u32,
) -> RunningManager {
    let config = ReplicaConfig {
        id,
        peers: peers.to_vec(),
        order: order_config(),
        catch_up_piece_bytes: piece_bytes,
        join: false,
    };
    let began = Instant::now();
    loop {
        let started = start_replica(
            config.clone(),
            dir,
            ManagerConfig::default(),
            true,
            TcpLimits::default(),
            &secret(),
        )
        .await;
        match started {
            Ok(running) => return running,
            // A replica stopped just now may still hold its ports for a moment.
            Err(error) if began.elapsed() < SETTLE_TIMEOUT => {
                eprintln!("replica {id}: {error}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("replica {id}: {error}"),
        }
    }
}

pub(crate) fn transport(claim: Claim, key: Key) -> Arc<TcpTransport> {
    let config = TcpConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
    };
    Arc::new(TcpTransport::with_credential(
        config,
        Some(Credential { claim, key }),
    ))
}

pub(crate) fn admin() -> Arc<TcpTransport> {
    transport(Claim::Admin, secret().admin_key())
}

pub(crate) async fn ask(
    transport: &Arc<TcpTransport>,
    addr: SocketAddr,
    request: ManagerRequest,
) -> ManagerResponse {
    match tessera_transport::call(transport, addr, &request, Bytes::new()).await {
        Ok((answer, _)) => answer,
        Err(error) => panic!("{addr}: {request:?}: {error}"),
    }
}

/// Asks `request` of the replicas in turn until one answers other than `Unordered` (a view
/// forming, a replica catching up).
pub(crate) async fn ask_group(
    transport: &Arc<TcpTransport>,
    addrs: &[SocketAddr],
    request: ManagerRequest,
) -> ManagerResponse {
    let began = Instant::now();
    loop {
        for &addr in addrs {
            let answer = tessera_transport::call(transport, addr, &request, Bytes::new()).await;
            match answer {
                Ok((ManagerResponse::Error(tessera_wire::ManagerError::Unordered(_)), _))
                | Err(_) => {}
                Ok((answer, _)) => return answer,
            }
        }
        if began.elapsed() > SETTLE_TIMEOUT {
            for &addr in addrs {
                let status = tessera_transport::call::<_, ManagerResponse>(
                    &admin(),
                    addr,
                    &ManagerRequest::Replica,
                    Bytes::new(),
                )
                .await;
                eprintln!("{addr}: {status:?}");
            }
            panic!("{request:?}: no replica ordered it");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the replica at `addr` is a member (leader or follower) that applied at least
/// `applied` positions; its status then.
pub(crate) async fn settled(addr: SocketAddr, applied: u64) -> tessera_wire::ReplicaStatus {
    let began = Instant::now();
    loop {
        let answer =
            tessera_transport::call(&admin(), addr, &ManagerRequest::Replica, Bytes::new()).await;
        if let Ok((ManagerResponse::Replica(status), _)) = answer {
            let member = status.role == "leader" || status.role == "follower";
            if member && status.applied >= applied {
                return status;
            }
        }
        assert!(began.elapsed() < SETTLE_TIMEOUT, "{addr} did not settle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn dump(replica: &RunningManager) -> Vec<String> {
    match &*replica.manager.lock().unwrap() {
        Served::Running(manager) => manager.state_dump(),
        Served::NoStore(path) => panic!("no store at {}", path.display()),
    }
}

/// Registers three servers and creates `files` files through the group at `addrs`.
pub(crate) async fn fill(addrs: &[SocketAddr], files: usize) {
    let server = transport(Claim::Server, secret().server_key());
    for port in 0..3 {
        let register = ManagerRequest::Register {
            server: None,
            addr: format!("127.0.0.1:{}", 9000 + port),
            incarnation: 1,
            cluster: None,
        };
        let answer = ask_group(&server, addrs, register).await;
        assert!(
            matches!(answer, ManagerResponse::Registered { .. }),
            "{answer:?}"
        );
    }
    let admin = admin();
    for index in 0..files {
        let create = ManagerRequest::Create {
            path: format!("/a/rather/long/directory/name/to/fill/the/store/file-{index:05}"),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 65536,
                width: Some(3),
            },
            replace: false,
        };
        let answer = ask_group(&admin, addrs, create).await;
        assert!(matches!(answer, ManagerResponse::File(_)), "{answer:?}");
    }
}

/// Replica 3 stops, the other two run on a while, and it starts again: it catches up from a
/// peer's store copied in pieces of 4 KiB (a store many times the piece, as a store over
/// 16 MiB is many times the most a frame carries), ends with the same store, and
/// authenticates a client key created while it was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_catches_up_in_pieces_and_knows_earlier_keys() {
    const PIECE: u32 = 4096;
    let peers = free_addrs(3);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let one = start(1, &peers, dirs[0].path(), PIECE).await;
    let two = start(2, &peers, dirs[1].path(), PIECE).await;
    let three = start(3, &peers, dirs[2].path(), PIECE).await;
    // The group starts once every replica stands at the same place (see replica.rs).
    for addr in &peers {
        settled(*addr, 0).await;
    }
    three.stop();
    let running = &peers[..2];
    fill(running, 200).await;
    let ManagerResponse::KeyCreated { id, key } = ask_group(
        &admin(),
        running,
        ManagerRequest::KeyCreate {
            name: "before".into(),
        },
    )
    .await
    else {
        panic!("no key")
    };
    let before = settled(peers[0], 0).await.applied;
    let began = Instant::now();
    let three = start(3, &peers, dirs[2].path(), PIECE).await;
    let status = settled(peers[2], before).await;
    println!(
        "replica 3 joined and caught up to position {} in {} ms",
        status.applied,
        began.elapsed().as_millis()
    );
    // The copy it fetched was many pieces long.
    let copied: u64 = [&dirs[0], &dirs[1]]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir.path()).unwrap())
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().contains("outgoing-"))
        .map(|entry| entry.metadata().unwrap().len())
        .max()
        .expect("a copy was made for replica 3");
    println!(
        "copy of {copied} bytes, {} pieces",
        copied.div_ceil(PIECE.into())
    );
    assert!(copied > 16 * u64::from(PIECE), "copy of {copied} bytes");
    // The key created before it joined opens a connection to it and is served.
    let client = transport(Claim::Client(id), key);
    let lookup = ManagerRequest::Lookup {
        path: "/a/rather/long/directory/name/to/fill/the/store/file-00007".into(),
    };
    let answer = ask(&client, peers[2], lookup).await;
    assert!(matches!(answer, ManagerResponse::File(_)), "{answer:?}");
    // Every replica holds the same store once all applied the same positions.
    let last = settled(peers[2], 0).await.applied;
    for addr in &peers {
        settled(*addr, last).await;
    }
    let reference = dump(&one);
    assert!(reference.iter().any(|line| line.starts_with("access_keys")));
    assert_eq!(dump(&two), reference);
    assert_eq!(dump(&three), reference);
}

/// Three replicas over fresh directories, settled, with five files made through them.
async fn settled_group_of_three() -> (Vec<SocketAddr>, Vec<tempfile::TempDir>, Vec<RunningManager>)
{
    let peers = free_addrs(3);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut group = Vec::new();
    for id in 1..=3 {
        group.push(start(id, &peers, dirs[usize::from(id) - 1].path(), 1 << 20).await);
    }
    for addr in &peers {
        settled(*addr, 0).await;
    }
    fill(&peers, 5).await;
    (peers, dirs, group)
}

/// Waits until the replica at `addr` says it stopped, then checks that it refuses a lookup
/// (clients go to another replica); its status.
async fn stopped_and_refusing(addr: SocketAddr) -> tessera_wire::ReplicaStatus {
    let began = Instant::now();
    let status = loop {
        let answer = ask(&admin(), addr, ManagerRequest::Replica).await;
        let ManagerResponse::Replica(status) = answer else {
            panic!("{answer:?}")
        };
        if status.role == "stopped" {
            break status;
        }
        assert!(
            began.elapsed() < SETTLE_TIMEOUT,
            "replica at {addr}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lookup = ManagerRequest::Lookup {
        path: "/after-0".into(),
    };
    let refused = ask(&admin(), addr, lookup).await;
    assert!(
        matches!(
            refused,
            ManagerResponse::Error(tessera_wire::ManagerError::Unordered(_))
        ),
        "{refused:?}"
    );
    status
}

/// A replica whose store fails (a full disk) stops: it leaves the order and refuses every
/// request, and the other two go on ordering and hold the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_store_fails_stops_and_the_others_go_on() {
    let (peers, _dirs, group) = settled_group_of_three().await;
    match &mut *group[2].manager.lock().unwrap() {
        Served::Running(manager) => manager.fail_commits = true,
        Served::NoStore(_) => panic!("no store"),
    }
    // The next change commits at replicas 1 and 2 and fails at 3.
    fill_more(&peers[..2], "after", 5).await;
    let status = stopped_and_refusing(peers[2]).await;
    println!("replica 3: {status:?}");
    fill_more(&peers[..2], "later", 5).await;
    let last = settled(peers[0], 0).await.applied;
    settled(peers[1], last).await;
    assert_eq!(dump(&group[0]), dump(&group[1]));
    assert!(dump(&group[0]).iter().any(|line| line.contains("later-4")));
}

/// A replica whose store file is deleted under it stops like one whose disk is full: it
/// refused every change the others applied, and answering on would serve a store that
/// drifted from theirs (before, it skipped those positions and went on answering).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_store_file_is_deleted_stops() {
    let (peers, dirs, _group) = settled_group_of_three().await;
    std::fs::remove_file(dirs[2].path().join("manager.redb")).expect("delete replica 3's store");
    fill_more(&peers[..2], "after", 5).await;
    stopped_and_refusing(peers[2]).await;
}

/// Creates `count` files named `/NAME-i` through the replicas at `addrs`.
async fn fill_more(addrs: &[SocketAddr], name: &str, count: usize) {
    for index in 0..count {
        let create = ManagerRequest::Create {
            path: format!("/{name}-{index}"),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 65536,
                width: Some(3),
            },
            replace: false,
        };
        let answer = ask_group(&admin(), addrs, create).await;
        assert!(matches!(answer, ManagerResponse::File(_)), "{answer:?}");
    }
}

/// Where the replica at `addr` stands in the order now.
async fn applied(addr: SocketAddr) -> u64 {
    match ask(&admin(), addr, ManagerRequest::Replica).await {
        ManagerResponse::Replica(status) => status.applied,
        other => panic!("{other:?}"),
    }
}

/// Reads on a connection are ordered until one request on it was ordered and answered; from
/// then on they are answered from the replica's own store (the order does not move), except
/// a read that finds nothing, which is ordered. A new connection, at another replica, sees a
/// change acknowledged just before it (its first read is ordered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_a_synced_connection_are_local_and_see_the_clients_writes() {
    let (peers, _dirs, group) = settled_group_of_three().await;
    let client = admin();
    let path = "/a/rather/long/directory/name/to/fill/the/store/file-00003";
    let lookup = |path: &str| ManagerRequest::Lookup { path: path.into() };
    let before = applied(peers[0]).await;
    let answer = ask(&client, peers[0], lookup(path)).await;
    let ManagerResponse::File(view) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(
        applied(peers[0]).await,
        before + 1,
        "the first read is ordered"
    );
    let reads = [
        lookup(path),
        ManagerRequest::List {
            prefix: "/a".into(),
        },
        ManagerRequest::LookupId { file: view.meta.id },
        ManagerRequest::Once {
            client: 7,
            sequence: 1,
            request: Box::new(ManagerRequest::LookupId { file: view.meta.id }),
        },
    ];
    for _ in 0..10 {
        for read in &reads {
            let answer = ask(&client, peers[0], read.clone()).await;
            assert!(!matches!(answer, ManagerResponse::Error(_)), "{answer:?}");
        }
    }
    assert_eq!(
        applied(peers[0]).await,
        before + 1,
        "synced reads are local"
    );
    assert!(
        !dump(&group[0]).iter().any(|line| line.starts_with("once")),
        "a local read left a once record"
    );
    // Absence is asked through the order.
    let missing = ask(&client, peers[0], lookup("/missing")).await;
    assert!(matches!(missing, ManagerResponse::Error(_)), "{missing:?}");
    assert_eq!(applied(peers[0]).await, before + 2);
    // The client's change, then a read of it at another replica on a new connection.
    fill_more(&peers[..1], "mine", 1).await;
    let elsewhere = ask(&admin(), peers[1], lookup("/mine-0")).await;
    assert!(
        matches!(elsewhere, ManagerResponse::File(_)),
        "{elsewhere:?}"
    );
    // A synced connection reads its own change locally at the replica that applied it.
    let create = ManagerRequest::Create {
        path: "/own".into(),
        layout: LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 65536,
            width: Some(3),
        },
        replace: false,
    };
    let created = ask(&client, peers[0], create).await;
    assert!(matches!(created, ManagerResponse::File(_)), "{created:?}");
    let stands = applied(peers[0]).await;
    let own = ask(&client, peers[0], lookup("/own")).await;
    assert!(matches!(own, ManagerResponse::File(_)), "{own:?}");
    assert_eq!(applied(peers[0]).await, stands);
}

/// A read on a synced connection at a replica that lags sees a change another replica
/// acknowledged just before: the replica answers it locally only once it has applied its
/// log up to where it ended when the read came (before, it answered from what it had
/// applied, and a client told of the change by another client read the old state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_read_at_a_lagging_replica_sees_a_change_acknowledged_elsewhere() {
    let (peers, _dirs, group) = settled_group_of_three().await;
    let reader = admin();
    let path = "/a/rather/long/directory/name/to/fill/the/store/file-00002";
    let lookup = ManagerRequest::Lookup { path: path.into() };
    // The first read syncs the reader's connection to replica 2.
    let ManagerResponse::File(view) = ask(&reader, peers[1], lookup.clone()).await else {
        panic!("no file")
    };
    let file = view.meta.id;
    let lagging = group[1].replica.clone().expect("a replica");
    lagging
        .applier_paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let before = applied(peers[1]).await;
    // Replica 1 orders and acknowledges the change: replica 2's order node acknowledges it
    // though its applier takes nothing.
    let size = 123_457;
    let resize = ManagerRequest::SetSize {
        file,
        size,
        grow_only: false,
    };
    let done = ask(&admin(), peers[0], resize).await;
    assert!(matches!(done, ManagerResponse::Done), "{done:?}");
    assert_eq!(applied(peers[1]).await, before, "replica 2 applied nothing");
    let resume = lagging.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        resume
            .applier_paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
    });
    let counted = lagging.reads_counted();
    let answer = ask(&reader, peers[1], ManagerRequest::LookupId { file }).await;
    let ManagerResponse::File(seen) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(
        seen.meta.size, size,
        "the read missed an acknowledged change"
    );
    let (local, ordered) = lagging.reads_counted();
    assert_eq!(
        (local - counted.0, ordered - counted.1),
        (1, 0),
        "the read waited for the change and was answered locally, not ordered"
    );
}

/// The order's read lease gates local reads: a replica that proposed nothing for longer
/// than the lease (three quarters of the suspicion timeout) orders a read on a synced
/// connection, and that ordered read, its own proposal, renews the lease, so the next read
/// is local again. (That a replica cut off from the others loses its lease before they
/// deliver without it is `tessera-order`'s test `tests/lease.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_a_read_lease_orders_the_read_and_renews_it() {
    let (peers, _dirs, group) = settled_group_of_three().await;
    let reader = admin();
    let path = "/a/rather/long/directory/name/to/fill/the/store/file-00001";
    let lookup = ManagerRequest::Lookup { path: path.into() };
    let replica = group[0].replica.clone().expect("a replica");
    let addr = peers[0];
    // Whether a lookup at `addr` was answered (local, ordered) as `expected`.
    let read = |expected: (u64, u64)| {
        let (reader, lookup, replica) = (reader.clone(), lookup.clone(), replica.clone());
        async move {
            let counted = replica.reads_counted();
            let answer = ask(&reader, addr, lookup).await;
            assert!(matches!(answer, ManagerResponse::File(_)), "{answer:?}");
            let (local, ordered) = replica.reads_counted();
            (local - counted.0, ordered - counted.1) == expected
        }
    };
    assert!(read((0, 1)).await, "a connection's first read is ordered");
    assert!(
        read((1, 0)).await,
        "then local, under the lease that read renewed"
    );
    let lease = Duration::from_micros(order_config().suspect_after_us / 4 * 3);
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert!(read((0, 1)).await, "the lease ran out: ordered");
    assert!(read((1, 0)).await, "renewed by that ordered read: local");
}
