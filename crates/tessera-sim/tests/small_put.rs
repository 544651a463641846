//! A small put (RAID-5, one partial stripe) reaches only the servers that hold its bytes: its
//! data column and its parity column. The other servers hold nothing of the file, so the
//! put's sync does not ask them to sync either (their handshakes and syncs were about a
//! third of a 64 KiB put's time on a tmpfs). What that skips costs nothing: both holding
//! servers losing power at once after the put keep the file whole, and with every other
//! server down it still reads.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tessera_client::{Client, LayoutRequest, Scheme};
use tessera_sim::{run_virtual, SimCluster};
use tessera_transport::{BoxFuture, Reply, Transport, TransportError};
use tessera_wire::StorageCall;

/// The client's transport, noting each storage request's server and kind.
struct Counting {
    inner: Arc<dyn Transport>,
    seen: Arc<Mutex<Vec<(SocketAddr, String)>>>,
}

impl Transport for Counting {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        if let Ok(call) = tessera_wire::decode_message::<StorageCall>(&message) {
            let kind = format!("{:?}", call.request);
            let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_string();
            self.seen.lock().unwrap().push((addr, kind));
        }
        self.inner.call(addr, message, payload)
    }
}

async fn small_put(seed: u64) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let counting = Counting {
        inner: Arc::new(cluster.network.transport(Duration::from_secs(1))),
        seen: seen.clone(),
    };
    let client = Client::with_transport(cluster.manager_addr, Arc::new(counting));
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: 16 << 10,
        width: Some(5),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let bytes: Vec<u8> = (0..10_000).map(|_| rng.gen()).collect();
    let (_pending, mut open) = client
        .create_pending_open("/small", layout)
        .await
        .expect("create pending");
    client
        .upload_bytes(&mut open, 0, &bytes)
        .await
        .expect("upload");
    client.commit_upload(&open).await.expect("commit");

    let seen = seen.lock().unwrap().clone();
    let mut contacted: Vec<usize> = (0..cluster.servers())
        .filter(|&i| seen.iter().any(|(addr, _)| *addr == cluster.server_addr(i)))
        .collect();
    contacted.sort();
    assert_eq!(
        contacted.len(),
        2,
        "only the data and parity servers are asked anything: {seen:?}"
    );
    for &index in &contacted {
        let addr = cluster.server_addr(index);
        let kinds: Vec<&str> = (seen.iter())
            .filter(|(a, _)| *a == addr)
            .map(|(_, kind)| kind.as_str())
            .collect();
        assert!(
            kinds.contains(&"DescribeAndSync"),
            "server {index} keeps the record and syncs: {kinds:?}"
        );
    }

    // Both holding servers lose power at once: only what they synced is left.
    for (n, &index) in contacted.iter().enumerate() {
        cluster.power_loss(index, seed * 10 + n as u64);
    }
    for &index in &contacted {
        assert!(cluster.start_server(index).await.is_none());
    }
    let others: Vec<usize> = (0..cluster.servers())
        .filter(|i| !contacted.contains(i))
        .collect();
    for &index in &others {
        cluster.crash_server(index);
    }
    let reader = cluster.client();
    let file = reader.open("/small").await.expect("open");
    let read = reader
        .read_at(&file, 0, bytes.len() as u64)
        .await
        .expect("read with only the holding servers up");
    assert!(read == bytes, "the put reads back whole (seed {seed})");
}

#[test]
fn a_small_put_asks_only_the_servers_holding_its_bytes_and_keeps_them_through_a_power_loss() {
    for seed in 0..4 {
        run_virtual(small_put(seed));
    }
}
