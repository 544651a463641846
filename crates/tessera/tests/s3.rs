//! The S3 gateway driven by a real client: `tessera s3` over a local cluster (`tessera up`, five
//! servers on 127.0.0.1), and boto3 (`tests/s3/client.py`) putting, getting (whole and by
//! ranges), listing (v1 and v2, prefix, delimiter, pages) and deleting, with every byte checked,
//! and bad input (wrong or missing signatures, malformed XML, `..` and NUL in keys, missing
//! buckets and keys) answered with S3's error codes while the gateway stays up.
//! A gateway SIGKILLed mid-PUT and mid-part loses nothing acknowledged (`tests/s3/killed.py`).
//!
//! Needs `python3` with boto3 (Debian: `apt-get install python3-boto3`); without them the test
//! fails saying so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

mod command;
use command::{tessera, text};

const ACCESS_KEY: &str = "TESSERATESTACCESSKEY";
const SECRET_KEY: &str = "tessera/test/secret/key/0123456789abcdefg";

/// A local cluster and a gateway over it, both stopped when dropped (also on panic).
struct Gateway {
    cluster: PathBuf,
    child: Child,
    endpoint: String,
    /// Where it serves its Prometheus metrics.
    metrics: String,
    /// The extra `tessera s3` arguments it was started with.
    extra: Vec<String>,
    _root: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = tessera(&["down", "--dir", text(&self.cluster)]);
    }
}

impl Gateway {
    fn start() -> Gateway {
        Gateway::start_with(&[])
    }

    /// A gateway started with these extra `tessera s3` arguments.
    fn start_with(extra: &[&str]) -> Gateway {
        let root = tempfile::Builder::new()
            .prefix("tessera-s3-")
            .tempdir()
            .expect("temporary directory");
        let cluster = root.path().join("cluster");
        let up = tessera(&["up", "--servers", "5", "--dir", text(&cluster), "--detach"]);
        assert!(
            up.status.success(),
            "tessera up: {}",
            String::from_utf8_lossy(&up.stderr)
        );
        let metrics = free_port();
        let extra: Vec<String> = extra.iter().map(|arg| arg.to_string()).collect();
        let (child, endpoint) = launch(root.path(), &cluster, &metrics, &extra);
        Gateway {
            cluster,
            child,
            endpoint,
            metrics,
            extra,
            _root: root,
        }
    }

    /// SIGKILL the gateway and start a new one over the same cluster (new addresses).
    fn kill_and_restart(&mut self) {
        self.child.kill().expect("SIGKILL tessera s3");
        self.child.wait().expect("wait for tessera s3");
        self.metrics = free_port();
        let root = self._root.path();
        let (child, endpoint) = launch(root, &self.cluster, &self.metrics, &self.extra);
        (self.child, self.endpoint) = (child, endpoint);
    }

    fn running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("wait for tessera s3")
            .is_none()
    }
}

/// A port free a moment ago (another process could take it first: then the gateway fails to
/// start, loudly).
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string()
}

/// Starts `tessera s3` over the cluster in `cluster` and waits until it listens: the process
/// and its endpoint.
fn launch(root: &Path, cluster: &Path, metrics: &str, extra: &[String]) -> (Child, String) {
    let addr_file = root.join("s3.addr");
    let _ = std::fs::remove_file(&addr_file);
    let config = cluster.join("cluster.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--cluster", text(&config), "s3", "--listen", "127.0.0.1:0"])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .args(["--addr-file", text(&addr_file), "--metrics", metrics])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cannot start tessera s3");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !addr_file.exists() {
        assert!(
            Instant::now() < deadline,
            "tessera s3 did not start listening in 30 s"
        );
        let exited = child.try_wait().expect("wait for tessera s3");
        assert!(
            exited.is_none(),
            "tessera s3 exited at start-up: {exited:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let addr = std::fs::read_to_string(&addr_file).expect("address file");
    (child, format!("http://{addr}"))
}

/// Fail, not skip, when the client is missing: CI installs it.
fn require_boto3() {
    let probe = Command::new("python3")
        .args(["-c", "import boto3"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "boto3 is missing (install python3-boto3): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("python3 is missing (install python3 and python3-boto3): {e}"),
    }
}

#[test]
fn boto3_drives_the_gateway() {
    require_boto3();
    let mut gateway = Gateway::start();
    let seed = std::env::var("TESSERA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    println!("boto3_drives_the_gateway: TESSERA_TEST_SEED={seed}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/client.py");
    let run = Command::new("python3")
        .arg(&script)
        .args([&gateway.endpoint, ACCESS_KEY, SECRET_KEY, &seed.to_string()])
        .output()
        .expect("cannot run python3");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the boto3 client failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    assert!(stdout.contains("ok: every check passed"), "{stdout}");
    assert!(gateway.running(), "the gateway exited during the run");
    assert_counted_requests(&gateway.metrics);

    // The object the client left is a plain file of the cluster, laid out as its headers said.
    let config = gateway.cluster.join("cluster.toml");
    let cli = |args: &[&str]| {
        let mut full = vec!["--cluster", text(&config)];
        full.extend_from_slice(args);
        let out = tessera(&full);
        assert!(
            out.status.success(),
            "tessera {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let got = cli(&["get", "kept/raid5/obj", "-"]);
    assert_eq!(got, "kept by the gateway\n".repeat(1000).as_bytes());
    let stat: serde_json::Value =
        serde_json::from_slice(&cli(&["stat", "kept/raid5/obj", "--json"])).expect("stat JSON");
    let layout = (&stat["scheme"], &stat["stripe_unit"], &stat["width"]);
    assert_eq!(
        layout,
        (&"raid5".into(), &16384.into(), &3.into()),
        "layout from the headers: {stat}"
    );
    let listed = String::from_utf8(cli(&["ls", ".s3/buckets/"])).expect("text");
    assert!(
        listed.contains(".s3/buckets/kept"),
        "bucket marker: {listed}"
    );
}

/// The gateway SIGKILLed in the middle of a PUT that replaces an object and of a multipart
/// part (`tests/s3/killed.py`): a new gateway over the same cluster serves the old object
/// whole with its ETag and lists nothing else; the multipart upload survives with its
/// finished part, takes the lost part again and completes to the right bytes.
#[test]
fn a_gateway_killed_mid_put_loses_nothing_acknowledged() {
    require_boto3();
    let mut gateway = Gateway::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/killed.py");
    let mut before = Command::new("python3")
        .arg(&script)
        .args(["before", &gateway.endpoint, ACCESS_KEY, SECRET_KEY])
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run python3");
    let mut line = String::new();
    let mut out = std::io::BufReader::new(before.stdout.take().expect("piped stdout"));
    std::io::BufRead::read_line(&mut out, &mut line).expect("read the client's output");
    let upload = line.strip_prefix("sent ").map(str::trim);
    let Some(upload) = upload.filter(|id| !id.is_empty()) else {
        let _ = before.kill();
        panic!("the client did not start its torn writes: {line:?}");
    };
    let upload = upload.to_string();
    gateway.kill_and_restart();
    let _ = before.kill();
    let _ = before.wait();
    let after = Command::new("python3")
        .arg(&script)
        .args(["after", &gateway.endpoint, ACCESS_KEY, SECRET_KEY, &upload])
        .output()
        .expect("cannot run python3");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&after.stdout),
        String::from_utf8_lossy(&after.stderr),
    );
    assert!(
        after.status.success(),
        "after the kill:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok"), "{stdout}");
    assert!(gateway.running(), "the new gateway exited");
}

/// The gateway's metrics count what the boto3 run did: puts, gets, multipart parts, and the
/// refused requests (bad signatures, missing keys) as errors.
fn assert_counted_requests(metrics: &str) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metrics).expect("connect to the metrics port");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut scrape = String::new();
    stream.read_to_string(&mut scrape).expect("read");
    let value = |name: &str| -> f64 {
        scrape
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    for kind in ["PUT object", "GET object", "PUT object part"] {
        let name = format!("tessera_s3_requests_total{{kind=\"{kind}\"}}");
        assert!(value(&name) >= 1.0, "{name} not counted:\n{scrape}");
    }
    let errors: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("tessera_s3_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "no refusal counted:\n{scrape}");
    let put_bytes = value("tessera_s3_received_bytes_total{kind=\"PUT object\"}");
    assert!(put_bytes >= 19_000.0, "object bytes received: {put_bytes}");
}

/// `tessera up --s3` starts the gateway with the cluster, writes its endpoint and keys into
/// `cluster.toml`, serves boto3 with them (and refuses other keys), keeps the keys across a
/// restart of the cluster, and `tessera down` stops it.
#[test]
fn up_starts_the_gateway_with_the_cluster() {
    require_boto3();
    let root = tempfile::Builder::new()
        .prefix("tessera-up-s3-")
        .tempdir()
        .expect("temporary directory");
    let dir = root.path().join("cluster");
    // Stops the cluster (and its gateway) on every way out, a failed assertion included.
    struct Down(PathBuf);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = tessera(&["down", "--dir", text(&self.0)]);
        }
    }
    let _down = Down(dir.clone());
    let read_file = || -> toml::Value {
        let text = std::fs::read_to_string(dir.join("cluster.toml")).expect("cluster.toml");
        toml::from_str(&text).expect("cluster.toml is TOML")
    };
    let field = |file: &toml::Value, name: &str| -> String {
        file.get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("cluster.toml has no {name}: {file}"))
            .to_string()
    };
    let mut keys = Vec::new();
    for round in 0..2 {
        let up_s3 = tessera(&[
            "up",
            "--servers",
            "3",
            "--dir",
            text(&dir),
            "--detach",
            "--s3",
            "127.0.0.1:0",
        ]);
        assert!(
            up_s3.status.success(),
            "tessera up --s3: {}",
            String::from_utf8_lossy(&up_s3.stderr)
        );
        let stdout = String::from_utf8_lossy(&up_s3.stdout).to_string();
        let file = read_file();
        let (endpoint, access, secret) = (
            field(&file, "s3_endpoint"),
            field(&file, "s3_access_key"),
            field(&file, "s3_secret_key"),
        );
        assert!(stdout.contains(&endpoint), "round {round}: {stdout}");
        let pid = file["s3_process"]["pid"].as_integer().expect("gateway pid") as i32;
        let script = format!(
            r#"
import boto3, botocore
from botocore.config import Config
def client(secret):
    return boto3.client("s3", endpoint_url="{endpoint}", aws_access_key_id="{access}",
        aws_secret_access_key=secret, region_name="us-east-1",
        config=Config(s3={{"addressing_style": "path"}}, retries={{"max_attempts": 1}}))
s3 = client("{secret}")
if {round} == 0:
    s3.create_bucket(Bucket="up-bucket")
    s3.put_object(Bucket="up-bucket", Key="k", Body=b"through up --s3")
assert s3.get_object(Bucket="up-bucket", Key="k")["Body"].read() == b"through up --s3"
try:
    client("not-the-secret").list_buckets()
    raise SystemExit("a wrong secret was accepted")
except botocore.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] == "SignatureDoesNotMatch", e.response
print("ok")
"#
        );
        let run = Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3");
        assert!(
            run.status.success() && String::from_utf8_lossy(&run.stdout).contains("ok"),
            "round {round}: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        keys.push((access, secret));
        let down = tessera(&["down", "--dir", text(&dir)]);
        assert!(down.status.success());
        // SAFETY: kill with signal 0 only asks whether the process exists. A zombie (exited,
        // not yet reaped by whoever adopted it) counts as stopped.
        let exists = unsafe { libc::kill(pid, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
        });
        let alive = exists && !zombie;
        assert!(
            !alive,
            "round {round}: the gateway (pid {pid}) outlived tessera down"
        );
    }
    assert_eq!(keys[0], keys[1], "the keys changed across a restart");
}

/// Fail, not skip, when rclone is missing: CI installs it.
fn require_rclone() {
    match Command::new("rclone").arg("version").output() {
        Ok(out) if out.status.success() => {}
        _ => panic!("rclone is missing (install it: apt-get install rclone)"),
    }
}

/// A second client, rclone, moves a 1 GiB object through the gateway: a multipart upload of
/// 16 MiB parts four at a time, a listing, a whole download and ranged reads, every byte
/// compared, then a delete.
#[test]
fn rclone_moves_a_one_gib_object() {
    require_rclone();
    let gateway = Gateway::start();
    let work = tempfile::Builder::new()
        .prefix("tessera-rclone-")
        .tempdir()
        .expect("temporary directory");
    const SIZE: u64 = 1 << 30;
    let source = work.path().join("one.bin");
    write_pattern(&source, SIZE);
    let rclone = |args: &[&str]| -> Output {
        let out = Command::new("rclone")
            .args(args)
            .args(["--s3-upload-cutoff", "16M", "--s3-chunk-size", "16M"])
            .args([
                "--transfers",
                "4",
                "--s3-upload-concurrency",
                "4",
                "--low-level-retries",
                "1",
            ])
            .env("RCLONE_CONFIG_T_TYPE", "s3")
            .env("RCLONE_CONFIG_T_PROVIDER", "Other")
            .env("RCLONE_CONFIG_T_ENDPOINT", &gateway.endpoint)
            .env("RCLONE_CONFIG_T_ACCESS_KEY_ID", ACCESS_KEY)
            .env("RCLONE_CONFIG_T_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("RCLONE_CONFIG_T_REGION", "us-east-1")
            .env("RCLONE_CONFIG_T_FORCE_PATH_STYLE", "true")
            .env("RCLONE_CONFIG", "/dev/null")
            // rclone 1.60 cannot use a CA bundle with its HTTP transport (and needs none here).
            .env_remove("AWS_CA_BUNDLE")
            .output()
            .expect("cannot run rclone");
        assert!(
            out.status.success(),
            "rclone {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    rclone(&["mkdir", "t:big"]);
    let started = Instant::now();
    rclone(&["copyto", text(&source), "t:big/one.bin"]);
    let put = started.elapsed();
    let listed = String::from_utf8(rclone(&["lsjson", "t:big"]).stdout).expect("text");
    assert!(
        listed.contains("\"Path\":\"one.bin\"") && listed.contains(&format!("\"Size\":{SIZE}")),
        "listing: {listed}"
    );
    let copy = work.path().join("back.bin");
    let started = Instant::now();
    rclone(&["copyto", "t:big/one.bin", text(&copy)]);
    let get = started.elapsed();
    assert_same_files(&source, &copy);
    for (offset, count) in [
        (0u64, 1u64),
        (SIZE - 1, 1),
        (123_456_789, 20 << 20),
        (16 << 20, 16 << 20),
    ] {
        let out = rclone(&[
            "cat",
            "--offset",
            &offset.to_string(),
            "--count",
            &count.to_string(),
            "t:big/one.bin",
        ]);
        assert_eq!(out.stdout, pattern(offset, count), "range {offset}+{count}");
    }
    rclone(&["deletefile", "t:big/one.bin"]);
    rclone(&["rmdir", "t:big"]);
    // Bodies stream: the gateway holds a few chunks per transfer, never the object.
    let peak = command::process_memory_bytes(gateway.child.id(), "VmHWM");
    println!(
        "rclone, 1 GiB through the gateway (debug build): put {:.1} s, get {:.1} s, the \
         gateway's peak resident memory {} MiB",
        put.as_secs_f64(),
        get.as_secs_f64(),
        peak >> 20
    );
    assert!(
        peak < SIZE / 2,
        "the gateway's peak resident memory was {} MiB for a 1 GiB object",
        peak >> 20
    );
}

/// The byte at `offset` of the test pattern: a position hash, so that a byte at a wrong
/// place (a part out of order, a range off by some bytes) differs.
fn pattern_byte(offset: u64) -> u8 {
    let x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (offset >> 20) as u8
}

fn pattern(offset: u64, count: u64) -> Vec<u8> {
    (offset..offset + count).map(pattern_byte).collect()
}

fn write_pattern(path: &Path, size: u64) {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let block = 1u64 << 20;
    for at in (0..size).step_by(block as usize) {
        file.write_all(&pattern(at, block.min(size - at)))
            .expect("write");
    }
    file.flush().expect("flush");
}

fn assert_same_files(a: &Path, b: &Path) {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).expect("open"),
        std::fs::File::open(b).expect("open"),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    loop {
        let na = fa.read(&mut ba).expect("read");
        let mut nb = 0;
        while nb < na {
            let n = fb.read(&mut bb[nb..na]).expect("read");
            if n == 0 {
                break;
            }
            nb += n;
        }
        assert_eq!(na, nb, "lengths differ near {at}");
        assert!(ba[..na] == bb[..nb], "bytes differ in the MiB at {at}");
        if na == 0 {
            return;
        }
        at += na as u64;
    }
}

/// Reads from `stream` until the gateway closes it (EOF or reset); the bytes read, or `None`
/// if it is still open after `limit`.
fn read_until_closed(stream: &mut std::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Some(got),
        }
    }
    None
}

/// Idle and slow peers cannot hold the gateway's connections (and descriptors): one that
/// sends nothing, one that sends half a request head, and one idle after a whole request
/// are each closed after `--idle-timeout`; the gateway answers a new request after them.
#[test]
fn idle_and_slow_connections_are_closed() {
    use std::io::Write;
    use std::net::TcpStream;
    let gateway = Gateway::start_with(&["--idle-timeout", "1s"]);
    let addr = gateway.endpoint.trim_start_matches("http://").to_string();
    let mut idle = TcpStream::connect(&addr).unwrap();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut kept = TcpStream::connect(&addr).unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let limit = Duration::from_secs(10);
    assert!(
        read_until_closed(&mut idle, limit).is_some(),
        "idle connection kept"
    );
    assert!(
        read_until_closed(&mut slow, limit).is_some(),
        "half a head kept"
    );
    let answered = read_until_closed(&mut kept, limit).expect("idle keep-alive kept");
    assert!(
        answered.starts_with(b"HTTP/1.1 403"),
        "unsigned request answered {:?}",
        String::from_utf8_lossy(&answered[..answered.len().min(200)])
    );
    let mut fresh = TcpStream::connect(&addr).unwrap();
    fresh
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let answer = read_until_closed(&mut fresh, limit).expect("closed after its answer");
    assert!(answer.starts_with(b"HTTP/1.1 403"), "after the idle peers");
}
