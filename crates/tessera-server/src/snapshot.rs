//! The storage requests of copy-on-write snapshots, run against the store (whose `snapshot`
//! module holds the design): begin, read as of a snapshot, drop its copies, and their size.

use crate::blocking;
use bytes::Bytes;
use std::sync::Arc;
use tessera_store::Store;
use tessera_wire::{StorageError, StorageRequest, StorageResponse};

/// Most files one `SnapshotBegin` may name: the request is one bounded message, and the
/// begin of each is a small durable write.
pub const SNAPSHOT_BEGIN_FILES_MAX: usize = 4096;

/// Answers one snapshot request.
pub(crate) async fn handle(
    store: Arc<Store>,
    request: StorageRequest,
) -> Result<(StorageResponse, Bytes), StorageError> {
    let done = Ok((StorageResponse::Done, Bytes::new()));
    match request {
        StorageRequest::SnapshotBegin { epoch, files } => {
            if files.len() > SNAPSHOT_BEGIN_FILES_MAX {
                return Err(StorageError::BadRequest {
                    detail: format!(
                        "{} files in one snapshot begin; at most {SNAPSHOT_BEGIN_FILES_MAX}",
                        files.len()
                    ),
                });
            }
            blocking(move || store.snapshot_begin(&files, epoch)).await?;
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
