//! Keying datagram sessions (a TCP handshake per session, before its first call): a burst of
//! calls to a server the client has no session with keys one session, not one per call, and
//! sessions to different servers are keyed at once rather than one after another.

use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_transport::{
    serve_tcp_limited, serve_udp, BoxFuture, ConnectionId, DatagramConfig, FrameHandler, TcpLimits,
    Transport, UdpConfig, UdpServer, UdpTransport,
};
use tokio::net::TcpListener;

const TEST_KEY: tessera_auth::Key = tessera_auth::Key([9; 32]);
const CREDENTIAL: tessera_auth::Credential = tessera_auth::Credential {
    claim: tessera_auth::Claim::Admin,
    key: TEST_KEY,
};
/// Each handshake waits this long at the server (blocking its runtime thread: the tests run
/// more threads than they key sessions at once): keyings one after another add up.
const HANDSHAKE_DELAY: Duration = Duration::from_millis(150);

/// Echoes every request; counts handshakes (each asks for the claim's key once).
#[derive(Default)]
struct Keyed {
    handshakes: AtomicU32,
    sessions: Mutex<HashMap<u64, tessera_auth::Key>>,
}

impl FrameHandler for Keyed {
    fn peer_key(&self, _claim: &tessera_auth::Claim) -> Option<tessera_auth::Key> {
        self.handshakes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(HANDSHAKE_DELAY);
        Some(TEST_KEY)
    }

    fn datagram_keyed(&self, session: u64, key: tessera_auth::Key) {
        self.sessions.lock().unwrap().insert(session, key);
    }

    fn datagram_key(&self, session: u64) -> Option<tessera_auth::Key> {
        self.sessions.lock().unwrap().get(&session).copied()
    }

    fn handle(
        &self,
        _connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        Box::pin(async move { Some((message, payload)) })
    }
}

/// A server that requires keyed sessions: TCP (handshakes) and UDP on one port.
async fn keyed_server() -> (SocketAddr, Arc<Keyed>, UdpServer) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let handler = Arc::new(Keyed::default());
    let socket = std::net::UdpSocket::bind(addr).expect("bind UDP");
    let config = DatagramConfig {
        require_session_keys: true,
        ..DatagramConfig::default()
    };
    let udp = serve_udp(socket, handler.clone(), config).expect("serve UDP");
    tokio::spawn(serve_tcp_limited(
        listener,
        handler.clone(),
        TcpLimits::default(),
    ));
    (addr, handler, udp)
}

fn client() -> Arc<UdpTransport> {
    let config = UdpConfig {
        credential: Some(CREDENTIAL),
        ..UdpConfig::default()
    };
    UdpTransport::new(config).expect("UDP socket")
}

async fn echo(client: Arc<UdpTransport>, addr: SocketAddr, i: u8) {
    let message = Bytes::from(vec![i; 8]);
    let reply = client
        .call(addr, message.clone(), Bytes::new())
        .await
        .expect("answered");
    assert_eq!(reply.message, message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_calls_to_a_new_server_keys_one_session() {
    let (addr, server, _udp) = keyed_server().await;
    let client = client();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8 {
        calls.spawn(echo(client.clone(), addr, i));
    }
    calls.join_all().await;
    assert_eq!(server.handshakes.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_to_different_servers_are_keyed_at_once() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(keyed_server().await);
    }
    let client = client();
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for (addr, _, _) in &servers {
        calls.spawn(echo(client.clone(), *addr, 1));
    }
    calls.join_all().await;
    let took = started.elapsed();
    for (_, server, _) in &servers {
        assert_eq!(server.handshakes.load(Ordering::SeqCst), 1);
    }
    // One after another they would take three handshake delays.
    assert!(
        took < HANDSHAKE_DELAY * 2,
        "three keyings took {took:?}, one takes at least {HANDSHAKE_DELAY:?}"
    );
}

/// What a small put does: its data and parity servers are readied together, then called one
/// after the other. The calls key nothing more, so they do not wait a handshake each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prepared_servers_are_keyed_at_once_and_their_calls_key_nothing() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(keyed_server().await);
    }
    let client = client();
    let started = Instant::now();
    let mut prepares = tokio::task::JoinSet::new();
    for (addr, _, _) in &servers {
        prepares.spawn(client.prepare(*addr));
    }
    prepares.join_all().await;
    let prepared = started.elapsed();
    assert!(
        prepared < HANDSHAKE_DELAY * 2,
        "three prepares took {prepared:?}, one takes at least {HANDSHAKE_DELAY:?}"
    );
    let started = Instant::now();
    for (addr, _, _) in &servers {
        echo(client.clone(), *addr, 2).await;
    }
    let called = started.elapsed();
    assert!(
        called < HANDSHAKE_DELAY,
        "three calls after the prepares took {called:?}: they keyed again"
    );
    // Readying a server with a session keys nothing either.
    client.prepare(servers[0].0).await;
    for (_, server, _) in &servers {
        assert_eq!(server.handshakes.load(Ordering::SeqCst), 1);
    }
}
