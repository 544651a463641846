//! A datagram request that waits in its own client's paced queue longer than the request
//! timeout is not a silent server: it is answered once it gets there. A request the server
//! holds without answering still times out after the request timeout.

use bytes::Bytes;
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_datagram::radon::Reservation;
use tessera_transport::{
    serve_udp, BoxFuture, ConnectionId, DatagramConfig, FrameHandler, Transport, TransportError,
    UdpConfig, UdpTransport,
};

/// Answers every request with a short message, except one whose message is `hold`: that one
/// is never answered.
struct ShortAnswers;

impl FrameHandler for ShortAnswers {
    fn handle(
        &self,
        _connection: ConnectionId,
        message: Bytes,
        _payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>> {
        Box::pin(async move {
            if &message[..] == b"hold" {
                std::future::pending::<()>().await;
            }
            Some((Bytes::from_static(b"done"), Bytes::new()))
        })
    }
}

const REQUEST_TIMEOUT: Duration = Duration::from_millis(400);
/// The client's sessions are paced at this rate: three requests of [`REQUEST_BYTES`] take
/// about 1.5 s to leave, the last ones far past the request timeout.
const RATE_BYTES_PER_S: u64 = 300_000;
const REQUEST_BYTES: usize = 600_000;

fn paced_client() -> Arc<UdpTransport> {
    let config = UdpConfig {
        datagram: DatagramConfig {
            connect_reservation: Some(Reservation {
                rate_bytes_per_s: RATE_BYTES_PER_S,
                period_us: 100_000,
            }),
            ..DatagramConfig::default()
        },
        request_timeout: REQUEST_TIMEOUT,
        credential: None,
    };
    UdpTransport::new(config).expect("UDP socket")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_still_in_its_own_paced_queue_does_not_time_out() {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let server =
        serve_udp(socket, Arc::new(ShortAnswers), DatagramConfig::default()).expect("serve");
    let client = paced_client();
    let started = Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(client.call(
                server.addr,
                Bytes::from_static(b"write"),
                Bytes::from(vec![7u8; REQUEST_BYTES]),
            ))
        })
        .collect();
    for (index, call) in calls.into_iter().enumerate() {
        match call.await.expect("the call's task") {
            Ok(reply) => assert_eq!(&reply.message[..], b"done", "request {index}"),
            Err(e) => panic!("request {index} failed after {:?}: {e}", started.elapsed()),
        }
    }
    let took = started.elapsed();
    // The last request left the client well after the request timeout.
    eprintln!("three paced requests answered in {took:?}");
    assert!(took > REQUEST_TIMEOUT * 2, "took {took:?}");

    // A request the server holds (delivered whole, never answered) times out as before.
    let started = Instant::now();
    match client
        .call(server.addr, Bytes::from_static(b"hold"), Bytes::new())
        .await
    {
        Err(TransportError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= REQUEST_TIMEOUT && took < REQUEST_TIMEOUT * 3,
        "took {took:?}"
    );
}
