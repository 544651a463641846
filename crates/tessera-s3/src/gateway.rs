//! The gateway's state and the storage steps the S3 operations share: bucket configs, small
//! gateway records, streaming an object's body in and out in stripe-sized chunks.

use crate::meta::{BucketConfig, ObjectMeta};
use crate::names;
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use tessera_client::{Client, ClientError, File, LayoutRequest, PendingFile};
use tessera_wire::ManagerError;

/// Bytes one client call of a streamed body moves (rounded to whole stripes).
const CHUNK_BYTES: u64 = 8 << 20;
/// Chunk writes of one upload in flight while the next chunk arrives: with the chunk being
/// filled, an upload holds at most `(WRITES_IN_FLIGHT + 1) * CHUNK_BYTES` (plus a stripe).
const WRITES_IN_FLIGHT: usize = 2;
/// Chunk reads of one download ahead of the one being sent.
const READ_AHEAD: usize = 2;
/// Largest gateway record (bucket config, object metadata) read back.
const RECORD_BYTES_MAX: u64 = 1 << 20;
/// Header overriding the scheme of a new bucket or object.
pub const SCHEME_HEADER: &str = "x-amz-meta-tessera-scheme";
/// Header overriding the stripe unit (bytes, or with K/M).
pub const STRIPE_UNIT_HEADER: &str = "x-amz-meta-tessera-stripe-unit";
/// Header overriding the width (servers to stripe over).
pub const WIDTH_HEADER: &str = "x-amz-meta-tessera-width";

/// An S3 gateway over one Tessera cluster.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) client: Client,
    /// Layout of new buckets unless their creation says otherwise.
    pub(crate) defaults: LayoutRequest,
    /// The part size of each multipart upload this gateway placed a part of (see
    /// [`crate::multipart`]).
    pub(crate) part_sizes:
        std::sync::Arc<tokio::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// How long a connection may take to send a request head (also while idle between
    /// requests), and a request body may send nothing, before it is dropped.
    pub(crate) idle: std::time::Duration,
}

/// The default of [`Gateway::with_idle_timeout`]: an idle or stalled peer holds a connection
/// and a descriptor at most this long (AWS closes idle connections after about 20 s too).
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// A client error as an S3 error; `missing` is what a missing path means in context.
pub(crate) fn s3_err(e: ClientError, missing: S3ErrorCode) -> S3Error {
    // Objects are files of a tree: `a` and `a/x` cannot both be objects (as in MinIO on a
    // file system, which answers `XMinioParentIsObject`).
    if let ClientError::Metadata(ManagerError::NotDir(at) | ManagerError::IsDir(at)) = &e {
        return S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!("the key conflicts with an object or prefix at '{at}': an object cannot also be a prefix of another"),
        );
    }
    let code = match &e {
        ClientError::Metadata(ManagerError::NotFound(_)) => missing,
        ClientError::Metadata(ManagerError::Layout(_)) => S3ErrorCode::InvalidArgument,
        ClientError::Metadata(ManagerError::NotEnoughServers { .. })
        | ClientError::Unavailable { .. }
        | ClientError::ManagerUnreachable { .. }
        | ClientError::Storage { .. } => S3ErrorCode::ServiceUnavailable,
        ClientError::TooLarge { .. } => S3ErrorCode::EntityTooLarge,
        _ => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, e.to_string())
}

/// A name error as S3's error for it.
pub(crate) fn name_err(e: names::NameError) -> S3Error {
    let code = match e {
        names::NameError::Bucket(_) => S3ErrorCode::InvalidBucketName,
        names::NameError::KeyTooLong(_) => S3ErrorCode::KeyTooLongError,
        _ => S3ErrorCode::InvalidArgument,
    };
    S3Error::with_message(code, e.to_string())
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Metadata(ManagerError::NotFound(_)))
}

impl Gateway {
    /// A gateway over `client`; new buckets get `defaults` unless their creation overrides it.
    pub fn new(client: Client, defaults: LayoutRequest) -> Gateway {
        Gateway {
            client,
            defaults,
            part_sizes: Default::default(),
            idle: IDLE_TIMEOUT,
        }
    }

    /// The same gateway dropping connections idle or stalled for `idle` (default
    /// [`IDLE_TIMEOUT`]).
    pub fn with_idle_timeout(mut self, idle: std::time::Duration) -> Gateway {
        self.idle = idle;
        self
    }

    /// A small file's bytes, or `None` if there is no such file.
    pub(crate) async fn read_record(&self, path: &str) -> Result<Option<Vec<u8>>, ClientError> {
        let file = match self.client.open(path).await {
            Ok(file) => file,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let size = self.client.size(&file).await?.min(RECORD_BYTES_MAX);
        self.client.read_at(&file, 0, size).await.map(Some)
    }

    /// The layout defaults of `bucket`; `NoSuchBucket` if it does not exist.
    pub(crate) async fn bucket_layout(&self, bucket: &str) -> S3Result<LayoutRequest> {
        names::check_bucket(bucket).map_err(name_err)?;
        let record = self
            .read_record(&names::marker_path(bucket))
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::NoSuchBucket))?;
        match record {
            None => Err(s3_error!(NoSuchBucket, "no bucket '{bucket}'")),
            // A creation cut off before its config was written.
            Some(bytes) if bytes.is_empty() => Ok(self.defaults.clone()),
            Some(bytes) => BucketConfig::decode(&bytes)
                .and_then(|config| config.layout())
                .map_err(|e| s3_error!(InternalError, "bucket '{bucket}': {e}")),
        }
    }

    /// The metadata of the object in `file`, if they were stored and describe that file.
    pub(crate) async fn object_meta(
        &self,
        bucket: &str,
        key: &str,
        file: u64,
    ) -> Option<ObjectMeta> {
        let bytes = self
            .read_record(&names::meta_path(bucket, key))
            .await
            .ok()??;
        let meta = ObjectMeta::decode(&bytes)
            .inspect_err(|e| tracing::warn!("{bucket}/{key}: {e}"))
            .ok()?;
        (meta.file == file).then_some(meta)
    }

    /// Write `bytes` as a new file that takes `path` when committed; it is synced, not yet
    /// committed.
    pub(crate) async fn write_pending_record(
        &self,
        path: &str,
        layout: LayoutRequest,
        bytes: &[u8],
    ) -> Result<PendingFile, ClientError> {
        let pending = self.client.create_pending(path, layout).await?;
        let written = async {
            self.client.write_at(&pending.file, 0, bytes).await?;
            self.client.sync(&pending.file).await
        };
        match written.await {
            Ok(()) => Ok(pending),
            Err(e) => {
                let _ = self.client.abandon_pending(&pending).await;
                Err(e)
            }
        }
    }

    /// Run `write` (which fills a pending file and gives the MD5 of what it wrote) under the
    /// file's lease, then sync the file; on any failure the pending file is abandoned.
    pub(crate) async fn fill_pending(
        &self,
        pending: &PendingFile,
        write: impl std::future::Future<Output = S3Result<[u8; 16]>>,
    ) -> S3Result<[u8; 16]> {
        let filled = self
            .client
            .keep_pending(pending, async {
                let md5 = write.await?;
                self.client
                    .sync(&pending.file)
                    .await
                    .map_err(|e| s3_err(e, S3ErrorCode::InternalError))?;
                Ok(md5)
            })
            .await;
        if filled.is_err() {
            let _ = self.client.abandon_pending(pending).await;
        }
        filled
    }

    /// Give a written and synced pending file its object's key, with `meta` beside it. The
    /// metadata record is written first and committed after the object: without it the
    /// object stays readable, with an ETag made from its file id.
    pub(crate) async fn commit_object(
        &self,
        bucket: &str,
        key: &str,
        layout: LayoutRequest,
        object: &PendingFile,
        meta: &ObjectMeta,
    ) -> S3Result<()> {
        let internal = |e| s3_err(e, S3ErrorCode::InternalError);
        let bytes = serde_json::to_vec(meta).expect("serializable");
        let record = match self
            .write_pending_record(&names::meta_path(bucket, key), layout, &bytes)
            .await
        {
            Ok(record) => record,
            Err(e) => {
                let _ = self.client.abandon_pending(object).await;
                return Err(internal(e));
            }
        };
        if let Err(e) = self.client.commit_pending(&object.file).await {
            let _ = self.client.abandon_pending(&record).await;
            let _ = self.client.abandon_pending(object).await;
            return Err(internal(e));
        }
        if let Err(e) = self.client.commit_pending(&record.file).await {
            tracing::warn!("{bucket}/{key}: stored, but its metadata could not be: {e}");
            let _ = self.client.abandon_pending(&record).await;
        }
        Ok(())
    }

    /// Bytes per chunk of a file's transfers: whole stripes, about [`CHUNK_BYTES`].
    pub(crate) async fn chunk_bytes(&self, file: &File) -> Result<u64, ClientError> {
        let stripe = self.client.meta(file).await?.layout.stripe_bytes();
        Ok(stripe * (CHUNK_BYTES / stripe).max(1))
    }

    /// Write a request body into `file` from offset 0, a chunk at a time, as it arrives;
    /// returns its length and MD5.
    pub(crate) async fn write_body(
        &self,
        file: &File,
        body: Option<StreamingBlob>,
    ) -> S3Result<(u64, [u8; 16])> {
        self.write_body_at(file, 0, body).await
    }

    /// Write a request body into `file` from offset `base`, a chunk at a time, as it arrives;
    /// returns its length and MD5.
    pub(crate) async fn write_body_at(
        &self,
        file: &File,
        base: u64,
        body: Option<StreamingBlob>,
    ) -> S3Result<(u64, [u8; 16])> {
        let chunk = self
            .chunk_bytes(file)
            .await
            .map_err(|e| s3_err(e, S3ErrorCode::InternalError))? as usize;
        // The MD5 of each chunk is taken on a blocking thread while the next chunk arrives
        // (one chunk at a time, in order): inline, it was a third of the gateway's CPU on
        // the task that receives the body.
        let mut md5 = Md5Chain::default();
        let (mut buf, mut offset) = (Vec::with_capacity(chunk), base);
        let mut writes = VecDeque::new();
        let mut body = body.map(|b| b.boxed());
        let result = async {
            loop {
                let next = match body.as_mut() {
                    // A body that sends nothing for the idle time fails its request (a
                    // stalled upload would otherwise hold its connection and chunk forever).
                    Some(stream) => tokio::time::timeout(self.idle, stream.next())
                        .await
                        .map_err(|_| {
                            s3_error!(RequestTimeout, "the body sent nothing for {:?}", self.idle)
                        })?,
                    None => None,
                };
                let end = next.is_none();
                if let Some(bytes) = next {
                    buf.extend_from_slice(&bytes.map_err(body_err)?);
                }
                while buf.len() >= chunk || (end && !buf.is_empty()) {
                    // The next chunk's buffer is made whole at once (growing it by doubling
                    // copied each chunk about once more).
                    let cut = chunk.min(buf.len());
                    let mut next = Vec::with_capacity(chunk);
                    next.extend_from_slice(&buf[cut..]);
                    buf.truncate(cut);
                    let full = Bytes::from(std::mem::replace(&mut buf, next));
                    md5.feed(full.clone()).await?;
                    let (client, file, at) = (self.client.clone(), file.clone(), offset);
                    offset = offset.checked_add(full.len() as u64).ok_or_else(|| {
                        s3_error!(EntityTooLarge, "the body ends past the largest offset")
                    })?;
                    writes.push_back(tokio::spawn(async move {
                        client.write_at(&file, at, &full).await
                    }));
                    if writes.len() > WRITES_IN_FLIGHT {
                        join_write(writes.pop_front().expect("non-empty")).await?;
                    }
                }
                if end {
                    while let Some(write) = writes.pop_front() {
                        join_write(write).await?;
                    }
                    return Ok((offset - base, md5.finish().await?));
                }
            }
        }
        .await;
        for write in writes {
            write.abort();
        }
        result
    }

    /// Stream bytes `start..end` of `file`, a chunk at a time with [`READ_AHEAD`] chunks read
    /// ahead; the reads stop when the receiver of the body goes away.
    pub(crate) fn read_body(&self, file: File, start: u64, end: u64, chunk: u64) -> StreamingBlob {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let client = self.client.clone();
        tokio::spawn(async move {
            let offsets = (start..end).step_by(chunk as usize);
            let blocks = match client
                .read_blocks(&file, offsets, chunk as usize, READ_AHEAD)
                .await
            {
                Ok(blocks) => blocks,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
            };
            let mut blocks = std::pin::pin!(blocks);
            let mut at = start;
            while let Some(block) = blocks.next().await {
                let wanted = chunk.min(end - at) as usize;
                let block = match block {
                    Ok((mut block, _)) if block.len() >= wanted => {
                        block.truncate(wanted);
                        Ok(Bytes::from(block))
                    }
                    Ok((block, _)) => Err(std::io::Error::other(format!(
                        "{}: {} bytes at {at} where {wanted} were expected (changed under the read?)",
                        file.path,
                        block.len()
                    ))),
                    Err(e) => Err(std::io::Error::other(e)),
                };
                let failed = block.is_err();
                if tx.send(block).await.is_err() || failed {
                    return;
                }
                at += wanted as u64;
            }
        });
        StreamingBlob::wrap(ChannelStream(rx))
    }
}

async fn join_write(write: tokio::task::JoinHandle<Result<(), ClientError>>) -> S3Result<()> {
    match write.await {
        Ok(done) => done.map_err(|e| s3_err(e, S3ErrorCode::InternalError)),
        Err(e) => Err(s3_error!(InternalError, "write task failed: {e}")),
    }
}

/// A body that could not be read: S3's own error if s3s gave one (a bad chunk signature),
/// else `IncompleteBody`.
fn body_err(e: s3s::StdError) -> S3Error {
    match e.downcast::<S3Error>() {
        Ok(e) => *e,
        Err(e) => s3_error!(IncompleteBody, "cannot read the request body: {e}"),
    }
}

/// The receiving end of a download's chunks, as a byte stream for the response body.
struct ChannelStream(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures::Stream for ChannelStream {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// An MD5 taken chunk by chunk on the blocking pool, at most one chunk at a time, in order.
#[derive(Default)]
struct Md5Chain {
    idle: Option<Md5>,
    hashing: Option<tokio::task::JoinHandle<Md5>>,
}

impl Md5Chain {
    /// The hasher once the chunk before is hashed.
    async fn take(&mut self) -> S3Result<Md5> {
        match self.hashing.take() {
            Some(job) => job
                .await
                .map_err(|e| s3_error!(InternalError, "hashing the body failed: {e}")),
            None => Ok(self.idle.take().unwrap_or_default()),
        }
    }

    /// Starts hashing `chunk` after the chunks fed before it.
    async fn feed(&mut self, chunk: Bytes) -> S3Result<()> {
        let mut md5 = self.take().await?;
        self.hashing = Some(tokio::task::spawn_blocking(move || {
            md5.update(&chunk);
            md5
        }));
        Ok(())
    }

    /// The MD5 of every chunk fed.
    async fn finish(mut self) -> S3Result<[u8; 16]> {
        Ok(self.take().await?.finalize().into())
    }
}
