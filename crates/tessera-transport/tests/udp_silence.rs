//! A datagram peer that goes silent: the call fails as a timeout (as it would over TCP), once
//! the session has waited `peer_lost_after_us`, so that callers treat it as silence (a
//! Tessera client pings the server before it reports it down) and not as a refusal.

use bytes::Bytes;
use std::time::{Duration, Instant};
use tessera_transport::{Transport, TransportError, UdpConfig, UdpTransport};

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_datagram_peer_is_a_timeout_after_the_silence_bound() {
    // Holds the port and never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().unwrap();
    let config = UdpConfig {
        request_timeout: Duration::from_secs(30),
        ..UdpConfig::default()
    };
    let bound = Duration::from_micros(config.datagram.peer_lost_after_us);
    let transport = UdpTransport::new(config).expect("UDP socket");
    let started = Instant::now();
    let answer = tessera_transport::call::<_, String>(
        &transport as &dyn Transport,
        addr,
        &"hello".to_string(),
        Bytes::new(),
    )
    .await;
    let took = started.elapsed();
    match answer {
        Err(TransportError::Timeout {
            addr: peer,
            timeout_ms,
        }) => {
            assert_eq!(peer, addr);
            assert_eq!(u128::from(timeout_ms), bound.as_millis());
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Lost once silent for the bound, long before the 30 s request timeout.
    assert!(took >= bound && took < bound * 10, "took {took:?}");
    drop(silent);
}
