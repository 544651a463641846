//! The manager's store lost (issue 15, item 8), with the real binary on 127.0.0.1: deleted
//! while the manager runs (changes refused, loudly), missing at a restart (servers refused
//! with the way out, nothing touched), and rebuilt by `tessera manager recover` from the
//! servers' file records (every file byte-exact, the cluster id kept).

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime};

const SERVERS: u32 = 5;
/// How long the servers may take to be seen up again.
const UP_TIMEOUT: Duration = Duration::from_secs(20);

/// A local cluster in a temporary directory, stopped when dropped (kept on failure).
struct Cluster {
    temp: Option<tempfile::TempDir>,
    dir: PathBuf,
}

impl Cluster {
    fn up() -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-store-loss-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().to_path_buf();
        let cluster = Cluster {
            temp: Some(temp),
            dir,
        };
        cluster.ok(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
        cluster
    }

    /// Runs `tessera ARGS` against this cluster (`--dir` for cluster commands, `--cluster`
    /// for the rest).
    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
        command.args(args).env_remove("TESSERA_CLUSTER");
        if matches!(args[0], "up" | "down") {
            command.arg("--dir").arg(&self.dir);
        } else {
            command.arg("--cluster").arg(&self.dir);
        }
        command.output().expect("cannot run the tessera binary")
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> Output {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "tessera {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn store(&self) -> PathBuf {
        self.dir.join("manager").join("manager.redb")
    }

    fn server_log(&self, id: u32) -> String {
        std::fs::read_to_string(self.dir.join(format!("server-{id}.log"))).unwrap_or_default()
    }

    /// The cluster id each server's `store.toml` names.
    fn clusters(&self) -> Vec<String> {
        (1..=SERVERS)
            .map(|id| {
                let path = self.dir.join(format!("server-{id}")).join("store.toml");
                let text = std::fs::read_to_string(&path).expect("store.toml");
                let table: toml::Table = text.parse().expect("store.toml parses");
                table["cluster"]
                    .as_str()
                    .expect("joined a cluster")
                    .to_string()
            })
            .collect()
    }

    /// Every file under the servers' `files/` directories, with its bytes.
    fn server_files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut all = BTreeMap::new();
        for id in 1..=SERVERS {
            collect(&self.dir.join(format!("server-{id}/files")), &mut all);
        }
        all
    }

    /// Waits until `tessera status` shows every server up.
    fn wait_all_up(&self) {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let output = self.run(&["status", "--json"]);
            let text = String::from_utf8_lossy(&output.stdout);
            if output.status.success() && text.matches("\"up\"").count() == SERVERS as usize {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "servers not up: {text} {}",
                String::from_utf8_lossy(&output.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
        if std::thread::panicking() {
            if let Some(temp) = self.temp.take() {
                eprintln!("cluster directory kept: {}", temp.keep().display());
            }
        }
    }
}

fn collect(dir: &Path, into: &mut BTreeMap<PathBuf, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(&path, into);
        } else {
            into.insert(path.clone(), std::fs::read(&path).expect("read"));
        }
    }
}

fn seeded(test: &str) -> StdRng {
    let seed = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        });
    eprintln!("{test}: TESSERA_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Puts a file of `len` random bytes with `scheme`; returns its bytes.
fn put(cluster: &Cluster, rng: &mut StdRng, remote: &str, scheme: &str, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    let local = cluster.dir.join("upload");
    std::fs::write(&local, &bytes).expect("write local file");
    let local = local.display().to_string();
    cluster.ok(&["put", &local, remote, "--scheme", scheme]);
    bytes
}

/// A file of each scheme, of sizes from under a stripe to several, named `PREFIX<scheme>.bin`:
/// their names and bytes.
fn put_every_scheme(cluster: &Cluster, rng: &mut StdRng, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for (scheme, len) in [
        ("raid0", 300_001),
        ("raid1", 12_345),
        ("raid4", 1 << 20),
        ("raid5", 2_500_000),
        ("hybrid", 777_777),
    ] {
        let remote = format!("{prefix}{scheme}.bin");
        let bytes = put(cluster, rng, &remote, scheme, len);
        files.push((remote, bytes));
    }
    files
}

#[track_caller]
fn assert_reads_back(cluster: &Cluster, remote: &str, want: &[u8]) {
    let local = cluster.dir.join("download");
    let _ = std::fs::remove_file(&local);
    cluster.ok(&["get", remote, &local.display().to_string()]);
    let got = std::fs::read(&local).expect("downloaded file");
    assert_eq!(got.len(), want.len(), "{remote}: length");
    assert!(got == want, "{remote}: bytes differ");
}

/// The whole story: files of every scheme; the manager's store deleted while the cluster is
/// down; `tessera up` refuses to run on a new, empty store and the servers say why, with
/// nothing on them touched; `tessera manager recover` rebuilds the store from the servers;
/// every file reads back byte-exact and the cluster keeps its id.
#[test]
fn lost_store_is_refused_then_recovered_from_the_servers() {
    let mut rng = seeded("lost_store_is_refused_then_recovered_from_the_servers");
    let cluster = Cluster::up();
    let mut files = put_every_scheme(&cluster, &mut rng, "dir/");
    // A file grown by a later write: the servers' records follow the size.
    let mut tail = vec![0u8; 50_000];
    rng.fill_bytes(&mut tail);
    let tail_path = cluster.dir.join("tail");
    std::fs::write(&tail_path, &tail).expect("tail");
    let grown_at = files[1].1.len();
    cluster.ok(&[
        "write",
        &files[1].0,
        &grown_at.to_string(),
        &tail_path.display().to_string(),
    ]);
    files[1].1.extend_from_slice(&tail);
    let clusters_before = cluster.clusters();

    cluster.ok(&["down"]);
    std::fs::remove_file(cluster.store()).expect("delete the manager's store");
    let before = cluster.server_files();

    let refused = cluster.run(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "up ran on a fresh store: {said}");
    assert!(
        said.contains("store")
            && said.contains("missing")
            && said.contains("tessera manager recover"),
        "{said}"
    );
    assert!(!cluster.store().exists(), "no new, empty store was created");
    let deadline = Instant::now() + UP_TIMEOUT;
    while !(1..=SERVERS).all(|id| cluster.server_log(id).contains("tessera manager recover")) {
        assert!(
            Instant::now() < deadline,
            "servers do not say why they are refused: {}",
            cluster.server_log(1)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cluster.server_log(1).contains(&format!(
        "cluster 0x{}",
        clusters_before[0].trim_start_matches('0')
    )));
    assert!(
        cluster.server_files() == before,
        "the refused start touched the servers' data"
    );

    let manager_dir = cluster.dir.join("manager").display().to_string();
    let recovered = cluster.ok(&["manager", "recover", "--dir", &manager_dir]);
    let said = String::from_utf8_lossy(&recovered.stdout);
    assert!(said.contains(&format!("{} files", files.len())), "{said}");
    cluster.wait_all_up();
    for (remote, bytes) in &files {
        assert_reads_back(&cluster, remote, bytes);
    }
    assert_eq!(
        cluster.clusters(),
        clusters_before,
        "the cluster kept its id"
    );
    // Recovering again over the store it wrote is refused.
    let again = cluster.run(&["manager", "recover", "--dir", &manager_dir]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    // And the cluster goes on: a new file, numbered above the old ones, reads back.
    let fresh = put(&cluster, &mut rng, "after", "raid5", 100_000);
    assert_reads_back(&cluster, "after", &fresh);
    for (remote, bytes) in &files {
        assert_reads_back(&cluster, remote, bytes);
    }
}

/// Deleting the store under a running manager: the manager logs it, and a change is refused
/// with a clear line instead of being acknowledged into a file that is gone at the next start;
/// the copy it made of its open store, put back in place, carries on the cluster.
#[test]
fn store_deleted_while_running_is_reported_and_changes_refused() {
    let mut rng = seeded("store_deleted_while_running_is_reported_and_changes_refused");
    let cluster = Cluster::up();
    let kept = put(&cluster, &mut rng, "kept", "raid1", 70_000);
    std::fs::remove_file(cluster.store()).expect("delete the manager's store");

    let log = cluster.dir.join("manager").join("log");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("was deleted while the manager ran")
    {
        assert!(Instant::now() < deadline, "the manager did not notice");
        std::thread::sleep(Duration::from_millis(50));
    }
    let local = cluster.dir.join("new");
    std::fs::write(&local, b"new bytes").expect("write");
    let refused = cluster.run(&["put", &local.display().to_string(), "new"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a change was acknowledged");
    assert!(said.contains("was deleted while the manager ran"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    // What it knows is still served.
    assert_reads_back(&cluster, "kept", &kept);

    // It copied its store aside, whole: put back, the cluster runs on as before.
    let logged = std::fs::read_to_string(&log).expect("manager log");
    assert!(logged.contains("was copied to"), "{logged}");
    let rescued: Vec<PathBuf> = std::fs::read_dir(cluster.dir.join("manager"))
        .expect("manager dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.display().to_string().contains("manager.redb.rescued-"))
        .collect();
    assert_eq!(rescued.len(), 1, "{rescued:?}");
    cluster.ok(&["down"]);
    std::fs::rename(&rescued[0], cluster.store()).expect("put the copy in place");
    cluster.ok(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
    assert_reads_back(&cluster, "kept", &kept);
    let added = put(&cluster, &mut rng, "added", "hybrid", 200_000);
    assert_reads_back(&cluster, "added", &added);
}

/// A server whose store was wiped gets its file records back when it is rebuilt, so that a
/// later recovery can count on it as on the others.
#[test]
fn rebuilt_server_gets_its_file_records_back() {
    let mut rng = seeded("rebuilt_server_gets_its_file_records_back");
    let cluster = Cluster::up();
    let bytes = put(&cluster, &mut rng, "f", "raid5", 400_000);
    let dir = cluster.dir.display().to_string();
    let server = cluster.dir.join("server-2");
    cluster.ok(&["server", "stop", "2", "--dir", &dir]);
    std::fs::remove_dir_all(&server).expect("wipe server 2");
    cluster.ok(&["server", "start", "2", "--dir", &dir]);
    cluster.ok(&["rebuild", "2"]);
    let files: Vec<PathBuf> = std::fs::read_dir(server.join("files"))
        .expect("files")
        .map(|entry| entry.expect("entry").path())
        .collect();
    assert!(!files.is_empty(), "nothing rebuilt");
    for file in &files {
        assert!(
            file.join("record").exists(),
            "{} has no record",
            file.display()
        );
    }
    cluster.ok(&["server", "stop", "1", "--dir", &dir]);
    assert_reads_back(&cluster, "f", &bytes);
}

/// A 64 KiB RAID-5 put holds bytes on two of the five servers (its one data unit and its
/// parity): only those two keep its directory and record (the others were only made to
/// create empty files and sync them), and a manager store recovered from the servers'
/// records still has the file, byte-exact.
#[test]
fn a_small_put_is_recorded_where_its_bytes_are_and_recovered_from_there() {
    let mut rng = seeded("a_small_put_is_recorded_where_its_bytes_are_and_recovered_from_there");
    let cluster = Cluster::up();
    let bytes = put(&cluster, &mut rng, "small", "raid5", 64 << 10);
    let holding: Vec<u32> = (1..=SERVERS)
        .filter(|id| {
            let files = cluster.dir.join(format!("server-{id}/files"));
            std::fs::read_dir(files).is_ok_and(|mut entries| entries.next().is_some())
        })
        .collect();
    assert_eq!(
        holding.len(),
        2,
        "servers with a file directory: {holding:?}"
    );
    for id in &holding {
        let files = cluster.dir.join(format!("server-{id}/files"));
        for entry in std::fs::read_dir(files).expect("files") {
            let dir = entry.expect("entry").path();
            assert!(
                dir.join("record").exists(),
                "{} has no record",
                dir.display()
            );
        }
    }
    cluster.ok(&["down"]);
    std::fs::remove_file(cluster.store()).expect("delete the manager's store");
    // Refused without a store, as above; the servers wait for the recovered one.
    let refused = cluster.run(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
    assert!(!refused.status.success());
    let deadline = Instant::now() + UP_TIMEOUT;
    while !(1..=SERVERS).all(|id| cluster.server_log(id).contains("tessera manager recover")) {
        assert!(
            Instant::now() < deadline,
            "servers not waiting for the store"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let manager_dir = cluster.dir.join("manager").display().to_string();
    let recovered = cluster.ok(&["manager", "recover", "--dir", &manager_dir]);
    let said = String::from_utf8_lossy(&recovered.stdout);
    assert!(said.contains("1 files"), "{said}");
    cluster.wait_all_up();
    assert_reads_back(&cluster, "small", &bytes);
}

/// Every server of the local cluster "loses power" at once, with the real binary and disks:
/// the cluster stopped, then each store's `boot` file made to name another boot and its
/// `unsynced` mark put back, as a power loss with answered writes not yet synced leaves them.
/// At `up` every store renews itself with its bytes kept aside (nothing is left to rebuild
/// from); `tessera rebuild 1` puts them back on every server and resyncs each file; every
/// file reads back byte-exact, and nothing stays kept once every server is rebuilt.
#[test]
fn every_server_losing_power_at_once_keeps_the_synced_files() {
    let mut rng = seeded("every_server_losing_power_at_once_keeps_the_synced_files");
    let cluster = Cluster::up();
    let files = put_every_scheme(&cluster, &mut rng, "");
    cluster.ok(&["down"]);
    for id in 1..=SERVERS {
        let root = cluster.dir.join(format!("server-{id}"));
        std::fs::write(root.join("boot"), "0000000000000001\n").expect("boot file");
        std::fs::write(root.join("unsynced"), "").expect("unsynced mark");
    }
    let up = cluster.ok(&["up", "--servers", &SERVERS.to_string(), "--detach"]);
    let said = String::from_utf8_lossy(&up.stdout);
    for id in 1..=SERVERS {
        assert!(
            said.contains(&format!("run `tessera rebuild {id}`")),
            "up does not say server {id} owes data: {said}"
        );
    }
    let kept = |id: u32| {
        std::fs::read_dir(cluster.dir.join(format!("server-{id}/kept")))
            .map(|entries| entries.count())
            .unwrap_or(0)
    };
    for id in 1..=SERVERS {
        assert!(
            cluster.server_log(id).contains("kept aside") && kept(id) > 0,
            "server {id} did not renew with its bytes kept: {}",
            cluster.server_log(id)
        );
    }
    let rebuilt = cluster.ok(&["rebuild", "1"]);
    let said = String::from_utf8_lossy(&rebuilt.stdout);
    assert!(said.contains("server 1 rebuilt"), "{said}");
    for (remote, bytes) in &files {
        assert_reads_back(&cluster, remote, bytes);
    }
    for id in 2..=SERVERS {
        cluster.ok(&["rebuild", &id.to_string()]);
    }
    for id in 1..=SERVERS {
        assert_eq!(
            kept(id),
            0,
            "server {id} still keeps bytes after its rebuild"
        );
    }
    cluster.wait_all_up();
    for (remote, bytes) in &files {
        assert_reads_back(&cluster, remote, bytes);
    }
}
