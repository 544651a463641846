//! `tessera server --metrics ADDR`: a server of a local cluster serves Prometheus's text
//! format, and its counts move with the work it does.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod command;
use command::{tessera, text};

/// `GET path` on `addr`: the status line and the body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The value of the sample `name` (with its labels) in a scrape, 0 if absent.
fn sample(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A temporary directory for a local cluster in `ROOT/cluster`, stopped on every way out
/// (a failed assertion included) when the value is dropped.
struct LocalCluster {
    root: tempfile::TempDir,
    dir: std::path::PathBuf,
}

impl LocalCluster {
    fn new(prefix: &str) -> LocalCluster {
        let root = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temporary directory");
        let dir = root.path().join("cluster");
        LocalCluster { root, dir }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = tessera(&["down", "--dir", text(&self.dir)]);
    }
}

/// Runs `tessera ARGS`, which must succeed: its standard output.
fn run(args: &[&str]) -> String {
    let out = tessera(args);
    assert!(
        out.status.success(),
        "tessera {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The address a daemon announces its metrics at on stderr (waits up to 30 s); the rest of
/// its stderr is read and dropped, so that the daemon never blocks writing it.
fn announced_metrics_addr(stderr: std::process::ChildStderr) -> String {
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        assert!(Instant::now() < deadline, "no metrics address announced");
        let line = lines.next().expect("daemon exited").expect("read stderr");
        if let Some(rest) = line.strip_prefix("metrics on http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    addr
}

#[test]
fn a_server_serves_prometheus_metrics_that_count_its_work() {
    let root = tempfile::Builder::new()
        .prefix("tessera-metrics-")
        .tempdir()
        .expect("temporary directory");
    let dir = root.path().join("cluster");
    let up = tessera(&["up", "--servers", "2", "--dir", text(&dir), "--detach"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    // Stops the cluster and the extra server on every way out, a failed assertion included.
    struct Cleanup(std::path::PathBuf, Option<std::process::Child>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(server) = &mut self.1 {
                let _ = server.kill();
                let _ = server.wait();
            }
            let _ = tessera(&["down", "--dir", text(&self.0)]);
        }
    }
    let mut cleanup = Cleanup(dir.clone(), None);
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("cluster.toml")).expect("cluster.toml"))
            .expect("TOML");
    let manager = config["manager"].as_str().expect("manager").to_string();
    let secret = dir.join("cluster.secret");
    let server_dir = root.path().join("third");
    let mut server = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--secret", text(&secret), "server", "--manager", &manager])
        .args(["--listen", "127.0.0.1:0", "--dir", text(&server_dir)])
        .args(["--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a server");
    let stderr = server.stderr.take().expect("stderr");
    cleanup.1 = Some(server);
    let metrics_addr = announced_metrics_addr(stderr);
    let (status, before) = http_get(&metrics_addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(
        before.contains("# TYPE tessera_server_transport counter"),
        "{before}"
    );
    // Three servers up: a put stripes over all of them, the new one included.
    let cli = |args: &[&str]| {
        let mut full = vec!["--cluster", text(&dir)];
        full.extend_from_slice(args);
        let out = tessera(&full);
        assert!(
            out.status.success(),
            "tessera {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while String::from_utf8_lossy(&cli(&["status"]).stdout)
        .matches(" up")
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "the third server never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let local = root.path().join("data");
    std::fs::write(&local, vec![7u8; 3 << 20]).expect("local file");
    cli(&[
        "put",
        text(&local),
        "f",
        "--scheme",
        "raid0",
        "--stripe-unit",
        "64K",
    ]);
    cli(&["get", "f", text(&root.path().join("back"))]);
    let (_, after) = http_get(&metrics_addr, "/metrics");
    let written = sample(
        &after,
        "tessera_server_received_bytes_total{kind=\"Write\"}",
    );
    let read = sample(&after, "tessera_server_sent_bytes_total{kind=\"Read\"}");
    // A third of 3 MiB each way (raid0 over three servers), give or take a stripe unit.
    assert!(
        (written - 1_048_576.0).abs() <= 65_536.0,
        "written {written}:\n{after}"
    );
    assert!(
        (read - 1_048_576.0).abs() <= 65_536.0,
        "read {read}:\n{after}"
    );
    assert!(
        sample(
            &after,
            "tessera_server_request_seconds_count{kind=\"Write\"}"
        ) >= 1.0,
        "{after}"
    );
    // A scrub is background work: its reads count apart. Nothing else was background.
    assert_eq!(sample(&after, "tessera_server_background_bytes_total"), 0.0);
    cli(&["put", text(&local), "p", "--scheme", "raid5"]);
    cli(&["scrub", "p"]);
    let (_, scrubbed) = http_get(&metrics_addr, "/metrics");
    let background = sample(&scrubbed, "tessera_server_background_bytes_total");
    // Its column of a 3 MiB raid5 file over three servers: 1.5 MiB.
    assert!(
        background >= 1_048_576.0,
        "background {background}:\n{scrubbed}"
    );
    // The disk's use is walked at most every 5 s: wait for the walk that sees the files.
    let stored_at_least = |bytes: f64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, scrape) = http_get(&metrics_addr, "/metrics");
            let stored = sample(&scrape, "tessera_server_disk_bytes{bytes=\"stored\"}");
            let total = sample(&scrape, "tessera_server_disk_bytes{bytes=\"total\"}");
            let free = sample(&scrape, "tessera_server_disk_bytes{bytes=\"available\"}");
            assert!(free > 0.0 && free <= total, "{scrape}");
            if stored >= bytes {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stored {stored} < {bytes}:\n{scrape}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // A third of the raid0 file and a third of the raid5 file's data and parity.
    stored_at_least(2.5 * 1_048_576.0);
    let (status, _) = http_get(&metrics_addr, "/other");
    assert!(status.contains("404"), "{status}");
    drop(cleanup);
}

/// `tessera top --count 2`: every server's line with its state, rates from the second
/// refresh on (the servers counted the first refresh's own requests), and what a server
/// that was down during a write owes.
#[test]
fn top_shows_each_servers_state_rates_and_debts() {
    let local_cluster = LocalCluster::new("tessera-top-");
    let (root, dir) = (&local_cluster.root, local_cluster.dir.clone());
    run(&["up", "--servers", "3", "--dir", text(&dir), "--detach"]);
    run(&["server", "stop", "3", "--dir", text(&dir)]);
    let local = root.path().join("data");
    std::fs::write(&local, vec![5u8; 1 << 20]).expect("local file");
    let cluster = ["--cluster", text(&dir)];
    let put = [
        &cluster[..],
        &["put", text(&local), "f", "--scheme", "raid5"],
    ]
    .concat();
    run(&put);
    let top = [&cluster[..], &["top", "--count", "2", "--interval", "0.3"]].concat();
    let out = run(&top);
    let refreshes: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(refreshes.len(), 2, "{out}");
    let line_of = |refresh: &str, id: &str| {
        refresh
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no line for server {id} in:\n{refresh}"))
            .to_string()
    };
    for id in ["1", "2"] {
        let line = line_of(refreshes[1], id);
        assert!(line.contains(" free "), "no disk use in: {line}");
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[2], "up", "{line}");
        let requests: f64 = fields[3]
            .parse()
            .unwrap_or_else(|_| panic!("no request rate in: {line}"));
        assert!(requests > 0.0, "{line}");
        assert!(line.ends_with("nothing"), "{line}");
    }
    // A file made while a server is down is owed whole.
    let stopped = line_of(refreshes[1], "3");
    assert!(stopped.contains(" down "), "{stopped}");
    assert!(stopped.ends_with("all of 1 files"), "{stopped}");
    run(&["server", "start", "3", "--dir", text(&dir)]);
    let status = [&cluster[..], &["status"]].concat();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Back, it is stale (it owes) until rebuilt.
    while line_of(&run(&status), "3").ends_with("down") {
        assert!(Instant::now() < deadline, "server 3 never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    run(&[&cluster[..], &["rebuild", "3"]].concat());
    let once = [&cluster[..], &["top", "--count", "1"]].concat();
    let rebuilt = line_of(&run(&once), "3");
    assert!(rebuilt.ends_with("nothing"), "after its rebuild: {rebuilt}");
    let bad = [&cluster[..], &["top", "--interval", "0"]].concat();
    let out = tessera(&bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad --interval"));
}

/// `tessera manager --metrics ADDR`: the manager counts the requests it serves by kind,
/// refusals as errors, and reports its servers by state.
#[test]
fn a_manager_serves_prometheus_metrics_of_its_requests_and_servers() {
    let root = tempfile::Builder::new()
        .prefix("tessera-manager-metrics-")
        .tempdir()
        .expect("temporary directory");
    let dir = root.path().join("manager");
    let addr_file = root.path().join("manager.addr");
    let mut manager = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "manager",
            "--init",
            "--listen",
            "127.0.0.1:0",
            "--dir",
            text(&dir),
        ])
        .args(["--addr-file", text(&addr_file), "--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a manager");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = manager.stderr.take().expect("stderr");
    let _kill = Kill(manager);
    let metrics_addr = announced_metrics_addr(stderr);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&addr_file).map_or(true, |a| a.trim().is_empty()) {
        assert!(Instant::now() < deadline, "no manager address written");
        std::thread::sleep(Duration::from_millis(50));
    }
    let addr = std::fs::read_to_string(&addr_file).expect("address");
    let secret = dir.join("cluster.secret");
    let cli = |args: &[&str]| {
        let mut full = vec!["--cluster", addr.trim(), "--secret", text(&secret)];
        full.extend_from_slice(args);
        tessera(&full)
    };
    assert!(cli(&["status"]).status.success());
    assert!(!cli(&["stat", "no-such-file"]).status.success());
    let (status, scrape) = http_get(&metrics_addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(
        sample(&scrape, "tessera_manager_requests_total{kind=\"Status\"}") >= 1.0,
        "{scrape}"
    );
    assert!(
        sample(&scrape, "tessera_manager_errors_total{kind=\"Lookup\"}") >= 1.0,
        "{scrape}"
    );
    assert!(
        scrape.contains("tessera_manager_servers{state=\"up\"} 0"),
        "{scrape}"
    );
    assert!(
        sample(
            &scrape,
            "tessera_manager_request_seconds_count{kind=\"Status\"}"
        ) >= 1.0,
        "{scrape}"
    );
}

/// `tessera up --metrics`: every daemon of the local cluster serves metrics at the address
/// `cluster.toml` names, and a server restarted serves them at the same one.
#[test]
fn up_with_metrics_gives_every_daemon_an_endpoint() {
    let local_cluster = LocalCluster::new("tessera-up-metrics-");
    let (root, dir) = (&local_cluster.root, local_cluster.dir.clone());
    let up = ["up", "--servers", "3", "--dir", text(&dir), "--detach"];
    let printed = run(&[&up[..], &["--metrics"]].concat());
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("cluster.toml")).expect("cluster.toml"))
            .expect("TOML");
    let metrics = config["metrics"].as_table().expect("a metrics table");
    let addr = |name: &str| metrics[name].as_str().expect("an address").to_string();
    for (name, prefix) in [
        ("manager", "tessera_manager_servers{state=\"up\"} 3"),
        ("server-1", "tessera_server_disk_bytes{bytes=\"total\"}"),
        ("server-2", "tessera_server_disk_bytes{bytes=\"available\"}"),
    ] {
        assert!(
            printed.contains(&format!("{name} http://{}/metrics", addr(name))),
            "{printed}"
        );
        let (status, body) = http_get(&addr(name), "/metrics");
        assert!(status.contains("200"), "{name}: {status}");
        assert!(body.contains(prefix), "{name}:\n{body}");
    }
    // No gateway was started: its address is kept for later, not printed.
    assert!(!printed.contains("s3 http://"), "{printed}");
    // The manager reports what a server owes: a file made while it is down, until rebuilt.
    let owed = "tessera_manager_owed{server=\"1\",what=\"whole_files\"}";
    let manager_owed = || sample(&http_get(&addr("manager"), "/metrics").1, owed);
    assert_eq!(manager_owed(), 0.0);
    run(&["server", "stop", "1", "--dir", text(&dir)]);
    let local = root.path().join("data");
    std::fs::write(&local, vec![3u8; 1 << 20]).expect("local file");
    let cluster = dir.join("cluster.toml");
    run(&[
        "--cluster",
        text(&cluster),
        "put",
        text(&local),
        "f",
        "--scheme",
        "raid5",
    ]);
    assert_eq!(manager_owed(), 1.0);
    run(&["server", "start", "1", "--dir", text(&dir)]);
    let (status, _) = http_get(&addr("server-1"), "/metrics");
    assert!(status.contains("200"), "after a restart: {status}");
    run(&["--cluster", text(&cluster), "rebuild", "1"]);
    assert_eq!(manager_owed(), 0.0, "after the rebuild");
}

/// Every server's count of requests of `kind` (`tessera_server_request_seconds_count`).
fn server_requests(metrics: &toml::value::Table, kind: &str) -> f64 {
    let name = format!("tessera_server_request_seconds_count{{kind=\"{kind}\"}}");
    (1..=5)
        .map(|server| {
            let addr = metrics[&format!("server-{server}")]
                .as_str()
                .expect("address");
            sample(&http_get(addr, "/metrics").1, &name)
        })
        .sum()
}

/// Starts the local cluster with its daemons' metrics: its `cluster.toml` and what it says.
fn up_with_metrics(local_cluster: &LocalCluster) -> (std::path::PathBuf, toml::Value) {
    let dir = &local_cluster.dir;
    run(&["up", "--dir", text(dir), "--detach", "--metrics"]);
    let cluster = dir.join("cluster.toml");
    let config =
        toml::from_str(&std::fs::read_to_string(&cluster).expect("cluster.toml")).expect("TOML");
    (cluster, config)
}

/// A `put` of 64 KiB under RAID-5 (a partial stripe of a new file: written fresh, its parity
/// beside its data, with no lock and no read) records no intent at its parity server: the
/// file is pending at the writer, discarded whole if it dies, so no write hole can be read. A
/// `write` into the committed file is read-modify-written under the parity lock and still
/// records an intent per stripe.
#[test]
fn a_put_records_no_intent_and_a_write_to_a_committed_file_does() {
    let local_cluster = LocalCluster::new("tessera-put-intents-");
    let root = &local_cluster.root;
    let (cluster, config) = up_with_metrics(&local_cluster);
    let metrics = config["metrics"].as_table().expect("a metrics table");
    let local = root.path().join("data");
    std::fs::write(&local, vec![7u8; 64 << 10]).expect("local file");
    let put = ["put", text(&local), "f", "--scheme", "raid5"];
    run(&[&["--cluster", text(&cluster)][..], &put].concat());
    assert!(server_requests(metrics, "Write") >= 2.0, "data and parity");
    assert_eq!(server_requests(metrics, "LockParity"), 0.0, "written fresh");
    assert_eq!(server_requests(metrics, "RecordIntent"), 0.0);
    let write = ["write", "f", "4096", text(&local)];
    run(&[&["--cluster", text(&cluster)][..], &write].concat());
    assert!(
        server_requests(metrics, "LockParity") >= 1.0,
        "read-modify-written"
    );
    assert!(
        server_requests(metrics, "WriteParity") >= 1.0,
        "read-modify-written"
    );
    assert!(server_requests(metrics, "RecordIntent") >= 1.0);
}

/// A large `put` syncs its servers as it goes (every 32 MiB written), so that its commit's
/// sync finds only the last bytes unwritten: a 72 MiB put asks every server for at least one
/// sync more than an 8 MiB put does, and both read back byte for byte.
#[test]
fn a_large_put_syncs_its_servers_as_it_goes() {
    let local_cluster = LocalCluster::new("tessera-put-sync-ahead-");
    let root = &local_cluster.root;
    let (cluster, config) = up_with_metrics(&local_cluster);
    let metrics = config["metrics"].as_table().expect("a metrics table");
    let syncs_of_put = |name: &str, len: usize| {
        let local = root.path().join(name);
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&local, &bytes).expect("local file");
        let before = server_requests(metrics, "Sync");
        let put = ["put", text(&local), name, "--scheme", "raid5"];
        run(&[&["--cluster", text(&cluster)][..], &put].concat());
        let syncs = server_requests(metrics, "Sync") - before;
        let back = root.path().join(format!("{name}.back"));
        let get = ["get", name, text(&back)];
        run(&[&["--cluster", text(&cluster)][..], &get].concat());
        assert!(
            std::fs::read(&back).expect("read back") == bytes,
            "{name} read back differs"
        );
        syncs
    };
    let small = syncs_of_put("small", 8 << 20);
    let large = syncs_of_put("large", 72 << 20);
    assert!(
        large >= small + 5.0,
        "a 72 MiB put asked the 5 servers for {large} syncs, an 8 MiB one for {small}"
    );
}
