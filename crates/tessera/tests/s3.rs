//! The S3 gateway driven by a real client: `tessera s3` over a local cluster (`tessera up`, five
//! servers on 127.0.0.1), and boto3 (`tests/s3/client.py`) putting, getting (whole and by
//! ranges), listing (v1 and v2, prefix, delimiter, pages) and deleting, with every byte checked,
//! and bad input (wrong or missing signatures, malformed XML, `..` and NUL in keys, missing
//! buckets and keys) answered with S3's error codes while the gateway stays up.
//!
//! Needs `python3` with boto3 (Debian: `apt-get install python3-boto3`); without them the test
//! fails saying so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

const ACCESS_KEY: &str = "TESSERATESTACCESSKEY";
const SECRET_KEY: &str = "tessera/test/secret/key/0123456789abcdefg";

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env_remove("TESSERA_CLUSTER")
        .stdin(Stdio::null())
        .output()
        .expect("cannot start the tessera binary")
}

fn text(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// A local cluster and a gateway over it, both stopped when dropped (also on panic).
struct Gateway {
    cluster: PathBuf,
    child: Child,
    endpoint: String,
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
        let addr_file = root.path().join("s3.addr");
        let config = cluster.join("cluster.toml");
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["--cluster", text(&config), "s3", "--listen", "127.0.0.1:0"])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args(["--addr-file", text(&addr_file)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot start tessera s3");
        let mut gateway = Gateway {
            cluster,
            child,
            endpoint: String::new(),
            _root: root,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !addr_file.exists() {
            assert!(
                Instant::now() < deadline,
                "tessera s3 did not start listening in 30 s"
            );
            assert!(gateway.running(), "tessera s3 exited at start-up");
            std::thread::sleep(Duration::from_millis(20));
        }
        let addr = std::fs::read_to_string(&addr_file).expect("address file");
        gateway.endpoint = format!("http://{addr}");
        gateway
    }

    fn running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("wait for tessera s3")
            .is_none()
    }
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
