//! Write-behind and fetch-ahead for one file: runs sent to the store and not yet answered,
//! and the next read-ahead block being fetched.
//!
//! Without them the mount is stop-and-wait: the kernel's next write waits while an 8 MiB
//! run travels, and a sequential reader waits for each block in turn, where the library's
//! `put` and `get` keep several chunks in flight (the mount ran at 0.56x the library's
//! write and 0.67x its read). Order is kept where it matters: a run waits for every earlier
//! run it overlaps before it is sent, and reads, truncations, fsyncs and closes wait for the
//! runs they depend on. A run that fails is reported by the next write, fsync or close of
//! the file (as a page cache reports a failed write-back), never dropped.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tessera_client::{Client, File};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Runs of one file in flight at most: with 8 MiB runs, 32 MiB per file being written.
pub const RUNS_IN_FLIGHT_MAX: usize = 4;
/// Read-ahead blocks a sequential reader has on their way beyond the one it reads: with
/// 8 MiB blocks, three blocks in flight, as the library's `get` keeps three chunks (one
/// block ahead: two in flight).
pub const BLOCKS_AHEAD: usize = 2;

/// A failure as the errno the kernel is given.
pub type Errno = fuser::Errno;

/// One run sent and not yet answered.
struct InFlight {
    range: Range<u64>,
    task: JoinHandle<Result<(), Errno>>,
}

/// What is sent to the store for one file, and in what order; shared by its open handles.
#[derive(Default)]
pub struct FileOrder {
    /// Held while runs are started, blocks fetched and the file truncated: without it, an
    /// older run taken out by one thread could be sent after a newer one sent by another,
    /// or a block fetched before a write could be kept as read-ahead after it.
    pub lock: Mutex<()>,
    in_flight: Mutex<Vec<InFlight>>,
    /// The first failure of a run sent in the background, until it is reported.
    failed: Mutex<Option<Errno>>,
    /// See [`FileOrder::written_end`].
    written_end: AtomicU64,
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

impl FileOrder {
    /// Sends `data` to `offset` of `file` in the background, once every run in flight that
    /// it overlaps is answered and fewer than [`RUNS_IN_FLIGHT_MAX`] remain.
    pub fn start(
        &self,
        runtime: &Handle,
        client: &Client,
        file: &File,
        offset: u64,
        data: Vec<u8>,
    ) {
        let range = offset..offset.saturating_add(data.len() as u64);
        self.settle(runtime, &range);
        loop {
            let oldest = {
                let mut in_flight = self.in_flight.lock().unwrap();
                if in_flight.len() < RUNS_IN_FLIGHT_MAX {
                    break;
                }
                in_flight.remove(0)
            };
            self.await_run(runtime, oldest);
        }
        let (client, file) = (client.clone(), file.clone());
        let task = runtime.spawn(async move {
            client
                .write_at(&file, offset, &data)
                .await
                .map_err(|e| crate::fs::errno(&e))
        });
        self.in_flight
            .lock()
            .unwrap()
            .push(InFlight { range, task });
    }

    /// Waits for every run in flight that overlaps `range`.
    pub fn settle(&self, runtime: &Handle, range: &Range<u64>) {
        let picked: Vec<InFlight> = self
            .in_flight
            .lock()
            .unwrap()
            .extract_if(.., |run| overlaps(&run.range, range))
            .collect();
        for run in picked {
            self.await_run(runtime, run);
        }
    }

    /// Waits for every run in flight, then reports (and forgets) the first failure of any
    /// run sent in the background since the last report.
    pub fn settle_all(&self, runtime: &Handle) -> Result<(), Errno> {
        self.settle(runtime, &(0..u64::MAX));
        match self.failed.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A failure of a background run not yet reported, if any (left to be reported again).
    pub fn failure(&self) -> Option<Errno> {
        *self.failed.lock().unwrap()
    }

    /// Where the bytes written through the mount since the file's runs last all landed
    /// end: the file's size counts them, as they are acknowledged to the writer before the
    /// manager has the size they give (buffered, or in flight).
    pub fn written_end(&self) -> u64 {
        self.written_end.load(Ordering::SeqCst)
    }

    /// Counts a write acknowledged up to `end`.
    pub fn note_written(&self, end: u64) {
        self.written_end.fetch_max(end, Ordering::SeqCst);
    }

    /// Forgets the bytes written, once every run has landed and the manager's size holds
    /// them (the caller holds the file's lock, before it changes the size).
    pub fn landed(&self) {
        self.written_end.store(0, Ordering::SeqCst);
    }

    /// Whether no run is in flight.
    pub fn is_idle(&self) -> bool {
        self.in_flight.lock().unwrap().is_empty()
    }

    fn await_run(&self, runtime: &Handle, run: InFlight) {
        let outcome = runtime.block_on(run.task).unwrap_or(Err(Errno::EIO)).err();
        if let Some(e) = outcome {
            tracing::warn!(
                start = run.range.start,
                end = run.range.end,
                "run failed: {e:?}"
            );
            self.failed.lock().unwrap().get_or_insert(e);
        }
    }
}

/// A read-ahead block being fetched in the background.
pub struct Prefetch {
    /// Offset of the block.
    pub offset: u64,
    /// The file's size when the fetch began.
    pub file_size: u64,
    task: JoinHandle<Result<Vec<u8>, Errno>>,
}

impl Prefetch {
    /// Starts fetching `len` bytes at `offset` of `file`.
    pub fn start(
        runtime: &Handle,
        client: &Client,
        file: &File,
        offset: u64,
        len: u64,
        file_size: u64,
    ) -> Prefetch {
        let (client, file) = (client.clone(), file.clone());
        let task = runtime.spawn(async move {
            client
                .read_at(&file, offset, len)
                .await
                .map_err(|e| crate::fs::errno(&e))
        });
        Prefetch {
            offset,
            file_size,
            task,
        }
    }

    /// The fetched bytes (waiting for them).
    pub fn wait(self, runtime: &Handle) -> Result<Arc<Vec<u8>>, Errno> {
        let data = runtime.block_on(self.task).unwrap_or(Err(Errno::EIO))?;
        Ok(Arc::new(data))
    }
}
