//! Multi-process resource tests: hostile peers that hold connections, memory or sessions of a
//! real local cluster, and a client that must go on working meanwhile (issue 15's target:
//! "each resource attack leaves other clients working at >= 0.8x their throughput and RSS
//! bounded by the configured budgets").
//!
//! Each test starts its own cluster (three servers) in a temporary directory, measures a
//! client's put and get of a few MiB without the attack, mounts the attack, measures the same
//! work under it, and checks the attacked daemon's resident memory (`VmRSS` of
//! `/proc/PID/status`) against the configured budget. The time ratio is printed; the bound
//! asserted on it is generous, since two shared cores make single runs noisy. Everything
//! stays on the loopback network (the datagram flood comes from other 127.0.0.0/8
//! addresses, as distinct sources).

mod command;
mod support;

use bytes::Bytes;
use rand::RngCore;
use serde::Deserialize;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_client::{Client, ClientConfig, LayoutRequest, Scheme, TransportKind};
use tessera_datagram::packet::{Packet, PacketKind};
use tessera_layout::Region;
use tessera_wire::{
    FrameHeader, FrameKind, StorageCall, StorageRequest, MESSAGE_BYTES_MAX, PAYLOAD_BYTES_MAX,
};
use tokio::io::AsyncWriteExt;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
const SERVERS: u32 = 3;
/// Bytes the client puts and gets in each measurement.
const WORK_BYTES: usize = 4 << 20;
/// The generous bound on (time under attack) / (time without), beyond the 0.8x target, for
/// a noisy shared machine; the measured ratio is printed.
const SLOWDOWN_MAX: f64 = 4.0;

#[derive(Deserialize)]
struct ClusterToml {
    manager: String,
    /// The local cluster's access key.
    key: String,
    manager_process: ProcessToml,
    servers: Vec<ServerToml>,
}

#[derive(Deserialize)]
struct ProcessToml {
    pid: u32,
}

#[derive(Deserialize)]
struct ServerToml {
    id: u32,
    addr: String,
    pid: u32,
}

/// A local cluster run by the `tessera` binary; `tessera down` when dropped.
struct Cluster {
    temp: Option<tempfile::TempDir>,
    dir: PathBuf,
    transport: TransportKind,
    file: ClusterToml,
}

impl Cluster {
    /// Start a manager and the servers over `transport`, with `env` (the daemons' limits).
    fn up(transport: TransportKind, env: &[(&str, &str)]) -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-resources-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().to_path_buf();
        let output = Command::new(TESSERA)
            .args(["up", "--detach", "--servers", &SERVERS.to_string()])
            .args(["--transport", transport.name(), "--dir"])
            .arg(&dir)
            .envs(env.iter().copied())
            .output()
            .expect("cannot run the tessera binary");
        let text = std::fs::read_to_string(dir.join("cluster.toml"));
        let cluster = Cluster {
            temp: Some(temp),
            dir,
            transport,
            file: toml::from_str(&text.unwrap_or_default()).unwrap_or(ClusterToml {
                manager: String::new(),
                key: String::new(),
                manager_process: ProcessToml { pid: 0 },
                servers: Vec::new(),
            }),
        };
        assert!(
            output.status.success(),
            "tessera up failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        cluster
    }

    fn manager(&self) -> SocketAddr {
        self.file.manager.parse().expect("manager address")
    }

    fn server(&self, index: usize) -> (SocketAddr, u32) {
        let server = &self.file.servers[index];
        (server.addr.parse().expect("server address"), server.pid)
    }

    async fn client(&self) -> Client {
        let key = tessera_client::parse_access_key(&self.file.key).expect("access key");
        let config = ClientConfig {
            transport: self.transport,
            credential: Some(key),
            ..ClientConfig::default()
        };
        Client::connect_with(self.manager(), config)
            .await
            .expect("the client connects to the manager")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(TESSERA)
            .args(["down", "--dir"])
            .arg(&self.dir)
            .output();
        if std::thread::panicking() {
            if let Some(temp) = self.temp.take() {
                eprintln!("cluster directory kept: {}", temp.keep().display());
            }
        }
    }
}

/// Resident memory of a process, bytes.
fn rss_bytes(pid: u32) -> u64 {
    command::process_memory_bytes(pid, "VmRSS")
}

/// The client's work: create a RAID-5 file, put `WORK_BYTES`, sync, get them back and compare.
/// Returns how long it took, failing the test if any step fails or takes over 60 s.
async fn put_get(cluster: &Cluster, name: &str) -> Duration {
    let mut data = vec![0u8; WORK_BYTES];
    rand::thread_rng().fill_bytes(&mut data);
    let started = Instant::now();
    let work = async {
        let client = cluster.client().await;
        let layout = LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 64 << 10,
            width: None,
        };
        let file = client.create(name, layout).await.expect("create");
        client.write_at(&file, 0, &data).await.expect("put");
        client.sync(&file).await.expect("sync");
        let back = client
            .read_at(&file, 0, WORK_BYTES as u64)
            .await
            .expect("get");
        assert!(back[..] == data[..], "{name}: the bytes read differ");
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .unwrap_or_else(|_| panic!("{name}: put and get did not complete within 60 s"));
    started.elapsed()
}

/// The best of two runs without the attack (the first warms caches and connections).
async fn baseline(cluster: &Cluster) -> Duration {
    let first = put_get(cluster, "/baseline-1").await;
    let second = put_get(cluster, "/baseline-2").await;
    first.min(second)
}

/// Prints and checks the slowdown of the work under attack.
fn check_slowdown(attack: &str, baseline: Duration, attacked: Duration) {
    let ratio = attacked.as_secs_f64() / baseline.as_secs_f64();
    println!(
        "{attack}: put+get of {} MiB took {attacked:?} under attack, {baseline:?} without \
         (ratio {ratio:.2}, throughput {:.2}x)",
        WORK_BYTES >> 20,
        1.0 / ratio
    );
    assert!(
        ratio <= SLOWDOWN_MAX || attacked < Duration::from_millis(500),
        "{attack}: the client took {ratio:.2} times as long"
    );
}

/// How many of `streams` the peer has closed (end of stream or reset, not merely silent).
fn closed_count(streams: &[TcpStream]) -> usize {
    let mut closed = 0;
    for stream in streams {
        stream.set_nonblocking(true).expect("nonblocking");
        let mut byte = [0u8; 1];
        match std::io::Read::read(&mut &*stream, &mut byte) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => closed += 1,
            Ok(_) => {}
        }
    }
    closed
}

/// Opens `count` TCP connections to `addr` that never send anything.
fn idle_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    (0..count)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Idle connections: 2,000 to the manager and 2,000 to a server (the lock-out).

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_beyond_the_caps_do_not_lock_clients_out() {
    let cluster = tokio::task::block_in_place(|| Cluster::up(TransportKind::Tcp, &[]));
    let base = baseline(&cluster).await;
    let manager_pid = cluster.file.manager_process.pid;
    let (server, server_pid) = cluster.server(0);
    let rss_before = (rss_bytes(manager_pid), rss_bytes(server_pid));
    let held_manager = idle_connections(cluster.manager(), 2_000);
    let held_server = idle_connections(server, 2_000);
    println!(
        "opened {} idle connections to the manager and {} to server 1",
        held_manager.len(),
        held_server.len()
    );
    assert!(held_manager.len() > 1_024 && held_server.len() > 1_024);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attacked = put_get(&cluster, "/under-idle-connections").await;
    check_slowdown("2,000 idle connections each", base, attacked);
    // The daemons hold at most their per-peer cap (256) of them: the rest were evicted.
    let (closed_manager, closed_server) = (closed_count(&held_manager), closed_count(&held_server));
    println!("closed by the manager: {closed_manager}, by server 1: {closed_server}");
    assert!(
        closed_manager >= held_manager.len() - 256,
        "{closed_manager}"
    );
    assert!(closed_server >= held_server.len() - 256, "{closed_server}");
    let rss_after = (rss_bytes(manager_pid), rss_bytes(server_pid));
    println!("RSS manager {rss_before:?} -> {rss_after:?} bytes (manager, server)");
    assert!(rss_after.0 < rss_before.0 + (64 << 20));
    assert!(rss_after.1 < rss_before.1 + (64 << 20));
}

/// A client's authenticated connection, opened before 2,000 strangers connect from its own
/// address (as behind one NAT; the per-address cap cannot tell them apart), is not the one
/// evicted for them: strangers evict strangers. Before, it was silent longest and went first.
#[tokio::test(flavor = "multi_thread")]
async fn idle_strangers_on_a_clients_address_do_not_evict_its_session() {
    let cluster = tokio::task::block_in_place(|| Cluster::up(TransportKind::Tcp, &[]));
    let (server, _) = cluster.server(0);
    let key = tessera_client::parse_access_key(&cluster.file.key)
        .expect("access key")
        .for_storage();
    let mut session = support::authenticated(server, &key).await;
    let held = tokio::task::block_in_place(|| idle_connections(server, 2_000));
    assert!(held.len() > 1_024, "{} connected", held.len());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The strangers beyond the cap of 256 were evicted...
    let closed = closed_count(&held);
    assert!(
        closed >= held.len() - 256,
        "{closed} of {} closed",
        held.len()
    );
    // ...and the session still answers: any answer to a ping (an incarnation of 0 may be
    // refused as stale) on this connection, not an end of stream.
    let call = StorageCall {
        incarnation: 0,
        request: StorageRequest::Ping,
        service: tessera_wire::Service::BestEffort,
    };
    let frame = tessera_wire::Frame::new(FrameKind::Request, 7, &call, Bytes::new()).to_bytes();
    session
        .write_all(&frame)
        .await
        .expect("the session is open");
    let mut head = [0u8; tessera_wire::FRAME_HEADER_BYTES];
    let read = tokio::io::AsyncReadExt::read_exact(&mut session, &mut head);
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer in time")
        .expect("the session was not closed");
    let header = FrameHeader::decode(&head).expect("a valid header");
    assert_eq!((header.kind, header.request_id), (FrameKind::Response, 7));
}

// ---------------------------------------------------------------------------------------------
// Frames that announce almost 24 MiB: some send only the header, some almost all of the body,
// then both stall. Without a budget each pinned its announced size.

/// The header of a request frame of the largest size.
fn largest_header() -> [u8; tessera_wire::FRAME_HEADER_BYTES] {
    FrameHeader {
        kind: FrameKind::Request,
        message_len: MESSAGE_BYTES_MAX,
        payload_len: PAYLOAD_BYTES_MAX,
        request_id: 1,
    }
    .encode()
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_frames_that_stall_stay_within_the_frame_budget() {
    let budget: u64 = 64 << 20;
    let cluster = tokio::task::block_in_place(|| {
        Cluster::up(TransportKind::Tcp, &[("TESSERA_FRAME_BUDGET", "64M")])
    });
    let base = baseline(&cluster).await;
    let (server, server_pid) = cluster.server(0);
    let rss_before = rss_bytes(server_pid);
    let body_len = MESSAGE_BYTES_MAX as usize + PAYLOAD_BYTES_MAX as usize;
    // The attacker holds an access key: an unauthenticated peer is refused before a frame is
    // read (tests/auth.rs), so the frame budget is what bounds an authenticated one.
    let key = tessera_client::parse_access_key(&cluster.file.key)
        .expect("access key")
        .for_storage();
    // 20 connections send all but the last byte of a frame (480 MiB in all, over seven times
    // the budget), then 200 send a header and nothing else.
    let mut senders = Vec::new();
    for _ in 0..20 {
        senders.push(tokio::spawn(async move {
            let mut stream = support::authenticated(server, &key).await;
            stream.write_all(&largest_header()).await.ok()?;
            let body = vec![0x5au8; body_len - 1];
            // Blocks while the server holds back (budget spent), or fails once evicted.
            let _ = stream.write_all(&body).await;
            Some(stream)
        }));
    }
    // Until the attack shows: at least one frame's worth buffered at the server.
    let mut rss_max = rss_before;
    let shows = Instant::now();
    while rss_max < rss_before + (24 << 20) && shows.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        rss_max = rss_max.max(rss_bytes(server_pid));
    }
    println!(
        "the attack holds {} MiB at the server after {:?}",
        (rss_max - rss_before) >> 20,
        shows.elapsed()
    );
    assert!(
        rss_max >= rss_before + (24 << 20),
        "the senders never got a frame's worth to the server"
    );
    let mut headers_only = Vec::new();
    for _ in 0..200 {
        let mut stream = support::authenticated(server, &key).await;
        stream.write_all(&largest_header()).await.expect("header");
        headers_only.push(stream);
    }
    let watch = async {
        loop {
            rss_max = rss_max.max(rss_bytes(server_pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let attacked = tokio::select! {
        took = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            put_get(&cluster, "/under-huge-frames").await
        } => took,
        _ = watch => unreachable!("the watch never ends"),
    };
    rss_max = rss_max.max(rss_bytes(server_pid));
    check_slowdown("220 frames of almost 24 MiB", base, attacked);
    println!(
        "server RSS {} MiB before, at most {} MiB under attack (budget {} MiB)",
        rss_before >> 20,
        rss_max >> 20,
        budget >> 20
    );
    // The budget, plus the read buffers of the connections (64 KiB each) and slack for the
    // answers to the client's reads (outside the budget) and the allocator's own.
    let allowance = budget + 220 * (64 << 10) + (16 << 20);
    assert!(
        rss_max < rss_before + allowance,
        "RSS grew by {} MiB, allowed {} MiB",
        (rss_max - rss_before) >> 20,
        allowance >> 20
    );
    for sender in senders {
        sender.abort();
    }
    drop(headers_only);
}

// ---------------------------------------------------------------------------------------------
// Answers never read: requests for large reads sent back to back, and nothing read back.

/// A raw frame of a storage request.
fn request_frame(call: &StorageCall, request_id: u64) -> Vec<u8> {
    let message = tessera_wire::encode_message(call);
    let mut frame = FrameHeader {
        kind: FrameKind::Request,
        message_len: message.len() as u32,
        payload_len: 0,
        request_id,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&message);
    frame
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_never_read_stay_within_the_frame_budget() {
    let budget: u64 = 64 << 20;
    let cluster = tokio::task::block_in_place(|| {
        Cluster::up(TransportKind::Tcp, &[("TESSERA_FRAME_BUDGET", "64M")])
    });
    let base = baseline(&cluster).await;
    // A file whose first column holds 2 MiB, on a server the attack then reads from.
    let client = cluster.client().await;
    let layout = LayoutRequest {
        scheme: Scheme::Raid0,
        stripe_unit: 1 << 20,
        width: None,
    };
    let file = client.create("/read-me", layout).await.expect("create");
    client
        .write_at(&file, 0, &vec![7u8; 12 << 20])
        .await
        .expect("write");
    let meta = client.meta(&file).await.expect("meta");
    let status = client.status().await.expect("status");
    let target = status
        .iter()
        .find(|s| s.id == meta.servers[0])
        .expect("the first column's server");
    let addr: SocketAddr = target.addr.parse().expect("address");
    let pid = (0..SERVERS as usize)
        .map(|i| cluster.server(i))
        .find(|(a, _)| *a == addr)
        .expect("the server's process")
        .1;
    let rss_before = rss_bytes(pid);
    let key = tessera_client::parse_access_key(&cluster.file.key)
        .expect("access key")
        .for_storage();
    let read = StorageCall {
        incarnation: target.incarnation,
        request: StorageRequest::Read {
            file: meta.id,
            region: Region::Data,
            offset: 0,
            len: 1 << 20,
            overlay: false,
        },
        service: tessera_wire::Service::BestEffort,
    };
    // 8 connections ask for 256 answers of 1 MiB each (2 GiB, 32 times the budget) and
    // never read one: the server must not compute what it cannot send.
    let mut attackers = Vec::new();
    for _ in 0..8 {
        let read = read.clone();
        attackers.push(tokio::spawn(async move {
            let mut stream = support::authenticated(addr, &key).await;
            for id in 0..256 {
                if stream.write_all(&request_frame(&read, id)).await.is_err() {
                    break;
                }
            }
            // Held open, never read.
            tokio::time::sleep(Duration::from_secs(120)).await;
            drop(stream);
        }));
    }
    let mut rss_max = rss_before;
    let watch = async {
        loop {
            rss_max = rss_max.max(rss_bytes(pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let attacked = tokio::select! {
        took = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            put_get(&cluster, "/under-unread-answers").await
        } => took,
        _ = watch => unreachable!("the watch never ends"),
    };
    rss_max = rss_max.max(rss_bytes(pid));
    check_slowdown("2 GiB of answers never read", base, attacked);
    println!(
        "server RSS {} MiB before, at most {} MiB under attack (budget {} MiB)",
        rss_before >> 20,
        rss_max >> 20,
        budget >> 20
    );
    // The budget, the socket buffers of the attackers' connections (4 MiB each way) and slack
    // for the client's own reads and the allocator.
    let allowance = budget + 8 * (8 << 20) + (32 << 20);
    assert!(
        rss_max < rss_before + allowance,
        "RSS grew by {} MiB, allowed {} MiB",
        (rss_max - rss_before) >> 20,
        allowance >> 20
    );
    for attacker in attackers {
        attacker.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Junk datagrams that open sessions: the 4,200 of 94 bytes, then a steady flood.

/// A session-opening DATA packet of a message that never continues: 94 bytes.
fn junk_opening(session: u64) -> Vec<u8> {
    Packet {
        kind: PacketKind::Data,
        first: true,
        last: false,
        probe: false,
        session,
        seq: 0,
        ack: 0,
        window: 256,
        timestamp: 0,
        echo: 0,
        message_len: 100_000,
        ack_delay: 0,
        queue: 0,
        payload: Bytes::from(vec![0x5a; 50]),
    }
    .encode()
}

#[tokio::test(flavor = "multi_thread")]
async fn junk_session_openings_do_not_make_a_server_unreachable() {
    let cluster = tokio::task::block_in_place(|| Cluster::up(TransportKind::Udp, &[]));
    let base = baseline(&cluster).await;
    let (server, server_pid) = cluster.server(0);
    let rss_before = rss_bytes(server_pid);
    // Sources 127.0.0.2 to 127.0.0.65.
    let sockets: Vec<UdpSocket> = (2..66u8)
        .map(|host| UdpSocket::bind((std::net::Ipv4Addr::new(127, 0, 0, host), 0)).expect("bind"))
        .collect();
    let mut session = 0xbad0_0000_0000u64;
    let mut send = move |count: usize| {
        for _ in 0..count {
            let socket = &sockets[session as usize % sockets.len()];
            let _ = socket.send_to(&junk_opening(session), server);
            session += 1;
        }
    };
    send(4_200);
    // The flood goes on at 20,000 openings a second while the client works.
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = flooding.clone();
    let flood = std::thread::spawn(move || {
        let mut sent = 4_200u64;
        while flag.load(std::sync::atomic::Ordering::Relaxed) {
            send(200);
            sent += 200;
            std::thread::sleep(Duration::from_millis(10));
        }
        sent
    });
    let attacked = put_get(&cluster, "/under-junk-sessions").await;
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    let sent = flood.join().expect("flood thread");
    check_slowdown(&format!("{sent} junk session openings"), base, attacked);
    let rss_after = rss_bytes(server_pid);
    println!(
        "server RSS {} MiB before, {} MiB after {sent} junk openings",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(rss_after < rss_before + (64 << 20));
    let client = cluster.client().await;
    let target = cluster.file.servers[0].id;
    let counters = client
        .server_counters()
        .await
        .expect("the servers' counters")
        .into_iter()
        .find(|(id, _)| *id == target)
        .map(|(_, counters)| counters)
        .expect("the attacked server's counters");
    let count = |name: &str| counters.get(name).copied().unwrap_or(0);
    println!(
        "server 1: sessions_opened {}, half_open_evicted {}, dropped_opens_source_rate {}, \
         dropped_opens_total_rate {}",
        count("sessions_opened"),
        count("half_open_evicted"),
        count("dropped_opens_source_rate"),
        count("dropped_opens_total_rate")
    );
    // Junk without a key never opens a session (dropped as unauthentic); what is admitted
    // is bounded by the rates and the eviction.
    assert!(
        count("half_open_evicted")
            + count("dropped_opens_source_rate")
            + count("dropped_unauthentic")
            > 0
    );
}
