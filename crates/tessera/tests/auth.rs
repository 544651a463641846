//! Authentication and authorization, attacked from outside (issue 15, item 6): a process that
//! reaches the ports but holds no key (or a wrong, revoked or merely a client's key) can
//! neither read, write, delete, register a server, take over a server id, keep a server down
//! with `ReportDown`, nor clear a stale server's debt with `Resynced`, and legitimate clients
//! keep working throughout. Each attacker here is a raw TCP peer that sends exactly the bytes
//! it means to (`support.rs`), against real daemons started by `tessera up` on 127.0.0.1.

mod support;

use bytes::Bytes;
use rand::{RngCore, SeedableRng};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_auth::{Claim, Credential, Key, KeyId, Refusal};
use tessera_client::{Client, ClientConfig, LayoutRequest, Scheme, ServerState};
use tessera_layout::Region;
use tessera_wire::{
    decode_message, Frame, FrameKind, Handshake, IndexRange, ManagerError, ManagerRequest,
    ManagerResponse, StorageCall, StorageError, StorageRequest, StorageResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
const SERVERS: u32 = 4;
const WAIT: Duration = Duration::from_secs(10);

/// A local cluster started by the binary; `tessera down` when dropped.
struct Cluster {
    dir: PathBuf,
    manager: SocketAddr,
    _temp: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(&self.dir, &["down"]);
    }
}

/// `tessera ARGS --dir DIR` (or `--cluster DIR/cluster.toml` for client commands).
fn run(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(TESSERA);
    command.args(args);
    if matches!(args.first(), Some(&"up") | Some(&"down") | Some(&"server")) {
        command.arg("--dir").arg(dir);
    } else if !args.contains(&"--cluster") {
        command.arg("--cluster").arg(dir.join("cluster.toml"));
    }
    command.output().expect("run tessera")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "tessera {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one line a failed command prints, asserting that it failed with exactly one line.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert!(!out.status.success(), "tessera {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("tessera: "), "{err}");
    err
}

impl Cluster {
    fn up() -> Cluster {
        let temp = tempfile::Builder::new()
            .prefix("tessera-auth-")
            .tempdir()
            .expect("temporary directory");
        let dir = temp.path().join("cluster");
        let mut cluster = Cluster {
            dir,
            manager: "127.0.0.1:1".parse().expect("address"),
            _temp: temp,
        };
        ok(
            &cluster.dir,
            &["up", "--servers", &SERVERS.to_string(), "--detach"],
        );
        cluster.manager = cluster.toml()["manager"]
            .as_str()
            .expect("manager")
            .parse()
            .expect("address");
        cluster
    }

    fn toml(&self) -> toml::Table {
        std::fs::read_to_string(self.dir.join("cluster.toml"))
            .expect("cluster.toml")
            .parse()
            .expect("parses")
    }

    /// The local cluster's client access key.
    fn client_key(&self) -> Credential {
        let text = self.toml()["key"].as_str().expect("key").to_string();
        tessera_client::parse_access_key(&text).expect("access key")
    }

    fn admin_key(&self) -> Credential {
        let text = std::fs::read_to_string(self.dir.join("cluster.secret")).expect("secret");
        let secret = tessera_client::Secret::from_file_text(&text).expect("secret parses");
        Credential {
            claim: Claim::Admin,
            key: secret.admin_key(),
        }
    }

    async fn client_with(&self, credential: Credential) -> Client {
        let config = ClientConfig {
            credential: Some(credential),
            ..ClientConfig::default()
        };
        Client::connect_with(self.manager, config)
            .await
            .expect("a legitimate client connects")
    }

    async fn client(&self) -> Client {
        self.client_with(self.client_key()).await
    }

    async fn admin(&self) -> Client {
        self.client_with(self.admin_key()).await
    }
}

/// Credentials an attacker may hold: none proven (a random key for a real claim), or a
/// client's key where a server's or the admin's is needed.
fn forged(claim: Claim) -> Credential {
    let mut key = [0u8; 32];
    rand::rngs::StdRng::from_entropy().fill_bytes(&mut key);
    Credential {
        claim,
        key: Key(key),
    }
}

/// What a raw peer got for its request.
#[derive(Debug)]
enum Outcome<T> {
    /// The daemon refused the connection (before or during the handshake).
    Refused(Handshake),
    /// The daemon answered the request.
    Answered(T),
}

/// Send `request` as the first frame of a connection without any handshake.
async fn send_without_handshake<R: serde::Serialize>(addr: SocketAddr, request: &R) -> Handshake {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let frame = Frame::new(FrameKind::Request, 7, request, Bytes::new()).to_bytes();
    stream.write_all(&frame).await.expect("send");
    let step = tokio::time::timeout(WAIT, support::read_step(&mut stream))
        .await
        .expect("refusal in time");
    // And then the connection is closed: nothing more is read or answered.
    let mut rest = [0u8; 64];
    let n = tokio::time::timeout(WAIT, stream.read(&mut rest))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed after the refusal");
    step
}

/// Authenticate with `credential` (which may be refused), then send `request` and read the
/// answer.
async fn call_as<R: serde::Serialize, A: serde::de::DeserializeOwned>(
    addr: SocketAddr,
    credential: &Credential,
    request: &R,
    payload: Bytes,
) -> Outcome<A> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    if let Err(step) = support::handshake(&mut stream, credential).await {
        return Outcome::Refused(step);
    }
    let frame = Frame::new(FrameKind::Request, 9, request, payload).to_bytes();
    stream.write_all(&frame).await.expect("send");
    let mut head = [0u8; tessera_wire::FRAME_HEADER_BYTES];
    stream.read_exact(&mut head).await.expect("answer");
    let header = tessera_wire::FrameHeader::decode(&head).expect("header");
    let mut body = vec![0u8; header.message_len as usize + header.payload_len as usize];
    stream.read_exact(&mut body).await.expect("body");
    Outcome::Answered(decode_message(&body[..header.message_len as usize]).expect("decodes"))
}

/// Every way a peer without the right key tries `request` at `addr`: no handshake at all, a
/// forged client key, a forged admin key, a forged server key. Each must be refused at the
/// handshake.
async fn assert_refused_without_a_key<R: serde::Serialize>(addr: SocketAddr, request: &R) {
    let step = send_without_handshake(addr, request).await;
    assert_eq!(step, Handshake::Refused(Refusal::Unauthenticated));
    for claim in [Claim::Client(KeyId(42)), Claim::Admin, Claim::Server] {
        let outcome: Outcome<ManagerResponse> =
            call_as(addr, &forged(claim), request, Bytes::new()).await;
        match outcome {
            Outcome::Refused(Handshake::Refused(Refusal::UnknownKey(_) | Refusal::BadProof(_))) => {
            }
            other => panic!("a forged {claim} key got {other:?}"),
        }
    }
}

/// A file of `size` random bytes, written by a legitimate client.
async fn stored_file(client: &Client, path: &str, size: usize) -> (tessera_client::File, Vec<u8>) {
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 16 << 10,
        width: None,
    };
    let file = client.create(path, layout).await.expect("create");
    let mut data = vec![0u8; size];
    rand::rngs::StdRng::seed_from_u64(size as u64).fill_bytes(&mut data);
    client.write_at(&file, 0, &data).await.expect("write");
    client.sync(&file).await.expect("sync");
    (file, data)
}

async fn read_all(client: &Client, path: &str) -> Vec<u8> {
    let file = client.open(path).await.expect("open");
    let size = client.stat(path).await.expect("stat").meta.size;
    client.read_at(&file, 0, size).await.expect("read")
}

/// The first server of a file's layout: its address and store incarnation.
async fn first_server(client: &Client, path: &str) -> (SocketAddr, u64) {
    let stat = client.stat(path).await.expect("stat");
    let status = client.status().await.expect("status");
    let server = status
        .iter()
        .find(|s| s.id == stat.meta.servers[0])
        .expect("server");
    (server.addr.parse().expect("address"), server.incarnation)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_without_a_key_cannot_read_a_file() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, data) = stored_file(&client, "secret.bin", 100_000).await;
    let (server, incarnation) = first_server(&client, "secret.bin").await;
    let read = StorageCall {
        incarnation,
        request: StorageRequest::Read {
            file: file.id,
            region: Region::Data,
            offset: 0,
            len: 16 << 10,
            overlay: true,
        },
        service: tessera_wire::Service::BestEffort,
    };
    assert_refused_without_a_key(server, &read).await;
    // Nor through the manager: the file's layout and servers are not handed out either.
    let lookup = ManagerRequest::Lookup {
        path: "secret.bin".into(),
    };
    assert_refused_without_a_key(cluster.manager, &lookup).await;
    // The same read with the key is served: the refusals above are the key's doing.
    let outcome: Outcome<StorageResponse> = call_as(
        server,
        &cluster.client_key().for_storage(),
        &read,
        Bytes::new(),
    )
    .await;
    assert!(
        matches!(outcome, Outcome::Answered(StorageResponse::Data)),
        "{outcome:?}"
    );
    assert_eq!(read_all(&client, "secret.bin").await, data);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_without_a_key_cannot_write_a_file() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, data) = stored_file(&client, "kept.bin", 100_000).await;
    let (server, incarnation) = first_server(&client, "kept.bin").await;
    let write = StorageCall {
        incarnation,
        request: StorageRequest::Write {
            file: file.id,
            region: Region::Data,
            offset: 0,
            invalidate_overflow: true,
        },
        service: tessera_wire::Service::BestEffort,
    };
    assert_refused_without_a_key(server, &write).await;
    // With a forged key and the payload of a real write: refused before a byte is read.
    let outcome: Outcome<StorageResponse> = call_as(
        server,
        &forged(Claim::Client(KeyId(7))),
        &write,
        Bytes::from(vec![0xEE; 4096]),
    )
    .await;
    assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
    // Nor replace the file's record there (a size of one byte, recovered from it after a
    // lost manager store), alone or with the sync that follows a write.
    let mut meta = client.stat("kept.bin").await.expect("stat").meta;
    meta.size = 1;
    for request in [
        StorageRequest::Describe {
            meta: meta.clone(),
            committed: true,
        },
        StorageRequest::DescribeAndSync {
            meta: meta.clone(),
            committed: true,
        },
    ] {
        let call = StorageCall {
            incarnation,
            request,
            service: tessera_wire::Service::BestEffort,
        };
        assert_refused_without_a_key(server, &call).await;
    }
    let resize = ManagerRequest::SetSize {
        file: file.id,
        size: 1,
        grow_only: false,
    };
    assert_refused_without_a_key(cluster.manager, &resize).await;
    assert_eq!(read_all(&client, "kept.bin").await, data, "nothing changed");
    let report = client.scrub(Some("kept.bin")).await.expect("scrub");
    assert!(report.unrepairable.is_empty(), "{report:?}");
    assert_eq!(report.corrupt_repaired + report.parity_repaired, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_without_a_key_cannot_delete_a_file() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, data) = stored_file(&client, "precious.bin", 50_000).await;
    let (server, incarnation) = first_server(&client, "precious.bin").await;
    let remove = StorageCall {
        incarnation,
        request: StorageRequest::Remove { file: file.id },
        service: tessera_wire::Service::BestEffort,
    };
    assert_refused_without_a_key(server, &remove).await;
    let unlink = ManagerRequest::Remove {
        path: "precious.bin".into(),
    };
    assert_refused_without_a_key(cluster.manager, &unlink).await;
    assert_eq!(read_all(&client, "precious.bin").await, data);
    // The CLI without a key says so in one line.
    let line = fails(
        &cluster.dir,
        &["--key", "k0000000000000001:00", "rm", "precious.bin"],
    );
    assert!(line.contains("access key"), "{line}");
}

/// A truncation's requests: without a key they are refused at the handshake; with a client's
/// key but no fence of the file (a peer skipping the protocol), the server refuses them too,
/// and nothing stored changes.
#[tokio::test(flavor = "multi_thread")]
async fn a_discard_needs_a_key_and_the_files_fence() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, data) = stored_file(&client, "whole.bin", 300_000).await;
    let (server, incarnation) = first_server(&client, "whole.bin").await;
    let call = |request| StorageCall {
        incarnation,
        request,
        service: tessera_wire::Service::BestEffort,
    };
    let requests = [
        StorageRequest::Discard {
            file: file.id,
            region: Region::Data,
            from: 0,
            fence: 1 << 63,
        },
        StorageRequest::Discard {
            file: file.id,
            region: Region::Redundancy,
            from: 0,
            fence: u64::MAX,
        },
        StorageRequest::RecordDiscard {
            file: file.id,
            stripes: IndexRange::new(0, u64::MAX),
            fence: 1 << 63,
        },
    ];
    for request in requests {
        let request = call(request);
        assert_refused_without_a_key(server, &request).await;
        let outcome: Outcome<StorageResponse> = call_as(
            server,
            &cluster.client_key().for_storage(),
            &request,
            Bytes::new(),
        )
        .await;
        assert!(
            matches!(
                outcome,
                Outcome::Answered(StorageResponse::Error(StorageError::NotFenced { .. }))
            ),
            "{:?} without the fence got {outcome:?}",
            request.request
        );
    }
    assert_eq!(
        read_all(&client, "whole.bin").await,
        data,
        "nothing changed"
    );
    let report = client.scrub(Some("whole.bin")).await.expect("scrub");
    assert!(report.unrepairable.is_empty(), "{report:?}");
    assert_eq!(report.corrupt_repaired + report.parity_repaired, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn registering_a_server_needs_the_server_key() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let before = client.status().await.expect("status");
    let register = ManagerRequest::Register {
        server: None,
        addr: "127.0.0.1:9".into(),
        incarnation: 0xbad,
        cluster: None,
    };
    assert_refused_without_a_key(cluster.manager, &register).await;
    // A client's and the admin's key are proven, but do not make a server.
    for credential in [cluster.client_key(), cluster.admin_key()] {
        let outcome: Outcome<ManagerResponse> =
            call_as(cluster.manager, &credential, &register, Bytes::new()).await;
        match outcome {
            Outcome::Answered(ManagerResponse::Error(ManagerError::Forbidden { .. })) => {}
            other => panic!("Register as {} got {other:?}", credential.claim),
        }
    }
    assert_eq!(client.status().await.expect("status"), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_id_cannot_be_taken_over_without_the_server_key() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (_, data) = stored_file(&client, "striped.bin", 200_000).await;
    let before = client.status().await.expect("status");
    let victim = &before[0];
    let takeover = ManagerRequest::Register {
        server: Some(victim.id),
        addr: "127.0.0.1:9".into(),
        incarnation: victim.incarnation ^ 1,
        cluster: None,
    };
    assert_refused_without_a_key(cluster.manager, &takeover).await;
    let heartbeat = ManagerRequest::Heartbeat {
        server: victim.id,
        incarnation: victim.incarnation,
        cluster: 1,
    };
    assert_refused_without_a_key(cluster.manager, &heartbeat).await;
    let outcome: Outcome<ManagerResponse> = call_as(
        cluster.manager,
        &cluster.client_key(),
        &takeover,
        Bytes::new(),
    )
    .await;
    assert!(
        matches!(
            outcome,
            Outcome::Answered(ManagerResponse::Error(ManagerError::Forbidden { .. }))
        ),
        "{outcome:?}"
    );
    assert_eq!(client.status().await.expect("status"), before);
    assert_eq!(read_all(&client, "striped.bin").await, data);
}

#[tokio::test(flavor = "multi_thread")]
async fn report_down_from_a_peer_without_a_key_keeps_no_server_down() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let target = client.status().await.expect("status")[1].id;
    let report = ManagerRequest::ReportDown { server: target };
    // The attack of the issue: ReportDown every 20 ms, here for 1.5 s, with no key and with
    // forged keys; the server stays up throughout.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        assert_refused_without_a_key(cluster.manager, &report).await;
        let state = client
            .status()
            .await
            .expect("status")
            .iter()
            .find(|s| s.id == target)
            .map(|s| s.state);
        assert_eq!(state, Some(ServerState::Up));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A server's key cannot report either (servers do not report their peers).
    let text = std::fs::read_to_string(cluster.dir.join("cluster.secret")).expect("secret");
    let secret = tessera_client::Secret::from_file_text(&text).expect("secret");
    let server = Credential {
        claim: Claim::Server,
        key: secret.server_key(),
    };
    let outcome: Outcome<ManagerResponse> =
        call_as(cluster.manager, &server, &report, Bytes::new()).await;
    assert!(
        matches!(
            outcome,
            Outcome::Answered(ManagerResponse::Error(ManagerError::Forbidden { .. }))
        ),
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resynced_needs_the_admin_and_a_stale_server_keeps_its_debt() {
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, _) = stored_file(&client, "debt.bin", 300_000).await;
    let stale = file_server(&client, "debt.bin").await;
    ok(&cluster.dir, &["server", "stop", &stale.to_string()]);
    // Overwritten while the server is away: it owes these stripes when it returns.
    let mut newer = vec![0u8; 300_000];
    rand::rngs::StdRng::seed_from_u64(99).fill_bytes(&mut newer);
    client
        .write_at(&file, 0, &newer)
        .await
        .expect("degraded write");
    client.sync(&file).await.expect("sync");
    ok(&cluster.dir, &["server", "start", &stale.to_string()]);
    wait_state(&client, stale, ServerState::Stale).await;

    let clear = ManagerRequest::Resynced {
        server: stale,
        file: file.id,
        stripes: IndexRange::new(0, u64::MAX),
        tag: 0,
    };
    assert_refused_without_a_key(cluster.manager, &clear).await;
    let outcome: Outcome<ManagerResponse> =
        call_as(cluster.manager, &cluster.client_key(), &clear, Bytes::new()).await;
    match outcome {
        Outcome::Answered(ManagerResponse::Error(ManagerError::Forbidden { needs, .. })) => {
            assert_eq!(needs, "admin")
        }
        other => panic!("Resynced with a client key got {other:?}"),
    }
    wait_state(&client, stale, ServerState::Stale).await;
    // The debt stands, so the stale server's old bytes are never served.
    assert_eq!(read_all(&client, "debt.bin").await, newer);
    // `rebuild` runs as the admin (the local cluster's secret) and clears it honestly.
    ok(&cluster.dir, &["rebuild", &stale.to_string()]);
    wait_state(&client, stale, ServerState::Up).await;
    assert_eq!(read_all(&client, "debt.bin").await, newer);
}

async fn file_server(client: &Client, path: &str) -> u32 {
    client.stat(path).await.expect("stat").meta.servers[0]
}

async fn wait_state(client: &Client, server: u32, want: ServerState) {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = client.status().await.expect("status");
        let state = status.iter().find(|s| s.id == server).map(|s| s.state);
        if state == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "server {server} is {state:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn access_keys_round_trip_and_a_revoked_key_is_refused() {
    let cluster = Cluster::up();
    let dir = &cluster.dir;
    let created = ok(dir, &["key", "create", "alice"]);
    let alice = created.trim().to_string();
    let alice_id = alice.split(':').next().expect("id").to_string();
    let listed = ok(dir, &["key", "ls"]);
    assert!(listed.contains(&format!("{alice_id}  alice")), "{listed}");
    assert!(listed.contains("local cluster"), "{listed}");
    assert!(
        !listed.contains(alice.split(':').nth(1).expect("secret")),
        "no secrets listed"
    );

    // Alice's key works for client commands, over the datagram and the TCP transport.
    std::fs::write(cluster.dir.join("payload"), b"hello from alice").expect("payload");
    let payload = cluster.dir.join("payload");
    ok(
        dir,
        &[
            "--key",
            &alice,
            "put",
            payload.to_str().expect("utf-8"),
            "a.txt",
        ],
    );
    for transport in ["udp", "tcp"] {
        let got = ok(
            dir,
            &[
                "--key",
                &alice,
                "--transport",
                transport,
                "read",
                "a.txt",
                "0",
                "16",
                "-",
            ],
        );
        assert_eq!(got, "hello from alice");
    }
    // ...but not for the admin's.
    let client_alice = cluster
        .client_with(tessera_client::parse_access_key(&alice).expect("key"))
        .await;
    match client_alice.key_list().await {
        Err(tessera_client::ClientError::Metadata(ManagerError::Forbidden { .. })) => {}
        other => panic!("key ls with a client key: {other:?}"),
    }

    ok(dir, &["key", "rm", &alice_id]);
    let listed = ok(dir, &["key", "ls"]);
    assert!(!listed.contains(&alice_id), "{listed}");
    // Revoked: new connections are refused with a one-line error...
    let line = fails(dir, &["--key", &alice, "ls"]);
    assert!(line.contains("unknown or revoked key"), "{line}");
    // ...and the connection alice already had is refused from then on, too.
    match client_alice.list("").await {
        Err(tessera_client::ClientError::Metadata(ManagerError::UnknownKey(_))) => {}
        other => panic!("a revoked key's open connection: {other:?}"),
    }
    // Storage servers refuse the revoked key within their refresh interval.
    tokio::time::sleep(tessera_server::STORAGE_KEYS_INTERVAL * 2).await;
    let admin = cluster.admin().await;
    let (addr, incarnation) = first_server(&admin, "a.txt").await;
    let ping = StorageCall {
        incarnation,
        request: StorageRequest::Ping,
        service: tessera_wire::Service::BestEffort,
    };
    let revoked = tessera_client::parse_access_key(&alice)
        .expect("key")
        .for_storage();
    let outcome: Outcome<StorageResponse> = call_as(addr, &revoked, &ping, Bytes::new()).await;
    assert!(
        matches!(
            outcome,
            Outcome::Refused(Handshake::Refused(Refusal::UnknownKey(_)))
        ),
        "{outcome:?}"
    );
    // Removing it twice is a clear error; the local cluster's own key still works.
    let line = fails(dir, &["key", "rm", &alice_id]);
    assert!(line.contains("no access key"), "{line}");
    assert!(ok(dir, &["ls"]).contains("a.txt"));
    // Key commands need the admin's secret: with only a client key they are refused.
    let line = fails(
        dir,
        &["--cluster", &cluster.manager.to_string(), "key", "ls"],
    );
    assert!(line.contains("admin"), "{line}");
}

/// The datagram transport: a session opened without a handshake (the public key, as any
/// stranger's) is dropped by the server without an answer, a forged key is refused at the
/// handshake that would key a session, and a keyed client is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_without_a_key_cannot_use_the_datagram_transport() {
    use tessera_transport::{Transport, TransportError, UdpConfig, UdpTransport};
    let cluster = Cluster::up();
    let client = cluster.client().await;
    let (file, data) = stored_file(&client, "udp.bin", 100_000).await;
    let (server, incarnation) = first_server(&client, "udp.bin").await;
    let udp = |credential: Option<Credential>| {
        UdpTransport::new(UdpConfig {
            request_timeout: Duration::from_millis(1500),
            credential,
            ..UdpConfig::default()
        })
        .expect("UDP socket")
    };
    let requests = [
        StorageRequest::Read {
            file: file.id,
            region: Region::Data,
            offset: 0,
            len: 4096,
            overlay: true,
        },
        StorageRequest::Remove { file: file.id },
        // A whole block into an open file: what a server answers on its network thread.
        StorageRequest::Write {
            file: file.id,
            region: Region::Data,
            offset: 0,
            invalidate_overflow: false,
        },
    ];
    let before = client.server_counters().await.expect("counters");
    let stranger = udp(None);
    for request in &requests {
        let call = StorageCall {
            incarnation,
            request: request.clone(),
            service: tessera_wire::Service::BestEffort,
        };
        let payload = match request {
            StorageRequest::Write { .. } => Bytes::from(vec![0xee; 4096]),
            _ => Bytes::new(),
        };
        let answer = tessera_transport::call::<_, StorageResponse>(
            &stranger as &dyn Transport,
            server,
            &call,
            payload,
        )
        .await;
        // No answer: the request times out, or the session is given up for lost.
        assert!(
            matches!(
                answer,
                Err(TransportError::Timeout { .. } | TransportError::Disconnected { .. })
            ),
            "{request:?} without a key: {answer:?}"
        );
    }
    let forger = udp(Some(forged(Claim::Client(KeyId(5))).for_storage()));
    let call = StorageCall {
        incarnation,
        request: requests[1].clone(),
        service: tessera_wire::Service::BestEffort,
    };
    let answer = tessera_transport::call::<_, StorageResponse>(
        &forger as &dyn Transport,
        server,
        &call,
        Bytes::new(),
    )
    .await;
    assert!(
        matches!(
            answer,
            Err(TransportError::Refused {
                refusal: Refusal::UnknownKey(_),
                ..
            })
        ),
        "{answer:?}"
    );
    // The server dropped the stranger's datagrams as unauthentic, and served nothing.
    let after = client.server_counters().await.expect("counters");
    let dropped = |counters: &Vec<(u32, std::collections::BTreeMap<String, u64>)>| -> u64 {
        counters
            .iter()
            .map(|(_, c)| c.get("dropped_unauthentic").copied().unwrap_or(0))
            .sum()
    };
    assert!(
        dropped(&after) > dropped(&before),
        "before {before:?} after {after:?}"
    );
    assert_eq!(
        read_all(&client, "udp.bin").await,
        data,
        "nothing removed or written"
    );
    // The same request from a keyed client is answered.
    let keyed = udp(Some(cluster.client_key().for_storage()));
    let call = StorageCall {
        incarnation,
        request: requests[0].clone(),
        service: tessera_wire::Service::BestEffort,
    };
    let answer = tessera_transport::call::<_, StorageResponse>(
        &keyed as &dyn Transport,
        server,
        &call,
        Bytes::new(),
    )
    .await;
    assert!(
        matches!(answer, Ok((StorageResponse::Data, _))),
        "{answer:?}"
    );
}
