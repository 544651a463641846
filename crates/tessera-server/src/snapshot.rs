//! The storage requests of copy-on-write snapshots, run against the store (whose `snapshot`
//! module holds the design, and argues the fence): fence, begin, release, read as of a
//! snapshot, drop its copies, and their size.

use crate::blocking;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tessera_store::{ParityLocks, Store};
use tessera_wire::{FileId, StorageError, StorageRequest, StorageResponse};
use tokio::time::Instant;

/// Most files one `SnapshotBegin` (or fence, or release) may name: the request is one
/// bounded message, and the begin of each is a small durable write.
pub const SNAPSHOT_BEGIN_FILES_MAX: usize = 4096;

/// Longest a `SnapshotFence` waits for the writes in flight to drain before it answers
/// `WritesInFlight`: a write holds a lock or record for a few round trips, and a dead writer's
/// lock lease is broken after `PARITY_LEASE`; well below the fence's own lease.
pub const SNAPSHOT_DRAIN_MAX: Duration = Duration::from_millis(1500);

/// How often a draining fence looks again.
const DRAIN_POLL: Duration = Duration::from_millis(2);

fn check_files(files: &[FileId]) -> Result<(), StorageError> {
    if files.len() > SNAPSHOT_BEGIN_FILES_MAX {
        return Err(StorageError::BadRequest {
            detail: format!(
                "{} files in one snapshot request; at most {SNAPSHOT_BEGIN_FILES_MAX}",
                files.len()
            ),
        });
    }
    Ok(())
}

/// Raises the fence of snapshot `epoch` on `files` and waits until no write of them is in
/// flight here: no parity lock held or waited for, no stale-parity record (a live one is a
/// full-stripe write in flight; an orphaned one a torn stripe, which the resolver makes
/// whole). Intent records left then are orphaned, and the begin records their spans lost.
async fn fence(
    store: &Store,
    locks: &ParityLocks,
    epoch: u64,
    files: &[FileId],
) -> Result<(), StorageError> {
    let lease = Duration::from_millis(tessera_wire::SNAPSHOT_FENCE_LEASE_MS);
    locks.fence(files, epoch, Instant::now() + lease);

    let give_up = Instant::now() + SNAPSHOT_DRAIN_MAX;
    loop {
        let busy = files
            .iter()
            .find(|&&file| !locks.quiet(file) || store.has_stale_records(file));
        let Some(&file) = busy else {
            return Ok(());
        };
        if Instant::now() >= give_up {
            locks.release_fence(files, epoch);
            return Err(StorageError::WritesInFlight { file });
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Answers one snapshot request.
pub(crate) async fn handle(
    store: Arc<Store>,
    locks: Arc<ParityLocks>,
    request: StorageRequest,
) -> Result<(StorageResponse, Bytes), StorageError> {
    let done = Ok((StorageResponse::Done, Bytes::new()));
    match request {
        StorageRequest::SnapshotFence { epoch, files } => {
            check_files(&files)?;
            fence(&store, &locks, epoch, &files).await?;
            done
        }
        StorageRequest::SnapshotBegin { epoch, files } => {
            check_files(&files)?;
            let now = Instant::now();
            for &file in &files {
                locks.require_fenced(file, epoch, now)?;
            }
            blocking(move || store.snapshot_begin(&files, epoch)).await?;
            done
        }
        StorageRequest::SnapshotRelease { epoch, files } => {
            check_files(&files)?;
            locks.release_fence(&files, epoch);
            done
        }
        StorageRequest::ReadSnapshot {
            file,
            region,
            offset,
            len,
            epoch,
        } => {
            let data =
                blocking(move || store.read_snapshot(file, region, offset, len, epoch)).await?;
            Ok((StorageResponse::Data, Bytes::from(data)))
        }
        StorageRequest::SnapshotDrop { file, epoch, live } => {
            blocking(move || store.snapshot_drop(file, epoch, &live)).await?;
            done
        }
        StorageRequest::SnapshotUsage { file } => {
            let stored_bytes = blocking(move || store.snapshot_usage(file)).await?;
            Ok((StorageResponse::Usage { stored_bytes }, Bytes::new()))
        }
        other => unreachable!("not a snapshot request: {other:?}"),
    }
}
