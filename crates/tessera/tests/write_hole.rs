//! The RAID-5 write hole and parity-lock leases (issue 15, items 1 and 2), on a real local
//! cluster started with the `tessera` binary.
//!
//! A client that dies between the data and the parity of a partial-stripe write must never
//! make a later reconstruction wrong (every byte outside its write is exact, every byte of its
//! write is old or new), and the lock it held must be free within a second, on both
//! transports, with no server marked down. The in-process tests stop a client's write at that
//! exact point (a transport that swallows its `WriteParity`, then the write's future is
//! dropped); the multi-process tests SIGKILL `tessera write` at random times (RAID-5 over both
//! transports; RAID-1 and Hybrid, which have no parity to update in place, over UDP).
//!
//! Random choices come from a seeded generator whose seed is printed; set `TESSERA_TEST_SEED`
//! to replay a failure. `TESSERA_WRITE_HOLE_RUNS` sets the number of SIGKILLed writes per
//! case in `sigkilled_writers_lose_no_acknowledged_byte_*` (default 12).

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_client::{Client, ClientConfig, File, LayoutRequest, Scheme, ServerState};
use tessera_transport::{
    BoxFuture, Reply, TcpConfig, TcpTransport, Transport, TransportError, TransportKind,
};
use tessera_wire::{StorageCall, StorageRequest};

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
const SERVERS: u32 = 5;
/// Stripe unit of every test file; a stripe holds four units of data.
const UNIT: u64 = 64 << 10;
const STRIPE: u64 = 4 * UNIT;
/// Stripes in every test file.
const STRIPES: u64 = 6;
const WAIT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
struct ClusterToml {
    manager: String,
}

/// A local cluster run by the `tessera` binary; `tessera down` when dropped.
struct Cluster {
    temp: Option<tempfile::TempDir>,
    dir: PathBuf,
    manager: SocketAddr,
}

impl Cluster {
    fn up() -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-write-hole-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().to_path_buf();
        let mut cluster = Cluster {
            temp: Some(temp),
            dir,
            manager: "127.0.0.1:1".parse().expect("address"),
        };
        let dir = cluster.dir.clone();
        cluster.run(
            &["up", "--servers", &SERVERS.to_string(), "--detach", "--dir"],
            Some(&dir),
        );
        let text = std::fs::read_to_string(cluster.dir.join("cluster.toml")).expect("toml");
        let file: ClusterToml = toml::from_str(&text).expect("cluster.toml parses");
        cluster.manager = file.manager.parse().expect("manager address");
        cluster
    }

    fn cluster_toml(&self) -> PathBuf {
        self.dir.join("cluster.toml")
    }

    /// `tessera ARGS [DIR]`, failing the test with its stderr if it fails; its stdout.
    fn run(&self, args: &[&str], dir: Option<&Path>) -> String {
        self.run_logged(args, dir, "error").0
    }

    /// `tessera ARGS [DIR]` logging at `log` (`TESSERA_LOG`); its stdout and stderr.
    fn run_logged(&self, args: &[&str], dir: Option<&Path>, log: &str) -> (String, String) {
        let mut command = Command::new(TESSERA);
        command.args(args);
        if let Some(dir) = dir {
            command.arg(dir);
        }
        let output = command
            .env("TESSERA_CLUSTER", self.cluster_toml())
            .env("TESSERA_LOG", log)
            .output()
            .expect("cannot run the tessera binary");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "tessera {} failed: {stderr}",
            args.join(" "),
        );
        (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
    }

    fn stop_server(&self, id: u32) {
        self.run(
            &["server", "stop", &id.to_string(), "--dir"],
            Some(&self.dir),
        );
    }

    fn start_server(&self, id: u32) {
        self.run(
            &["server", "start", &id.to_string(), "--dir"],
            Some(&self.dir),
        );
    }

    async fn client(&self, transport: TransportKind) -> Client {
        let config = ClientConfig {
            transport,
            credential: Some(admin_credential(&self.dir)),
            ..ClientConfig::default()
        };
        Client::connect_with(self.manager, config)
            .await
            .expect("connect to the manager")
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

fn seeded(test: &str) -> StdRng {
    let seed = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    eprintln!("{test}: seed {seed} (replay with TESSERA_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

fn random_bytes(rng: &mut StdRng, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len as usize];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Every byte equal to `want`, except inside `unacknowledged` (a write whose client died),
/// where each byte is either the old one or the new one.
#[track_caller]
fn check_bytes(what: &str, got: &[u8], want: &[u8], unacknowledged: Option<(u64, &[u8])>) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut wrong = 0usize;
    let mut first = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let new = unacknowledged.and_then(|(offset, bytes)| {
            let i = i as u64;
            (i >= offset && i < offset + bytes.len() as u64).then(|| bytes[(i - offset) as usize])
        });
        if g != w && Some(g) != new {
            wrong += 1;
            first.get_or_insert(i);
        }
    }
    assert_eq!(
        wrong, 0,
        "{what}: {wrong} acknowledged bytes read wrong, the first at {first:?}"
    );
}

async fn all_up(client: &Client) -> bool {
    client
        .status()
        .await
        .expect("status")
        .iter()
        .all(|s| s.state == ServerState::Up)
}

async fn wait_all_up(client: &Client) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while !all_up(client).await {
        assert!(
            Instant::now() < deadline,
            "servers not all up after {WAIT_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A client stopped between its data writes and its parity write, in process.
// ---------------------------------------------------------------------------------------------

/// A client's transport that dies at one point: the manager is reached over TCP as usual;
/// requests to servers go through `servers` until a `WriteParity` comes, which is never sent
/// (its future never resolves), as if the client were killed right before sending it.
struct DiesBeforeParity {
    manager: SocketAddr,
    manager_transport: Arc<TcpTransport>,
    servers: Arc<dyn Transport>,
    /// Set when the parity write was swallowed: the client is "dead" from then on.
    dead: Arc<AtomicBool>,
}

impl Transport for DiesBeforeParity {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        self.call_expecting(addr, message, payload, None)
    }

    fn call_expecting(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        if addr == self.manager {
            return self.manager_transport.call(addr, message, payload);
        }
        let call: Option<StorageCall> = tessera_wire::decode_message(&message).ok();
        let parity = matches!(
            call.map(|c| c.request),
            Some(StorageRequest::WriteParity { .. })
        );
        if parity || self.dead.load(Ordering::SeqCst) {
            self.dead.store(true, Ordering::SeqCst);
            return Box::pin(std::future::pending());
        }
        self.servers
            .call_expecting(addr, message, payload, reply_bytes)
    }
}

/// A client of `transport` whose next partial-stripe write dies before its parity write.
fn doomed_client(cluster: &Cluster, transport: TransportKind) -> (Client, Arc<AtomicBool>) {
    let tcp = TcpConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(5),
    };
    // Every connection is authenticated: the admin's credential, from the cluster's secret.
    let credential = admin_credential(&cluster.dir);
    let storage = Some(credential.for_storage());
    let servers: Arc<dyn Transport> = match transport {
        TransportKind::Tcp => Arc::new(Arc::new(TcpTransport::with_credential(tcp, storage))),
        TransportKind::Udp => Arc::new(
            tessera_transport::UdpTransport::new(tessera_transport::UdpConfig {
                datagram: ClientConfig::default().datagram,
                request_timeout: tcp.request_timeout,
                credential: storage,
            })
            .expect("UDP socket"),
        ),
    };
    let dead = Arc::new(AtomicBool::new(false));
    let transport = DiesBeforeParity {
        manager: cluster.manager,
        manager_transport: Arc::new(TcpTransport::with_credential(tcp, Some(credential))),
        servers,
        dead: dead.clone(),
    };
    (
        Client::with_transport(cluster.manager, Arc::new(transport)),
        dead,
    )
}

/// Runs a write on `client` until it dies before its parity write, then drops it.
async fn write_and_die(client: &Client, dead: &AtomicBool, file: &File, offset: u64, data: &[u8]) {
    let write = client.write_at(file, offset, data);
    tokio::pin!(write);
    let deadline = tokio::time::sleep(WAIT_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            result = &mut write => panic!("the doomed write finished: {result:?}"),
            () = &mut deadline => panic!("the doomed write never reached its parity write"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {
                if dead.load(Ordering::SeqCst) {
                    // Dropping the future stops the client where it stands: data written,
                    // parity not, the lock held and never renewed again.
                    return;
                }
            }
        }
    }
}

/// A partial-stripe write inside stripe `stripe` over two data units: two data columns are
/// read-modify-written under the stripe's lock.
fn partial_write(rng: &mut StdRng, stripe: u64) -> (u64, Vec<u8>) {
    let offset = stripe * STRIPE + rng.gen_range(UNIT / 2..UNIT);
    let len = rng.gen_range(UNIT / 2..UNIT + UNIT / 2);
    (offset, random_bytes(rng, len))
}

async fn client_dies_between_data_and_parity(transport: TransportKind) {
    let mut rng = seeded(&format!(
        "client_dies_between_data_and_parity {transport:?}"
    ));
    let cluster = Cluster::up();
    let client = cluster.client(transport).await;
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: UNIT as u32,
        width: Some(SERVERS),
    };
    let file = client.create("hole", layout).await.expect("create");
    let mut model = random_bytes(&mut rng, STRIPES * STRIPE);
    client.write_at(&file, 0, &model).await.expect("write");
    client.sync(&file).await.expect("sync");

    // 1. The lock a dead client held is free within a second, and nobody is marked down. The
    //    doomed client stays alive (its connection or session open), so only the lease can
    //    free the lock, on either transport.
    let (doomed, dead) = doomed_client(&cluster, transport);
    let (offset, bytes) = partial_write(&mut rng, 1);
    write_and_die(&doomed, &dead, &file, offset, &bytes).await;
    // The same bytes again, so that the model is exact whatever the dead write left.
    let bytes = random_bytes(&mut rng, bytes.len() as u64);
    let started = Instant::now();
    client
        .write_at(&file, offset, &bytes)
        .await
        .expect("write after the dead one");
    let waited = started.elapsed();
    eprintln!("{transport:?}: a write to the dead client's stripe took {waited:?}");
    assert!(
        waited < Duration::from_secs(1),
        "the dead client's lock held {waited:?}"
    );
    model[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
    assert!(
        all_up(&client).await,
        "a server was marked down over a held lock"
    );

    // 2. A dead client's stripe, with its record unresolved, survives the loss of any one
    //    server (the parity server's record survives its restart).
    let (doomed, dead) = doomed_client(&cluster, transport);
    let (offset, bytes) = partial_write(&mut rng, 3);
    write_and_die(&doomed, &dead, &file, offset, &bytes).await;
    drop(doomed);
    let unacknowledged = Some((offset, &bytes[..]));
    let meta = client.list("hole").await.expect("list")[0].clone();
    for server in meta.servers.clone() {
        cluster.stop_server(server);
        let fresh = cluster.client(transport).await;
        let mut got = vec![0u8; model.len()];
        fresh
            .read_into(&file, 0, &mut got)
            .await
            .expect("degraded read");
        check_bytes(
            &format!("server {server} lost"),
            &got,
            &model,
            unacknowledged,
        );
        cluster.start_server(server);
        wait_all_up(&client).await;
    }

    // 3. The next writer of the stripe resolves the record; parity then matches the data.
    let bytes = random_bytes(&mut rng, bytes.len() as u64);
    client.write_at(&file, offset, &bytes).await.expect("write");
    model[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
    let mut got = vec![0u8; model.len()];
    client.read_into(&file, 0, &mut got).await.expect("read");
    check_bytes("after the record's resolution", &got, &model, None);
    let report = client.scrub(Some("hole")).await.expect("scrub");
    assert_eq!(
        report.parity_repaired, 0,
        "the record was resolved wrong: {report:?}"
    );
    assert!(report.unrepairable.is_empty(), "{report:?}");
    for server in meta.servers {
        cluster.stop_server(server);
        let fresh = cluster.client(transport).await;
        let mut got = vec![0u8; model.len()];
        fresh
            .read_into(&file, 0, &mut got)
            .await
            .expect("degraded read");
        check_bytes(
            &format!("after resolution, server {server} lost"),
            &got,
            &model,
            None,
        );
        cluster.start_server(server);
        wait_all_up(&client).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn client_dies_between_data_and_parity_udp() {
    client_dies_between_data_and_parity(TransportKind::Udp).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_dies_between_data_and_parity_tcp() {
    client_dies_between_data_and_parity(TransportKind::Tcp).await;
}

// ---------------------------------------------------------------------------------------------
// `tessera write` SIGKILLed at random points, then one server lost.
// ---------------------------------------------------------------------------------------------

fn runs() -> usize {
    std::env::var("TESSERA_WRITE_HOLE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

fn get(cluster: &Cluster, transport: &str, out: &Path) -> Vec<u8> {
    cluster.run(
        &[
            "--transport",
            transport,
            "get",
            "hole",
            out.to_str().expect("path"),
        ],
        None,
    );
    std::fs::read(out).expect("got file")
}

fn sigkilled_writers_lose_no_acknowledged_byte(scheme: &str, transport: &str) {
    let mut rng = seeded(&format!("sigkilled_writers {scheme} {transport}"));
    let cluster = Cluster::up();
    let scratch = cluster.dir.join("scratch");
    let mut model = random_bytes(&mut rng, STRIPES * STRIPE);
    std::fs::write(&scratch, &model).expect("scratch");
    let local = scratch.to_str().expect("path");
    cluster.run(
        &[
            "--transport",
            transport,
            "put",
            local,
            "hole",
            "--scheme",
            scheme,
            "--stripe-unit",
            "64K",
        ],
        None,
    );
    let stat = cluster.run(&["stat", "hole"], None);
    assert!(stat.contains(&format!("scheme       {scheme}")), "{stat}");
    let out = cluster.dir.join("out");
    let (mut killed, mut finished, mut resolved) = (0, 0, 0);
    let mut slowest = Duration::ZERO;
    // Kill times spread over a whole write's run time, measured here (the fastest of three).
    // (A partial-stripe write of the bytes already there.)
    std::fs::write(&scratch, &model[..(STRIPE / 2) as usize]).expect("scratch");
    let write_us = (0..3)
        .map(|_| {
            let started = Instant::now();
            cluster.run(
                &["--transport", transport, "write", "hole", "0", local],
                None,
            );
            started.elapsed().as_micros() as u64
        })
        .min()
        .expect("three writes");
    for run in 0..runs() {
        // A partial-stripe write: inside one stripe, or across the boundary of two.
        let offset = rng.gen_range(0..(STRIPES - 1) * STRIPE);
        let len = rng.gen_range(1..STRIPE - UNIT);
        let bytes = random_bytes(&mut rng, len);
        std::fs::write(&scratch, &bytes).expect("scratch");
        let mut child = Command::new(TESSERA)
            .args([
                "--transport",
                transport,
                "write",
                "hole",
                &offset.to_string(),
                local,
            ])
            .env("TESSERA_CLUSTER", cluster.cluster_toml())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tessera write");
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..write_us)));
        let _ = child.kill();
        let status = child.wait().expect("wait");
        let unacknowledged = if status.success() {
            finished += 1;
            model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
            None
        } else {
            killed += 1;
            Some((offset, &bytes[..]))
        };
        // One server lost, whichever: every acknowledged byte reads back.
        let server = rng.gen_range(1..=SERVERS);
        cluster.stop_server(server);
        let got = get(&cluster, transport, &out);
        check_bytes(
            &format!("run {run}: write {offset}+{len} killed, then server {server} lost"),
            &got,
            &model,
            unacknowledged,
        );
        cluster.start_server(server);
        let deadline = Instant::now() + WAIT_TIMEOUT;
        while cluster
            .run(&["status"], None)
            .lines()
            .any(|l| l.ends_with("down"))
        {
            assert!(
                Instant::now() < deadline,
                "server {server} did not come back"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Another client writes the same bytes again (acknowledged): it waits for the dead
        // client's lock, resolves what it left, and makes the model exact again.
        let started = Instant::now();
        let args = [
            "--transport",
            transport,
            "write",
            "hole",
            &offset.to_string(),
            local,
        ];
        let (_, log) = cluster.run_logged(&args, None, "tessera_client=info");
        slowest = slowest.max(started.elapsed());
        resolved += log.matches("resolved the intent record").count();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        let got = get(&cluster, transport, &out);
        check_bytes(&format!("run {run}: rewritten"), &got, &model, None);
    }
    eprintln!(
        "{scheme} {transport}: {killed} writes killed ({resolved} left an intent record that the next \
         writer resolved), {finished} finished before the kill; a whole write takes \
         {write_us} us; the slowest rewrite after a kill took {slowest:?}"
    );
    let report = cluster.run(&["scrub"], None);
    assert!(
        report.contains("repaired: 0 corrupt blocks, 0 parity mismatches"),
        "{report}"
    );
    assert!(
        !cluster
            .run(&["status"], None)
            .lines()
            .any(|l| l.ends_with("down")),
        "a server was left down"
    );
}

#[test]
fn sigkilled_writers_lose_no_acknowledged_byte_raid5_udp() {
    sigkilled_writers_lose_no_acknowledged_byte("raid5", "udp");
}

#[test]
fn sigkilled_writers_lose_no_acknowledged_byte_raid5_tcp() {
    sigkilled_writers_lose_no_acknowledged_byte("raid5", "tcp");
}

/// RAID-1 writes both copies of a piece at once, with no lock: a client killed in between
/// leaves one copy new and one old, and a later loss serves the other one, old or new, never
/// a byte outside the write.
#[test]
fn sigkilled_writers_lose_no_acknowledged_byte_raid1_udp() {
    sigkilled_writers_lose_no_acknowledged_byte("raid1", "udp");
}

/// Hybrid partial stripes go to mirrored overflow entries, each added whole by its server,
/// and base data and parity are not touched: the same holds as for RAID-1.
#[test]
fn sigkilled_writers_lose_no_acknowledged_byte_hybrid_udp() {
    sigkilled_writers_lose_no_acknowledged_byte("hybrid", "udp");
}

/// `tessera write` of whole stripes SIGKILLed at random points, then one server lost: a
/// full-stripe write takes a stale-parity record first (`tessera-store`'s `stale` module), so
/// `tessera get` either reads every byte outside the write exact and every byte of it old or
/// new, or fails naming a stripe of the write (a torn stripe under a lost column reads as an
/// error, never as bytes). The next writer of the same range makes everything exact, also
/// degraded, and a final scrub finds no parity to repair.
#[test]
fn sigkilled_full_stripe_writers_then_a_server_lost_raid5_udp() {
    let mut rng = seeded("sigkilled_full_stripe_writers raid5 udp");
    let cluster = Cluster::up();
    let scratch = cluster.dir.join("scratch");
    let mut model = random_bytes(&mut rng, STRIPES * STRIPE);
    std::fs::write(&scratch, &model).expect("scratch");
    let local = scratch.to_str().expect("path");
    let put = [
        "put",
        local,
        "hole",
        "--scheme",
        "raid5",
        "--stripe-unit",
        "64K",
    ];
    cluster.run(&put, None);
    let out = cluster.dir.join("out");
    let write = |offset: u64| {
        let mut command = Command::new(TESSERA);
        command
            .args(["write", "hole", &offset.to_string(), local])
            .env("TESSERA_CLUSTER", cluster.cluster_toml())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    };
    // Kill times spread over a whole write's run time (the fastest of three, of 3 stripes).
    std::fs::write(&scratch, &model[..(3 * STRIPE) as usize]).expect("scratch");
    let write_us = (0..3)
        .map(|_| {
            let started = Instant::now();
            assert!(write(0).status().expect("write").success());
            started.elapsed().as_micros() as u64
        })
        .min()
        .expect("three writes");
    let (mut killed, mut unreadable) = (0, 0);
    for run in 0..runs() {
        let first = rng.gen_range(0..STRIPES - 1);
        let stripes = rng.gen_range(1..=(STRIPES - first).min(3));
        let (offset, len) = (first * STRIPE, stripes * STRIPE);
        let bytes = random_bytes(&mut rng, len);
        std::fs::write(&scratch, &bytes).expect("scratch");
        let mut child = write(offset).spawn().expect("spawn tessera write");
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..write_us)));
        let _ = child.kill();
        let unacknowledged = if child.wait().expect("wait").success() {
            model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
            None
        } else {
            killed += 1;
            Some((offset, &bytes[..]))
        };
        let server = rng.gen_range(1..=SERVERS);
        cluster.stop_server(server);
        let what = format!("run {run}: write {offset}+{len} killed, then server {server} lost");
        let output = Command::new(TESSERA)
            .args(["get", "hole", out.to_str().expect("path")])
            .env("TESSERA_CLUSTER", cluster.cluster_toml())
            .output()
            .expect("run tessera get");
        if output.status.success() {
            let got = std::fs::read(&out).expect("got file");
            check_bytes(&what, &got, &model, unacknowledged);
        } else {
            // Only a stripe of the killed write may be unreadable, and only as that error.
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(unacknowledged.is_some(), "{what}: get failed: {stderr}");
            let stripe = torn_stripe(&stderr)
                .unwrap_or_else(|| panic!("{what}: get failed, not on a torn stripe: {stderr}"));
            assert!(
                (first..first + stripes).contains(&stripe),
                "{what}: {stderr}"
            );
            unreadable += 1;
        }
        cluster.start_server(server);
        wait_none_down(&cluster, server);
        // The same range written again, acknowledged: exact, also with a server lost.
        assert!(write(offset).status().expect("write").success());
        model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        check_bytes(
            &format!("run {run}: rewritten"),
            &get(&cluster, "udp", &out),
            &model,
            None,
        );
        cluster.stop_server(server);
        let got = get(&cluster, "udp", &out);
        check_bytes(
            &format!("run {run}: rewritten, server {server} lost"),
            &got,
            &model,
            None,
        );
        cluster.start_server(server);
        wait_none_down(&cluster, server);
    }
    eprintln!(
        "raid5 udp full stripes: {killed} of {} writes killed, {unreadable} reads with a server \
         lost failed on a torn stripe; a 3-stripe write takes {write_us} us",
        runs()
    );
    let report = cluster.run(&["scrub"], None);
    assert!(
        report.contains("repaired: 0 corrupt blocks, 0 parity mismatches"),
        "{report}"
    );
}

/// The stripe a `tessera get` failed on as torn (`... stripe N of 'hole' was left
/// half-written ...`), if that is why it failed.
fn torn_stripe(stderr: &str) -> Option<u64> {
    let before = &stderr[..stderr.find(" of 'hole' was left half-written")?];
    before.rsplit("stripe ").next()?.parse().ok()
}

/// Waits until the manager counts no server down (`server` was just started).
fn wait_none_down(cluster: &Cluster, server: u32) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while cluster
        .run(&["status"], None)
        .lines()
        .any(|l| l.ends_with("down"))
    {
        assert!(
            Instant::now() < deadline,
            "server {server} did not come back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The admin's credential, from the secret in the cluster's directory.
fn admin_credential(dir: &Path) -> tessera_client::Credential {
    let text = std::fs::read_to_string(dir.join("cluster.secret")).expect("secret");
    let secret = tessera_client::Secret::from_file_text(&text).expect("secret parses");
    tessera_client::Credential {
        claim: tessera_client::Claim::Admin,
        key: secret.admin_key(),
    }
}

/// A server SIGKILLed at a random point of a `tessera put` (RAID-5, 64 KiB units), often
/// while the put's servers sync it and keep its record (`DescribeAndSync`): a put that exits
/// 0 reads back exact with that server still down, after it returns and is rebuilt, and with
/// any one server down after that; a put that fails leaves the file it would have replaced
/// whole. Sizes run from a few bytes (one partial stripe: two servers hold it) to three
/// stripes and a bit; three paths are replaced over and over. A final scrub repairs nothing.
#[test]
fn a_server_sigkilled_during_puts_loses_no_acknowledged_put() {
    let mut rng = seeded("a_server_sigkilled_during_puts");
    let cluster = Cluster::up();
    let scratch = cluster.dir.join("scratch");
    let out = cluster.dir.join("out");
    let paths = ["p0", "p1", "p2"];
    let put = |path: &str| {
        let mut command = Command::new(TESSERA);
        command
            .args(["put", scratch.to_str().expect("path"), path])
            .args(["--scheme", "raid5", "--stripe-unit", "64K"])
            .env("TESSERA_CLUSTER", cluster.cluster_toml())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };
    let get = |path: &str| -> Vec<u8> {
        cluster.run(&["get", path, out.to_str().expect("path")], None);
        std::fs::read(&out).expect("got file")
    };
    // Kill times spread over a whole put's run time (the fastest of three, of 3 stripes).
    std::fs::write(&scratch, random_bytes(&mut rng, 3 * STRIPE)).expect("scratch");
    let put_us = (0..3)
        .map(|_| {
            let started = Instant::now();
            assert!(put("timing").status().expect("put").success());
            started.elapsed().as_micros() as u64
        })
        .min()
        .expect("three puts");
    let mut model: Vec<Option<Vec<u8>>> = vec![None; paths.len()];
    let mut failed = 0;
    for run in 0..runs() {
        let which = rng.gen_range(0..paths.len());
        let len = match rng.gen_range(0..3) {
            0 => rng.gen_range(1..UNIT),
            1 => rng.gen_range(UNIT..STRIPE),
            _ => rng.gen_range(STRIPE..3 * STRIPE + 1000),
        };
        let bytes = random_bytes(&mut rng, len);
        std::fs::write(&scratch, &bytes).expect("scratch");
        let child = put(paths[which]).spawn().expect("spawn tessera put");
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..put_us)));
        let server = rng.gen_range(1..=SERVERS);
        cluster.stop_server(server);
        let output = child.wait_with_output().expect("wait");
        let what = format!(
            "run {run}: put of {len} bytes to {}, server {server} killed",
            paths[which]
        );
        if output.status.success() {
            model[which] = Some(bytes);
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                stderr.contains("is unchanged"),
                "{what}: put failed: {stderr}"
            );
            failed += 1;
        }
        let check = |when: &str| {
            for (path, want) in paths.iter().zip(&model) {
                if let Some(want) = want {
                    check_bytes(&format!("{what}, {path} {when}"), &get(path), want, None);
                }
            }
        };
        check("with the server down");
        cluster.start_server(server);
        wait_none_down(&cluster, server);
        cluster.run(&["rebuild", &server.to_string()], None);
        check("after it came back");
    }
    for server in 1..=SERVERS {
        cluster.stop_server(server);
        for (path, want) in paths.iter().zip(&model) {
            if let Some(want) = want {
                let what = format!("{path} at the end, server {server} down");
                check_bytes(&what, &get(path), want, None);
            }
        }
        cluster.start_server(server);
        wait_none_down(&cluster, server);
    }
    eprintln!(
        "raid5 puts with a server SIGKILLed: {failed} of {} failed; a 3-stripe put takes \
         {put_us} us",
        runs()
    );
    let report = cluster.run(&["scrub"], None);
    assert!(
        report.contains("repaired: 0 corrupt blocks, 0 parity mismatches"),
        "{report}"
    );
}
