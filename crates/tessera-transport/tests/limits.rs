//! The TCP server's limits over real sockets on 127.0.0.1, in one process: idle connections are
//! closed (but not while a request is in progress), a header cut short is dropped at its
//! deadline, and a newcomer beyond the caps evicts the idle connection silent longest, after
//! which that connection's client goes on over a fresh one. Every connection authenticates
//! first (the handshake done by hand for the raw ones), so what follows is what an
//! authenticated peer may hold.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_transport::{
    serve_tcp_limited, BoxFuture, ConnectionId, FrameHandler, TcpConfig, TcpLimits, TcpTransport,
    Transport,
};
use tessera_wire::{FrameHeader, FrameKind, FRAME_HEADER_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Answers every request with its own message, after sleeping as many milliseconds as the
/// message's first byte says.
struct Echo;

/// The key the test server accepts for any claim.
const TEST_KEY: tessera_auth::Key = tessera_auth::Key([7; 32]);
const CREDENTIAL: tessera_auth::Credential = tessera_auth::Credential {
    claim: tessera_auth::Claim::Admin,
    key: TEST_KEY,
};

impl FrameHandler for Echo {
    fn peer_key(&self, _claim: &tessera_auth::Claim) -> Option<tessera_auth::Key> {
        Some(TEST_KEY)
    }

    fn handle(
        &self,
        _connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        Box::pin(async move {
            let sleep_ms = message.first().copied().unwrap_or(0) as u64;
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            Some((message, payload))
        })
    }
}

async fn serve(limits: TcpLimits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(serve_tcp_limited(listener, Arc::new(Echo), limits));
    addr
}

/// A raw connection to `addr`, authenticated by a handshake done by hand.
async fn connect(addr: SocketAddr) -> TcpStream {
    use tessera_wire::{decode_message, Frame, Handshake};
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    async fn step(stream: &mut TcpStream, step: &Handshake) -> Handshake {
        let frame = Frame::new(FrameKind::Request, 0, step, Bytes::new()).to_bytes();
        stream.write_all(&frame).await.expect("send");
        let mut head = [0u8; FRAME_HEADER_BYTES];
        stream.read_exact(&mut head).await.expect("answer");
        let header = FrameHeader::decode(&head).expect("header");
        let mut body = vec![0u8; header.message_len as usize];
        stream.read_exact(&mut body).await.expect("body");
        decode_message(&body).expect("decodes")
    }
    let nonce: [u8; 32] = rand::random();
    let hello = Handshake::Hello {
        version: tessera_auth::HANDSHAKE_VERSION,
        claim: Some(CREDENTIAL.claim),
        nonce,
        datagram_session: None,
    };
    let Handshake::Challenge { nonce: theirs, .. } = step(&mut stream, &hello).await else {
        panic!("not challenged");
    };
    let side = tessera_auth::Side::Connecting;
    let proof = tessera_auth::proof(&TEST_KEY, side, &CREDENTIAL.claim, &nonce, &theirs);
    let welcome = step(&mut stream, &Handshake::Proof { proof }).await;
    assert_eq!(welcome, Handshake::Welcome);
    stream
}

fn request(id: u64, message: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        kind: FrameKind::Request,
        message_len: message.len() as u32,
        payload_len: 0,
        request_id: id,
    };
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(message);
    frame
}

/// How long until the server closes `stream` (reading and dropping any answers), if within
/// `within`.
async fn closed_after(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn an_idle_connection_is_closed_but_not_while_its_request_is_in_progress() {
    let addr = serve(TcpLimits {
        idle_timeout: Duration::from_millis(300),
        ..TcpLimits::default()
    })
    .await;
    let mut idle = connect(addr).await;
    let took = closed_after(&mut idle, Duration::from_secs(5))
        .await
        .expect("the idle connection is closed");
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    // A request that takes 600 ms (twice the idle timeout) keeps its connection, and its
    // answer arrives.
    let mut busy = connect(addr).await;
    busy.write_all(&request(7, &[200, 1, 2]))
        .await
        .expect("send");
    busy.write_all(&request(8, &[250, 1, 2]))
        .await
        .expect("send");
    busy.write_all(&request(9, &[150, 1, 2]))
        .await
        .expect("send");
    let mut head = [0u8; FRAME_HEADER_BYTES];
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), busy.read_exact(&mut head))
            .await
            .expect("an answer in time")
            .expect("an answer, not a closed connection");
        let header = FrameHeader::decode(&head).expect("header");
        let mut body = vec![0u8; header.message_len as usize];
        busy.read_exact(&mut body).await.expect("body");
    }
}

#[tokio::test]
async fn a_header_cut_short_is_dropped_at_its_deadline() {
    let addr = serve(TcpLimits {
        header_timeout: Duration::from_millis(200),
        ..TcpLimits::default()
    })
    .await;
    let mut stream = connect(addr).await;
    stream
        .write_all(&request(1, b"x")[..5])
        .await
        .expect("send");
    let took = closed_after(&mut stream, Duration::from_secs(5))
        .await
        .expect("the connection is dropped");
    assert!(took < Duration::from_secs(2), "dropped after {took:?}");
}

#[tokio::test]
async fn newcomers_evict_the_idle_connection_silent_longest_and_its_client_goes_on() {
    let addr = serve(TcpLimits {
        connections_max: 4,
        connections_per_peer_max: 4,
        ..TcpLimits::default()
    })
    .await;
    let client = Arc::new(TcpTransport::with_credential(
        TcpConfig::default(),
        Some(CREDENTIAL),
    ));
    let call = |message: &'static [u8]| {
        let client = client.clone();
        async move {
            client
                .call(addr, Bytes::from_static(message), Bytes::new())
                .await
        }
    };
    assert_eq!(
        call(b"\x00one").await.expect("first call").message,
        &b"\x00one"[..]
    );
    // Four idle newcomers: the client's pooled connection, silent longest, is evicted.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr).await.expect("connect"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its next call goes on a fresh connection.
    assert_eq!(
        call(b"\x00two").await.expect("second call").message,
        &b"\x00two"[..]
    );
    let mut closed = 0;
    for stream in &mut held {
        if closed_after(stream, Duration::from_millis(200))
            .await
            .is_some()
        {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 1,
        "the client's newcomer evicted the oldest idle one"
    );
}

/// Echoes, and remembers which connection each request came on and which connections closed.
#[derive(Default)]
struct Connections {
    handled_on: std::sync::Mutex<Vec<ConnectionId>>,
    closed: std::sync::Mutex<Vec<ConnectionId>>,
}

impl FrameHandler for Connections {
    fn peer_key(&self, _claim: &tessera_auth::Claim) -> Option<tessera_auth::Key> {
        Some(TEST_KEY)
    }

    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        self.handled_on.lock().unwrap().push(connection);
        Box::pin(async move { Some((message, payload)) })
    }

    fn closed(&self, connection: ConnectionId) {
        self.closed.lock().unwrap().push(connection);
    }
}

/// A reset closes the pooled connection (the server hears it end) and the next call opens a
/// new one: what a manager replica knows of the old connection does not carry over.
#[tokio::test]
async fn a_reset_closes_the_connection_and_the_next_call_opens_another() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = Arc::new(Connections::default());
    tokio::spawn(serve_tcp_limited(
        listener,
        server.clone(),
        TcpLimits::default(),
    ));
    let client = TcpTransport::with_credential(TcpConfig::default(), Some(CREDENTIAL));
    let client = Arc::new(client);
    for message in [&b"\x00one"[..], b"\x00two"] {
        let message = Bytes::from_static(message);
        let reply = client.call(addr, message.clone(), Bytes::new()).await;
        assert_eq!(reply.expect("call").message, message);
    }
    client.reset(addr).await;
    let reply = client.call(addr, Bytes::from_static(b"\x00three"), Bytes::new());
    assert!(reply.await.is_ok());
    let handled_on = server.handled_on.lock().unwrap().clone();
    assert_eq!(handled_on.len(), 3);
    assert_eq!(handled_on[0], handled_on[1], "pooled before the reset");
    assert_ne!(handled_on[1], handled_on[2], "a new connection after it");
    let start = Instant::now();
    while !server.closed.lock().unwrap().contains(&handled_on[0]) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the reset connection was never closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
