//! Multi-process fault tests: a real local cluster started with the `tessera` binary, servers
//! killed and restarted under it, bytes on its disks corrupted, garbage sent to its sockets, and
//! every byte read back through the client library compared with a model of what was written.
//!
//! Each test runs its own cluster of five servers in a temporary directory, stopped by a guard
//! even when the test panics (the directory is then kept, and its path printed, for the logs).
//! Random choices come from a seeded generator whose seed is printed; set `TESSERA_TEST_SEED`
//! to replay a failure.

mod support;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Deserialize;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_client::{Client, ClientError, File, LayoutRequest, Scheme, ScrubReport, ServerState};
use tessera_wire::{
    decode_message, FileMeta, Frame, FrameHeader, FrameKind, Incarnation, ServerId, ServerStatus,
    StorageCall, StorageError, StorageRequest, StorageResponse, FRAME_HEADER_BYTES,
    MESSAGE_BYTES_MAX,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
/// Servers in every test cluster; files are striped over all of them.
const SERVERS: u32 = 5;
/// Stripe unit of every test file.
const UNIT: u64 = 64 << 10;
/// How long a server may take to reach a state, or to close a connection.
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers: the cluster, a model of each file, seeds and byte comparisons.
// ---------------------------------------------------------------------------------------------

/// The parts of `cluster.toml` the tests need.
#[derive(Deserialize)]
struct ClusterToml {
    manager: String,
    servers: Vec<ServerToml>,
}

#[derive(Deserialize)]
struct ServerToml {
    id: u32,
    dir: PathBuf,
}

/// A local cluster run by the `tessera` binary; `tessera down` when dropped.
struct Cluster {
    temp: Option<tempfile::TempDir>,
    dir: PathBuf,
    manager: SocketAddr,
}

/// Run `tessera ARGS --dir DIR`, failing the test with its stderr if it fails.
fn run_tessera(dir: &std::path::Path, args: &[&str]) {
    let output = Command::new(TESSERA)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("cannot run the tessera binary");
    assert!(
        output.status.success(),
        "tessera {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Cluster {
    /// Start a manager and five servers, and wait until every server is up.
    fn up() -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-faults-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().to_path_buf();
        // The guard exists before anything starts, so a failed start is cleaned up too.
        let mut cluster = Cluster {
            temp: Some(temp),
            dir,
            manager: "127.0.0.1:1".parse().expect("address"),
        };
        cluster.start_all();
        cluster
    }

    fn start_all(&mut self) {
        self.tessera(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
        self.manager = self
            .file()
            .manager
            .parse()
            .expect("manager address in cluster.toml");
    }

    /// `tessera down`, then `tessera up` on the same directory.
    fn restart_all(&mut self) {
        self.tessera(&["down"]);
        self.start_all();
    }

    fn tessera(&self, args: &[&str]) {
        tokio::task::block_in_place(|| run_tessera(&self.dir, args));
    }

    fn file(&self) -> ClusterToml {
        let text = std::fs::read_to_string(self.dir.join("cluster.toml")).expect("cluster.toml");
        toml::from_str(&text).expect("cluster.toml parses")
    }

    /// Kill server `id` at once, as a crash would.
    fn stop_server(&self, id: ServerId) {
        self.tessera(&["server", "stop", &id.to_string()]);
    }

    /// Start server `id` again and wait until the manager sees it.
    fn start_server(&self, id: ServerId) {
        self.tessera(&["server", "start", &id.to_string()]);
    }

    /// The admin's credential, from the cluster's secret.
    fn admin(&self) -> tessera_client::Credential {
        let text = std::fs::read_to_string(self.dir.join("cluster.secret")).expect("secret");
        let secret = tessera_client::Secret::from_file_text(&text).expect("secret parses");
        tessera_client::Credential {
            claim: tessera_client::Claim::Admin,
            key: secret.admin_key(),
        }
    }

    /// A client acting as the admin (rebuild clears debts).
    async fn client(&self) -> Client {
        let config = tessera_client::ClientConfig {
            credential: Some(self.admin()),
            ..tessera_client::ClientConfig::default()
        };
        Client::connect_with(self.manager, config)
            .await
            .expect("connect to the manager")
    }

    /// Path of one of a server's files for file `file` (`data`, `redundancy`, `overflow`).
    fn store_file(&self, server: ServerId, file: u64, name: &str) -> PathBuf {
        let dir = self
            .file()
            .servers
            .into_iter()
            .find(|s| s.id == server)
            .map(|s| s.dir)
            .expect("server in cluster.toml");
        dir.join("files").join(file.to_string()).join(name)
    }

    /// Bytes of a server's file straight from its disk.
    fn raw(&self, server: ServerId, file: u64, name: &str, offset: u64, len: u64) -> Vec<u8> {
        let path = self.store_file(server, file, name);
        let handle = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        let mut bytes = vec![0u8; len as usize];
        handle
            .read_exact_at(&mut bytes, offset)
            .unwrap_or_else(|e| panic!("cannot read {}+{len} of {}: {e}", offset, path.display()));
        bytes
    }

    /// A whole file of a server's store, empty if it does not exist.
    fn raw_all(&self, server: ServerId, file: u64, name: &str) -> Vec<u8> {
        std::fs::read(self.store_file(server, file, name)).unwrap_or_default()
    }

    /// Invert one byte of a server's file on disk, behind the server's back.
    fn flip_byte(&self, server: ServerId, file: u64, name: &str, offset: u64) {
        let path = self.store_file(server, file, name);
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        let mut byte = [0u8; 1];
        handle.read_exact_at(&mut byte, offset).expect("read byte");
        byte[0] ^= 0xFF;
        handle.write_all_at(&byte, offset).expect("write byte");
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

/// A generator seeded from `TESSERA_TEST_SEED` or the clock; the seed is printed.
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

/// Equal bytes, or a failure naming the first difference (not megabytes of hex).
#[track_caller]
fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    let differing = got.iter().zip(want).filter(|(a, b)| a != b).count();
    panic!(
        "{what}: read {} bytes, expected {}; first difference at byte {first:?}, {differing} \
         bytes differ",
        got.len(),
        want.len()
    );
}

#[track_caller]
fn assert_clean(what: &str, report: &ScrubReport) {
    assert!(
        report.corrupt_repaired == 0
            && report.parity_repaired == 0
            && report.mirrors_repaired == 0
            && report.unrepairable.is_empty(),
        "{what}: scrub found damage: {report:?}"
    );
}

/// A server's record at the manager.
async fn status_of(client: &Client, server: ServerId) -> ServerStatus {
    client
        .status()
        .await
        .expect("status")
        .into_iter()
        .find(|s| s.id == server)
        .unwrap_or_else(|| panic!("server {server} unknown to the manager"))
}

async fn state_of(client: &Client, server: ServerId) -> ServerState {
    status_of(client, server).await.state
}

async fn wait_state(client: &Client, server: ServerId, want: ServerState) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    loop {
        let state = state_of(client, server).await;
        if state == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "server {server} is {state:?}, not {want:?}, after {WAIT_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where a byte of a file lives: the server holding its data block and the offset in that
/// server's data file.
fn data_location(meta: &FileMeta, offset: u64) -> (ServerId, u64) {
    let layout = meta.layout;
    let block = offset / UNIT;
    let slot = layout.data_slot(block);
    (
        meta.servers[slot.column as usize],
        layout.local_offset(slot) + offset % UNIT,
    )
}

/// A file and what it must hold.
struct Model {
    file: File,
    scheme: Scheme,
    data: Vec<u8>,
    /// Data bytes per stripe.
    stripe: u64,
}

impl Model {
    async fn create(client: &Client, path: &str, scheme: Scheme) -> Model {
        let file = client
            .create(
                path,
                LayoutRequest {
                    scheme,
                    stripe_unit: UNIT as u32,
                    width: None,
                },
            )
            .await
            .unwrap_or_else(|e| panic!("create {path}: {e}"));
        let meta = client.stat(path).await.expect("stat").meta;
        assert_eq!(
            meta.layout.width, SERVERS,
            "{path}: striped over every server"
        );
        Model {
            file,
            scheme,
            data: Vec::new(),
            stripe: meta.layout.stripe_bytes(),
        }
    }

    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn apply(&mut self, offset: u64, bytes: &[u8]) {
        let (start, end) = (offset as usize, offset as usize + bytes.len());
        if end > self.data.len() {
            self.data.resize(end, 0);
        }
        self.data[start..end].copy_from_slice(bytes);
    }

    async fn write(&mut self, client: &Client, offset: u64, bytes: &[u8]) {
        client
            .write_at(&self.file, offset, bytes)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: write of {} bytes at {offset}: {e}",
                    self.file.path,
                    bytes.len()
                )
            });
        self.apply(offset, bytes);
    }

    async fn meta(&self, client: &Client) -> FileMeta {
        client.stat(&self.file.path).await.expect("stat").meta
    }

    /// Read the whole file (asking for more than its size) and compare every byte.
    async fn check(&self, client: &Client, what: &str) {
        let what = format!("{} ({}): {what}", self.file.path, self.scheme);
        let got = client
            .read_at(&self.file, 0, self.len() + UNIT)
            .await
            .unwrap_or_else(|e| panic!("{what}: read failed: {e}"));
        assert_bytes(&what, &got, &self.data);
        assert_eq!(
            client.size(&self.file).await.expect("size"),
            self.len(),
            "{what}: size"
        );
    }
}

/// Kinds of write a test throws at a file.
#[derive(Debug, Clone, Copy)]
enum WriteKind {
    /// Inside one stripe unit.
    WithinUnit,
    /// Across stripe units, less than a stripe.
    AcrossUnits,
    /// One whole stripe, aligned.
    FullStripe,
    /// More than a stripe, unaligned at both ends.
    Unaligned,
    /// From inside the last stripe to past the end.
    Extending,
    /// Starting past the end, leaving a hole of zeros.
    PastEnd,
}

/// Offset and length of a write of `kind` into a file of `size` bytes (at least a few stripes).
fn pick_write(rng: &mut StdRng, kind: WriteKind, size: u64, stripe: u64) -> (u64, u64) {
    match kind {
        WriteKind::WithinUnit => {
            let len = rng.gen_range(1..UNIT / 2);
            let block = rng.gen_range(0..size / UNIT);
            (block * UNIT + rng.gen_range(0..UNIT - len), len)
        }
        WriteKind::AcrossUnits => {
            let len = rng.gen_range(UNIT / 2..stripe - UNIT / 2);
            (rng.gen_range(0..size - len), len)
        }
        WriteKind::FullStripe => (rng.gen_range(0..size / stripe) * stripe, stripe),
        WriteKind::Unaligned => {
            let len = stripe + rng.gen_range(1..2 * UNIT);
            (rng.gen_range(1..size - len), len)
        }
        WriteKind::Extending => (
            size - rng.gen_range(1..UNIT),
            stripe + rng.gen_range(1..UNIT),
        ),
        WriteKind::PastEnd => (size + rng.gen_range(1..UNIT), rng.gen_range(1..UNIT)),
    }
}

const WRITE_KINDS: [WriteKind; 6] = [
    WriteKind::WithinUnit,
    WriteKind::AcrossUnits,
    WriteKind::FullStripe,
    WriteKind::Unaligned,
    WriteKind::Extending,
    WriteKind::PastEnd,
];

/// A file of `stripes` stripes and some odd bytes, with partial-stripe overwrites, synced.
async fn populated(
    client: &Client,
    rng: &mut StdRng,
    path: &str,
    scheme: Scheme,
    stripes: u64,
) -> Model {
    let mut model = Model::create(client, path, scheme).await;
    let size = stripes * model.stripe + rng.gen_range(1..UNIT);
    model.write(client, 0, &random_bytes(rng, size)).await;
    for kind in [WriteKind::WithinUnit, WriteKind::AcrossUnits] {
        let (offset, len) = pick_write(rng, kind, model.len(), model.stripe);
        model.write(client, offset, &random_bytes(rng, len)).await;
    }
    client.sync(&model.file).await.expect("sync");
    model.check(client, "written, all servers up").await;
    model
}

// ---------------------------------------------------------------------------------------------
// 1. Degraded reads and writes, a stale server, rebuild, and the rebuilt contents in use.
// ---------------------------------------------------------------------------------------------

async fn degraded_read_write_rebuild(scheme: Scheme) {
    let mut rng = seeded(&format!("degraded_read_write_rebuild {scheme}"));
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let mut model = populated(&client, &mut rng, "degraded", scheme, 3).await;

    cluster.stop_server(3);
    model.check(&client, "server 3 killed").await;
    for (i, kind) in WRITE_KINDS.into_iter().enumerate() {
        let (offset, len) = pick_write(&mut rng, kind, model.len(), model.stripe);
        model
            .write(&client, offset, &random_bytes(&mut rng, len))
            .await;
        model
            .check(
                &client,
                &format!("degraded write {i} ({kind:?}) of {len} bytes at {offset}"),
            )
            .await;
    }
    client.sync(&model.file).await.expect("degraded sync");

    cluster.start_server(3);
    assert_eq!(
        state_of(&client, 3).await,
        ServerState::Stale,
        "server 3 missed writes: it must come back stale"
    );
    model
        .check(&client, "server 3 back, stale, not rebuilt")
        .await;
    for kind in [WriteKind::WithinUnit, WriteKind::FullStripe] {
        let (offset, len) = pick_write(&mut rng, kind, model.len(), model.stripe);
        model
            .write(&client, offset, &random_bytes(&mut rng, len))
            .await;
        model
            .check(
                &client,
                &format!("write while server 3 is stale ({kind:?})"),
            )
            .await;
    }

    let progress = client.rebuild(3, |_| {}).await.expect("rebuild server 3");
    assert!(
        progress.stripes_done > 0,
        "server 3 owed stripes: {progress:?}"
    );
    assert_eq!(state_of(&client, 3).await, ServerState::Up);
    model.check(&client, "server 3 rebuilt").await;
    let report = client
        .scrub(Some(&model.file.path))
        .await
        .expect("scrub after rebuild");
    assert_clean("after rebuilding server 3", &report);
    assert_eq!(report.stripes_skipped, 0, "{report:?}");

    // Server 3's rebuilt units now stand in for server 1's.
    cluster.stop_server(1);
    model
        .check(&client, "server 1 killed after rebuilding server 3")
        .await;

    // Two servers lost: RAID-1 survives when they hold no unit and its mirror (servers 1 and 3
    // are never neighbouring columns); the parity schemes must refuse rather than guess.
    cluster.stop_server(3);
    let read = client.read_at(&model.file, 0, model.len()).await;
    match (scheme, read) {
        (Scheme::Raid1, Ok(bytes)) => {
            assert_bytes("raid1 with servers 1 and 3 down", &bytes, &model.data)
        }
        (Scheme::Raid1, Err(e)) => panic!("raid1 with servers 1 and 3 down: {e}"),
        (_, Err(ClientError::Unavailable { servers, .. })) => {
            let ids: Vec<ServerId> = servers.iter().map(|(id, _)| *id).collect();
            assert!(
                ids.contains(&1) || ids.contains(&3),
                "unavailable names the wrong servers: {ids:?}"
            );
        }
        (_, other) => panic!("{scheme} with two servers down: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_read_write_rebuild_raid1() {
    degraded_read_write_rebuild(Scheme::Raid1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_read_write_rebuild_raid4() {
    degraded_read_write_rebuild(Scheme::Raid4).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_read_write_rebuild_raid5() {
    degraded_read_write_rebuild(Scheme::Raid5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_read_write_rebuild_hybrid() {
    degraded_read_write_rebuild(Scheme::Hybrid).await;
}

// ---------------------------------------------------------------------------------------------
// 2. A server that missed writes and comes back never serves what it missed.
// ---------------------------------------------------------------------------------------------

/// An overwrite of bytes on server 2 while it was down.
struct Missed {
    /// File offset; the range lies in one of server 2's stripe units.
    offset: u64,
    /// The new bytes.
    new: Vec<u8>,
    /// Whether the write covers whole stripes. Otherwise Hybrid puts the new bytes in the
    /// overflow regions, not the data files.
    full_stripe: bool,
    /// Server 2's data file under the range before the write (Hybrid's base data, which
    /// partial writes left behind in overflow may shadow).
    on_disk_before: Vec<u8>,
}

async fn returning_server_never_serves_missed_bytes(scheme: Scheme) {
    let mut rng = seeded(&format!("returning_server {scheme}"));
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let mut model = populated(&client, &mut rng, "returning", scheme, 4).await;
    let meta = model.meta(&client).await;
    let layout = meta.layout;
    let column = meta
        .servers
        .iter()
        .position(|&s| s == 2)
        .expect("server 2 holds a column") as u32;
    let blocks_on_2: Vec<u64> = (0..model.len() / UNIT)
        .filter(|&b| layout.data_slot(b).column == column)
        .collect();
    assert!(blocks_on_2.len() >= 3, "{blocks_on_2:?}");

    // Overwrites of server 2's units: partial ones inside two of them, and the whole stripe
    // holding a third.
    let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut missed = Vec::new();
    for &block in &blocks_on_2[..2] {
        let len = rng.gen_range(512..UNIT / 2);
        let offset = block * UNIT + rng.gen_range(0..UNIT - len);
        let new = random_bytes(&mut rng, len);
        writes.push((offset, new.clone()));
        missed.push((offset, new, false));
    }
    let block = blocks_on_2[2];
    let stripe_offset = layout.stripe_of_block(block) * model.stripe;
    let bytes = random_bytes(&mut rng, model.stripe);
    let within = (block * UNIT - stripe_offset) as usize;
    missed.push((
        block * UNIT,
        bytes[within..within + UNIT as usize].to_vec(),
        true,
    ));
    writes.push((stripe_offset, bytes));
    let missed: Vec<Missed> = missed
        .into_iter()
        .map(|(offset, new, full_stripe)| {
            let (server, local) = data_location(&meta, offset);
            assert_eq!(server, 2);
            let on_disk_before = cluster.raw(2, meta.id, "data", local, new.len() as u64);
            if scheme != Scheme::Hybrid {
                let old = &model.data[offset as usize..offset as usize + new.len()];
                assert_bytes("server 2's data file before the kill", &on_disk_before, old);
            }
            Missed {
                offset,
                new,
                full_stripe,
                on_disk_before,
            }
        })
        .collect();

    cluster.stop_server(2);
    for (offset, bytes) in &writes {
        model.write(&client, *offset, bytes).await;
    }
    model.check(&client, "server 2 down").await;

    cluster.start_server(2);
    assert_eq!(state_of(&client, 2).await, ServerState::Stale);
    model
        .check(&client, "server 2 back without a rebuild")
        .await;

    // Server 2 really holds the old bytes: the exact read above went around it.
    let overflow = cluster.raw_all(2, meta.id, "overflow");
    for m in &missed {
        let (_, local) = data_location(&meta, m.offset);
        let raw = cluster.raw(2, meta.id, "data", local, m.new.len() as u64);
        assert_bytes(
            &format!("server 2's data file at file offset {}", m.offset),
            &raw,
            &m.on_disk_before,
        );
        assert!(
            raw != m.new,
            "the overwrite at {} reached server 2's data file",
            m.offset
        );
        assert!(
            !contains(&overflow, &m.new),
            "the overwrite at {} reached server 2's overflow region",
            m.offset
        );
    }

    // A rebuild brings the missed bytes to server 2.
    client.rebuild(2, |_| {}).await.expect("rebuild server 2");
    assert_eq!(state_of(&client, 2).await, ServerState::Up);
    let overflow = cluster.raw_all(2, meta.id, "overflow");
    for m in &missed {
        let (_, local) = data_location(&meta, m.offset);
        let raw = cluster.raw(2, meta.id, "data", local, m.new.len() as u64);
        if m.full_stripe || scheme != Scheme::Hybrid {
            assert_bytes(
                &format!("server 2's rebuilt data file at file offset {}", m.offset),
                &raw,
                &m.new,
            );
        } else {
            assert!(
                contains(&overflow, &m.new),
                "rebuild did not restore the overflow entry at {}",
                m.offset
            );
        }
    }
    let other = meta.servers[((column + 2) % SERVERS) as usize];
    cluster.stop_server(other);
    model
        .check(
            &client,
            &format!("server {other} killed after rebuilding server 2"),
        )
        .await;
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread")]
async fn returning_server_never_serves_missed_bytes_raid1() {
    returning_server_never_serves_missed_bytes(Scheme::Raid1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn returning_server_never_serves_missed_bytes_raid5() {
    returning_server_never_serves_missed_bytes(Scheme::Raid5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn returning_server_never_serves_missed_bytes_hybrid() {
    returning_server_never_serves_missed_bytes(Scheme::Hybrid).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Two clients writing disjoint parts of one stripe at once keep its redundancy right.
// ---------------------------------------------------------------------------------------------

/// Writes per client.
const CONCURRENT_WRITES: usize = 50;

async fn concurrent_partial_writes_to_one_stripe(scheme: Scheme) {
    let mut rng = seeded(&format!("concurrent_partial_writes {scheme}"));
    let cluster = Cluster::up();
    let client_a = cluster.client().await;
    let client_b = cluster.client().await;
    let mut model = Model::create(&client_a, "concurrent", scheme).await;
    let size = 3 * model.stripe;
    model
        .write(&client_a, 0, &random_bytes(&mut rng, size))
        .await;
    client_a.sync(&model.file).await.expect("sync");

    // Stripe 1: client A owns its first unit and a part of the second, client B the rest of
    // the second and the third. The boundary is not 4 KiB aligned, so both clients write into
    // one checksummed block; neither ever writes the whole stripe.
    let start = model.stripe;
    let mut split = start + UNIT + rng.gen_range(1..UNIT);
    if split.is_multiple_of(4096) {
        split += 1;
    }
    let regions = [(start, split), (split, start + 3 * UNIT)];
    let plans: Vec<Vec<(u64, Vec<u8>)>> = regions
        .iter()
        .map(|&(lo, hi)| {
            (0..CONCURRENT_WRITES)
                .map(|_| {
                    let (offset, len) = if rng.gen_ratio(1, 5) {
                        (lo, hi - lo)
                    } else {
                        let offset = rng.gen_range(lo..hi);
                        (offset, rng.gen_range(1..=(hi - offset).min(UNIT)))
                    };
                    (offset, random_bytes(&mut rng, len))
                })
                .collect()
        })
        .collect();
    let tasks: Vec<_> = [client_a.clone(), client_b.clone()]
        .into_iter()
        .zip(plans.clone())
        .map(|(client, plan)| {
            let file = model.file.clone();
            tokio::spawn(async move {
                for (offset, bytes) in plan {
                    client
                        .write_at(&file, offset, &bytes)
                        .await
                        .unwrap_or_else(|e| panic!("concurrent write at {offset}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    // The regions are disjoint, so each client's writes land in its own order.
    for plan in &plans {
        for (offset, bytes) in plan {
            model.apply(*offset, bytes);
        }
    }
    model.check(&client_a, "after concurrent writes").await;
    model.check(&client_b, "after concurrent writes").await;

    // Reconstruction from redundancy gives the final bytes of the unit both clients wrote.
    let meta = model.meta(&client_a).await;
    let (shared, _) = data_location(&meta, split);
    cluster.stop_server(shared);
    model
        .check(
            &client_a,
            &format!("server {shared} (the unit both wrote) killed"),
        )
        .await;
    cluster.start_server(shared);
    wait_state(&client_a, shared, ServerState::Up).await;

    let report = client_a.scrub(Some(&model.file.path)).await.expect("scrub");
    assert_clean("after concurrent partial writes", &report);
    assert_eq!(report.stripes_checked, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_partial_writes_to_one_stripe_raid5() {
    concurrent_partial_writes_to_one_stripe(Scheme::Raid5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_partial_writes_to_one_stripe_hybrid() {
    concurrent_partial_writes_to_one_stripe(Scheme::Hybrid).await;
}

/// Two clients overwriting the same bytes of a RAID-5 stripe at once: whichever lands last
/// wins, but parity must match whatever the data ended up being. The range spans two units, so
/// the writes take two data columns.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_overlapping_writes_keep_parity_raid5() {
    let mut rng = seeded("concurrent_overlapping_writes_keep_parity_raid5");
    let cluster = Cluster::up();
    let client_a = cluster.client().await;
    let client_b = cluster.client().await;
    let mut model = Model::create(&client_a, "overlapping", Scheme::Raid5).await;
    let size = 3 * model.stripe;
    model
        .write(&client_a, 0, &random_bytes(&mut rng, size))
        .await;
    let lo = model.stripe + UNIT - rng.gen_range(1..8192);
    let hi = model.stripe + UNIT + rng.gen_range(1..8192);
    let plans: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|_| {
            (0..CONCURRENT_WRITES)
                .map(|_| random_bytes(&mut rng, hi - lo))
                .collect()
        })
        .collect();
    let tasks: Vec<_> = [client_a.clone(), client_b.clone()]
        .into_iter()
        .zip(plans.clone())
        .map(|(client, plan)| {
            let file = model.file.clone();
            tokio::spawn(async move {
                for bytes in plan {
                    client
                        .write_at(&file, lo, &bytes)
                        .await
                        .unwrap_or_else(|e| panic!("concurrent write at {lo}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    let healthy = client_a.read_at(&model.file, 0, size).await.expect("read");
    let winner = &healthy[lo as usize..hi as usize];
    let last: Vec<&Vec<u8>> = plans.iter().map(|p| p.last().expect("writes")).collect();
    assert!(
        last.iter().any(|l| l.as_slice() == winner),
        "the overwritten range holds neither client's last write"
    );
    model.apply(lo, winner);
    assert_bytes("after overlapping writes", &healthy, &model.data);

    // Both data columns of the range, in turn, rebuilt from parity and the other columns.
    let meta = model.meta(&client_a).await;
    for offset in [lo, hi - 1] {
        let (server, _) = data_location(&meta, offset);
        cluster.stop_server(server);
        model
            .check(
                &client_a,
                &format!("server {server} (holding byte {offset}) killed"),
            )
            .await;
        cluster.start_server(server);
        wait_state(&client_a, server, ServerState::Up).await;
    }
    let report = client_a.scrub(Some(&model.file.path)).await.expect("scrub");
    assert_clean("after overlapping concurrent writes", &report);
}

// ---------------------------------------------------------------------------------------------
// 4. A corrupt block on disk is never returned, and is repaired in place.
// ---------------------------------------------------------------------------------------------

async fn corrupt_block_is_reconstructed_and_repaired(scheme: Scheme) {
    let mut rng = seeded(&format!("corrupt_block {scheme}"));
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let mut model = Model::create(&client, "corrupt", scheme).await;
    // Whole stripes (so Hybrid's base data is the file) and a partial tail.
    let size = 3 * model.stripe + rng.gen_range(1..UNIT);
    model.write(&client, 0, &random_bytes(&mut rng, size)).await;
    client.sync(&model.file).await.expect("sync");
    let meta = model.meta(&client).await;
    let layout = meta.layout;

    // A data block: block 1, in stripe 0.
    let block = 1;
    let offset = block * UNIT + rng.gen_range(0..UNIT);
    let (server, local) = data_location(&meta, offset);
    let unit_local = local - offset % UNIT;
    let unit = model.data[(block * UNIT) as usize..((block + 1) * UNIT) as usize].to_vec();
    cluster.flip_byte(server, meta.id, "data", local);
    assert_ne!(
        cluster.raw(server, meta.id, "data", unit_local, UNIT),
        unit,
        "the flip did not reach the disk"
    );
    model
        .check(
            &client,
            &format!("byte {offset} flipped on server {server}"),
        )
        .await;
    assert_bytes(
        &format!("server {server}'s data file after the read repaired it"),
        &cluster.raw(server, meta.id, "data", unit_local, UNIT),
        &unit,
    );

    // A redundancy block (a mirror copy or a parity unit of stripe 1), found by scrub.
    let stripe = 1;
    let first = layout.blocks_of_stripe(stripe).start;
    let unit_of = |b: u64| model.data[(b * UNIT) as usize..((b + 1) * UNIT) as usize].to_vec();
    let (slot, expected) = match scheme {
        Scheme::Raid1 => (layout.mirror_slot(first).expect("mirror"), unit_of(first)),
        _ => {
            let mut parity = vec![0u8; UNIT as usize];
            for b in layout.blocks_of_stripe(stripe) {
                for (p, d) in parity.iter_mut().zip(unit_of(b)) {
                    *p ^= d;
                }
            }
            (layout.parity_slot(stripe).expect("parity"), parity)
        }
    };
    let holder = meta.servers[slot.column as usize];
    let slot_local = layout.local_offset(slot);
    assert_bytes(
        "redundancy unit before the flip",
        &cluster.raw(holder, meta.id, "redundancy", slot_local, UNIT),
        &expected,
    );
    cluster.flip_byte(
        holder,
        meta.id,
        "redundancy",
        slot_local + rng.gen_range(0..UNIT),
    );
    let report = client.scrub(Some(&model.file.path)).await.expect("scrub");
    assert_eq!(report.corrupt_repaired, 1, "{report:?}");
    assert_eq!(
        (
            report.parity_repaired,
            report.mirrors_repaired,
            report.unrepairable.len()
        ),
        (0, 0, 0),
        "{report:?}"
    );
    assert_bytes(
        &format!("server {holder}'s redundancy unit after scrub"),
        &cluster.raw(holder, meta.id, "redundancy", slot_local, UNIT),
        &expected,
    );

    // The repaired redundancy is what a degraded read of that stripe relies on.
    let (lost, _) = data_location(&meta, first * UNIT);
    cluster.stop_server(lost);
    model
        .check(
            &client,
            &format!("server {lost} killed after the repair of server {holder}"),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_block_is_reconstructed_and_repaired_raid1() {
    corrupt_block_is_reconstructed_and_repaired(Scheme::Raid1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_block_is_reconstructed_and_repaired_raid5() {
    corrupt_block_is_reconstructed_and_repaired(Scheme::Raid5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_block_is_reconstructed_and_repaired_hybrid() {
    corrupt_block_is_reconstructed_and_repaired(Scheme::Hybrid).await;
}

// ---------------------------------------------------------------------------------------------
// 5. Garbage and truncated frames: the connection is dropped, the server goes on serving.
// ---------------------------------------------------------------------------------------------

fn header(kind: FrameKind, message_len: u32, payload_len: u32) -> [u8; FRAME_HEADER_BYTES] {
    FrameHeader {
        kind,
        message_len,
        payload_len,
        request_id: 7,
    }
    .encode()
}

/// A request frame meant for the store `incarnation`.
fn request_frame(request_id: u64, incarnation: Incarnation, request: StorageRequest) -> Vec<u8> {
    let call = StorageCall {
        incarnation,
        request,
        service: tessera_wire::Service::BestEffort,
    };
    Frame::new(FrameKind::Request, request_id, &call, Bytes::new()).to_bytes()
}

/// Read one response frame.
async fn read_response(stream: &mut TcpStream) -> (FrameHeader, StorageResponse) {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    tokio::time::timeout(WAIT_TIMEOUT, stream.read_exact(&mut head))
        .await
        .expect("answer in time")
        .expect("answer header");
    let header = FrameHeader::decode(&head).expect("valid header");
    let mut body = vec![0u8; header.message_len as usize + header.payload_len as usize];
    stream.read_exact(&mut body).await.expect("answer body");
    let response = decode_message(&body[..header.message_len as usize]).expect("answer decodes");
    (header, response)
}

/// The admin's credential toward storage servers, for the raw connections of these tests.
static RAW_CREDENTIAL: std::sync::OnceLock<tessera_client::Credential> = std::sync::OnceLock::new();

/// A raw connection to a server, authenticated as the admin (the garbage tests are about
/// what an authenticated peer sends; `auth.rs` covers peers without a key).
async fn raw_connection(addr: SocketAddr) -> TcpStream {
    support::authenticated(addr, RAW_CREDENTIAL.get().expect("credential set")).await
}

/// A fresh connection answers a ping with the server's id.
async fn ping(addr: SocketAddr, incarnation: Incarnation) -> Option<ServerId> {
    let mut stream = raw_connection(addr).await;
    stream
        .write_all(&request_frame(1, incarnation, StorageRequest::Ping))
        .await
        .expect("send ping");
    match read_response(&mut stream).await {
        (header, StorageResponse::Pong { server }) => {
            assert_eq!(header.kind, FrameKind::Response);
            assert_eq!(header.request_id, 1);
            server
        }
        (_, other) => panic!("ping answered with {other:?}"),
    }
}

/// Whether the server closes the connection (end of stream or reset) within the timeout,
/// without answering anything.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    match read {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("the server answered garbage with {n} bytes"),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_survives_garbage_and_truncated_frames() {
    let mut rng = seeded("server_survives_garbage");
    let cluster = Cluster::up();
    let _ = RAW_CREDENTIAL.set(cluster.admin().for_storage());
    let client = cluster.client().await;
    let model = populated(&client, &mut rng, "garbage", Scheme::Raid5, 3).await;
    let target: ServerId = 1;
    let status = status_of(&client, target).await;
    let (addr, store): (SocketAddr, Incarnation) = (
        status.addr.parse().expect("server address"),
        status.incarnation,
    );
    assert_eq!(ping(addr, store).await, Some(target));

    let valid = request_frame(9, store, StorageRequest::Ping);
    let undecodable = vec![0xFFu8; 16];
    assert!(decode_message::<StorageCall>(&undecodable).is_err());
    let mut noise = random_bytes(&mut rng, 1000);
    noise[0] = b'x';
    let mut wrong_version = valid.clone();
    wrong_version[2] = wrong_version[2].wrapping_add(1);
    let mut oversized = header(FrameKind::Request, MESSAGE_BYTES_MAX, 0).to_vec();
    oversized[4..8].copy_from_slice(&(MESSAGE_BYTES_MAX + 1).to_le_bytes());
    let mut response_kind = header(FrameKind::Response, 1, 0).to_vec();
    response_kind.push(0);
    let mut undecodable_frame = header(FrameKind::Request, undecodable.len() as u32, 0).to_vec();
    undecodable_frame.extend_from_slice(&undecodable);
    let cases: [(&str, Vec<u8>); 5] = [
        ("1000 random bytes", noise),
        (
            "a valid header with an undecodable message",
            undecodable_frame,
        ),
        ("a header of another protocol version", wrong_version),
        ("a header announcing an oversized message", oversized),
        ("a response frame sent to a server", response_kind),
    ];
    for (what, bytes) in cases {
        let mut stream = raw_connection(addr).await;
        // The server may reset the connection before it has read everything; that is fine.
        let _ = stream.write_all(&bytes).await;
        assert!(
            closed_by_server(&mut stream).await,
            "{what}: the server kept the connection open"
        );
        assert_eq!(
            ping(addr, store).await,
            Some(target),
            "{what}: server stopped serving"
        );
        model.check(&client, &format!("after {what}")).await;
    }

    // A frame cut short: the header promises 1000 message bytes, 10 arrive. While that
    // connection hangs, the server serves everyone else; when it closes, nothing is left over.
    let mut truncated = header(FrameKind::Request, 1000, 0).to_vec();
    truncated.extend_from_slice(&random_bytes(&mut rng, 10));
    let mut hanging = raw_connection(addr).await;
    hanging.write_all(&truncated).await.expect("send truncated");
    assert_eq!(
        ping(addr, store).await,
        Some(target),
        "a truncated frame stalls the server"
    );
    model
        .check(&client, "while a truncated frame is pending")
        .await;
    drop(hanging);
    assert_eq!(ping(addr, store).await, Some(target));

    // A well-formed request with an absurd length is answered with an error, and the
    // connection stays usable.
    let mut stream = raw_connection(addr).await;
    let absurd = StorageRequest::Read {
        file: model.file.id,
        region: tessera_layout::Region::Data,
        offset: u64::MAX - 10,
        len: u32::MAX,
        overlay: false,
    };
    stream
        .write_all(&request_frame(3, store, absurd))
        .await
        .expect("send");
    match read_response(&mut stream).await {
        (header, StorageResponse::Error(StorageError::BadRequest { .. })) => {
            assert_eq!(header.request_id, 3)
        }
        (_, other) => panic!("an out-of-bounds read was answered with {other:?}"),
    }
    // A request meant for another store is refused, and the connection stays usable.
    let wrong = store.wrapping_add(1);
    stream
        .write_all(&request_frame(
            4,
            wrong,
            StorageRequest::Remove {
                file: model.file.id,
            },
        ))
        .await
        .expect("send");
    match read_response(&mut stream).await {
        (header, StorageResponse::Error(StorageError::WrongStore { wanted, found })) => {
            assert_eq!((header.request_id, wanted, found), (4, wrong, store))
        }
        (_, other) => panic!("a request for another store was answered with {other:?}"),
    }
    stream
        .write_all(&request_frame(5, store, StorageRequest::Ping))
        .await
        .expect("send");
    assert!(matches!(
        read_response(&mut stream).await,
        (_, StorageResponse::Pong { server: Some(1) })
    ));

    for status in client.status().await.expect("status") {
        assert_eq!(status.state, ServerState::Up, "{status:?}");
    }
    model.check(&client, "after every garbage case").await;
}

// ---------------------------------------------------------------------------------------------
// 6. A server killed in the middle of a large write.
// ---------------------------------------------------------------------------------------------

const PUT_WRITE_BYTES: u64 = 1 << 20;
const PUT_WRITES: usize = 16;
/// Writes made durable with a sync before the kill is set off.
const PUT_SYNCED_WRITES: usize = 4;
/// The kill is set off as this write starts, just after the sync.
const PUT_KILL_AT: usize = PUT_SYNCED_WRITES;
/// Writes from this one on wait for the kill to have happened, so some surely run degraded.
const PUT_AFTER_KILL: usize = 12;

async fn server_killed_mid_put(scheme: Scheme) {
    let mut rng = seeded(&format!("server_killed_mid_put {scheme}"));
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let model = Model::create(&client, "put", scheme).await;
    let data = random_bytes(&mut rng, PUT_WRITE_BYTES * PUT_WRITES as u64);
    let victim: ServerId = 2;

    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let dir = cluster.dir.clone();
    let mut killer = tokio::spawn(async move {
        if kill_rx.await.is_ok() {
            tokio::task::spawn_blocking(move || {
                run_tessera(&dir, &["server", "stop", &victim.to_string()])
            })
            .await
            .expect("kill task");
        }
        Instant::now()
    });
    let mut kill_tx = Some(kill_tx);
    let mut killed_at = None;
    let mut acknowledged = vec![false; PUT_WRITES];
    let mut spans = Vec::new();
    for (i, chunk) in data.chunks(PUT_WRITE_BYTES as usize).enumerate() {
        if i == PUT_SYNCED_WRITES {
            client
                .sync(&model.file)
                .await
                .expect("sync before the kill");
        }
        if i == PUT_KILL_AT {
            kill_tx
                .take()
                .expect("once")
                .send(())
                .expect("killer waits");
        }
        if i == PUT_AFTER_KILL && killed_at.is_none() {
            killed_at = Some((&mut killer).await.expect("killer"));
        }
        let offset = i as u64 * PUT_WRITE_BYTES;
        let started = Instant::now();
        match client.write_at(&model.file, offset, chunk).await {
            Ok(()) => acknowledged[i] = true,
            Err(e @ (ClientError::Unavailable { .. } | ClientError::Storage { .. })) => {
                eprintln!("write {i} failed cleanly: {e}")
            }
            Err(e) => panic!("write {i} failed with an unexpected error: {e:?}"),
        }
        spans.push((started, Instant::now()));
    }
    let killed_at = killed_at.expect("the kill happened before the last writes");
    let degraded = spans.iter().filter(|(_, done)| *done > killed_at).count();
    let in_flight = spans
        .iter()
        .position(|(start, done)| *start < killed_at && killed_at < *done);
    eprintln!(
        "{scheme}: write {in_flight:?} in flight when the kill returned, {degraded} writes \
         finished after it; acknowledged: {acknowledged:?}"
    );
    assert!(degraded >= PUT_WRITES - PUT_AFTER_KILL);

    let check_acknowledged = |what: String| {
        let client = &client;
        let model = &model;
        let data = &data;
        let acknowledged = &acknowledged;
        async move {
            let synced = PUT_SYNCED_WRITES as u64 * PUT_WRITE_BYTES;
            let got = client
                .read_at(&model.file, 0, synced)
                .await
                .unwrap_or_else(|e| panic!("{what}: read of the synced bytes: {e}"));
            assert_bytes(
                &format!("{what}: synced bytes"),
                &got,
                &data[..synced as usize],
            );
            for (i, _) in acknowledged.iter().enumerate().filter(|(_, &ok)| ok) {
                let offset = i as u64 * PUT_WRITE_BYTES;
                let got = client
                    .read_at(&model.file, offset, PUT_WRITE_BYTES)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: read of write {i}: {e}"));
                assert_bytes(
                    &format!("{what}: acknowledged write {i}"),
                    &got,
                    &data[offset as usize..(offset + PUT_WRITE_BYTES) as usize],
                );
            }
            if acknowledged.iter().all(|&ok| ok) {
                let got = client
                    .read_at(&model.file, 0, data.len() as u64 + 1)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: read of the whole file: {e}"));
                assert_bytes(&format!("{what}: whole file"), &got, data);
            }
        }
    };
    check_acknowledged(format!("server {victim} killed mid-put")).await;

    // Whatever the kill interrupted was recorded: the server comes back stale and serves none
    // of it; a rebuild makes it whole, and its units then stand in for another server's.
    cluster.start_server(victim);
    check_acknowledged(format!("server {victim} back, not rebuilt")).await;
    client.rebuild(victim, |_| {}).await.expect("rebuild");
    assert_eq!(state_of(&client, victim).await, ServerState::Up);
    let report = client.scrub(Some(&model.file.path)).await.expect("scrub");
    assert_clean("after rebuilding the killed server", &report);
    cluster.stop_server(4);
    check_acknowledged(format!("server {victim} rebuilt, server 4 killed")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_put_raid5() {
    server_killed_mid_put(Scheme::Raid5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_put_hybrid() {
    server_killed_mid_put(Scheme::Hybrid).await;
}

// ---------------------------------------------------------------------------------------------
// 7. The namespace survives a restart of the whole cluster, manager included.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn manager_restart_keeps_namespace() {
    let mut rng = seeded("manager_restart_keeps_namespace");
    let mut cluster = Cluster::up();
    let client = cluster.client().await;
    let mut models = Vec::new();
    for scheme in Scheme::ALL {
        let path = format!("kept/{}", scheme.name());
        models.push(populated(&client, &mut rng, &path, scheme, 3).await);
    }
    let manager_before = cluster.manager;

    cluster.restart_all();
    let fresh = cluster.client().await;
    let listed: Vec<String> = fresh
        .list("kept/")
        .await
        .expect("list")
        .into_iter()
        .map(|meta| meta.path)
        .collect();
    let mut expected: Vec<String> = models.iter().map(|m| m.file.path.clone()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for status in fresh.status().await.expect("status") {
        assert_eq!(status.state, ServerState::Up, "{status:?}");
    }
    for model in &mut models {
        let opened = fresh.open(&model.file.path).await.expect("open");
        assert_eq!(opened, model.file);
        model.check(&fresh, "after restarting the cluster").await;
        let (offset, len) = pick_write(&mut rng, WriteKind::Unaligned, model.len(), model.stripe);
        model
            .write(&fresh, offset, &random_bytes(&mut rng, len))
            .await;
        model.check(&fresh, "written after the restart").await;
    }
    // A client from before the restart reconnects by itself when the manager kept its address.
    if cluster.manager == manager_before {
        for model in &models {
            model.check(&client, "old client after the restart").await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 8. A server of another cluster at a dead server's address is never trusted.
// ---------------------------------------------------------------------------------------------

impl Cluster {
    /// `cluster.toml` as a table.
    fn cluster_toml(&self) -> toml::Table {
        std::fs::read_to_string(self.dir.join("cluster.toml"))
            .expect("cluster.toml")
            .parse()
            .expect("cluster.toml parses")
    }

    /// Change `cluster.toml`, as the `tessera` commands will read it.
    fn edit_cluster_toml(&self, edit: impl FnOnce(&mut toml::Table)) {
        let path = self.dir.join("cluster.toml");
        let mut file: toml::Table = std::fs::read_to_string(&path)
            .expect("cluster.toml")
            .parse()
            .expect("cluster.toml parses");
        edit(&mut file);
        std::fs::write(&path, toml::to_string(&file).expect("toml")).expect("write cluster.toml");
    }

    /// Start server `id` again, listening on `addr` instead of its own address.
    fn start_server_at(&self, id: ServerId, addr: &str) {
        self.edit_cluster_toml(|file| {
            let servers = file["servers"].as_array_mut().expect("servers");
            let server = servers
                .iter_mut()
                .find(|s| s["id"].as_integer() == Some(i64::from(id)))
                .expect("server in cluster.toml");
            server["addr"] = toml::Value::String(addr.into());
        });
        self.start_server(id);
    }
}

/// Ports are reused: a server that dies frees its address, and another process (here a server
/// of another cluster, holding a file of the same id) may listen there before the manager
/// notices. Requests name the store they are meant for, so that server refuses them: reads
/// are served degraded from the survivors, and a removal never touches the other cluster.
#[tokio::test(flavor = "multi_thread")]
async fn server_at_a_reused_address_is_refused() {
    let mut rng = seeded("server_at_a_reused_address");
    let (ours, theirs) = (Cluster::up(), Cluster::up());
    let (client, other) = (ours.client().await, theirs.client().await);
    let model = populated(&client, &mut rng, "reused", Scheme::Raid1, 4).await;
    let their_model = populated(&other, &mut rng, "reused", Scheme::Raid1, 4).await;
    assert_eq!(
        model.file.id, their_model.file.id,
        "both clusters number their first file alike, so a wrong server would have it"
    );

    let victim: ServerId = 2;
    let addr = status_of(&client, victim).await.addr;
    ours.stop_server(victim);
    theirs.stop_server(victim);
    theirs.start_server_at(victim, &addr);
    wait_state(&other, victim, ServerState::Up).await;
    assert_eq!(
        status_of(&other, victim).await.addr,
        addr,
        "took over the address"
    );

    model
        .check(
            &client,
            &format!("server {victim} killed, another cluster's server at {addr}"),
        )
        .await;
    client
        .remove(&model.file.path)
        .await
        .expect("remove, one server down");
    their_model
        .check(
            &other,
            "after the other cluster removed its file of the same id",
        )
        .await;
    let report = other
        .scrub(Some(&their_model.file.path))
        .await
        .expect("scrub");
    assert_clean("the other cluster's file after the removal", &report);
}

/// The same for the manager's address: a server of one cluster started against another
/// cluster's manager (as after a manager's port was taken over) is refused, so that manager
/// never sends its clients to the stranger, whose store holds a file of the same id.
#[tokio::test(flavor = "multi_thread")]
async fn server_of_another_cluster_is_refused_by_the_manager() {
    let mut rng = seeded("server_of_another_cluster");
    let (ours, theirs) = (Cluster::up(), Cluster::up());
    let (client, other) = (ours.client().await, theirs.client().await);
    let _model = populated(&client, &mut rng, "stranger", Scheme::Raid5, 2).await;
    let their_model = populated(&other, &mut rng, "stranger", Scheme::Raid5, 2).await;
    let before = other.status().await.expect("status");

    // Our server 2 comes back pointed at their manager.
    let victim: ServerId = 2;
    ours.stop_server(victim);
    // The CLI's wait for the servers asks their manager, so it needs their access key; the
    // server keeps our cluster's secret.
    let their_key = theirs.cluster_toml()["key"].clone();
    ours.edit_cluster_toml(|file| {
        file["manager"] = toml::Value::String(theirs.manager.to_string());
        file["key"] = their_key;
    });
    ours.start_server(victim);
    let log = ours.dir.join(format!("server-{victim}.log"));
    let refused = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("refused this server")
    };
    // A few heartbeats' time, or until the server says it was refused.
    let deadline = Instant::now() + 4 * tessera_server::HEARTBEAT_INTERVAL;
    while !refused() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = |servers: &[ServerStatus]| -> Vec<(ServerId, String, Incarnation)> {
        servers
            .iter()
            .map(|s| (s.id, s.addr.clone(), s.incarnation))
            .collect()
    };
    let after = other.status().await.expect("status");
    assert_eq!(
        records(&after),
        records(&before),
        "their manager's servers are unchanged"
    );
    assert!(
        refused(),
        "the server logs why it stays out: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    their_model
        .check(&other, "with a stranger knocking at their manager")
        .await;
    let report = other
        .scrub(Some(&their_model.file.path))
        .await
        .expect("scrub");
    assert_clean("their file", &report);
}

// ---------------------------------------------------------------------------------------------
// Transport counters: the receive budget at work, and servers' counters over the wire.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn striped_reads_are_granted_by_the_client_and_counted_at_the_servers() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let layout = LayoutRequest {
        scheme: Scheme::Raid0,
        stripe_unit: 32 << 10,
        width: None,
    };
    let file = client.create("granted", layout).await.expect("create");
    let mut rng = seeded("granted");
    let data = random_bytes(&mut rng, 3 << 20);
    client.write_at(&file, 0, &data).await.expect("write");
    let before = client.server_counters().await.expect("server counters");
    assert_eq!(before.len(), 5, "every server answers: {before:?}");
    let sent_before: u64 = before.iter().map(|(_, c)| c["data_packets_sent"]).sum();
    let got = client
        .read_at(&file, 0, data.len() as u64)
        .await
        .expect("read");
    assert_bytes("read back", &got, &data);
    let after = client.server_counters().await.expect("server counters");
    let sent_after: u64 = after.iter().map(|(_, c)| c["data_packets_sent"]).sum();
    // 3 MiB of answers went out as DATA packets from the servers.
    assert!(
        sent_after - sent_before >= 48,
        "{sent_before} -> {sent_after}"
    );
    // A stripe of 32 KiB units, just written, is in the servers' page caches: each unit is
    // answered on the server's network thread.
    let inline = |counters: &[(ServerId, std::collections::BTreeMap<String, u64>)]| -> u64 {
        counters.iter().map(|(_, c)| c["reads_inline"]).sum()
    };
    let stripe = 5 * (32 << 10);
    let got = client.read_at(&file, 0, stripe).await.expect("read");
    assert_bytes("a stripe read back", &got, &data[..stripe as usize]);
    let last = client.server_counters().await.expect("server counters");
    assert!(
        inline(&last) >= inline(&after) + 5,
        "reads answered inline: {} -> {}",
        inline(&after),
        inline(&last)
    );
    let mine = client.transport_counters().await;
    assert!(
        mine["grants"] > 0,
        "the client granted the answers: {mine:?}"
    );
    assert!(mine["messages_delivered"] > 0, "{mine:?}");
}

/// Writes of whole blocks to files the servers have open are answered on their network
/// threads, in the page cache (`Store::write_cached`), for RAID-0 data and Hybrid's overflow
/// entries alike; the bytes read back exact, and after a sync they stay exact with the
/// cluster restarted.
#[tokio::test(flavor = "multi_thread")]
async fn small_writes_are_answered_on_the_servers_network_threads() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let mut rng = seeded("inline writes");
    let mut files = Vec::new();
    for (name, scheme) in [
        ("inline0", Scheme::Raid0),
        ("inline-hybrid", Scheme::Hybrid),
    ] {
        let layout = LayoutRequest {
            scheme,
            stripe_unit: 64 << 10,
            width: None,
        };
        let file = client.create(name, layout).await.expect("create");
        let mut data = random_bytes(&mut rng, 2 << 20);
        client.write_at(&file, 0, &data).await.expect("write");
        files.push((file, data.clone()));
        let before = client.server_counters().await.expect("server counters");
        // 64 KiB at unit boundaries: one whole unit each (Hybrid: a partial stripe, so two
        // overflow entries, primary and mirror).
        for _ in 0..20 {
            let at = rng.gen_range(0..32) * (64 << 10);
            let piece = random_bytes(&mut rng, 64 << 10);
            client
                .write_at(&files.last().unwrap().0, at, &piece)
                .await
                .expect("small write");
            data[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
        }
        files.last_mut().unwrap().1 = data;
        let after = client.server_counters().await.expect("server counters");
        let inline = counter_sum(&after, "writes_inline") - counter_sum(&before, "writes_inline");
        assert!(inline >= 20, "{name}: writes answered inline: {inline}");
    }
    for (file, data) in &files {
        let got = client
            .read_at(file, 0, data.len() as u64)
            .await
            .expect("read");
        assert_bytes("small writes read back", &got, data);
        client.sync(file).await.expect("sync");
    }
    let mut cluster = cluster;
    cluster.restart_all();
    let client = cluster.client().await;
    for ((file, data), name) in files.iter().zip(["inline0", "inline-hybrid"]) {
        assert_eq!(file.path.trim_start_matches('/'), name);
        let file = client.open(name).await.expect("open");
        let got = client
            .read_at(&file, 0, data.len() as u64)
            .await
            .expect("read");
        assert_bytes("synced small writes after restarts", &got, data);
    }
}

/// Sums one counter over every server.
fn counter_sum(
    counters: &[(ServerId, std::collections::BTreeMap<String, u64>)],
    name: &str,
) -> u64 {
    counters.iter().map(|(_, c)| c[name]).sum()
}

/// The servers' disk queues hear how each request is to be served (issue 18 item 4): a
/// reserved client's reads as reserved, a scrub's as background, the rest as best effort.
#[tokio::test(flavor = "multi_thread")]
async fn reserved_and_rebuild_requests_reach_the_servers_disk_queues_as_such() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    // Units above the largest read answered inline, so that every read waits for a slot.
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 512 << 10,
        width: None,
    };
    let file = client.create("served", layout).await.expect("create");
    let data = random_bytes(&mut seeded("served"), 8 << 20);
    client.write_at(&file, 0, &data).await.expect("write");
    let before = client.server_counters().await.expect("server counters");
    assert_eq!(before.len(), SERVERS as usize, "every server answers");
    let config = tessera_client::ClientConfig {
        credential: Some(cluster.admin()),
        reservation: Some(tessera_client::stream::Reservation {
            rate_bytes_per_s: 100_000_000,
            period_us: 1_000_000,
        }),
        ..tessera_client::ClientConfig::default()
    };
    let reserved = Client::connect_with(cluster.manager, config)
        .await
        .expect("connect");
    let got = reserved
        .read_at(&file, 0, data.len() as u64)
        .await
        .expect("read");
    assert_bytes("reserved read", &got, &data);
    let read = client.server_counters().await.expect("server counters");
    // 8 MiB in units of 512 KiB over 4 data columns: reads on every server, none of them
    // best effort.
    let delta =
        |after: &[_], before: &[_], name| counter_sum(after, name) - counter_sum(before, name);
    assert!(delta(&read, &before, "queue_reserved") >= 4, "{read:?}");
    assert_eq!(delta(&read, &before, "queue_best_effort"), 0);
    let report = client.scrub(Some("served")).await.expect("scrub");
    assert_eq!(
        report.corrupt_repaired + report.parity_repaired,
        0,
        "{report:?}"
    );
    let scrubbed = client.server_counters().await.expect("server counters");
    assert!(
        delta(&scrubbed, &read, "queue_background") >= 4,
        "{scrubbed:?}"
    );
    assert_eq!(delta(&scrubbed, &read, "queue_reserved"), 0);
    assert_eq!(counter_sum(&scrubbed, "queue_waiting"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_resets_its_sessions_so_servers_stop_at_once() {
    let cluster = Cluster::up();
    let observer = cluster.client().await;
    let before = observer.server_counters().await.expect("server counters");
    let resets_before: u64 = before.iter().map(|(_, c)| c["resets_received"]).sum();
    {
        let client = cluster.client().await;
        let layout = LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 64 << 10,
            width: None,
        };
        let file = client.create("goodbye", layout).await.expect("create");
        client
            .write_at(&file, 0, &vec![9u8; 1 << 20])
            .await
            .expect("write");
        client.read_at(&file, 0, 1 << 20).await.expect("read");
    }
    // Dropping the client closed its sessions: every server it used got a RESET, so none
    // retransmits to it after it is gone.
    // (The RESETs and the observer's question travel on different sockets: allow them a
    // moment to land.)
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let after = observer.server_counters().await.expect("server counters");
        let resets_after: u64 = after.iter().map(|(_, c)| c["resets_received"]).sum();
        if resets_after - resets_before >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{resets_before} -> {resets_after} RESETs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Read-ahead: blocks in order, short at the end, degraded once a server is gone.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn read_ahead_yields_every_block_in_order_and_reads_degraded_after_a_loss() {
    use futures::StreamExt;
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: UNIT as u32,
        width: None,
    };
    let file = client.create("read-ahead", layout).await.expect("create");
    let mut rng = seeded("read-ahead");
    // Not a whole number of blocks: the last one is short, the one after it empty.
    let block = 3 * UNIT as usize + 1000;
    let data = random_bytes(&mut rng, 7 * block as u64 + 12_345);
    client.write_at(&file, 0, &data).await.expect("write");
    let offsets: Vec<u64> = (0..9).map(|i| (i * block) as u64).collect();
    let expected = |offset: u64| {
        let start = (offset as usize).min(data.len());
        &data[start..(start + block).min(data.len())]
    };
    for (what, read_ahead) in [("one at a time", 1), ("three ahead", 3)] {
        let blocks: Vec<_> = client
            .read_blocks(&file, offsets.clone(), block, read_ahead)
            .await
            .expect("read_blocks")
            .collect()
            .await;
        assert_eq!(blocks.len(), offsets.len());
        for (offset, got) in offsets.iter().zip(blocks) {
            let (bytes, _took) = got.unwrap_or_else(|e| panic!("{what}: block at {offset}: {e}"));
            assert_bytes(
                &format!("{what}: block at {offset}"),
                &bytes,
                expected(*offset),
            );
        }
    }
    // A server lost before the reads: every block is reconstructed from the others.
    cluster.stop_server(2);
    let mut stream = Box::pin(
        client
            .read_blocks(&file, offsets.clone(), block, 4)
            .await
            .expect("read_blocks, one server down"),
    );
    for offset in &offsets {
        let (bytes, _) = stream
            .next()
            .await
            .expect("a block per offset")
            .unwrap_or_else(|e| panic!("degraded block at {offset}: {e}"));
        assert_bytes(
            &format!("degraded block at {offset}"),
            &bytes,
            expected(*offset),
        );
    }
    assert!(stream.next().await.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn blocks_as_received_are_the_files_bytes_in_every_scheme_healthy_and_degraded() {
    use futures::StreamExt;
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let mut rng = seeded("blocks-as-received");
    let size = 40 * UNIT + 4321;
    let schemes = [
        Scheme::Raid0,
        Scheme::Raid1,
        Scheme::Raid4,
        Scheme::Raid5,
        Scheme::Hybrid,
    ];
    let mut files = Vec::new();
    for scheme in schemes {
        let layout = LayoutRequest {
            scheme,
            stripe_unit: UNIT as u32,
            width: None,
        };
        let path = format!("as-received-{scheme:?}");
        let file = client.create(&path, layout).await.expect("create");
        let mut data = random_bytes(&mut rng, size);
        client.write_at(&file, 0, &data).await.expect("write");
        // A partial-stripe overwrite: Hybrid keeps it in overflow regions, which a read
        // must lay over the stripes.
        let patch = random_bytes(&mut rng, UNIT + 777);
        let at = 5 * UNIT as usize + 123;
        client
            .write_at(&file, at as u64, &patch)
            .await
            .expect("patch");
        data[at..at + patch.len()].copy_from_slice(&patch);
        files.push((scheme, path, data));
    }
    // Not unit-aligned at either end, blocks of several units and a piece.
    let (start, end, block) = (UNIT / 3, size - 1000, 3 * UNIT as usize + 5000);
    let read_all = |path: String| {
        let client = client.clone();
        async move {
            let open = client.open_file(&path).await?;
            let blocks: Vec<Result<tessera_client::Pieces, ClientError>> = client
                .read_open_blocks(open, start..end, block, 3)
                .collect()
                .await;
            blocks.into_iter().collect::<Result<Vec<_>, _>>()
        }
    };
    let check = |what: &str, blocks: Vec<tessera_client::Pieces>, data: &[u8]| {
        assert_eq!(
            blocks.len(),
            (end - start).div_ceil(block as u64) as usize,
            "{what}"
        );
        let mut got = Vec::new();
        for (i, pieces) in blocks.iter().enumerate() {
            let wanted = block.min((end - start) as usize - i * block);
            assert_eq!(pieces.len(), wanted, "{what}: block {i}'s length");
            got.extend(pieces.parts().iter().flat_map(|part| part.iter().copied()));
        }
        assert_bytes(what, &got, &data[start as usize..end as usize]);
    };
    for (scheme, path, data) in &files {
        let blocks = read_all(path.clone()).await.expect("healthy read");
        // Sliced from each column's answer, not gathered into one buffer per block.
        assert!(blocks.iter().all(|b| b.parts().len() > 1), "{scheme:?}");
        check(&format!("{scheme:?} healthy"), blocks, data);
    }
    // A flipped byte on disk: each redundant scheme serves the file's bytes (rebuilt from
    // the others), RAID-0 refuses; no scheme yields the flipped byte.
    for (scheme, path, data) in &files {
        let meta = client.stat(path).await.expect("stat").meta;
        let offset = start + 2 * UNIT + 17;
        let (server, local) = data_location(&meta, offset);
        cluster.flip_byte(server, meta.id, "data", local);
        match (scheme, read_all(path.clone()).await) {
            (Scheme::Raid0, Err(e)) => assert!(e.to_string().contains("corrupt block"), "{e}"),
            (Scheme::Raid0, Ok(_)) => panic!("RAID-0 served a block that fails its checksum"),
            (_, Ok(blocks)) => check(&format!("{scheme:?} over a flipped byte"), blocks, data),
            (_, Err(e)) => panic!("{scheme:?} over a flipped byte: {e}"),
        }
        if *scheme == Scheme::Raid0 {
            // Put it back: the degraded reads below must fail for the lost server only.
            cluster.flip_byte(server, meta.id, "data", local);
        }
    }
    // Ranges at the type's limits: refused with the range named, never wrapped or endless.
    let open = || client.open_file(&files[3].1);
    let near_end: Vec<_> = client
        .read_open_blocks(
            open().await.expect("open"),
            u64::MAX - 10..u64::MAX,
            block,
            3,
        )
        .collect()
        .await;
    assert!(
        matches!(near_end.first(), Some(Err(ClientError::TooLarge { .. }))),
        "{near_end:?}"
    );
    let zero_blocks: Vec<_> = (client.read_open_blocks(open().await.expect("open"), 0..5, 0, 3))
        .collect()
        .await;
    let lengths: Vec<usize> = (zero_blocks.iter())
        .map(|b| b.as_ref().expect("a block of one byte").len())
        .collect();
    assert_eq!(
        lengths, [1; 5],
        "blocks of 0 bytes are taken as blocks of 1"
    );
    cluster.stop_server(2);
    for (scheme, path, data) in &files {
        match (scheme, read_all(path.clone()).await) {
            (Scheme::Raid0, Err(e)) => assert!(e.to_string().contains("server"), "{e}"),
            (Scheme::Raid0, Ok(_)) => panic!("RAID-0 read with a server lost"),
            (_, Ok(blocks)) => check(&format!("{scheme:?} degraded"), blocks, data),
            (_, Err(e)) => panic!("{scheme:?} degraded: {e}"),
        }
    }
}
