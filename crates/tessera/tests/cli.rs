//! Multi-process tests of the `tessera` command. Each test starts a real local cluster (a
//! manager and five servers as child processes on 127.0.0.1) in a temporary directory, drives it
//! through the CLI exactly as a user would, and compares every byte read back with a local model.
//!
//! Randomized tests take their seed from `TESSERA_TEST_SEED` (or the clock) and print it, so a
//! failure can be replayed. The helpers live here rather than in `tests/common` because other
//! test files of this crate are written independently.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// Servers in every test cluster.
const SERVERS: u32 = 5;
/// The stripe unit every test file uses (`--stripe-unit 64K`).
const STRIPE_UNIT_BYTES: usize = 64 << 10;
/// Longest any one command may run before the test gives up on it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Every scheme the CLI offers.
const SCHEMES: [&str; 5] = ["raid0", "raid1", "raid4", "raid5", "hybrid"];

/// Data units in one stripe of `scheme` at width `width`: parity schemes give one unit to parity.
fn data_units(scheme: &str, width: usize) -> usize {
    match scheme {
        "raid0" | "raid1" => width,
        _ => width - 1,
    }
}

/// What one run of the binary did.
struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The run for a failure message: command line, status, output.
    fn describe(&self, command: &str) -> String {
        let mut stdout = self.stdout_text();
        stdout.truncate(2000);
        format!(
            "{command}: {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
            self.status, self.stderr
        )
    }

    /// Check that the run succeeded.
    #[track_caller]
    fn assert_ok(&self, command: &str) {
        assert!(self.status.success(), "{}", self.describe(command));
    }
}

/// The command line, for messages.
fn command_line(args: &[&str]) -> String {
    format!("tessera {}", args.join(" "))
}

/// Run the real binary with `args`, feeding `stdin` if given, killing it after
/// `COMMAND_TIMEOUT`.
fn tessera(args: &[&str], stdin: Option<&[u8]>) -> Run {
    tessera_with_env(args, stdin, &[])
}

/// Like [`tessera`], with these environment variables set.
fn tessera_with_env(args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env_remove("TESSERA_CLUSTER")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start the tessera binary");
    // Feed and drain the pipes on their own threads so that no pipe buffer can stall the child.
    let feeder = stdin.map(|bytes| {
        let mut pipe = child.stdin.take().expect("piped stdin");
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            // The child may fail before reading everything; that shows in its exit status.
            let _ = pipe.write_all(&bytes);
        })
    });
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes)
                .expect("read a pipe of the child");
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tessera") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} did not finish within {COMMAND_TIMEOUT:?}",
                command_line(args)
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    if let Some(feeder) = feeder {
        feeder.join().expect("stdin feeder");
    }
    Run {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: String::from_utf8_lossy(&stderr.join().expect("stderr reader")).into_owned(),
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// A seeded generator; the seed is printed (libtest shows it when the test fails).
fn seeded(test: &str) -> StdRng {
    let seed = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    println!("{test}: seed {seed} (replay with TESSERA_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Byte-exact comparison that reports where, not the whole buffers.
#[track_caller]
fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: got {} bytes, want {}; first difference at byte {first}",
        got.len(),
        want.len()
    );
}

/// Flip every bit of one byte of a file in place (same inode, as disk corruption would).
fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset)
        .expect("read the byte");
    byte[0] ^= 0xff;
    file.write_all_at(&byte, offset).expect("write the byte");
}

/// The counts of a scrub's "repaired:" line: corrupt blocks, parity and mirror mismatches.
fn repairs(scrub_stdout: &str) -> [u64; 3] {
    let line = scrub_stdout
        .lines()
        .find(|l| l.starts_with("repaired:"))
        .unwrap_or_else(|| panic!("no 'repaired:' line in scrub output:\n{scrub_stdout}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("digits"))
        .collect();
    numbers
        .try_into()
        .unwrap_or_else(|_| panic!("expected three counts in '{line}'"))
}

/// A local cluster in a temporary directory, stopped when dropped (also on panic).
struct Cluster {
    /// The cluster's data directory (`--dir`).
    dir: PathBuf,
    /// Where the test keeps its local files.
    local: PathBuf,
    servers: u32,
    /// Environment of `tessera up` (its daemons inherit it).
    env: Vec<(&'static str, &'static str)>,
    /// Holds both directories; removed after `down`, as fields drop after `Drop::drop`.
    _root: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = tessera(&["down", "--dir", text(&self.dir)], None);
    }
}

impl Cluster {
    fn start(servers: u32) -> Cluster {
        Cluster::start_with_env(servers, &[])
    }

    /// A cluster whose daemons start with these environment variables.
    fn start_with_env(servers: u32, env: &[(&'static str, &'static str)]) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("tessera-cli-")
            .tempdir()
            .expect("temporary directory");
        let cluster = Cluster {
            dir: root.path().join("cluster"),
            local: root.path().join("local"),
            servers,
            env: env.to_vec(),
            _root: root,
        };
        std::fs::create_dir_all(&cluster.local).expect("local directory");
        cluster.up();
        cluster
    }

    fn up(&self) {
        let servers = self.servers.to_string();
        let args = [
            "up",
            "--servers",
            &servers,
            "--dir",
            text(&self.dir),
            "--detach",
        ];
        let run = tessera_with_env(&args, None, &self.env);
        run.assert_ok(&command_line(&args));
        assert!(
            run.stdout_text()
                .contains(&format!("with {servers} servers")),
            "{}",
            run.describe(&command_line(&args))
        );
    }

    fn down(&self) {
        let args = ["down", "--dir", text(&self.dir)];
        tessera(&args, None).assert_ok(&command_line(&args));
    }

    fn cluster_file(&self) -> PathBuf {
        self.dir.join("cluster.toml")
    }

    /// A path for a local file of the test.
    fn local(&self, name: &str) -> PathBuf {
        self.local.join(name.replace('/', "_"))
    }

    /// A client command against this cluster, and its command line for messages.
    fn client(&self, args: &[&str], stdin: Option<&[u8]>) -> (Run, String) {
        let file = self.cluster_file();
        let mut full = vec!["--cluster", text(&file)];
        full.extend_from_slice(args);
        (tessera(&full, stdin), command_line(&full))
    }

    /// A command that must succeed; its stdout.
    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let (run, command) = self.client(args, None);
        run.assert_ok(&command);
        run.stdout_text()
    }

    /// A command that must fail the way the CLI promises (see [`error_line`]).
    #[track_caller]
    fn fails(&self, args: &[&str]) -> (String, Run) {
        let (run, command) = self.client(args, None);
        (error_line(&run, &command), run)
    }

    /// Like [`fails`](Self::fails), and nothing else may be on stderr.
    #[track_caller]
    fn fails_with_one_line(&self, args: &[&str]) -> String {
        let (line, run) = self.fails(args);
        assert_one_line(&run);
        line
    }

    fn put(&self, remote: &str, data: &[u8], scheme: &str) {
        self.put_with(remote, data, &["--scheme", scheme]);
    }

    fn put_with(&self, remote: &str, data: &[u8], options: &[&str]) {
        let local = self.local(remote);
        std::fs::write(&local, data).expect("write local file");
        let mut args = vec!["put", text(&local), remote];
        args.extend_from_slice(options);
        self.ok(&args);
    }

    fn get(&self, remote: &str) -> Vec<u8> {
        let local = self.local(&format!("{remote}.got"));
        let _ = std::fs::remove_file(&local);
        self.ok(&["get", remote, text(&local)]);
        std::fs::read(&local).expect("read fetched file")
    }

    fn write(&self, remote: &str, offset: usize, data: &[u8]) {
        let local = self.local(&format!("{remote}.patch"));
        std::fs::write(&local, data).expect("write local patch");
        self.ok(&["write", remote, &offset.to_string(), text(&local)]);
    }

    fn read(&self, remote: &str, offset: usize, len: usize, to_stdout: bool) -> Vec<u8> {
        let (offset, len) = (offset.to_string(), len.to_string());
        if to_stdout {
            let (run, command) = self.client(&["read", remote, &offset, &len, "-"], None);
            run.assert_ok(&command);
            return run.stdout;
        }
        let local = self.local(&format!("{remote}.range"));
        let _ = std::fs::remove_file(&local);
        self.ok(&["read", remote, &offset, &len, text(&local)]);
        std::fs::read(&local).expect("read fetched range")
    }

    fn stat(&self, remote: &str) -> Value {
        let out = self.ok(&["stat", remote, "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stat --json: {e}:\n{out}"))
    }

    fn file_id(&self, remote: &str) -> u64 {
        self.stat(remote)["id"].as_u64().expect("stat has an id")
    }

    /// `(id, state)` of every server, from `status --json`.
    fn states(&self) -> Vec<(u64, String)> {
        let out = self.ok(&["status", "--json"]);
        let status: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}:\n{out}"));
        status["servers"]
            .as_array()
            .expect("servers is a list")
            .iter()
            .map(|s| {
                (
                    s["id"].as_u64().expect("id"),
                    s["state"].as_str().expect("state").to_string(),
                )
            })
            .collect()
    }

    #[track_caller]
    fn assert_states(&self, want: &[(u64, &str)]) {
        let got = self.states();
        let want: Vec<(u64, String)> = want.iter().map(|&(i, s)| (i, s.to_string())).collect();
        assert_eq!(got, want, "server states");
    }

    fn server(&self, action: &str, id: u32) {
        let id = id.to_string();
        let args = ["server", action, &id, "--dir", text(&self.dir)];
        tessera(&args, None).assert_ok(&command_line(&args));
    }

    /// A file of server `server`'s store for file `id`: data, redundancy, overflow, ...
    fn stored(&self, server: u32, id: u64, name: &str) -> PathBuf {
        self.dir
            .join(format!("server-{server}"))
            .join("files")
            .join(id.to_string())
            .join(name)
    }

    /// The first server whose `name` file of file `id` holds at least `min_bytes`.
    fn server_holding(&self, id: u64, name: &str, min_bytes: u64, skip: &[u32]) -> u32 {
        (1..=self.servers)
            .filter(|s| !skip.contains(s))
            .find(|&s| {
                std::fs::metadata(self.stored(s, id, name)).is_ok_and(|m| m.len() >= min_bytes)
            })
            .unwrap_or_else(|| panic!("no server holds a {name} file of file {id}"))
    }
}

/// Check that a run failed the way the CLI promises: exit code 1 (not a panic's 101) and exactly
/// one line starting "tessera: ", the last on stderr (warnings may come before it). Returns it.
#[track_caller]
fn error_line(run: &Run, command: &str) -> String {
    assert_eq!(
        run.status.code(),
        Some(1),
        "expected a clean failure: {}",
        run.describe(command)
    );
    let lines: Vec<&str> = run.stderr.trim_end().lines().collect();
    let errors = lines.iter().filter(|l| l.starts_with("tessera: ")).count();
    let last = lines.last().copied().unwrap_or("");
    assert!(
        errors == 1 && last.starts_with("tessera: "),
        "expected one 'tessera: ' line, last on stderr: {}",
        run.describe(command)
    );
    last.to_string()
}

#[track_caller]
fn assert_one_line(run: &Run) {
    assert_eq!(
        run.stderr.trim_end().lines().count(),
        1,
        "stderr must be one line:\n{}",
        run.stderr
    );
}

/// A command without the test cluster's `--cluster` that must fail with one line on stderr.
#[track_caller]
fn fails_alone_with_one_line(args: &[&str]) -> String {
    let run = tessera(args, None);
    let line = error_line(&run, &command_line(args));
    assert_one_line(&run);
    line
}

#[track_caller]
fn assert_mentions(line: &str, words: &[&str]) {
    for word in words {
        assert!(line.contains(word), "'{line}' should mention '{word}'");
    }
}

/// Test 1: every scheme stores and returns files at the sizes where off-by-one errors live.
#[test]
fn every_scheme_round_trips_awkward_sizes() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("every_scheme_round_trips_awkward_sizes");
    let mut stored: Vec<(String, usize, &str)> = Vec::new();
    for scheme in SCHEMES {
        let stripe = data_units(scheme, 5) * STRIPE_UNIT_BYTES;
        for size in [0, 1, stripe - 1, stripe + 1, 3 * stripe + 12_345] {
            let remote = format!("rt/{scheme}/{size}");
            let data = random_bytes(&mut rng, size);
            c.put_with(
                &remote,
                &data,
                &["--scheme", scheme, "--stripe-unit", "64K", "--width", "5"],
            );
            assert_bytes(&c.get(&remote), &data, &remote);
            stored.push((remote, size, scheme));
        }
    }
    let listing = c.ok(&["ls", "rt/"]);
    let mut listed: Vec<(String, usize, String)> = listing
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 3, "ls line '{line}'");
            (
                fields[2].to_string(),
                fields[0].parse().expect("size"),
                fields[1].to_string(),
            )
        })
        .collect();
    listed.sort();
    let mut want: Vec<(String, usize, String)> = stored
        .into_iter()
        .map(|(path, size, scheme)| (path, size, scheme.to_string()))
        .collect();
    want.sort();
    assert_eq!(listed, want, "ls rt/");
    let json: Value = serde_json::from_str(&c.ok(&["ls", "rt/", "--json"])).expect("ls --json");
    let mut listed_json: Vec<(String, usize, String)> = json
        .as_array()
        .expect("ls --json is an array")
        .iter()
        .map(|file| {
            assert_eq!(file["stripe_unit"], 65536, "{file}");
            (
                file["path"].as_str().unwrap().to_string(),
                file["size"].as_u64().unwrap() as usize,
                file["scheme"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    listed_json.sort();
    assert_eq!(listed_json, want, "ls rt/ --json");

    // `-` is stdin for put and stdout for get.
    for scheme in ["raid5", "hybrid"] {
        let remote = format!("pipe/{scheme}");
        let data = random_bytes(&mut rng, 2 * 4 * STRIPE_UNIT_BYTES + 777);
        let (run, command) = c.client(&["put", "-", &remote, "--scheme", scheme], Some(&data));
        run.assert_ok(&command);
        let (run, command) = c.client(&["get", &remote, "-"], None);
        run.assert_ok(&command);
        assert_bytes(&run.stdout, &data, &format!("get {remote} -"));
        assert_bytes(&c.get(&remote), &data, &remote);
    }
    let (run, _) = c.client(&["get", "rt/hybrid/0", "-"], None);
    assert!(
        run.status.success() && run.stdout.is_empty(),
        "empty file to stdout"
    );
}

/// Test 2: random overwrites (some extending the file, some leaving a hole) and random range
/// reads against a local model.
#[test]
fn random_overwrites_and_reads_match_a_model() {
    const WRITES: usize = 10;
    const READS: usize = 8;
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("random_overwrites_and_reads_match_a_model");
    for scheme in ["raid5", "hybrid", "raid1"] {
        let remote = format!("rw/{scheme}");
        let initial = rng.gen_range(1..3 * 4 * STRIPE_UNIT_BYTES);
        let mut model = random_bytes(&mut rng, initial);
        c.put(&remote, &model, scheme);
        for i in 0..WRITES {
            let len = if rng.gen_bool(0.5) {
                rng.gen_range(1..=8192)
            } else {
                rng.gen_range(1..=300_000)
            };
            let offset = match rng.gen_range(0..10) {
                0 => model.len(),
                1 => model.len() + rng.gen_range(1..100_000),
                2 => model.len().saturating_sub(rng.gen_range(0..len)),
                _ => rng.gen_range(0..model.len()),
            };
            let patch = random_bytes(&mut rng, len);
            c.write(&remote, offset, &patch);
            if model.len() < offset + len {
                model.resize(offset + len, 0);
            }
            model[offset..offset + len].copy_from_slice(&patch);
            if i % 3 == 2 || i == WRITES - 1 {
                let what = format!("{remote} after write #{i} of {len} bytes at {offset}");
                assert_bytes(&c.get(&remote), &model, &what);
            }
        }
        assert_eq!(
            c.stat(&remote)["size"].as_u64(),
            Some(model.len() as u64),
            "{remote} size"
        );
        for i in 0..READS {
            let offset = rng.gen_range(0..model.len() + 1000);
            let len = rng.gen_range(0..200_000);
            let got = c.read(&remote, offset, len, i % 2 == 1);
            let want = &model[offset.min(model.len())..(offset + len).min(model.len())];
            assert_bytes(&got, want, &format!("read {remote} {offset} {len}"));
        }
    }
}

/// Test 3: `stat --json` and `status --json` describe what is stored.
#[test]
fn stat_and_status_report_layout_and_overhead() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("stat_and_status_report_layout_and_overhead");
    let mib = random_bytes(&mut rng, 1 << 20);
    let small = random_bytes(&mut rng, 10_000);
    // (remote, scheme, width, contents, expected stored/size). 1 MiB is whole stripes of every
    // parity scheme at width 5 (4 data units) and 3 (2 data units).
    let cases: [(&str, &str, u64, &[u8], f64); 7] = [
        ("st/raid0", "raid0", 5, &mib, 1.0),
        ("st/raid1", "raid1", 5, &mib, 2.0),
        ("st/raid4", "raid4", 5, &mib, 1.25),
        ("st/raid5", "raid5", 5, &mib, 1.25),
        ("st/raid5-w3", "raid5", 3, &mib, 1.5),
        ("st/hybrid", "hybrid", 5, &mib, 1.25),
        // A partial stripe under Hybrid lives in the mirrored overflow region.
        ("st/hybrid-small", "hybrid", 5, &small, 2.0),
    ];
    for (remote, scheme, width, data, ratio) in cases {
        let width_text = width.to_string();
        c.put_with(remote, data, &["--scheme", scheme, "--width", &width_text]);
        let stat = c.stat(remote);
        assert_eq!(stat["path"], remote, "{stat}");
        assert_eq!(stat["size"].as_u64(), Some(data.len() as u64), "{stat}");
        assert_eq!(stat["scheme"], scheme, "{stat}");
        assert_eq!(stat["stripe_unit"].as_u64(), Some(65536), "{stat}");
        assert_eq!(stat["width"].as_u64(), Some(width), "{stat}");
        let mut servers: Vec<u64> = stat["servers"]
            .as_array()
            .expect("servers")
            .iter()
            .map(|s| s.as_u64().expect("server id"))
            .collect();
        assert_eq!(servers.len() as u64, width, "{stat}");
        servers.sort();
        servers.dedup();
        assert_eq!(servers.len() as u64, width, "distinct servers: {stat}");
        assert!(servers.iter().all(|s| (1..=5).contains(s)), "{stat}");
        assert_eq!(stat["unreachable_servers"], serde_json::json!([]), "{stat}");
        let stored = stat["stored_bytes"].as_u64().expect("stored_bytes") as f64;
        let got = stored / data.len() as f64;
        assert!(
            (ratio..ratio + 0.02).contains(&got),
            "{remote}: stored/size {got:.4}, want about {ratio}: {stat}"
        );
    }

    let out = c.ok(&["status", "--json"]);
    let status: Value = serde_json::from_str(&out).expect("status --json");
    let manager: SocketAddr = status["manager"]
        .as_str()
        .expect("manager")
        .parse()
        .expect("manager address");
    assert!(manager.ip().is_loopback(), "{out}");
    let servers = status["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 5, "{out}");
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server["id"].as_u64(), Some(i as u64 + 1), "{out}");
        assert_eq!(server["state"], "up", "{out}");
        let addr: SocketAddr = server["addr"]
            .as_str()
            .expect("addr")
            .parse()
            .expect("server address");
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{out}");
    }
}

/// Test 4: mistakes get exit code 1 and one line on stderr that names the problem, and leave
/// nothing behind.
#[test]
fn bad_input_fails_with_one_clear_line() {
    let c = Cluster::start(SERVERS);
    let local = c.local("input");
    std::fs::write(&local, b"some bytes").expect("local file");
    let input = text(&local);
    let out = c.local("out");
    let missing_local = c.local("no-such-local-file");
    let missing_cluster = c.local("nowhere").join("cluster.toml");

    // A bare address needs an access key (a local cluster's file carries one).
    let line = fails_alone_with_one_line(&["--cluster", "127.0.0.1:1", "ls"]);
    assert_mentions(&line, &["127.0.0.1:1", "no access key", "--key"]);
    let some_key = format!("k{:016x}:{:064x}", 1, 2);
    let line = fails_alone_with_one_line(&["--cluster", "127.0.0.1:1", "--key", &some_key, "ls"]);
    assert_mentions(&line, &["127.0.0.1:1", "cannot reach"]);
    let line = fails_alone_with_one_line(&["--cluster", "127.0.0.1:1", "--key", "k12:34", "ls"]);
    assert_mentions(&line, &["bad access key", "KEYID:SECRET"]);
    let line = fails_alone_with_one_line(&["--cluster", text(&missing_cluster), "ls"]);
    assert_mentions(&line, &["no cluster", text(&missing_cluster)]);

    let line = c.fails_with_one_line(&["get", "missing/file", text(&out)]);
    assert_mentions(&line, &["no such file", "missing/file"]);
    assert!(!out.exists(), "a failed get must not create its output");
    for args in [
        &["rm", "missing/file"][..],
        &["stat", "missing/file"],
        &["read", "missing/file", "0", "10", text(&out)],
        &["write", "missing/file", "0", input],
    ] {
        let line = c.fails_with_one_line(args);
        assert_mentions(&line, &["no such file", "missing/file"]);
    }

    let line = c.fails_with_one_line(&["put", input, "w", "--width", "9"]);
    assert_mentions(&line, &["width 9", "5"]);
    let line = c.fails_with_one_line(&["put", input, "w", "--scheme", "raid5", "--width", "1"]);
    assert_mentions(&line, &["raid5", "1"]);
    let line = c.fails_with_one_line(&["put", input, "w", "--scheme", "raid7"]);
    assert_mentions(&line, &["unknown scheme", "raid7"]);
    let line = c.fails_with_one_line(&["put", input, "w", "--stripe-unit", "3Q"]);
    assert_mentions(&line, &["bad size", "3Q"]);
    let line = c.fails_with_one_line(&["put", text(&missing_local), "w"]);
    assert_mentions(&line, &["cannot open", text(&missing_local)]);

    let dir = text(&c.dir);
    let line = c.fails_with_one_line(&["server", "stop", "9", "--dir", dir]);
    assert_mentions(&line, &["server 9"]);
    let line = c.fails_with_one_line(&["server", "start", "1", "--dir", dir]);
    assert_mentions(&line, &["server 1", "already running"]);
    // Without --dir: the cluster --cluster names (the directory of its file), one way of
    // naming a cluster for every command; an address names no local directory.
    let line = c.fails_with_one_line(&["server", "stop", "9"]);
    assert_mentions(&line, &["server 9"]);
    let line = c.fails_with_one_line(&["server", "start", "1"]);
    assert_mentions(&line, &["server 1", "already running"]);
    let by_address = ["--cluster", "127.0.0.1:9", "server", "stop", "1"];
    let run = tessera(&by_address, None);
    let line = error_line(&run, &command_line(&by_address));
    assert_mentions(&line, &["127.0.0.1:9", "--dir"]);

    assert_eq!(c.ok(&["ls"]), "", "failed commands must not create files");
    c.assert_states(&[(1, "up"), (2, "up"), (3, "up"), (4, "up"), (5, "up")]);
}

/// Bad datagram limits on `tessera server` fail with one line naming the flag, before the
/// server reads its secret or binds anything.
#[test]
fn bad_datagram_limits_fail_with_one_clear_line() {
    let root = tempfile::tempdir().expect("temporary directory");
    let dir = root.path().join("server");
    let server = |flag: &str, value: &str| {
        let args = [
            "server",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--dir",
            text(&dir),
            flag,
            value,
        ];
        fails_alone_with_one_line(&args)
    };
    let line = server("--datagram-memory", "3Q");
    assert_mentions(&line, &["--datagram-memory", "bad size", "3Q"]);
    let line = server("--datagram-memory", "18446744073709551615M");
    assert_mentions(&line, &["--datagram-memory", "too large"]);
    let line = server("--datagram-memory-per-source", "1M");
    assert_mentions(&line, &["--datagram-memory-per-source", "largest message"]);
    let line = server("--datagram-memory", "100M");
    assert_mentions(
        &line,
        &["--datagram-memory ", "--datagram-memory-per-source"],
    );
    let line = server("--datagram-out-of-order-per-source", "1K");
    assert_mentions(&line, &["--datagram-out-of-order-per-source", "datagram"]);
    let line = server("--datagram-sessions-max", "0");
    assert_mentions(&line, &["--datagram-sessions-max", "at least 1"]);
    let line = server("--datagram-sessions-per-source-max", "0");
    assert_mentions(&line, &["--datagram-sessions-per-source-max", "at least 1"]);
    let line = server("--datagram-send-queue", "1M");
    assert_mentions(&line, &["--datagram-send-queue", "largest message"]);
    assert!(
        !dir.exists(),
        "a refused server must not create its directory"
    );
}

/// Test 5: with servers stopped, a read returns the exact bytes or fails naming the servers it
/// lacks; never anything else.
#[test]
fn stopped_servers_give_exact_bytes_or_a_clean_error() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("stopped_servers_give_exact_bytes_or_a_clean_error");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for scheme in ["raid0", "raid1", "raid5", "hybrid"] {
        let remote = format!("lost/{scheme}");
        let mut data = random_bytes(&mut rng, 3 * 4 * STRIPE_UNIT_BYTES + 4321);
        c.put(&remote, &data, scheme);
        if scheme == "hybrid" {
            // A partial-stripe write, so the overflow region takes part in degraded reads.
            let patch = random_bytes(&mut rng, 5000);
            c.write(&remote, 70_000, &patch);
            data[70_000..75_000].copy_from_slice(&patch);
        }
        files.push((remote, data));
    }
    let data_of = |remote: &str| &files.iter().find(|(r, _)| r == remote).expect("file").1;

    // The error names stopped servers only: all of them, or (`all` false) at least one. A
    // failed get may leave output behind, but only a prefix of the true bytes.
    let failed_get = |remote: &str, stopped: &[u32], all: bool| {
        let out = c.local(&format!("{remote}.failed"));
        let _ = std::fs::remove_file(&out);
        let (line, _) = c.fails(&["get", remote, text(&out)]);
        assert_mentions(&line, &["unavailable", remote]);
        let named: Vec<u32> = (1..=SERVERS)
            .filter(|id| line.contains(&format!("server {id} ")))
            .collect();
        let fits = if all {
            named == stopped
        } else {
            !named.is_empty() && named.iter().all(|id| stopped.contains(id))
        };
        assert!(fits, "'{line}' should name servers {stopped:?}");
        let partial = std::fs::read(&out).unwrap_or_default();
        assert!(
            data_of(remote).starts_with(&partial),
            "{remote}: wrong bytes"
        );
        let (run, _) = c.client(&["get", remote, "-"], None);
        assert_eq!(run.status.code(), Some(1), "get {remote} -: {}", run.stderr);
        assert!(
            data_of(remote).starts_with(&run.stdout),
            "{remote}: wrong bytes"
        );
    };

    c.server("stop", 3);
    failed_get("lost/raid0", &[3], true);
    for remote in ["lost/raid1", "lost/raid5", "lost/hybrid"] {
        assert_bytes(
            &c.get(remote),
            data_of(remote),
            &format!("{remote}, 3 down"),
        );
    }
    let range = c.read("lost/raid5", 100_000, 500_000, false);
    assert_bytes(&range, &data_of("lost/raid5")[100_000..600_000], "range");
    c.assert_states(&[(1, "up"), (2, "up"), (3, "down"), (4, "up"), (5, "up")]);

    c.server("stop", 4);
    // RAID-0 lacks each of them; naming either is right.
    failed_get("lost/raid0", &[3, 4], false);
    failed_get("lost/raid5", &[3, 4], true);
    failed_get("lost/hybrid", &[3, 4], true);
    // Whether RAID-1 survives two losses depends on where the mirrors are; either outcome is
    // fine, wrong bytes are not.
    let out = c.local("raid1.two-down");
    let (run, command) = c.client(&["get", "lost/raid1", text(&out)], None);
    if run.status.success() {
        let got = std::fs::read(&out).expect("fetched");
        assert_bytes(&got, data_of("lost/raid1"), "lost/raid1, 3 and 4 down");
    } else {
        let line = error_line(&run, &command);
        assert_mentions(&line, &["unavailable", "server 3", "server 4"]);
    }

    // Nothing was written while they were down: back, they are up and serve at once.
    c.server("start", 3);
    c.server("start", 4);
    c.assert_states(&[(1, "up"), (2, "up"), (3, "up"), (4, "up"), (5, "up")]);
    for (remote, data) in &files {
        assert_bytes(&c.get(remote), data, &format!("{remote}, all back"));
    }
}

/// `truncate` cuts every scheme's files without writing zeros over what it cuts (what is
/// stored shrinks), leaves parity and mirrors consistent (a scrub repairs nothing, a read
/// with a server stopped gives the same bytes), and shows zeros when a file grows again.
/// With a server down it zeroes instead, and the server is rebuilt to match.
#[test]
fn truncation_discards_what_it_cuts_and_keeps_redundancy() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("truncation_discards_what_it_cuts_and_keeps_redundancy");
    let len = 32 * STRIPE_UNIT_BYTES + 777;
    let cut = 300_001;
    let mut files = Vec::new();
    for scheme in SCHEMES {
        let remote = format!("cut/{scheme}");
        let mut data = random_bytes(&mut rng, len);
        c.put(&remote, &data, scheme);
        // Partial-stripe writes on both sides of the cut: Hybrid overflow entries.
        for at in [cut - 10_000, cut + 400_000] {
            let patch = random_bytes(&mut rng, 5000);
            c.write(&remote, at, &patch);
            data[at..at + 5000].copy_from_slice(&patch);
        }
        let stored = |c: &Cluster| c.stat(&remote)["stored_bytes"].as_u64().expect("stored");
        let before = stored(&c);
        c.ok(&["truncate", &remote, &cut.to_string()]);
        assert_bytes(&c.get(&remote), &data[..cut], &format!("{remote} cut"));
        let after = stored(&c);
        // Writing zeros instead would store as much as before (Hybrid: more, its zeroed
        // stripe tail goes to mirrored overflow entries).
        assert!(
            after < before / 2,
            "{remote}: {after} bytes stored after the cut, {before} before"
        );
        c.ok(&["truncate", &remote, &len.to_string()]);
        data[cut..].fill(0);
        assert_bytes(&c.get(&remote), &data, &format!("{remote} grown again"));
        files.push((remote, data));
    }
    assert_eq!(repairs(&c.ok(&["scrub"])), [0, 0, 0], "nothing to repair");
    c.server("stop", 2);
    for (remote, data) in files.iter().filter(|(r, _)| !r.ends_with("raid0")) {
        assert_bytes(&c.get(remote), data, &format!("{remote}, server 2 down"));
    }
    // Down, the discard cannot reach server 2: zeros are written, and it owes them.
    let (remote, data) = &files[3];
    c.ok(&["truncate", remote, "100000"]);
    assert_bytes(&c.get(remote), &data[..100_000], "cut with a server down");
    c.server("start", 2);
    c.ok(&["rebuild", "2"]);
    c.server("stop", 4);
    assert_bytes(&c.get(remote), &data[..100_000], "server 2 rebuilt, 4 down");
    c.server("start", 4);

    let line = c.fails_with_one_line(&["truncate", "cut/none", "0"]);
    assert_mentions(&line, &["cut/none"]);
    let line = c.fails_with_one_line(&["truncate", remote, "12Q"]);
    assert_mentions(&line, &["bad size"]);
    let line = c.fails_with_one_line(&["truncate", remote, &u64::MAX.to_string()]);
    assert_mentions(&line, &["maximum size"]);
    assert_bytes(
        &c.get(remote),
        &data[..100_000],
        "after refused truncations",
    );
}

/// Test 6: a server whose disk was wiped comes back stale, is rebuilt, and then its contents
/// alone (with another server stopped) give back every byte.
#[test]
fn wiped_server_is_rebuilt_exactly() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("wiped_server_is_rebuilt_exactly");
    let stripe = 4 * STRIPE_UNIT_BYTES;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (remote, scheme, size, partial_writes) in [
        ("rb/raid5-big", "raid5", 3 * stripe + 999, 0),
        ("rb/raid5-small", "raid5", 5000, 0),
        ("rb/hybrid-big", "hybrid", 3 * stripe + 4321, 12),
        ("rb/hybrid-small", "hybrid", 3000, 2),
    ] {
        let mut data = random_bytes(&mut rng, size);
        c.put(remote, &data, scheme);
        for _ in 0..partial_writes {
            let len = rng.gen_range(1..6000);
            let offset = rng.gen_range(0..data.len() + 2000);
            let patch = random_bytes(&mut rng, len);
            c.write(remote, offset, &patch);
            if data.len() < offset + len {
                data.resize(offset + len, 0);
            }
            data[offset..offset + len].copy_from_slice(&patch);
        }
        files.push((remote.to_string(), data));
    }
    let hybrid = c.file_id("rb/hybrid-big");
    c.server_holding(hybrid, "overflow", 1, &[]);

    c.server("stop", 2);
    let store = c.dir.join("server-2");
    std::fs::remove_dir_all(&store).expect("wipe server 2");
    c.server("start", 2);
    c.assert_states(&[(1, "up"), (2, "stale"), (3, "up"), (4, "up"), (5, "up")]);
    // A stale server holds nothing; reads must not take its (empty) word for anything.
    for (remote, data) in &files {
        assert_bytes(&c.get(remote), data, &format!("{remote}, 2 stale"));
    }

    let out = c.ok(&["rebuild", "2"]);
    assert!(
        out.contains("server 2 rebuilt") && out.contains(&format!("in {} files", files.len())),
        "rebuild output: {out}"
    );
    c.assert_states(&[(1, "up"), (2, "up"), (3, "up"), (4, "up"), (5, "up")]);
    // Every column of a file of several stripes holds data units.
    for remote in ["rb/raid5-big", "rb/hybrid-big"] {
        let id = c.file_id(remote);
        let data = std::fs::metadata(c.stored(2, id, "data")).map(|m| m.len());
        assert!(data.unwrap_or(0) > 0, "{remote} is back on server 2");
    }
    let scrub = c.ok(&["scrub"]);
    assert_eq!(
        repairs(&scrub),
        [0, 0, 0],
        "a clean rebuild leaves nothing to repair"
    );

    for victim in [4, 1] {
        c.server("stop", victim);
        for (remote, data) in &files {
            let what = format!("{remote}, 2 rebuilt and {victim} down");
            assert_bytes(&c.get(remote), data, &what);
        }
        c.server("start", victim);
    }
}

/// Test 7: a flipped byte is caught by its checksum and repaired, by a read or by a scrub,
/// in data, parity and mirror files alike.
#[test]
fn flipped_bytes_are_repaired_by_read_and_scrub() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("flipped_bytes_are_repaired_by_read_and_scrub");
    let data = random_bytes(&mut rng, 3 * 4 * STRIPE_UNIT_BYTES + 1234);
    c.put("sc/raid5", &data, "raid5");
    let id = c.file_id("sc/raid5");

    // Flip, let `repair` run, and check the file on disk is exactly what it was.
    let damage_and_repair = |server: u32, id: u64, name: &str, offset: u64, repair: &dyn Fn()| {
        let path = c.stored(server, id, name);
        let before = std::fs::read(&path).expect("stored file");
        let offset = offset.min(before.len() as u64 - 1);
        flip_byte(&path, offset);
        repair();
        let after = std::fs::read(&path).expect("stored file");
        let what = format!("server {server} {name} of file {id} after a flip at {offset}");
        assert_bytes(&after, &before, &what);
    };
    let scrub_repairs_one = |remote: Option<&str>| {
        let mut args = vec!["scrub"];
        args.extend(remote);
        let out = c.ok(&args);
        assert_eq!(repairs(&out).iter().sum::<u64>(), 1, "scrub output:\n{out}");
        assert_eq!(repairs(&c.ok(&args)), [0, 0, 0], "second scrub");
    };

    let first = c.server_holding(id, "data", 8192, &[]);
    damage_and_repair(first, id, "data", 5000, &|| {
        assert_bytes(&c.get("sc/raid5"), &data, "read over a flipped byte");
    });
    assert_eq!(
        repairs(&c.ok(&["scrub"])),
        [0, 0, 0],
        "read-repair left work"
    );

    let second = c.server_holding(id, "data", 8192, &[first]);
    damage_and_repair(second, id, "data", 70_000, &|| {
        let out = c.ok(&["scrub"]);
        assert_eq!(repairs(&out)[0], 1, "one corrupt block repaired:\n{out}");
        assert_eq!(repairs(&c.ok(&["scrub"])), [0, 0, 0], "second scrub");
    });

    let parity = c.server_holding(id, "redundancy", 8192, &[]);
    damage_and_repair(parity, id, "redundancy", 4096 + 17, &|| {
        scrub_repairs_one(None)
    });

    let mirrored = random_bytes(&mut rng, 2 * 5 * STRIPE_UNIT_BYTES + 99);
    c.put("sc/raid1", &mirrored, "raid1");
    let id1 = c.file_id("sc/raid1");
    let mirror = c.server_holding(id1, "redundancy", 8192, &[]);
    damage_and_repair(mirror, id1, "redundancy", 9000, &|| {
        scrub_repairs_one(Some("sc/raid1"))
    });

    assert_bytes(&c.get("sc/raid5"), &data, "sc/raid5 at the end");
    assert_bytes(&c.get("sc/raid1"), &mirrored, "sc/raid1 at the end");
}

/// Every file under `dir` that has bytes, in a stable order.
fn files_with_bytes(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("list a store directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Flip one bit of a file in place.
fn flip_bit(path: &Path, bit: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, bit / 8)
        .expect("read the byte");
    byte[0] ^= 1 << (bit % 8);
    file.write_all_at(&byte, bit / 8).expect("write the byte");
}

/// Test 7b (issue 15, item 3): one flipped bit in any file of a stopped server's directory.
/// After a restart `get` is exact, `scrub` repairs what it finds (a second scrub finds
/// nothing), and a degraded `get` without that server is exact. A flipped bit in `store.toml`
/// keeps the server from starting, with its log naming the file; the documented recovery
/// (start it on an empty directory, `rebuild`) restores it. The first flip is the issue's
/// reproduction: the first record of a Hybrid file's `overflow.log`, read before any scrub;
/// the third is another server's log, scrubbed before any read (so scrub alone decides which
/// copy is right). `TESSERA_CLI_FLIPS` sets the
/// number of flips (default 10).
#[test]
fn bit_flips_in_a_stopped_servers_directory_are_found_served_and_scrubbed() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("bit_flips_in_a_stopped_servers_directory");
    let flips: usize = std::env::var("TESSERA_CLI_FLIPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let stripe = 4 * STRIPE_UNIT_BYTES;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (remote, scheme, size, partial_writes) in [
        ("bf/hybrid", "hybrid", 3 * stripe + 4321, 24),
        ("bf/raid5", "raid5", 2 * stripe + 999, 4),
        ("bf/raid1", "raid1", stripe + 77, 2),
    ] {
        let mut data = random_bytes(&mut rng, size);
        c.put(remote, &data, scheme);
        for _ in 0..partial_writes {
            let len = rng.gen_range(1..6000);
            let offset = rng.gen_range(0..data.len() - len);
            let patch = random_bytes(&mut rng, len);
            c.write(remote, offset, &patch);
            data[offset..offset + len].copy_from_slice(&patch);
        }
        files.push((remote.to_string(), data));
    }
    // `put` and `write` sync before they return: everything is durable on every server.
    let hybrid = c.file_id("bf/hybrid");
    let check_all = |what: &str| {
        for (remote, data) in &files {
            assert_bytes(&c.get(remote), data, &format!("{remote}: {what}"));
        }
    };
    let mut scrub_totals = [0u64; 3];
    for flip in 0..flips {
        let (server, path) = match flip {
            0 | 2 => {
                // The servers with the longest logs (entries of both roles, most likely).
                let log_len = |s: &u32| {
                    std::fs::metadata(c.stored(*s, hybrid, "overflow.log")).map_or(0, |m| m.len())
                };
                let mut by_length: Vec<u32> = (1..=SERVERS).collect();
                by_length.sort_by_key(|s| std::cmp::Reverse(log_len(s)));
                let server = by_length[flip / 2];
                assert!(log_len(&server) >= 12 + 3 * 36, "too few overflow records");
                (server, c.stored(server, hybrid, "overflow.log"))
            }
            1 => {
                let server = rng.gen_range(1..=SERVERS);
                let store = c.dir.join(format!("server-{server}"));
                (server, store.join("store.toml"))
            }
            _ => {
                let server = rng.gen_range(1..=SERVERS);
                let candidates = files_with_bytes(&c.dir.join(format!("server-{server}")));
                (
                    server,
                    candidates[rng.gen_range(0..candidates.len())].clone(),
                )
            }
        };
        c.server("stop", server);
        let len = std::fs::metadata(&path).expect("stored file").len();
        // A log flip lands in the first record: every record after it counts.
        let bits = if flip == 0 || flip == 2 {
            12 * 8..48 * 8
        } else {
            0..len * 8
        };
        let bit = rng.gen_range(bits);
        flip_bit(&path, bit);
        let what = format!(
            "flip {flip}: bit {bit} of {} on server {server}",
            path.display()
        );
        println!("{what}");
        if path.ends_with("store.toml") {
            let id = server.to_string();
            let args = ["server", "start", &id, "--dir", text(&c.dir)];
            let run = tessera(&args, None);
            assert!(!run.status.success(), "{what}: {}", run.describe("start"));
            let log = c.dir.join(format!("server-{server}.log"));
            let log = std::fs::read_to_string(&log).expect("server log");
            assert!(
                log.contains("store.toml") && log.contains("checksum"),
                "{what}: the server's log does not name the damaged file:\n{log}"
            );
            check_all(&format!("{what}, server refused to start"));
            let store = c.dir.join(format!("server-{server}"));
            let away = store.with_extension(format!("damaged-{flip}"));
            std::fs::rename(&store, away).expect("move it away");
            c.server("start", server);
            c.ok(&["rebuild", &id]);
        } else {
            c.server("start", server);
            // Reads repair what they meet; scrubbing first leaves every decision to scrub.
            let scrub_first = flip == 2 || (flip > 2 && rng.gen_bool(0.5));
            if !scrub_first {
                check_all(&what);
            }
            let out = c.ok(&["scrub"]);
            for (total, count) in scrub_totals.iter_mut().zip(repairs(&out)) {
                *total += count;
            }
            let again = c.ok(&["scrub"]);
            assert_eq!(repairs(&again), [0, 0, 0], "{what}: second scrub:\n{again}");
            check_all(&format!("{what}, scrubbed"));
        }
        let other = (server % SERVERS) + 1;
        for victim in [server, other] {
            c.server("stop", victim);
            check_all(&format!("{what}, then server {victim} stopped"));
            c.server("start", victim);
        }
    }
    println!("scrub repaired (corrupt, parity, mirror) over {flips} flips: {scrub_totals:?}");
}

/// Test 8: the manager's namespace survives `down` and `up` on the same directory.
#[test]
fn restarted_cluster_keeps_its_files() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("restarted_cluster_keeps_its_files");
    let mut files: Vec<(String, &str, Vec<u8>)> = Vec::new();
    for (remote, scheme, size) in [
        ("keep/raid5", "raid5", 700_001),
        ("keep/hybrid", "hybrid", 12_345),
        ("keep/raid1", "raid1", 1),
    ] {
        let data = random_bytes(&mut rng, size);
        c.put(remote, &data, scheme);
        files.push((remote.to_string(), scheme, data));
    }
    c.down();
    c.up();
    c.assert_states(&[(1, "up"), (2, "up"), (3, "up"), (4, "up"), (5, "up")]);
    let listing = c.ok(&["ls"]);
    for (remote, scheme, data) in &files {
        let want = format!("{} {scheme} {remote}", data.len());
        let listed = listing
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == want);
        assert!(listed, "'{want}' not in ls:\n{listing}");
        assert_bytes(&c.get(remote), data, &format!("{remote} after restart"));
    }
    // New files get new ids: they must not land on the old files' stored bytes.
    let fresh = random_bytes(&mut rng, 300_000);
    c.put("keep/fresh", &fresh, "raid5");
    assert_bytes(&c.get("keep/fresh"), &fresh, "keep/fresh");
    for (remote, _, data) in &files {
        assert_bytes(&c.get(remote), data, &format!("{remote} after a new put"));
    }
}

/// RAID-0 has no redundancy: a corrupt block or a wiped server must give a clean error naming
/// the server, never a crash or wrong bytes; once the lost file is removed, a rebuild completes.
#[test]
fn raid0_damage_fails_cleanly() {
    let c = Cluster::start(SERVERS);
    let mut rng = seeded("raid0_damage_fails_cleanly");
    let striped = random_bytes(&mut rng, 2 * 5 * STRIPE_UNIT_BYTES + 77);
    let parity = random_bytes(&mut rng, 300_000);
    c.put("z/raid0", &striped, "raid0");
    c.put("a/raid5", &parity, "raid5");

    let id = c.file_id("z/raid0");
    let server = c.server_holding(id, "data", 8192, &[]);
    flip_byte(&c.stored(server, id, "data"), 4096 + 3);
    let (line, _) = c.fails(&["get", "z/raid0", text(&c.local("r0.out"))]);
    assert_mentions(&line, &[&format!("server {server} "), "corrupt"]);
    let (line, run) = c.fails(&["scrub", "z/raid0"]);
    assert_mentions(&line, &["could not be repaired"]);
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        report.contains(&format!(
            "unrepairable: z/raid0 stripe 0: corrupt blocks on servers [{server}]"
        )),
        "scrub output:\n{report}"
    );
    c.ok(&["rm", "z/raid0"]);

    // Wipe a server under a RAID-0 file: the rebuild cannot restore it and says which file.
    c.put("z/raid0", &striped, "raid0");
    c.server("stop", 2);
    std::fs::remove_dir_all(c.dir.join("server-2")).expect("wipe server 2");
    c.server("start", 2);
    let (line, _) = c.fails(&["get", "z/raid0", text(&c.local("r0.out"))]);
    assert_mentions(&line, &["unavailable", "server 2 "]);
    let (line, _) = c.fails(&["rebuild", "2"]);
    assert_mentions(&line, &["z/raid0", "server 2 "]);
    // Everything else was rebuilt; server 2 stays stale only for the lost raid0 file.
    c.assert_states(&[(1, "up"), (2, "stale"), (3, "up"), (4, "up"), (5, "up")]);
    // Once the lost file is removed, the rebuild completes.
    c.ok(&["rm", "z/raid0"]);
    c.ok(&["rebuild", "2"]);
    c.assert_states(&[(1, "up"), (2, "up"), (3, "up"), (4, "up"), (5, "up")]);
    c.server("stop", 4);
    assert_bytes(&c.get("a/raid5"), &parity, "a/raid5 after the rebuild");
}

/// Issue 18, admission control: with the hosts' link rate configured on the manager, a
/// reserved stream that does not fit on a link is refused at once with one line naming the
/// link and what is left, and one that fits runs; its reservation is given back at the end.
#[test]
fn reservations_that_do_not_fit_a_link_are_refused() {
    let c = Cluster::start_with_env(3, &[("TESSERA_LINK_RATE", "10MB/s")]);
    let data = random_bytes(&mut seeded("admitted"), 1_000_000);
    // RAID-5 over 3 servers: a stream puts half its rate on each server's link (10 MB/s of
    // payload, 10.69 on the wire: 1,416 payload bytes per 1,514-byte frame), of which
    // 9 MB/s (0.9 of 10 MB/s) is reservable.
    c.put("admitted", &data, "raid5");
    let got = c.local("admitted.got");
    let line = c.fails_with_one_line(&["get", "admitted", text(&got), "--rate", "20MB/s"]);
    assert_mentions(
        &line,
        &[
            "reservation refused: server",
            "has 9.00 MB/s of 9.00 MB/s reservable left, 10.69 MB/s asked",
            "--link-rate",
        ],
    );
    assert!(!got.exists(), "a refused get writes nothing");
    // The client's host link carries what the stream asks of all three servers' (3.75 MB/s
    // each at 7 MB/s): 11.23 MB/s does not fit in its 9, though each server's link has room.
    let line = c.fails_with_one_line(&["get", "admitted", text(&got), "--rate", "7MB/s"]);
    assert_mentions(
        &line,
        &[
            "reservation refused: client 127.0.0.1 has 9.00 MB/s",
            "11.23 MB/s asked",
        ],
    );
    // One that fits runs, twice in a row: the first gave its reservation back.
    for _ in 0..2 {
        c.ok(&["get", "admitted", text(&got), "--rate", "5MB/s"]);
        assert_eq!(std::fs::read(&got).unwrap(), data);
    }
    // A refused put leaves the old file as it was.
    let local = c.local("admitted.new");
    std::fs::write(&local, b"new contents").unwrap();
    let line = c.fails_with_one_line(&[
        "put",
        text(&local),
        "admitted",
        "--scheme",
        "raid5",
        "--rate",
        "20MB/s",
    ]);
    assert_mentions(&line, &["reservation refused", "admitted is unchanged"]);
    c.ok(&["get", "admitted", text(&got)]);
    assert_eq!(std::fs::read(&got).unwrap(), data);
}

/// Issue 18: a reserved stream is paced at its rate (put and get, over UDP) and reports its
/// periods and deadlines; bad rates and periods fail with one line.
#[test]
fn reserved_streams_are_paced_and_report_their_deadlines() {
    for (args, words) in [
        (
            &["put", "x", "y", "--rate", "0"][..],
            &["rate '0'", "at least 1 byte/s"][..],
        ),
        (
            &["put", "x", "y", "--rate=-5MB/s"],
            &["-5MB/s", "at least 1 byte/s"],
        ),
        (&["get", "y", "x", "--rate", "fast"], &["bad rate 'fast'"]),
        (
            &[
                "read", "y", "0", "1", "x", "--rate", "1MB/s", "--period", "0s",
            ],
            &["period '0s'", "1ms"],
        ),
        (
            &[
                "write", "y", "0", "x", "--rate", "1MB/s", "--period", "soon",
            ],
            &["bad period 'soon'"],
        ),
    ] {
        let line = fails_alone_with_one_line(args);
        assert_mentions(&line, words);
    }

    let c = Cluster::start(3);
    let data = random_bytes(&mut seeded("reserved"), 10_000_000);
    let local = c.local("reserved");
    std::fs::write(&local, &data).expect("local file");
    let started = Instant::now();
    let out = c.ok(&[
        "put",
        text(&local),
        "reserved",
        "--scheme",
        "raid5",
        "--rate",
        "5MB/s",
        "--json",
    ]);
    let put_elapsed = started.elapsed();
    let report: Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("put --json: {e}:\n{out}"));
    eprintln!("put at 5MB/s: {put_elapsed:?}, {report}");
    assert_eq!(report["bytes"], 10_000_000);
    assert_eq!(report["periods"], 2);
    let judged =
        report["deadlines_met"].as_u64().unwrap() + report["deadlines_missed"].as_u64().unwrap();
    assert_eq!(judged, 2);
    // Chunks of a reserved stream are about a quarter of a period's budget (here 9 stripes
    // of 128 KiB), each released at the start of its period: the second 5 MB at 1 s.
    assert!(
        report["elapsed_us"].as_u64().unwrap() >= 1_000_000,
        "{report}"
    );

    let got = c.local("reserved.got");
    let out = c.ok(&[
        "get",
        "reserved",
        text(&got),
        "--rate",
        "5MB/s",
        "--period",
        "500ms",
    ]);
    eprintln!("get at 5MB/s: {out}");
    assert!(out.contains("4 periods"), "{out}");
    assert_bytes(
        &std::fs::read(&got).expect("fetched"),
        &data,
        "reserved get",
    );
}

/// Issue 18, adversary: a reserved client SIGKILLed mid-stream never releases its
/// reservation; the manager keeps it until its lease lapses (a stream the size of the link's
/// rest is refused meanwhile), then admits the same stream again. A leaked reservation would
/// refuse it for ever.
#[test]
fn a_killed_reserved_clients_reservation_lapses_with_its_lease() {
    let c = Cluster::start_with_env(3, &[("TESSERA_LINK_RATE", "10MB/s")]);
    let data = random_bytes(&mut seeded("killed reserved"), 25_000_000);
    c.put("long", &data, "raid5");
    // At 5 MB/s the get takes about 5 s; the client's link has 9 MB/s reservable and one
    // such stream asks about 8 (see `reservations_that_do_not_fit_a_link_are_refused`).
    let got = c.local("long.got");
    let file = c.cluster_file();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--cluster", text(&file), "get", "long", text(&got)])
        .args(["--rate", "5MB/s"])
        .env_remove("TESSERA_CLUSTER")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the reserved get");
    // The output file is made only after the reservation was admitted.
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while std::fs::metadata(&got).map_or(true, |m| m.len() == 0) {
        assert!(child.try_wait().unwrap().is_none(), "the get ended early");
        assert!(Instant::now() < deadline, "the reserved get never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("SIGKILL the reserved get");
    let killed = Instant::now();
    child.wait().unwrap();
    let again = c.local("long.again");
    let args = ["get", "long", text(&again), "--rate", "5MB/s"];
    let line = c.fails_with_one_line(&args);
    assert_mentions(&line, &["reservation refused: client 127.0.0.1"]);
    // Admitted again once the lease (10 s from the last renewal, renewed at a third of it)
    // has lapsed, and not long after.
    let lapsed = loop {
        let tried = killed.elapsed();
        let (run, command) = c.client(&args, None);
        if run.status.success() {
            break tried;
        }
        assert_mentions(&run.stderr, &["reservation refused"]);
        assert!(
            killed.elapsed() < Duration::from_secs(25),
            "still refused {:?} after the kill: {}",
            killed.elapsed(),
            run.describe(&command)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("admitted again {lapsed:?} after the kill");
    assert!(
        lapsed >= Duration::from_secs(5),
        "admitted after {lapsed:?}"
    );
    assert_bytes(
        &std::fs::read(&again).expect("fetched"),
        &data,
        "get after the lapse",
    );
}

/// `bench --against-minio` refuses a missing MinIO binary and an object size out of range
/// with one line, before it starts any cluster.
#[test]
fn bench_against_minio_refuses_bad_input_first() {
    let line = fails_alone_with_one_line(&["bench", "--against-minio", "/nonexistent/minio"]);
    assert_mentions(&line, &["no MinIO binary", "/nonexistent/minio"]);
    // Any existing file passes the first check; the size is refused before it is run.
    let some_file = env!("CARGO_BIN_EXE_tessera");
    let args = ["bench", "--against-minio", some_file, "--object-size"];
    let line = fails_alone_with_one_line(&[&args[..], &["0"]].concat());
    assert_mentions(&line, &["--object-size", "at least one byte"]);
    let line = fails_alone_with_one_line(&[&args[..], &["17G"]].concat());
    assert_mentions(&line, &["--object-size", "over 16 GiB"]);
}
