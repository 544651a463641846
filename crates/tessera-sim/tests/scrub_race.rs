//! A scrub repairs a mirror while a writer writes the same bytes. A writer that died between
//! its primary and mirror copies left them different; the scrub then reads both and copies
//! the primary over the mirror. Meanwhile a second writer writes the range and is
//! acknowledged. Before mirror fences, the repair could land after that writer's mirror copy
//! and undo it there: with the primary's server down, the acknowledged bytes were gone. The
//! scrubber's transport here starts the second write just before the repair's write goes
//! out and lets it run for 300 ms (ample for both its copies on the simulated network), so
//! the interleaving is exact, not left to chance.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tessera_client::{Client, LayoutRequest, Scheme};
use tessera_layout::{OverflowRole, Region};
use tessera_sim::{run_virtual, BeforeCall, SimCluster};
use tessera_transport::{BoxFuture, Transport};
use tessera_wire::StorageRequest;

const UNIT: u32 = 4096;
/// The range the writers race over: part of one unit (a Hybrid partial-stripe write, so its
/// copies are overflow entries).
const AT: u64 = 5000;
const LEN: usize = 1500;

/// Whether `request` writes a mirror copy of `scheme`.
fn is_mirror_write(scheme: Scheme, request: &StorageRequest) -> bool {
    matches!(
        (scheme, request),
        (
            Scheme::Raid1,
            StorageRequest::Write {
                region: Region::Redundancy,
                ..
            },
        ) | (
            Scheme::Hybrid,
            StorageRequest::OverflowWrite {
                role: OverflowRole::Mirror,
                ..
            },
        )
    )
}

/// A client whose mirror writes never leave: `reached` is set when the first is sent, which
/// is after its primary copy was answered.
fn dying_writer(cluster: &SimCluster, scheme: Scheme, reached: Arc<AtomicBool>) -> Client {
    let inner: Arc<dyn Transport> = Arc::new(cluster.network.transport(Duration::from_secs(1)));
    let hook = BeforeCall::new(
        inner,
        move |_: SocketAddr, request: Option<&StorageRequest>| {
            if request.is_some_and(|r| is_mirror_write(scheme, r)) {
                reached.store(true, Ordering::SeqCst);
                return Box::pin(std::future::pending()) as BoxFuture<'static, ()>;
            }
            Box::pin(async {}) as BoxFuture<'static, ()>
        },
    );
    Client::with_transport(cluster.manager_addr, Arc::new(hook))
}

/// A scrubber that, before its first write under a mirror fence, starts `write` and gives it
/// 300 ms.
fn racing_scrubber(
    cluster: &SimCluster,
    write: BoxFuture<'static, ()>,
    started: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
) -> Client {
    let inner: Arc<dyn Transport> = Arc::new(cluster.network.transport(Duration::from_secs(1)));
    let write = Arc::new(Mutex::new(Some(write)));
    let hook = BeforeCall::new(
        inner,
        move |_: SocketAddr, request: Option<&StorageRequest>| {
            let repair = matches!(request, Some(StorageRequest::UnderMirrorFence { .. }));
            let held = if repair {
                write.lock().unwrap().take()
            } else {
                None
            };
            let started = started.clone();
            Box::pin(async move {
                if let Some(write) = held {
                    *started.lock().unwrap() = Some(tokio::spawn(write));
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }) as BoxFuture<'static, ()>
        },
    );
    Client::with_transport(cluster.manager_addr, Arc::new(hook))
}

/// Reads the raced range with server `down` stopped.
async fn read_without(cluster: &mut SimCluster, down: usize) -> Vec<u8> {
    cluster.crash_server(down);
    let reader = cluster.client();
    let file = reader.open("/f").await.expect("open");
    let read = reader
        .read_at(&file, AT, LEN as u64)
        .await
        .expect("a degraded read");
    assert!(cluster.start_server(down).await.is_none());
    read
}

async fn race(scheme: Scheme, seed: u64) {
    let cluster = SimCluster::start(seed, 4).await;
    let mut cluster = cluster;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let first = cluster.client();
    let layout = LayoutRequest {
        scheme,
        stripe_unit: UNIT,
        width: Some(4),
    };
    let file = first.create("/f", layout).await.expect("create");
    let base: Vec<u8> = (0..6 * UNIT).map(|_| rng.gen()).collect();
    first.write_at(&file, 0, &base).await.expect("write");
    first.sync(&file).await.expect("sync");

    // A writer dies between its primary and mirror copies: they differ from now on.
    let reached = Arc::new(AtomicBool::new(false));
    let dying = dying_writer(&cluster, scheme, reached.clone());
    let torn: Vec<u8> = (0..LEN).map(|_| rng.gen()).collect();
    let died = {
        let file = dying.open("/f").await.expect("open");
        tokio::spawn(async move {
            let _ = dying.write_at(&file, AT, &torn).await;
        })
    };
    while !reached.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    died.abort();

    // The scrub repairs the mirror while a second writer writes the range.
    let expected: Vec<u8> = (0..LEN).map(|_| rng.gen()).collect();
    let write = {
        let writer = cluster.client();
        let expected = expected.clone();
        Box::pin(async move {
            let file = writer.open("/f").await.expect("open");
            writer
                .write_at(&file, AT, &expected)
                .await
                .expect("the write during the scrub");
            writer.sync(&file).await.expect("sync");
        }) as BoxFuture<'static, ()>
    };
    let started = Arc::new(Mutex::new(None));
    let scrubber = racing_scrubber(&cluster, write, started.clone());
    let report = scrubber.scrub(Some("/f")).await.expect("the scrub");
    let writing = started
        .lock()
        .unwrap()
        .take()
        .expect("the write raced the repair");
    writing.await.expect("the write was acknowledged");
    assert!(report.mirrors_repaired >= 1, "{scheme:?}: {report:?}");
    assert!(report.unrepairable.is_empty(), "{scheme:?}: {report:?}");

    // Both copies hold the acknowledged write: read with each of the range's servers down.
    let meta = first.stat("/f").await.expect("stat").meta;
    let block = AT / u64::from(UNIT);
    let columns = match scheme {
        Scheme::Raid1 => [
            meta.layout.data_slot(block).column,
            meta.layout.mirror_slot(block).expect("mirror").column,
        ],
        _ => [OverflowRole::Primary, OverflowRole::Mirror]
            .map(|role| meta.layout.overflow_column(block, role)),
    };
    for column in columns {
        let down = cluster.index_of(meta.servers[column as usize]);
        let read = read_without(&mut cluster, down).await;
        let wrong = read.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(
            wrong, 0,
            "{scheme:?} seed {seed}: {wrong} of {LEN} bytes read wrong with column {column} down"
        );
    }
}

#[test]
fn a_scrub_repairing_a_raid1_mirror_never_undoes_a_write_racing_it() {
    for seed in 0..3 {
        run_virtual(race(Scheme::Raid1, seed));
    }
}

#[test]
fn a_scrub_repairing_a_hybrid_overflow_mirror_never_undoes_a_write_racing_it() {
    for seed in 0..3 {
        run_virtual(race(Scheme::Hybrid, seed));
    }
}

/// A read finds a corrupt 4 KiB block in block 0's unit and repairs the unit while a write
/// of other bytes of that unit has landed on the primary, its mirror copy not yet sent.
/// Before, the repair took the mirror's copy for the primary's (RAID-1: the whole mirror
/// unit; Hybrid: the mirror's overflow entries, the primary's trimmed), undoing that write
/// there; once the mirror copy landed too, the write was acknowledged and read back old with
/// the mirror's server down. Now a RAID-1 repair rewrites only the block that fails its
/// checksum, and a Hybrid one keeps the primary's entries. RAID-1 writes the unit's second
/// block; Hybrid writes 500 bytes inside the first (a partial stripe: overflow entries).
async fn read_repair_race(scheme: Scheme, seed: u64) {
    let (unit, at, len): (u32, u64, usize) = match scheme {
        Scheme::Raid1 => (8192, 4096, 4096),
        _ => (4096, 1000, 500),
    };
    let mut cluster = SimCluster::start(seed, 4).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let first = cluster.client();
    let layout = LayoutRequest {
        scheme,
        stripe_unit: unit,
        width: Some(4),
    };
    let file = first.create("/f", layout).await.expect("create");
    let base: Vec<u8> = (0..6 * unit).map(|_| rng.gen()).collect();
    first.write_at(&file, 0, &base).await.expect("write");
    first.sync(&file).await.expect("sync");
    let meta = first.stat("/f").await.expect("stat").meta;
    let primary = meta.layout.data_slot(0);
    let mirror_column = match scheme {
        Scheme::Raid1 => meta.layout.mirror_slot(0).expect("mirror").column,
        _ => meta.layout.overflow_column(0, OverflowRole::Mirror),
    };
    let primary_server = cluster.index_of(meta.servers[primary.column as usize]);
    let mirror_server = cluster.index_of(meta.servers[mirror_column as usize]);
    let offset = meta.layout.local_offset(primary) + rng.gen_range(0..4096);
    assert!(cluster.flip_bit_in(primary_server, meta.id, "data", offset, 3));

    // A writer of other bytes of the unit, its mirror copy held back until `go`.
    let (reached, go) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let inner: Arc<dyn Transport> = Arc::new(cluster.network.transport(Duration::from_secs(5)));
    let hook = {
        let (reached, go) = (reached.clone(), go.clone());
        BeforeCall::new(
            inner,
            move |_: SocketAddr, request: Option<&StorageRequest>| {
                let held = request.is_some_and(|r| is_mirror_write(scheme, r));
                let (reached, go) = (reached.clone(), go.clone());
                Box::pin(async move {
                    if held {
                        reached.store(true, Ordering::SeqCst);
                        go.acquire().await.expect("open").forget();
                    }
                }) as BoxFuture<'static, ()>
            },
        )
    };
    let writer = Client::with_transport(cluster.manager_addr, Arc::new(hook));
    let written: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    let writing = {
        let written = written.clone();
        let file = writer.open("/f").await.expect("open");
        tokio::spawn(async move {
            writer.write_at(&file, at, &written).await?;
            writer.sync(&file).await
        })
    };
    while !reached.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    // The read meets the corrupt block and repairs the unit; the write's primary copy is
    // in, so the read returns it.
    let mut expected = base[..unit as usize].to_vec();
    expected[at as usize..at as usize + len].copy_from_slice(&written);
    let reader = cluster.client();
    let file = reader.open("/f").await.expect("open");
    let read = reader.read_at(&file, 0, 4096).await.expect("a read");
    let wrong = read.iter().zip(&expected).filter(|(a, b)| a != b).count();
    assert_eq!(wrong, 0, "{scheme:?} seed {seed}: the repairing read");
    go.add_permits(64);
    writing
        .await
        .expect("joined")
        .expect("the write was acknowledged");

    for down in [mirror_server, primary_server] {
        cluster.crash_server(down);
        let reader = cluster.client();
        let file = reader.open("/f").await.expect("open");
        let read = reader
            .read_at(&file, 0, u64::from(unit))
            .await
            .expect("a degraded read");
        let wrong = read.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(
            wrong, 0,
            "{scheme:?} seed {seed}: {wrong} bytes wrong with server {down} down"
        );
        assert!(cluster.start_server(down).await.is_none());
    }
}

#[test]
fn a_read_repairing_a_corrupt_raid1_block_never_undoes_a_write_of_its_unit() {
    for seed in 0..3 {
        run_virtual(read_repair_race(Scheme::Raid1, seed));
    }
}

#[test]
fn a_read_repairing_a_corrupt_hybrid_unit_never_undoes_an_overflow_write_of_it() {
    for seed in 0..3 {
        run_virtual(read_repair_race(Scheme::Hybrid, seed));
    }
}
