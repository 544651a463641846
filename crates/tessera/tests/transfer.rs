//! The CLI's data path (issue 19): what `put` and `get` ask the manager, counted by a proxy in
//! front of it that decodes every request frame; and that the global flags reach the client a
//! command makes (`--transport`, seen in the servers' datagram counters). Each test starts its
//! own local cluster with `tessera up`.

mod command;

use command::{tessera, text};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tessera_wire::{decode_message, FrameHeader, FrameKind, ManagerRequest, FRAME_HEADER_BYTES};

/// Frames of the handshake that open every connection (hello, proof), not requests.
const HANDSHAKE_FRAMES: usize = 2;

/// A local cluster in a temporary directory, stopped when dropped.
struct Cluster {
    dir: PathBuf,
    _root: tempfile::TempDir,
}

impl Cluster {
    fn up(transport: &str) -> Cluster {
        let root = tempfile::tempdir().expect("temporary directory");
        let dir = root.path().join("cluster");
        let out = tessera(&[
            "--transport",
            transport,
            "up",
            "--detach",
            "--dir",
            text(&dir),
        ]);
        assert!(
            out.status.success(),
            "up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster { dir, _root: root }
    }

    /// A value of `cluster.toml`.
    fn field(&self, name: &str) -> String {
        let toml = std::fs::read_to_string(self.dir.join("cluster.toml")).expect("cluster.toml");
        let line = toml
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("no {name} in cluster.toml"));
        line.split_once(" = ")
            .expect("a value")
            .1
            .trim_matches('"')
            .to_string()
    }

    fn manager(&self) -> SocketAddr {
        self.field("manager").parse().expect("manager address")
    }

    /// Runs `tessera ARGS` against `cluster` (an address) with the cluster's access key.
    fn run(&self, cluster: &str, args: &[&str]) -> Vec<u8> {
        let key = self.field("key");
        let mut all = vec!["--cluster", cluster, "--key", &key];
        all.extend_from_slice(args);
        let out = tessera(&all);
        assert!(
            out.status.success(),
            "tessera {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = tessera(&["down", "--dir", text(&self.dir)]);
    }
}

/// A TCP proxy in front of the manager that records the kind of every request it forwards.
struct CountingProxy {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

impl CountingProxy {
    fn start(upstream: SocketAddr) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let manager = TcpStream::connect(upstream).expect("reach the manager");
                let (back_from, back_to) =
                    (manager.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || copy(back_from, back_to));
                let seen = seen.clone();
                std::thread::spawn(move || forward_requests(client, manager, &seen));
            }
        });
        CountingProxy { addr, requests }
    }

    /// The requests forwarded since the last call, by kind.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Forwards whole frames from a client to the manager, recording each request's kind (its
/// variant's name) before the manager can answer it.
fn forward_requests(mut client: TcpStream, mut manager: TcpStream, seen: &Mutex<Vec<String>>) {
    for frame_index in 0.. {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        if client.read_exact(&mut header).is_err() {
            break;
        }
        let decoded = FrameHeader::decode(&header).expect("a frame header from the client");
        let mut body = vec![0u8; (decoded.message_len + decoded.payload_len) as usize];
        client.read_exact(&mut body).expect("a whole frame");
        if frame_index >= HANDSHAKE_FRAMES && decoded.kind == FrameKind::Request {
            let message = &body[..decoded.message_len as usize];
            let request: ManagerRequest = decode_message(message).expect("a manager request");
            let kind = format!("{request:?}");
            let name = kind.split([' ', '(']).next().unwrap_or("").to_string();
            seen.lock().unwrap().push(name);
        }
        if manager.write_all(&header).is_err() || manager.write_all(&body).is_err() {
            break;
        }
    }
    let _ = manager.shutdown(std::net::Shutdown::Write);
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write a local file");
    text(&path).to_string()
}

#[test]
fn a_put_of_64_kib_asks_the_manager_twice_and_a_get_once() {
    let cluster = Cluster::up("udp");
    let proxy = CountingProxy::start(cluster.manager());
    let via = proxy.addr.to_string();
    let local = tempfile::tempdir().expect("temporary directory");
    let data: Vec<u8> = (0..64 << 10)
        .map(|i: u32| (i * 7 + i / 251) as u8)
        .collect();
    let source = write_file(local.path(), "in", &data);

    for scheme in ["raid5", "hybrid", "raid1"] {
        let remote = format!("small/{scheme}");
        cluster.run(&via, &["put", &source, &remote, "--scheme", scheme]);
        assert_eq!(
            proxy.take(),
            ["CreatePending", "CommitPendingSized"],
            "a new {scheme} file"
        );
        // Replacing it: the old file's data goes to servers the new file's view names.
        cluster.run(&via, &["put", &source, &remote, "--scheme", scheme]);
        assert_eq!(
            proxy.take(),
            ["CreatePending", "CommitPendingSized"],
            "a replaced {scheme} file"
        );
        let back = cluster.run(&via, &["get", &remote, "-"]);
        assert_eq!(proxy.take(), ["Lookup"], "a get of {scheme}");
        assert!(back == data, "{scheme}: the bytes read back differ");
    }
    // The size the commit carried is the file's, as `stat` reads it from the manager.
    let stat = cluster.run(&via, &["stat", "small/raid5", "--json"]);
    let stat: serde_json::Value = serde_json::from_slice(&stat).expect("stat --json");
    assert_eq!(stat["size"], data.len() as u64);
}

#[test]
fn a_large_put_asks_nothing_per_chunk_and_write_tells_the_size_once() {
    let cluster = Cluster::up("udp");
    let proxy = CountingProxy::start(cluster.manager());
    let via = proxy.addr.to_string();
    let local = tempfile::tempdir().expect("temporary directory");
    // Several 8 MiB chunks and a short last one.
    let data: Vec<u8> = (0..(20 << 20) + 12_345)
        .map(|i: u32| (i ^ (i >> 9)) as u8)
        .collect();
    let source = write_file(local.path(), "in", &data);
    cluster.run(&via, &["put", &source, "big", "--scheme", "raid5"]);
    assert_eq!(proxy.take(), ["CreatePending", "CommitPendingSized"]);
    // Growing it by a write past its end: the open, the sync that restates the size, and
    // for each partial stripe (read-modify-written under its parity lock) the file's view
    // asked again once the lock is granted (`FileContext::revalidate`: a column may have
    // come to owe the stripe since the open).
    let tail = write_file(local.path(), "tail", &[0xa5; 100_000]);
    let at = (data.len() - 50_000).to_string();
    cluster.run(&via, &["write", "big", &at, &tail]);
    // A partial stripe's read-modify-write tried again (a request timed out under load: seen
    // once in CI) asks once more; never more than twice per partial stripe.
    let asked = proxy.take();
    let lookups = asked.iter().filter(|kind| *kind == "LookupId").count();
    assert!(
        asked.first().map(String::as_str) == Some("Lookup")
            && asked.last().map(String::as_str) == Some("SyncFile")
            && (2..=4).contains(&lookups)
            && asked.len() == lookups + 2,
        "{asked:?}"
    );
    let back = cluster.run(&via, &["get", "big", "-"]);
    assert_eq!(back.len(), data.len() + 50_000);
    assert!(back[..data.len() - 50_000] == data[..data.len() - 50_000]);
    assert!(back[data.len() - 50_000..].iter().all(|&b| b == 0xa5));
}

#[test]
fn the_transport_flag_reaches_the_client_of_a_command() {
    let cluster = Cluster::up("udp");
    let addr = cluster.manager().to_string();
    let local = tempfile::tempdir().expect("temporary directory");
    let source = write_file(local.path(), "in", &vec![3u8; 1 << 20]);
    let received = || datagrams_received(&cluster);
    let before = received();
    cluster.run(&addr, &["--transport", "tcp", "put", &source, "over-tcp"]);
    let after_tcp = received();
    cluster.run(&addr, &["put", &source, "over-udp"]);
    let after_udp = received();
    // A few stray datagrams may land meanwhile (the closing of sessions that earlier
    // commands opened, under load); a put of 1 MiB over UDP moves at least its ~20
    // loopback-sized data datagrams and their requests.
    let (over_tcp, over_udp) = (after_tcp - before, after_udp - after_tcp);
    assert!(
        over_udp >= 20 && over_tcp * 4 < over_udp,
        "datagrams at the servers: {over_tcp} for a put with --transport tcp, {over_udp} for \
         one over the cluster's UDP"
    );
}

/// Datagrams all servers received, asked over TCP (so that asking moves nothing).
fn datagrams_received(cluster: &Cluster) -> u64 {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let key = tessera_client::parse_access_key(&cluster.field("key")).expect("access key");
        let config = tessera_client::ClientConfig {
            transport: tessera_client::TransportKind::Tcp,
            credential: Some(key),
            ..tessera_client::ClientConfig::default()
        };
        let client = tessera_client::Client::connect_with(cluster.manager(), config)
            .await
            .expect("connect");
        let counters = client.server_counters().await.expect("server counters");
        assert_eq!(counters.len(), 5, "every server answers");
        counters
            .iter()
            .map(|(_, c)| c.get("datagrams_received").copied().unwrap_or(0))
            .sum()
    })
}

/// The S3 gateway's PutObject (issue 19 item 3, issue 20): the object's file is opened once at
/// its creation and written through the transfer API, so a put of several 8 MiB chunks asks
/// the manager what a put of 1 KiB asks, and nothing per chunk (no lookup, no size update).
#[test]
fn a_gateway_put_asks_the_manager_the_same_whatever_its_size() {
    let cluster = Cluster::up("udp");
    let proxy = CountingProxy::start(cluster.manager());
    let via = proxy.addr.to_string();
    let root = tempfile::tempdir().expect("temporary directory");
    let addr_file = root.path().join("s3.addr");
    let (access, secret) = (
        "TESSERATESTACCESSKEY",
        "tessera/test/secret/key/0123456789abcdefg",
    );
    let key = cluster.field("key");
    let mut gateway = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "--cluster",
            &via,
            "--key",
            &key,
            "s3",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--access-key", access, "--secret-key", secret])
        .args(["--addr-file", text(&addr_file)])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start tessera s3");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !addr_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let endpoint = format!("http://{}", std::fs::read_to_string(&addr_file).unwrap());
    let boto3 = |code: &str| {
        let script = format!(
            "import boto3, botocore\n\
             s3 = boto3.client('s3', endpoint_url='{endpoint}', aws_access_key_id='{access}',\n\
                 aws_secret_access_key='{secret}', region_name='us-east-1',\n\
                 config=botocore.config.Config(retries={{'max_attempts': 1}}))\n{code}\n"
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3 (with python3-boto3) is needed");
        assert!(
            out.status.success(),
            "boto3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    boto3("s3.create_bucket(Bucket='tbucket')");
    // Lease renewals and the gateway's sweep of stale multipart uploads (a `List` every
    // 10 s) are timing, not per-chunk work.
    let asked = || -> Vec<String> {
        let mut kinds = proxy.take();
        kinds.retain(|kind| kind != "RenewPending" && kind != "List");
        kinds
    };
    asked();
    boto3("s3.put_object(Bucket='tbucket', Key='small', Body=b'x' * 1024)");
    let small = asked();
    boto3(
        "data = bytes((i * 7 + (i >> 13)) % 251 for i in range((20 << 20) + 12345))\n\
         s3.put_object(Bucket='tbucket', Key='big', Body=data)\n\
         got = s3.get_object(Bucket='tbucket', Key='big')['Body'].read()\n\
         assert got == data, 'the object read back differs'",
    );
    let big = asked();
    let _ = gateway.kill();
    let _ = gateway.wait();
    println!("a put of 1 KiB asked {small:?}; a put of 20 MiB and its get {big:?}");
    assert!(
        !small.iter().any(|k| k == "SetSize" || k == "LookupId"),
        "a put asked {small:?}"
    );
    // The big one's list also holds the get's requests after its put's.
    assert_eq!(big[..small.len()], small[..], "put of 20 MiB asked {big:?}");
    assert!(
        big.len() - small.len() <= 3,
        "the get asked {:?}",
        &big[small.len()..]
    );
}
