//! A degraded read races a full-stripe write (issue 15). The read reconstructs a lost unit
//! from the parity and the other data units, read in parallel; a write that completes
//! between the parity read and the data reads used to make it XOR old parity with new data
//! and return bytes that were neither the old nor the new. The reader's transport here
//! holds its data reads until its parity read is answered and the whole write is done, so
//! the interleaving is exact, not left to chance.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tessera_client::Client;
use tessera_layout::Region;
use tessera_sim::{run_virtual, SimCluster};
use tessera_transport::{BoxFuture, Reply, Transport, TransportError};
use tessera_wire::{StorageCall, StorageRequest};
use tokio::sync::watch;

const UNIT: u32 = 4096;
/// Three data units and one parity unit per stripe.
const STRIPE: usize = 3 * UNIT as usize;

/// The interleaving the reader's transport forces, once.
struct Race {
    /// Stripe 0's parity column.
    parity: SocketAddr,
    /// Stripe 0's data columns still up.
    data: Vec<SocketAddr>,
    /// The reader's parity read has been answered.
    parity_read: watch::Sender<bool>,
    /// The full-stripe write, run by the first data read held back.
    write: Mutex<Option<BoxFuture<'static, ()>>>,
    /// The write is done.
    written: watch::Sender<bool>,
    /// The write ran between the reader's parity and data reads.
    fired: AtomicBool,
}

/// The reader's transport: every request passes through, but a data read of stripe 0
/// waits for the parity read's answer and then for the write.
struct Racing {
    inner: Arc<dyn Transport>,
    race: Arc<Race>,
}

impl Race {
    async fn before_data_read(&self) {
        let mut parity_read = self.parity_read.subscribe();
        parity_read
            .wait_for(|&read| read)
            .await
            .expect("sender kept");
        let write = self.write.lock().unwrap().take();
        if let Some(write) = write {
            write.await;
            self.fired.store(true, Ordering::SeqCst);
            self.written.send_replace(true);
        }
        let mut written = self.written.subscribe();
        written.wait_for(|&done| done).await.expect("sender kept");
    }
}

impl Transport for Racing {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        self.call_expecting(addr, message, payload, None)
    }

    fn call_expecting(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        let region = match tessera_wire::decode_message::<StorageCall>(&message) {
            Ok(StorageCall {
                request: StorageRequest::Read { region, .. },
                ..
            }) => Some(region),
            _ => None,
        };
        let (inner, race) = (self.inner.clone(), self.race.clone());
        Box::pin(async move {
            let data_read = region == Some(Region::Data) && race.data.contains(&addr);
            if data_read {
                race.before_data_read().await;
            }
            let reply = inner
                .call_expecting(addr, message, payload, reply_bytes)
                .await;
            if region == Some(Region::Redundancy) && addr == race.parity {
                race.parity_read.send_replace(true);
            }
            reply
        })
    }
}

/// Column 0 of stripe 0 lost; a reader reads its first unit, degraded; a writer's write of
/// `len` bytes at `offset` (new bytes over the old stripe 0) completes after the reader's
/// parity read and before its data reads. The read must return the unit's old or new bytes
/// (it ends after the write: the new ones).
async fn race(seed: u64, offset: usize, len: usize) {
    let mut cluster = SimCluster::start(seed, 4).await;
    let writer = cluster.client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let old: Vec<u8> = (0..STRIPE).map(|_| rng.gen()).collect();
    let mut new = old.clone();
    rng.fill(&mut new[offset..offset + len]);
    let (file, columns) = cluster.raid5_file(&writer, UNIT, &old).await;
    let index_of = |column: usize| columns[column];
    // RAID-5 puts stripe 0's parity on the last column.
    let parity = cluster.server_addr(index_of(3));
    let data = vec![
        cluster.server_addr(index_of(1)),
        cluster.server_addr(index_of(2)),
    ];
    cluster.crash_server(index_of(0));
    let write = {
        let (writer, file) = (writer.clone(), file.clone());
        let bytes = new[offset..offset + len].to_vec();
        Box::pin(async move {
            writer
                .write_at(&file, offset as u64, &bytes)
                .await
                .expect("the write");
        }) as BoxFuture<'static, ()>
    };
    let race = Arc::new(Race {
        parity,
        data,
        parity_read: watch::channel(false).0,
        write: Mutex::new(Some(write)),
        written: watch::channel(false).0,
        fired: AtomicBool::new(false),
    });
    let racing = Racing {
        inner: Arc::new(cluster.network.transport(Duration::from_secs(1))),
        race: race.clone(),
    };
    let reader = Client::with_transport(cluster.manager_addr, Arc::new(racing));
    let file = reader.open("/f").await.expect("open");
    let read = reader
        .read_at(&file, 0, u64::from(UNIT))
        .await
        .expect("the degraded read");
    assert!(
        race.fired.load(Ordering::SeqCst),
        "the write ran between the reads"
    );
    let unit = UNIT as usize;
    let differing = read
        .iter()
        .zip(&new[..unit])
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        read[..] == old[..unit] || read[..] == new[..unit],
        "the degraded read returned neither the old nor the new unit ({differing} of {unit} \
         bytes differ from the new)"
    );
    assert_eq!(read[..], new[..unit], "the read ended after the write");
}

/// A full-stripe write (under a stale-parity record). Before the stripe generation, the read
/// returned old parity XOR new data: 4,082 of 4,096 bytes wrong;
/// for the partial write below, 996.
#[test]
fn a_full_stripe_write_between_a_degraded_reads_units_is_never_mixed_in() {
    run_virtual(race(11, 0, STRIPE));
}

/// A read-modify-write of 1,000 bytes of column 1 (under the parity lock and an intent
/// record): column 0's bytes do not change, but parity does.
#[test]
fn a_partial_stripe_write_between_a_degraded_reads_units_is_never_mixed_in() {
    run_virtual(race(12, UNIT as usize + 100, 1000));
}
