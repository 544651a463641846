//! Writes that arrive after a pending file's lease ran out (issue 15): a writer stalled for a
//! whole lease loses its pending file, whose data the servers delete; what it writes when it
//! runs again must be refused and leave nothing on disk. Before tombstones, the late write
//! made the file again on every server it reached, unreachable (no file in the namespace owns
//! it) and never removed (the manager had forgotten the file).
//!
//! Each test starts a real local cluster (`tessera up`, a manager and five servers as child
//! processes on 127.0.0.1, a short pending lease) and plays the stalled writer in process: it
//! keeps its open file (the view of the servers it got at creation) and writes again through
//! it after the lease is gone, as a writer woken from SIGSTOP does, without asking the manager.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_client::{Client, ClientConfig, ClientError, LayoutRequest, Scheme, TransportKind};
use tessera_wire::StorageError;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
const SERVERS: u32 = 5;
/// The test clusters' pending lease: short, so that it runs out within a test.
const PENDING_LEASE_MS: u64 = 1500;
/// The manager's tick, then a server's next orphan poll (every 10 heartbeats of 300 ms).
const CLEANUP_WAIT: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
struct ClusterToml {
    manager: String,
}

/// A local cluster run by the `tessera` binary; `tessera down` when dropped.
struct Cluster {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    manager: SocketAddr,
}

impl Cluster {
    fn up() -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-late-writes-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().to_path_buf();
        run(
            &["up", "--servers", &SERVERS.to_string(), "--detach", "--dir"],
            &dir,
        );
        let text = std::fs::read_to_string(dir.join("cluster.toml")).expect("cluster.toml");
        let file: ClusterToml = toml::from_str(&text).expect("cluster.toml parses");
        Cluster {
            _temp: temp,
            dir,
            manager: file.manager.parse().expect("manager address"),
        }
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

    /// File ids that have a directory on any server's disk.
    fn ids_on_disk(&self) -> BTreeSet<u64> {
        let mut ids = BTreeSet::new();
        for server in 1..=SERVERS {
            let files = self.dir.join(format!("server-{server}")).join("files");
            let Ok(entries) = std::fs::read_dir(files) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                    ids.insert(id);
                }
            }
        }
        ids
    }

    fn restart_servers(&self) {
        for server in 1..=SERVERS {
            let id = server.to_string();
            run(&["server", "stop", &id, "--dir"], &self.dir);
            run(&["server", "start", &id, "--dir"], &self.dir);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(TESSERA)
            .args(["down", "--dir"])
            .arg(&self.dir)
            .output();
    }
}

/// `tessera ARGS DIR` with the test lease, failing the test with its stderr if it fails.
fn run(args: &[&str], dir: &Path) {
    let output = Command::new(TESSERA)
        .args(args)
        .arg(dir)
        .env_remove("TESSERA_CLUSTER")
        .env("TESSERA_PENDING_LEASE_MS", PENDING_LEASE_MS.to_string())
        .output()
        .expect("cannot run the tessera binary");
    assert!(
        output.status.success(),
        "tessera {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
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

/// A writer creates a pending file and writes to it, then stalls: it stops renewing, the
/// lease runs out, the servers delete the data (and, with `restart`, are all restarted). Its
/// late write through the view it kept is refused as `Removed`, and no byte of it is on any
/// server's disk, then or after the servers' next orphan polls.
async fn late_write_after_the_lease(transport: TransportKind, restart: bool) {
    let cluster = Cluster::up();
    let client = cluster.client(transport).await;
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        width: Some(SERVERS),
        stripe_unit: 64 << 10,
    };
    let (pending, mut open) = client
        .create_pending_open("late", layout)
        .await
        .expect("create a pending file");
    let id = pending.file.id;
    let data = vec![0x5a; 1 << 20];
    client
        .upload_bytes(&mut open, 0, &data)
        .await
        .expect("write while the lease holds");
    assert!(
        cluster.ids_on_disk().contains(&id),
        "the write left no data"
    );
    // The writer stalls: no renewal. The manager expires the file, the servers delete it.
    let deadline = Instant::now() + CLEANUP_WAIT;
    while cluster.ids_on_disk().contains(&id) {
        assert!(
            Instant::now() < deadline,
            "the expired file's data was not removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if restart {
        cluster.restart_servers();
    }
    // It wakes and writes on, as a stopped process does with the state it had.
    let late = client.upload_bytes(&mut open, 0, &data).await;
    match late {
        Err(ClientError::Storage {
            error: StorageError::Removed { file },
            ..
        }) => assert_eq!(file, id),
        other => panic!("late write answered {other:?}, not Removed"),
    }
    assert!(
        !cluster.ids_on_disk().contains(&id),
        "the late write left the removed file's bytes on disk"
    );
    // No orphan poll removes them later either: the manager forgot the file.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        !cluster.ids_on_disk().contains(&id),
        "the late write left the removed file's bytes on disk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_after_the_lease_is_refused_udp() {
    late_write_after_the_lease(TransportKind::Udp, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_after_the_lease_and_a_server_restart_is_refused_tcp() {
    late_write_after_the_lease(TransportKind::Tcp, true).await;
}
