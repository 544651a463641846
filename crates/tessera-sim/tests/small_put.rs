//! A small put (RAID-5, one partial stripe) reaches only the servers that hold its bytes: its
//! data column and its parity column. The other servers hold nothing of the file, so the
//! put's sync does not ask them to sync either (their handshakes and syncs were about a
//! third of a 64 KiB put's time on a tmpfs). Its stripe is new, zeros everywhere, so its
//! parity is written beside its data with no lock and no read. What that skips costs
//! nothing: with either holding server down the file reads whole from the other; both
//! losing power at once after the put keep it whole; and with every other server down it
//! still reads.
//!
//! Writes through one pending file's handle, in any order and overlapping, with parity
//! written fresh where a stripe was untouched and read-modify-written where it was not,
//! read back exact, also with any one server down.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tessera_client::{Client, LayoutRequest, Scheme};
use tessera_layout::Region;
use tessera_sim::{run_virtual, BeforeCall, SimCluster};
use tessera_transport::BoxFuture;
use tessera_wire::StorageRequest;

/// Each storage request's server and kind, in the order they were sent.
type Seen = Arc<Mutex<Vec<(SocketAddr, String)>>>;

/// A client of `cluster` whose storage requests are noted, each with its server and kind,
/// with the list they go to.
fn counting_client(cluster: &SimCluster) -> (Client, Seen) {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let noted = seen.clone();
    let counting = BeforeCall::new(
        Arc::new(cluster.network.transport(Duration::from_secs(1))),
        move |addr, request: Option<&StorageRequest>| {
            if let Some(request) = request {
                let kind = format!("{request:?}");
                let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_string();
                noted.lock().unwrap().push((addr, kind));
            }
            Box::pin(async {}) as BoxFuture<'static, ()>
        },
    );
    (
        Client::with_transport(cluster.manager_addr, Arc::new(counting)),
        seen,
    )
}

async fn small_put(seed: u64) {
    let mut cluster = SimCluster::start(seed, 5).await;
    let (client, seen) = counting_client(&cluster);
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
    // A new file's partial stripe holds zeros: no parity lock, no read of them.
    let reads = (seen.iter())
        .filter(|(_, kind)| matches!(kind.as_str(), "LockParity" | "Read"))
        .count();
    assert_eq!(reads, 0, "a new file's stripe is read back: {seen:?}");
    for &index in &contacted {
        cluster.crash_server(index);
        let reader = cluster.client();
        let file = reader.open("/small").await.expect("open");
        let read = (reader.read_at(&file, 0, bytes.len() as u64).await)
            .expect("read with a holding server down");
        assert!(
            read == bytes,
            "server {index} down: the parity holds the write"
        );
        assert!(cluster.start_server(index).await.is_none());
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

/// Random writes (offsets, lengths, order) through one pending file's handle, then a commit:
/// the file reads as a model of the writes says, with every server up and with each one down
/// (parity matches the data wherever it was written fresh or read-modify-written). A second
/// handle made of the file midway turns fresh writes off for the first; the writes still
/// land right.
async fn writes_through_one_handle(seed: u64, second_handle: bool) {
    let mut cluster = SimCluster::start(seed, 4).await;
    let client = cluster.client();
    let unit = 4096u32;
    let layout = LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: unit,
        width: Some(4),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (pending, mut open) = client
        .create_pending_open("/many", layout)
        .await
        .expect("create pending");
    let stripe = 3 * unit as usize;
    let mut model = vec![0u8; 12 * stripe];
    for n in 0..16 {
        if second_handle && n == 8 {
            let _other = client
                .open_id(&pending.file)
                .await
                .expect("a second handle");
        }
        let len = rng.gen_range(1..2 * stripe);
        let at = rng.gen_range(0..model.len() - len);
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if rng.gen() {
            client
                .upload_bytes(&mut open, at as u64, &bytes)
                .await
                .expect("write");
        } else {
            // As an HTTP body arrives: pieces cut anywhere, several in flight, neighbours
            // sharing stripes.
            let mut pieces = Vec::new();
            let mut from = 0;
            while from < len {
                let to = (from + rng.gen_range(1..unit as usize * 2)).min(len);
                pieces.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                    &bytes[from..to],
                )));
                from = to;
            }
            let stream = futures::stream::iter(pieces);
            let written = client.upload_stream(&mut open, at as u64, stream).await;
            assert_eq!(written.ok(), Some(len as u64), "a streamed write");
        }
        model[at..at + len].copy_from_slice(&bytes);
    }
    client.commit_upload(&open).await.expect("commit");
    let size = client.stat("/many").await.expect("stat").meta.size as usize;
    let model = &model[..size];
    for down in [None, Some(0), Some(1), Some(2), Some(3)] {
        if let Some(index) = down {
            cluster.crash_server(index);
        }
        let reader = cluster.client();
        let file = reader.open("/many").await.expect("open");
        let read = (reader.read_at(&file, 0, size as u64).await).expect("read");
        let wrong = read.iter().zip(model).filter(|(a, b)| a != b).count();
        assert_eq!(
            wrong, 0,
            "seed {seed}, server {down:?} down: {wrong} bytes wrong"
        );
        if let Some(index) = down {
            assert!(cluster.start_server(index).await.is_none());
        }
    }
}

#[test]
fn writes_through_one_pending_handle_in_any_order_read_back_exact_also_degraded() {
    for seed in 0..6 {
        run_virtual(writes_through_one_handle(seed, false));
        run_virtual(writes_through_one_handle(seed, true));
    }
}

/// Stripe units of the files of [`slow_parity_cluster`]'s tests (RAID-5 over 4).
const UNIT: usize = 4096;

/// A cluster of 4 servers and a client of it whose writes of parity are each held back by
/// 20 ms (of virtual time).
async fn slow_parity_cluster(seed: u64) -> (SimCluster, Client) {
    let cluster = SimCluster::start(seed, 4).await;
    let slow = BeforeCall::new(
        Arc::new(cluster.network.transport(Duration::from_secs(1))),
        |_, request: Option<&StorageRequest>| {
            let parity = matches!(
                request,
                Some(StorageRequest::Write {
                    region: Region::Redundancy,
                    ..
                })
            );
            Box::pin(async move {
                if parity {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }) as BoxFuture<'static, ()>
        },
    );
    let client = Client::with_transport(cluster.manager_addr, Arc::new(slow));
    (cluster, client)
}

/// RAID-5 over 4, of [`UNIT`]s.
fn raid5_over_4() -> LayoutRequest {
    LayoutRequest {
        scheme: Scheme::Raid5,
        stripe_unit: UNIT as u32,
        width: Some(4),
    }
}

/// `path` reads as `model` with each server down in turn.
async fn reads_exact_with_each_server_down(
    cluster: &mut SimCluster,
    path: &str,
    model: &[u8],
    seed: u64,
) {
    for index in 0..cluster.servers() {
        cluster.crash_server(index);
        let reader = cluster.client();
        let file = reader.open(path).await.expect("open");
        let read = (reader.read_at(&file, 0, model.len() as u64).await).expect("read");
        let wrong = read.iter().zip(model).filter(|(a, b)| a != b).count();
        assert_eq!(
            wrong, 0,
            "seed {seed}, server {index} down: {wrong} bytes wrong"
        );
        assert!(cluster.start_server(index).await.is_none());
    }
}

/// A body's first piece ends inside stripe 0 (written fresh: its parity beside its data, no
/// lock) and the next piece goes on in the same stripe, in flight beside it (read, modified
/// and written under the parity lock). The fresh parity lands late: the second write must
/// not read the stripe's parity before it does, or one of the two writes' share of the
/// parity is lost, and a read with a data server down gives wrong bytes.
async fn streamed_after_fresh(seed: u64) {
    let (mut cluster, client) = slow_parity_cluster(seed).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let bytes: Vec<u8> = (0..UNIT + 100).map(|_| rng.gen()).collect();
    let (_pending, mut open) = client
        .create_pending_open("/two", raid5_over_4())
        .await
        .expect("create pending");
    let pieces = [&bytes[..UNIT / 2], &bytes[UNIT / 2..]]
        .map(|piece| Ok::<_, std::io::Error>(Bytes::copy_from_slice(piece)));
    let written = (client.upload_stream(&mut open, 0, futures::stream::iter(pieces))).await;
    assert_eq!(written.ok(), Some(bytes.len() as u64));
    client.commit_upload(&open).await.expect("commit");
    reads_exact_with_each_server_down(&mut cluster, "/two", &bytes, seed).await;
}

#[test]
fn a_write_of_a_stripe_written_fresh_waits_for_that_write() {
    for seed in 0..3 {
        run_virtual(streamed_after_fresh(seed));
    }
}

/// Once a second handle is made of a pending file, its maker is no longer its only writer:
/// even a stripe nothing touched yet is then written under the parity lock.
#[test]
fn a_second_handle_of_a_pending_file_turns_fresh_writes_off() {
    run_virtual(async {
        let cluster = SimCluster::start(7, 4).await;
        let (client, seen) = counting_client(&cluster);
        let layout = LayoutRequest {
            scheme: Scheme::Raid5,
            stripe_unit: 4096,
            width: Some(4),
        };
        let (pending, mut open) = (client.create_pending_open("/shared", layout))
            .await
            .expect("create pending");
        let locks = |seen: &Mutex<Vec<(SocketAddr, String)>>| {
            let seen = seen.lock().unwrap();
            seen.iter().filter(|(_, kind)| kind == "LockParity").count()
        };
        client
            .upload_bytes(&mut open, 0, &[1; 100])
            .await
            .expect("write");
        assert_eq!(locks(&seen), 0, "stripe 0 written fresh");
        let _second = client
            .open_id(&pending.file)
            .await
            .expect("a second handle");
        client
            .upload_bytes(&mut open, 5 * 3 * 4096, &[2; 100])
            .await
            .expect("write");
        assert_eq!(locks(&seen), 1, "stripe 5 written under the lock");
    });
}

/// A handle made of a pending file while its maker's fresh write is in flight writes the
/// same stripe (read, modified and written under the parity lock). The fresh parity lands
/// late: the second handle's write must wait for it as the maker's own would, or it reads
/// the parity before the fresh write's share is in it and one of the two shares is lost.
async fn second_handle_during_fresh(seed: u64) {
    let (mut cluster, client) = slow_parity_cluster(seed).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = (0..UNIT + 100).map(|_| rng.gen()).collect();
    let overlay: Vec<u8> = (0..50).map(|_| rng.gen()).collect();
    let (pending, mut open) = client
        .create_pending_open("/both", raid5_over_4())
        .await
        .expect("create pending");
    let first = client.upload_bytes(&mut open, 0, &model);
    let second = async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut other = client.open_id(&pending.file).await.expect("second handle");
        client.upload_bytes(&mut other, 10, &overlay).await
    };
    let (first, second) = futures::join!(first, second);
    first.expect("maker's write");
    second.expect("second handle's write");
    model[10..60].copy_from_slice(&overlay);
    client.commit_upload(&open).await.expect("commit");
    reads_exact_with_each_server_down(&mut cluster, "/both", &model, seed).await;
}

#[test]
fn a_write_through_a_handle_made_during_a_fresh_write_waits_for_it() {
    for seed in 0..3 {
        run_virtual(second_handle_during_fresh(seed));
    }
}
