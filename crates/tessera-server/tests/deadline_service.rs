//! Deadline-ordered service at a server (Radon, issue 18 item 4): a reserved stream's reads
//! are not served behind a best-effort bulk scan of the same store. Asserted on order (how
//! many of the scan's reads finish while a stream read waits), never on speed.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_layout::Region;
use tessera_server::schedule::ScheduleConfig;
use tessera_store::Store;
use tessera_transport::{ConnectionId, FrameHandler};
use tessera_wire::{Service, StorageCall, StorageRequest, StorageResponse};

const FILE: u64 = 1;
const SCAN_READ_BYTES: u32 = 1 << 20;
const SCAN_READS: u64 = 400;
const STREAM_READ_BYTES: u32 = 64 << 10;
const STREAM_READS: u64 = 20;

struct Server {
    handler: Arc<dyn FrameHandler>,
    incarnation: u64,
}

impl Server {
    async fn call(&self, request: StorageRequest, service: Service, payload: Bytes) -> Bytes {
        let call = StorageCall {
            incarnation: self.incarnation,
            request,
            service,
        };
        let message = Bytes::from(tessera_wire::encode_message(&call));
        let (answer, data) = self
            .handler
            .handle(1 as ConnectionId, message, payload)
            .await
            .expect("the server answers");
        let answer: StorageResponse = tessera_wire::decode_message(&answer).expect("an answer");
        assert!(!matches!(answer, StorageResponse::Error(_)), "{answer:?}");
        data
    }

    async fn read(&self, len: u32, service: Service) {
        let read = StorageRequest::Read {
            file: FILE,
            region: Region::Data,
            offset: 0,
            len,
            overlay: false,
        };
        let data = self.call(read, service, Bytes::new()).await;
        assert_eq!(data.len(), len as usize);
    }

    async fn counter(&self, name: &str) -> u64 {
        let message = StorageCall {
            incarnation: self.incarnation,
            request: StorageRequest::TransportCounters,
            service: Service::BestEffort,
        };
        let message = Bytes::from(tessera_wire::encode_message(&message));
        let (answer, _) = self
            .handler
            .handle(1 as ConnectionId, message, Bytes::new())
            .await
            .expect("counters");
        match tessera_wire::decode_message(&answer).expect("an answer") {
            StorageResponse::Counters { counters } => {
                counters.into_iter().find(|(n, _)| n == name).expect(name).1
            }
            other => panic!("not counters: {other:?}"),
        }
    }
}

/// Starts a scan of `SCAN_READS` best-effort reads at once; counts them as they finish.
fn start_scan(server: &Arc<Server>) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let finished = Arc::new(AtomicU64::new(0));
    let scan = (0..SCAN_READS)
        .map(|_| {
            let (server, finished) = (server.clone(), finished.clone());
            tokio::spawn(async move {
                server.read(SCAN_READ_BYTES, Service::BestEffort).await;
                finished.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    (finished, scan)
}

/// Waits until at least `queued` requests wait for the disk.
async fn until_queued(server: &Server, queued: u64) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while server.counter("queue_waiting").await < queued {
        let (waiting, done) = (
            server.counter("queue_waiting").await,
            server.counter("queue_best_effort").await,
        );
        assert!(
            Instant::now() < give_up,
            "the scan never queued up: {waiting} waiting, {done} done"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserved_reads_are_not_served_behind_a_bulk_scan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(Store::open(dir.path()).expect("store"));
    let incarnation = store.incarnation();
    let schedule = ScheduleConfig {
        disk_slots: 1,
        rebuild_bytes_per_s: None,
    };
    let server = Arc::new(Server {
        handler: tessera_server::handler_scheduled(store, 1, schedule),
        incarnation,
    });
    let write = StorageRequest::Write {
        file: FILE,
        region: Region::Data,
        offset: 0,
        invalidate_overflow: false,
    };
    let bytes = Bytes::from(vec![7u8; SCAN_READ_BYTES as usize]);
    server.call(write, Service::BestEffort, bytes).await;

    let (finished, scan) = start_scan(&server);
    until_queued(&server, SCAN_READS / 2).await;
    // A reserved stream's reads, one after another: each waits at most for the scan read
    // holding the disk and, once per `RESERVED_RUN_MAX` of them, the starvation rule's turn.
    let mut waited_max = 0;
    for _ in 0..STREAM_READS {
        let before = finished.load(Ordering::SeqCst);
        let deadline = Service::Reserved {
            deadline_us: 100_000,
        };
        server.read(STREAM_READ_BYTES, deadline).await;
        waited_max = waited_max.max(finished.load(Ordering::SeqCst) - before);
    }
    let scan_left = SCAN_READS - finished.load(Ordering::SeqCst);
    assert!(
        scan_left >= SCAN_READS / 4,
        "the scan nearly ended before the stream did"
    );
    assert!(
        waited_max <= 3,
        "a reserved read waited for {waited_max} scan reads"
    );
    let turns = server.counter("queue_unreserved_ahead_of_reserved").await;
    assert!(turns <= STREAM_READS / 8 + 1, "{turns} turns of the scan");
    // The same read as best effort waits behind every scan read queued before it.
    let before = finished.load(Ordering::SeqCst);
    server.read(STREAM_READ_BYTES, Service::BestEffort).await;
    let best_effort_waited = finished.load(Ordering::SeqCst) - before;
    assert!(
        best_effort_waited >= scan_left - 3,
        "a best-effort read waited for only {best_effort_waited} of {scan_left} scan reads"
    );
    // And the scan is not starved: it finishes.
    for read in scan {
        read.await.expect("scan read");
    }
    assert_eq!(server.counter("queue_reserved").await, STREAM_READS);
    assert_eq!(server.counter("queue_waiting").await, 0);
    println!(
        "best effort waited for {best_effort_waited} scan reads, reserved at most {waited_max} \
         ({turns} starvation turns); {scan_left} scan reads left when the stream ended"
    );
}
