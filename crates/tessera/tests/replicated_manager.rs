//! The replicated manager (issue 17) with the real binary on 127.0.0.1: three replicas
//! (`tessera manager --id N --peers ...`), four servers and client commands given every
//! replica's address. During a series of puts one replica is killed (SIGKILL) and restarted
//! (it must catch up from the others), then the replica the clients and servers talk to is
//! killed. Every acknowledged put must read back byte-exact, each put succeed within a retry,
//! and service return within a bounded time (printed: run with `--nocapture`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::local::{admin_client, local_ok, tessera, Down};

const REPLICAS: usize = 3;
const SERVERS: usize = 4;
const PUTS: usize = 24;
/// Longest a daemon may take to write its address file, or servers to be seen up.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest one put may take, failover included (the target is 1 s of outage; a
/// loaded two-core machine running debug builds gets more).
const PUT_BOUND: Duration = Duration::from_secs(15);

/// A temporary directory removed only if the test passes.
struct TempDir(Option<tempfile::TempDir>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(temp) = self.0.take() {
                eprintln!("kept {}", temp.keep().display());
            }
        }
    }
}

struct Daemons {
    dir: PathBuf,
    managers: Vec<String>,
    replicas: Vec<Option<Child>>,
    servers: Vec<Child>,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in self
            .replicas
            .iter_mut()
            .flatten()
            .chain(self.servers.iter_mut())
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Three ports free for TCP and UDP alike (the order runs on UDP at the manager's port).
fn free_ports(count: usize) -> Vec<u16> {
    let mut ports = Vec::new();
    while ports.len() < count {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() && !ports.contains(&port) {
            ports.push(port);
        }
    }
    ports
}

fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < START_TIMEOUT,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Daemons {
    fn secret(&self) -> PathBuf {
        self.dir.join("replica-1").join("cluster.secret")
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap()
    }

    fn start_replica(&mut self, id: usize) {
        let mut command = tessera();
        command
            .args(["manager", "--init", "--id", &id.to_string(), "--peers"])
            .arg(self.managers.join(","))
            .arg("--dir")
            .arg(self.dir.join(format!("replica-{id}")));
        if id > 1 {
            command.arg("--secret").arg(self.secret());
        }
        let log = self.log(&format!(
            "replica-{id}-{}",
            Instant::now().elapsed().as_nanos()
        ));
        let child = command.stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.replicas[id - 1] = Some(child);
        if id == 1 {
            wait_for_file(&self.secret());
        }
    }

    fn kill_replica(&mut self, id: usize) {
        let mut child = self.replicas[id - 1].take().expect("running");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    fn start_server(&mut self, index: usize) {
        let addr_file = self.dir.join(format!("server-{index}.addr"));
        let child = tessera()
            .args(["server", "--listen", "127.0.0.1:0", "--manager"])
            .arg(self.managers.join(","))
            .arg("--dir")
            .arg(self.dir.join(format!("server-{index}")))
            .arg("--secret")
            .arg(self.secret())
            .arg("--addr-file")
            .arg(&addr_file)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("server-{index}")))
            .spawn()
            .unwrap();
        self.servers.push(child);
        wait_for_file(&addr_file);
    }

    /// `tessera --cluster A,B,C --secret S ARGS`.
    fn run(&self, args: &[&str]) -> Output {
        tessera()
            .arg("--cluster")
            .arg(self.managers.join(","))
            .arg("--secret")
            .arg(self.secret())
            .args(args)
            .output()
            .unwrap()
    }

    fn status(&self) -> String {
        String::from_utf8_lossy(&self.run(&["status"]).stdout).into_owned()
    }

    fn wait_servers_up(&self) {
        let start = Instant::now();
        loop {
            let status = self.status();
            if status.matches(" up").count() >= SERVERS {
                return;
            }
            assert!(start.elapsed() < START_TIMEOUT, "servers not up: {status}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A put, retried (a new client) if the command fails; its time and the tries it took.
fn put(daemons: &Daemons, local: &Path, remote: &str) -> (Duration, usize) {
    let start = Instant::now();
    for tries in 1..=3 {
        let output = daemons.run(&["put", local.to_str().unwrap(), remote, "--scheme", "raid5"]);
        if output.status.success() {
            return (start.elapsed(), tries);
        }
        eprintln!(
            "put {remote} failed (try {tries}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(start.elapsed() < PUT_BOUND, "put {remote} took too long");
    }
    panic!("put {remote} failed three times");
}

#[test]
fn puts_survive_killing_replicas() {
    let temp = tempfile::Builder::new()
        .prefix("tessera-replicated-")
        .tempdir()
        .unwrap();
    // Kept when the test fails (the daemons' logs are in it).
    let temp = TempDir(Some(temp));
    let mut daemons = Daemons::started(&temp);
    println!("{}", daemons.status());

    let mut written = Vec::new();
    let mut slowest = [Duration::ZERO; 3];
    for index in 0..PUTS {
        match index {
            // A replica the clients do not talk to (they try replica 1 first).
            6 => daemons.kill_replica(2),
            // It comes back and must catch up before it serves.
            10 => daemons.start_replica(2),
            // The replica the clients and servers talk to.
            16 => daemons.kill_replica(1),
            _ => {}
        }
        let phase = match index {
            0..6 => 0,
            6..16 => 1,
            _ => 2,
        };
        let local = daemons.dir.join(format!("local-{index}"));
        let bytes: Vec<u8> = (0..150_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ index as u8)
            .collect();
        std::fs::write(&local, &bytes).unwrap();
        let remote = format!("/put-{index}");
        let (took, tries) = put(&daemons, &local, &remote);
        assert!(tries <= 2, "put {index} needed {tries} tries");
        slowest[phase] = slowest[phase].max(took);
        println!("put {index}: {} ms, {tries} tries", took.as_millis());
        written.push((remote, bytes));
    }
    println!(
        "slowest put: {} ms with every replica, {} ms around the kill and restart of replica 2, \
         {} ms after the kill of replica 1",
        slowest[0].as_millis(),
        slowest[1].as_millis(),
        slowest[2].as_millis()
    );
    let status = daemons.status();
    println!("{status}");

    for (remote, bytes) in &written {
        let out = daemons.dir.join("readback");
        let output = daemons.run(&["get", remote, out.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "get {remote}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            std::fs::read(&out).unwrap() == *bytes,
            "{remote} read back different bytes"
        );
    }

    // Replica 2, restarted, caught up: it answers reads of its own and lists every file.
    let only_two = tessera()
        .arg("--cluster")
        .arg(&daemons.managers[1])
        .arg("--secret")
        .arg(daemons.secret())
        .args(["ls"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&only_two.stdout);
    assert!(
        only_two.status.success(),
        "ls at replica 2: {}",
        String::from_utf8_lossy(&only_two.stderr)
    );
    for (remote, _) in &written {
        assert!(
            listing.contains(remote.as_str()),
            "replica 2 does not list {remote}: {listing}"
        );
    }
    assert!(
        status.contains("catching-up")
            || status
                .lines()
                .filter(|l| l.contains("leader") || l.contains("follower"))
                .count()
                == 2,
        "two replicas should be members: {status}"
    );
}

impl Daemons {
    /// Three replicas and the servers, up, in `temp`.
    fn started(temp: &TempDir) -> Daemons {
        let ports = free_ports(REPLICAS);
        let mut daemons = Daemons {
            dir: temp.0.as_ref().unwrap().path().to_path_buf(),
            managers: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            replicas: (0..REPLICAS).map(|_| None).collect(),
            servers: Vec::new(),
        };
        for id in 1..=REPLICAS {
            daemons.start_replica(id);
        }
        for index in 1..=SERVERS {
            daemons.start_server(index);
        }
        daemons.wait_servers_up();
        daemons
    }

    /// Puts a small file of its own at `remote` (retried as `put` does).
    fn put_small(&self, remote: &str) {
        let local = self.dir.join("small");
        std::fs::write(&local, remote.as_bytes()).unwrap();
        put(self, &local, remote);
    }

    /// `tessera ls` asked of replica `id` alone.
    fn ls_at(&self, id: usize) -> String {
        let output = tessera()
            .arg("--cluster")
            .arg(&self.managers[id - 1])
            .arg("--secret")
            .arg(self.secret())
            .arg("ls")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "ls at replica {id}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until `tessera status` lists `count` replicas as leader or follower.
    fn wait_members(&self, count: usize) -> String {
        let start = Instant::now();
        loop {
            let status = self.status();
            let members = status
                .lines()
                .filter(|l| l.contains("leader") || l.contains("follower"))
                .count();
            if members == count {
                return status;
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "{count} replicas are not members: {status}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops replica `id` (SIGSTOP): it neither answers nor applies.
    fn pause_replica(&self, id: usize) {
        let pid = self.replicas[id - 1].as_ref().expect("running").id();
        let stopped = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
    }
}

fn temp_dir(prefix: &str) -> TempDir {
    TempDir(Some(
        tempfile::Builder::new().prefix(prefix).tempdir().unwrap(),
    ))
}

/// A replica whose directory is deleted (store, incarnation file, everything) and that is
/// started again with the same id rejoins as a new incarnation, catches up from the others
/// and serves every file, those created before it was wiped and after.
#[test]
fn a_wiped_replica_rejoins_and_catches_up() {
    let temp = temp_dir("tessera-wiped-replica-");
    let mut daemons = Daemons::started(&temp);
    for index in 0..3 {
        daemons.put_small(&format!("/before-{index}"));
    }
    daemons.kill_replica(3);
    std::fs::remove_dir_all(daemons.dir.join("replica-3")).unwrap();
    daemons.start_replica(3);
    for index in 0..3 {
        daemons.put_small(&format!("/after-{index}"));
    }
    println!("{}", daemons.wait_members(3));
    let listing = daemons.ls_at(3);
    for name in ["before", "after"] {
        for index in 0..3 {
            let path = format!("/{name}-{index}");
            assert!(listing.contains(&path), "replica 3 lacks {path}: {listing}");
        }
    }
}

/// Every replica killed at once (SIGKILL), one of them behind the others (stopped while
/// three puts were acknowledged), then all started again: the group starts from the most
/// advanced store, so each replica alone lists every acknowledged file, and service resumes.
#[test]
fn every_replica_killed_at_once_restarts_without_loss() {
    let temp = temp_dir("tessera-all-replicas-");
    let mut daemons = Daemons::started(&temp);
    daemons.put_small("/first");
    daemons.pause_replica(3);
    for index in 0..3 {
        daemons.put_small(&format!("/while-3-stopped-{index}"));
    }
    for id in 1..=REPLICAS {
        daemons.kill_replica(id);
    }
    let began = Instant::now();
    for id in 1..=REPLICAS {
        daemons.start_replica(id);
    }
    daemons.wait_servers_up();
    println!(
        "{}\nservers up {} ms after the restart",
        daemons.wait_members(3),
        began.elapsed().as_millis()
    );
    daemons.put_small("/after");
    for id in 1..=REPLICAS {
        let listing = daemons.ls_at(id);
        for path in [
            "/first",
            "/while-3-stopped-0",
            "/while-3-stopped-1",
            "/while-3-stopped-2",
            "/after",
        ] {
            assert!(
                listing.contains(path),
                "replica {id} lacks {path}: {listing}"
            );
        }
    }
    let out = daemons.dir.join("readback");
    let output = daemons.run(&["get", "/while-3-stopped-2", out.to_str().unwrap()]);
    assert!(output.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"/while-3-stopped-2");
}

#[test]
fn local_cluster_with_three_manager_replicas() {
    let temp = tempfile::Builder::new()
        .prefix("tessera-up-managers-")
        .tempdir()
        .unwrap();
    let dir = temp.path().join("cluster");
    let file = temp.path().join("small");
    std::fs::write(&file, b"replicated metadata").unwrap();
    let file = file.to_str().unwrap();
    local_ok(
        &dir,
        &["up", "--managers", "3", "--servers", "4", "--detach"],
    );
    let _down = Down(&dir);
    local_ok(&dir, &["put", file, "/a"]);
    // The replica clients use first, killed: the cluster goes on.
    local_ok(&dir, &["manager", "stop", "1"]);
    local_ok(&dir, &["put", file, "/b"]);
    let status = local_ok(&dir, &["status"]);
    assert!(
        status.contains("down ("),
        "replica 1 should be listed down: {status}"
    );
    // Back, it catches up and serves again.
    local_ok(&dir, &["manager", "start", "1"]);
    let start = Instant::now();
    loop {
        let status = local_ok(&dir, &["status"]);
        let members = status
            .lines()
            .filter(|l| l.contains("leader") || l.contains("follower"))
            .count();
        if members == 3 {
            break;
        }
        assert!(
            start.elapsed() < START_TIMEOUT,
            "replica 1 did not rejoin: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    local_ok(&dir, &["put", file, "/c"]);
    let listing = local_ok(&dir, &["ls"]);
    for path in ["/a", "/b", "/c"] {
        assert!(listing.contains(path), "{path} missing: {listing}");
    }
    // The whole group stopped and started again keeps everything.
    local_ok(&dir, &["down"]);
    local_ok(
        &dir,
        &["up", "--managers", "3", "--servers", "4", "--detach"],
    );
    let listing = local_ok(&dir, &["ls"]);
    for path in ["/a", "/b", "/c"] {
        assert!(
            listing.contains(path),
            "{path} missing after a restart: {listing}"
        );
    }
    let out = temp.path().join("back");
    local_ok(&dir, &["get", "/b", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), b"replicated metadata");
}

/// The metadata operations the throughput measurement times, one kind at a time.
#[derive(Clone, Copy, Debug)]
enum MetadataOp {
    /// `create` of a new file.
    Create,
    /// `stat` of a file the `Create` phase of the round made.
    Stat,
    /// A small-file put: `create`, a write of [`SMALL_PUT_BYTES`], `sync` (the file is
    /// committed with its size at the manager).
    SmallPut,
}

const METADATA_OPS: [MetadataOp; 3] = [MetadataOp::Create, MetadataOp::Stat, MetadataOp::SmallPut];

/// The kinds to measure: all, or those `TESSERA_METADATA_OPS` names (`create`, `stat`,
/// `small-put`, comma-separated; `stat` reads what `create` made), to profile one kind.
fn metadata_ops() -> Vec<MetadataOp> {
    let Ok(named) = std::env::var("TESSERA_METADATA_OPS") else {
        return METADATA_OPS.to_vec();
    };
    let kind = |name: &str| match name.trim() {
        "create" => MetadataOp::Create,
        "stat" => MetadataOp::Stat,
        "small-put" => MetadataOp::SmallPut,
        other => panic!("TESSERA_METADATA_OPS: unknown kind '{other}' (create, stat, small-put)"),
    };
    named.split(',').map(kind).collect()
}
/// What a small-file put writes.
const SMALL_PUT_BYTES: usize = 4096;

/// One operation of kind `op`, number `n` of client `task` in `round`.
async fn metadata_op(client: &tessera_client::Client, op: MetadataOp, at: (usize, usize, u64)) {
    let (round, task, n) = at;
    let layout = tessera_client::LayoutRequest {
        scheme: tessera_client::Scheme::Raid5,
        stripe_unit: 65536,
        width: Some(3),
    };
    match op {
        MetadataOp::Create => {
            let path = format!("/bench/{round}/{task}/{n}");
            client.create(&path, layout).await.unwrap();
        }
        MetadataOp::Stat => {
            client
                .stat(&format!("/bench/{round}/{task}/0"))
                .await
                .unwrap();
        }
        MetadataOp::SmallPut => {
            let path = format!("/bench/{round}/{task}/put-{n}");
            let file = client.create(&path, layout).await.unwrap();
            let data = vec![n as u8; SMALL_PUT_BYTES];
            client.write_at(&file, 0, &data).await.unwrap();
            client.sync(&file).await.unwrap();
        }
    }
}

/// Operations of kind `op` per second by `clients` concurrent clients (sharing one client
/// library instance, as a gateway's requests do) for `time`, against the local cluster in
/// `dir`.
async fn metadata_ops_per_second(
    dir: &Path,
    clients: usize,
    time: Duration,
    round: usize,
    op: MetadataOp,
) -> f64 {
    let client = admin_client(dir).await;
    let deadline = Instant::now() + time;
    let tasks: Vec<_> = (0..clients)
        .map(|task| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    metadata_op(&client, op, (round, task, ops)).await;
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    let mut ops = 0;
    for task in tasks {
        ops += task.await.unwrap();
    }
    ops as f64 / time.as_secs_f64()
}

/// CPU time (user and system, ms) used so far by the daemons of the local cluster in `dir`
/// (by their first argument: `manager` or `server`) and by this process (the clients),
/// from `/proc`: what one operation costs each, where the two cores go.
fn cpu_ms_by_role(dir: &Path) -> [u64; 3] {
    let ticks = |stat: &str| -> u64 {
        // utime and stime: the 12th and 13th fields after the command name, in 10 ms ticks.
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields = after_name.split_whitespace().skip(11).take(2);
        fields.filter_map(|f| f.parse::<u64>().ok()).sum::<u64>() * 10
    };
    let mut cpu = [0u64; 3];
    let dir = dir.to_string_lossy().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|arg| String::from_utf8_lossy(arg).to_string())
            .collect();
        if !args.iter().any(|arg| arg.starts_with(&dir)) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        match args.get(1).map(String::as_str) {
            Some("manager") => cpu[0] += ticks(&stat),
            Some("server") => cpu[1] += ticks(&stat),
            _ => {}
        }
    }
    cpu[2] = ticks(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default());
    cpu
}

/// `tessera up` of a local cluster in `dir` with `managers`, its manager daemons logging
/// their counters (target `tessera_manager::counters`).
fn up_counting(dir: &Path, managers: &str) {
    let output = tessera()
        .env("TESSERA_LOG", "info,tessera_manager::counters=debug")
        .args(["up", "--managers", managers, "--servers", "3", "--detach"])
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tessera up: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The last counters line of every manager log under `dir`.
fn last_counters(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(at) = dirs.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let last = text.lines().rfind(|l| l.contains("synced_commits"));
            if let Some(line) = last {
                let from = line.find("manager").or(line.find("replica")).unwrap_or(0);
                found.push(line[from..].to_string());
            }
        }
    }
    found.sort();
    found
}

/// Issue 17's throughput target (3 replicas at >= 0.7x one manager), measured side by side
/// for create, stat and small-file put: a measurement, not a check, so it runs only when
/// asked. It prints what the managers counted: batches of deliveries and their sizes,
/// synced commits, reads answered locally or ordered.
#[test]
#[ignore = "a measurement (about 40 s of both cores): cargo test -p tessera --test replicated_manager -- --ignored --nocapture"]
fn metadata_throughput_one_and_three_managers() {
    let temp = tempfile::tempdir().unwrap();
    let one = temp.path().join("one");
    let three = temp.path().join("three");
    up_counting(&one, "1");
    up_counting(&three, "3");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut done = [0u64; 2];
    let (mut measured, mut counted, mut cpu_per_op) = (Vec::new(), Vec::new(), Vec::new());
    for op in metadata_ops() {
        let (mut single, mut replicated) = (Vec::new(), Vec::new());
        let mut cpu = [[0u64; 3]; 2];
        for round in 0..3 {
            let time = Duration::from_secs(2);
            let run = |dir: &Path, cpu: &mut [u64; 3]| {
                let before = cpu_ms_by_role(dir);
                let ops = runtime.block_on(metadata_ops_per_second(dir, 8, time, round, op));
                let after = cpu_ms_by_role(dir);
                for (sum, (a, b)) in cpu.iter_mut().zip(after.iter().zip(before)) {
                    *sum += a.saturating_sub(b);
                }
                ops
            };
            single.push(run(one.as_path(), &mut cpu[0]));
            replicated.push(run(three.as_path(), &mut cpu[1]));
            done[0] += (single[round] * 2.0) as u64;
            done[1] += (replicated[round] * 2.0) as u64;
        }
        let per_op = |cpu: [u64; 3], ops: &[f64]| -> Vec<f64> {
            let ops: f64 = ops.iter().sum::<f64>() * 2.0;
            cpu.iter().map(|&ms| ms as f64 / ops.max(1.0)).collect()
        };
        cpu_per_op.push((op, per_op(cpu[0], &single), per_op(cpu[1], &replicated)));
        measured.push((op, single, replicated));
        std::thread::sleep(Duration::from_secs(1)); // The replicas' last counters.
        counted.push((op, [last_counters(&one), last_counters(&three)]));
    }
    local_ok(&one, &["down"]);
    local_ok(&three, &["down"]);
    println!("ops/s, 8 clients, 3 interleaved rounds of 2 s per kind:");
    for (op, single, replicated) in &measured {
        let ratios: Vec<f64> = single.iter().zip(replicated).map(|(s, r)| r / s).collect();
        println!("{op:?}:");
        println!("  1 manager:  {single:.0?}");
        println!("  3 replicas: {replicated:.0?}");
        println!("  ratio:      {ratios:.2?}");
    }
    println!("ops in all: 1 manager {}, 3 replicas {}", done[0], done[1]);
    println!("CPU ms per op (managers, servers, clients), all rounds:");
    for (op, single, replicated) in &cpu_per_op {
        println!("  {op:?}: 1 manager {single:.2?}, 3 replicas {replicated:.2?}");
    }
    for (op, counters) in &counted {
        println!("counters after the {op:?} rounds (since the start; cpu_ms: the process's):");
        for line in counters.iter().flatten() {
            println!("  {line}");
        }
    }
    assert!(measured
        .iter()
        .flat_map(|(_, s, r)| s.iter().chain(r))
        .all(|&ops| ops > 0.0));
}
