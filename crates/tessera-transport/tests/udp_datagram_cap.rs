//! `DatagramConfig::path_datagram_bytes_max` caps the datagrams a transport sends below what
//! the path carries: on loopback (MTU 65,536) a capped client sends an Ethernet LAN's 1,472-byte
//! datagrams, so that one host can measure a LAN's per-packet costs.

use bytes::Bytes;
use std::time::{Duration, Instant};
use tessera_transport::{Transport, UdpConfig, UdpTransport};

/// The largest datagram a client sends toward a peer that never answers, for a call
/// carrying 20,000 bytes.
async fn largest_datagram_sent(cap: Option<usize>) -> usize {
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    peer.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let addr = peer.local_addr().unwrap();
    let mut config = UdpConfig {
        request_timeout: Duration::from_secs(2),
        ..UdpConfig::default()
    };
    config.datagram.path_datagram_bytes_max = cap;
    let transport = UdpTransport::new(config).expect("UDP socket");
    let call = tokio::spawn(async move {
        let payload = Bytes::from(vec![7u8; 20_000]);
        let _ = tessera_transport::call::<_, String>(
            &transport as &dyn Transport,
            addr,
            &"hello".to_string(),
            payload,
        )
        .await;
    });
    let (mut largest, mut bytes, started) = (0, 0, Instant::now());
    let mut buf = vec![0u8; 65_536];
    while bytes < 20_000 && started.elapsed() < Duration::from_secs(5) {
        if let Ok((n, _)) = tokio::task::block_in_place(|| peer.recv_from(&mut buf)) {
            largest = largest.max(n);
            bytes += n;
        }
    }
    call.abort();
    assert!(bytes >= 20_000, "the call's bytes arrived: {bytes}");
    largest
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capped_transport_sends_no_datagram_past_the_cap_on_loopback() {
    let capped = largest_datagram_sent(Some(1472)).await;
    assert!(capped <= 1472, "capped: a datagram of {capped} bytes");
    let uncapped = largest_datagram_sent(None).await;
    assert!(
        uncapped > 1472,
        "uncapped: loopback's datagrams, {uncapped} bytes at most"
    );
}
