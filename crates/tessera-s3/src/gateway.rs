//! The gateway's state and the storage steps the S3 operations share: bucket configs, small
//! gateway records, streaming an object's body in and out in stripe-sized chunks.

use crate::copy::short_block;
use crate::etag_md5::EtagMd5;
use crate::meta::{BucketConfig, ObjectMeta};
use crate::names;
use bytes::Bytes;
use futures::StreamExt;
use s3s::dto::StreamingBlob;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};
use std::pin::Pin;
use std::task::{Context, Poll};
use tessera_client::{
    Client, ClientError, LayoutRequest, OpenFile, PendingFile, Pieces, StreamUploadError,
};
use tessera_wire::ManagerError;

/// Chunk reads of one download ahead of the one being sent: as many as the client library's
/// own downloads keep in flight.
pub(crate) const READ_AHEAD: usize = tessera_client::TRANSFERS_IN_FLIGHT;
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
        // One manager round trip: the open brings the size and layout with it.
        let open = match self.client.open_file(path).await {
            Ok(open) => open,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = vec![0u8; open.size().min(RECORD_BYTES_MAX) as usize];
        let got = self.client.download_into(&open, 0, &mut bytes).await?;
        bytes.truncate(got);
        Ok(Some(bytes))
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

    /// Write `bytes` as a new file that takes `path` when committed (by
    /// [`Client::commit_upload`], which syncs it first).
    pub(crate) async fn write_pending_record(
        &self,
        path: &str,
        layout: LayoutRequest,
        bytes: &[u8],
    ) -> Result<(PendingFile, OpenFile), ClientError> {
        let (pending, mut open) = self.client.create_pending_open(path, layout).await?;
        match self.client.upload_bytes(&mut open, 0, bytes).await {
            Ok(()) => Ok((pending, open)),
            Err(e) => {
                let _ = self.client.abandon_pending(&pending).await;
                Err(e)
            }
        }
    }

    /// Run `write` (which fills a pending file, open as `open`, and gives the MD5 of what it
    /// wrote) under the file's lease; on any failure the pending file is abandoned. The
    /// file is synced by its commit ([`Gateway::commit_object`]).
    pub(crate) async fn fill_pending(
        &self,
        pending: &PendingFile,
        open: &mut OpenFile,
        write: impl AsyncFnOnce(&mut OpenFile) -> S3Result<[u8; 16]>,
    ) -> S3Result<[u8; 16]> {
        let filled = self.client.keep_pending(pending, write(open)).await;
        if filled.is_err() {
            let _ = self.client.abandon_pending(pending).await;
        }
        filled
    }

    /// Give a written pending file its object's key, with `meta` beside it. The metadata
    /// record is written first and committed after the object: without it the object stays
    /// readable, with an ETag made from its file id. An object `open` for transfers is
    /// synced and committed with the size its writes gave it ([`Client::commit_upload`]:
    /// no manager request of its own for the sync); without, it must be synced already.
    pub(crate) async fn commit_object(
        &self,
        (bucket, key): (&str, &str),
        layout: LayoutRequest,
        (object, open): (&PendingFile, Option<&OpenFile>),
        meta: &ObjectMeta,
    ) -> S3Result<()> {
        let internal = |e| s3_err(e, S3ErrorCode::InternalError);
        let bytes = serde_json::to_vec(meta).expect("serializable");
        let (record, record_open) = match self
            .write_pending_record(&names::meta_path(bucket, key), layout, &bytes)
            .await
        {
            Ok(record) => record,
            Err(e) => {
                let _ = self.client.abandon_pending(object).await;
                return Err(internal(e));
            }
        };
        // The record's servers sync beside the object's (syncing is most of a commit), and
        // the record is committed after the object.
        let record_synced = self.client.sync_upload(&record_open);
        let (committed, record_synced) = match open {
            // Under the lease: syncing a large object may take a while.
            Some(open) => {
                let commit = self.client.commit_upload(open);
                let both = futures::future::join(commit, record_synced);
                self.client.keep_pending(object, both).await
            }
            None => {
                let commit = self.client.commit_pending(&object.file);
                futures::future::join(commit, record_synced).await
            }
        };
        if let Err(e) = committed {
            let _ = self.client.abandon_pending(&record).await;
            let _ = self.client.abandon_pending(object).await;
            return Err(internal(e));
        }
        let record_committed = match record_synced {
            Ok(()) => self.client.commit_synced(&record_open).await,
            Err(e) => Err(e),
        };
        if let Err(e) = record_committed {
            tracing::warn!("{bucket}/{key}: stored, but its metadata could not be: {e}");
            let _ = self.client.abandon_pending(&record).await;
        }
        Ok(())
    }

    /// Write a request body into `open` from offset `base`, a chunk of whole stripes at a
    /// time, as it arrives, [`tessera_client::TRANSFERS_IN_FLIGHT`] chunks written while the
    /// next arrives (the open file's view serves every chunk: no manager round trip per
    /// chunk); returns its length and MD5. The manager learns the size at the sync or commit.
    pub(crate) async fn write_body_at(
        &self,
        open: &mut OpenFile,
        base: u64,
        body: Option<StreamingBlob>,
    ) -> S3Result<(u64, [u8; 16])> {
        let chunk = open.chunk_bytes(None) as usize;
        let mut chunker = BodyChunks::new(body, chunk, self.idle);
        let chunks = futures::stream::unfold(&mut chunker, |chunker| async move {
            chunker.next_chunk().await.map(|chunk| (chunk, chunker))
        });
        let written = self
            .client
            .upload_stream(open, base, Box::pin(chunks))
            .await;
        let size = match written {
            Ok(size) => size,
            Err(StreamUploadError::Source(e)) => return Err(e),
            Err(StreamUploadError::Store(e)) => return Err(s3_err(e, S3ErrorCode::InternalError)),
        };
        Ok((size, chunker.md5.finish().await?))
    }

    /// Stream bytes `start..end` of the file `open`, a chunk of whole stripes at a time with
    /// [`READ_AHEAD`] chunks read ahead (no manager round trip: the open's view serves
    /// them), each sent as the servers' answers hold it (`tessera_client::Pieces`: no copy
    /// into a block of the gateway's); the reads stop when the receiver of the body goes
    /// away.
    pub(crate) fn read_body(&self, open: OpenFile, start: u64, end: u64) -> StreamingBlob {
        // The reads ahead are futures of the task below, driven only while it polls them:
        // waiting to hand a block to a body one block behind, it left them unpolled. Room
        // for as many blocks as are read ahead keeps them going while the body is sent.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Pieces, std::io::Error>>(READ_AHEAD);
        let blocks = whole_blocks(self.client.clone(), open, start..end);
        tokio::spawn(async move {
            let mut blocks = std::pin::pin!(blocks);
            while let Some(block) = blocks.next().await {
                let failed = block.is_err();
                if tx.send(block).await.is_err() || failed {
                    return;
                }
            }
        });
        StreamingBlob::wrap(ChannelStream {
            blocks: rx,
            parts: Vec::new().into_iter(),
        })
    }
}

/// The blocks of bytes `range` of the file `open`, a chunk of whole stripes each, in order,
/// [`READ_AHEAD`] read at once; an error if the file holds fewer bytes than its size said
/// (changed under the read).
fn whole_blocks(
    client: Client,
    open: OpenFile,
    range: std::ops::Range<u64>,
) -> impl futures::Stream<Item = Result<Pieces, std::io::Error>> {
    let chunk = open.chunk_bytes(None) as usize;
    let path = open.file().path.clone();
    let mut at = range.start;
    let end = range.end;
    client
        .read_open_blocks(open, range, chunk, READ_AHEAD)
        .map(move |block| {
            let block = block.map_err(std::io::Error::other)?;
            let wanted = (chunk as u64).min(end - at);
            short_block(&path, &block, at, wanted, "read").map_err(std::io::Error::other)?;
            at += wanted;
            Ok(block)
        })
}

/// A body that could not be read: S3's own error if s3s gave one (a bad chunk signature),
/// else `IncompleteBody`.
fn body_err(e: s3s::StdError) -> S3Error {
    match e.downcast::<S3Error>() {
        Ok(e) => *e,
        Err(e) => s3_error!(IncompleteBody, "cannot read the request body: {e}"),
    }
}

/// The receiving end of a download's blocks, as a byte stream for the response body: each
/// block's parts one after the other.
struct ChannelStream {
    blocks: tokio::sync::mpsc::Receiver<Result<Pieces, std::io::Error>>,
    /// What is left of the block being sent.
    parts: std::vec::IntoIter<Bytes>,
}

impl futures::Stream for ChannelStream {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(part) = self.parts.next() {
                return Poll::Ready(Some(Ok(part)));
            }
            match std::task::ready!(self.blocks.poll_recv(cx)) {
                Some(Ok(block)) => self.parts = block.into_parts().into_iter(),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            }
        }
    }
}

/// A request body cut into chunks of `chunk` bytes (the last shorter), each the body's
/// pieces as they arrived (cut at the chunk's end, not copied: the storage write gathers
/// each request from them), each hashed into `md5` on a blocking thread of its own while the
/// next arrives and the chunks before are written: inline, the MD5 was a third of the
/// gateway's CPU on the task that receives the body.
struct BodyChunks {
    body: Option<futures::stream::BoxStream<'static, Result<Bytes, s3s::StdError>>>,
    /// The chunk being filled, never beyond `chunk` bytes.
    pieces: Pieces,
    /// What the last piece of the body brought beyond the chunk it filled.
    rest: Bytes,
    chunk: usize,
    idle: std::time::Duration,
    md5: Md5Chain,
}

impl BodyChunks {
    fn new(body: Option<StreamingBlob>, chunk: usize, idle: std::time::Duration) -> BodyChunks {
        BodyChunks {
            body: body.map(|b| b.boxed()),
            pieces: Pieces::new(),
            rest: Bytes::new(),
            chunk,
            idle,
            md5: Md5Chain::default(),
        }
    }

    /// Adds what fits of `piece` to the chunk being filled, keeping the remainder for the
    /// next.
    fn take(&mut self, mut piece: Bytes) {
        let fits = (self.chunk - self.pieces.len()).min(piece.len());
        self.pieces.push(piece.split_to(fits));
        self.rest = piece;
    }

    /// The next chunk; `None` once the body has ended and everything was handed out.
    async fn next_chunk(&mut self) -> Option<S3Result<Pieces>> {
        let rest = std::mem::take(&mut self.rest);
        self.take(rest);
        while self.pieces.len() < self.chunk && self.rest.is_empty() {
            let Some(stream) = self.body.as_mut() else {
                break;
            };
            // A body that sends nothing for the idle time fails its request (a stalled
            // upload would otherwise hold its connection and chunk forever).
            let next = match tokio::time::timeout(self.idle, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let idle = self.idle;
                    return Some(Err(s3_error!(
                        RequestTimeout,
                        "the body sent nothing for {idle:?}"
                    )));
                }
            };
            match next {
                Some(Ok(bytes)) => self.take(bytes),
                Some(Err(e)) => return Some(Err(body_err(e))),
                None => self.body = None,
            }
        }
        if self.pieces.is_empty() {
            return None;
        }
        let full = std::mem::take(&mut self.pieces);
        Some(self.md5.feed(full.clone()).await.map(|()| full))
    }
}

/// Chunks handed to a body's hasher and not yet hashed, beyond which the body waits for it.
/// Each is a chunk's buffer held a while longer (~8 MiB); four let the hasher fall behind by
/// a storage write's worth and catch up, where it had none: the body waited for the chunk
/// before to be hashed before it handed the next to the storage writes, so a late MD5 held
/// the writes back, and the writes held the MD5 (a chunk to hash came only with the next).
pub(crate) const MD5_QUEUE: usize = 4;

/// An MD5 taken chunk by chunk, in order, on a blocking thread of its own fed through a
/// queue of [`MD5_QUEUE`] chunks, started with the first chunk.
#[derive(Default)]
struct Md5Chain {
    queue: Option<tokio::sync::mpsc::Sender<Pieces>>,
    hasher: Option<tokio::task::JoinHandle<EtagMd5>>,
}

impl Md5Chain {
    /// Queues `chunk` to be hashed after the chunks fed before it; waits only while
    /// [`MD5_QUEUE`] chunks are queued.
    async fn feed(&mut self, chunk: Pieces) -> S3Result<()> {
        let queue = self.queue.get_or_insert_with(|| {
            let (queue, mut chunks) = tokio::sync::mpsc::channel::<Pieces>(MD5_QUEUE);
            self.hasher = Some(tokio::task::spawn_blocking(move || {
                let mut md5 = EtagMd5::new();
                while let Some(chunk) = chunks.blocking_recv() {
                    md5.update_pieces(&chunk);
                }
                md5
            }));
            queue
        });
        queue
            .send(chunk)
            .await
            .map_err(|_| s3_error!(InternalError, "hashing the body failed: its hasher is gone"))
    }

    /// The MD5 of every chunk fed, once all are hashed.
    async fn finish(mut self) -> S3Result<[u8; 16]> {
        // Closing the queue ends the hasher after the last chunk.
        drop(self.queue.take());
        let md5 = match self.hasher.take() {
            Some(hasher) => hasher
                .await
                .map_err(|e| s3_error!(InternalError, "hashing the body failed: {e}"))?,
            None => EtagMd5::new(),
        };
        Ok(md5.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::{Digest, Md5};

    /// A body arriving in pieces that do not line up with the chunks comes out as whole
    /// chunks (the last one shorter) that make up every byte in order, with its MD5.
    #[tokio::test]
    async fn a_body_is_cut_into_whole_chunks_with_its_md5() {
        let body: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut pieces = Vec::new();
        let (mut at, mut len) = (0, 1);
        while at < body.len() {
            let end = (at + len).min(body.len());
            pieces.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &body[at..end],
            )));
            (at, len) = (end, len * 3 % 9_001 + 1);
        }
        let blob = StreamingBlob::wrap(futures::stream::iter(pieces));
        let idle = std::time::Duration::from_secs(5);
        let mut chunks = BodyChunks::new(Some(blob), 4_096, idle);
        let mut joined = Vec::new();
        while let Some(chunk) = chunks.next_chunk().await {
            let chunk = chunk.expect("a chunk");
            assert!(chunk.len() == 4_096 || joined.len() + chunk.len() == body.len());
            assert!(
                chunks.pieces.is_empty(),
                "the chunk's pieces were handed on"
            );
            chunk
                .parts()
                .iter()
                .for_each(|part| joined.extend_from_slice(part));
        }
        assert!(joined == body, "the chunks make up the body");
        let md5: [u8; 16] = Md5::digest(&body).into();
        assert_eq!(chunks.md5.finish().await.expect("an MD5"), md5);
    }

    /// `body` as a request body arriving in pieces of `piece` bytes.
    fn blob_in_pieces(body: &[u8], piece: usize) -> StreamingBlob {
        let pieces: Vec<_> = body
            .chunks(piece)
            .map(|p| Ok::<_, std::io::Error>(Bytes::copy_from_slice(p)))
            .collect();
        StreamingBlob::wrap(futures::stream::iter(pieces))
    }

    /// The hasher runs behind the chunks handed out, through a queue: a body of many more
    /// chunks than the queue holds, in pieces of odd sizes, still hashes to its exact MD5
    /// (every chunk once, in order), as does an empty body (no chunk, no hasher started).
    #[tokio::test]
    async fn a_body_longer_than_the_md5_queue_keeps_its_exact_md5() {
        const CHUNK: usize = 1_000;
        let idle = std::time::Duration::from_secs(5);
        let len = CHUNK * (3 * MD5_QUEUE + 2) + 17;
        let body: Vec<u8> = (0..len as u32).map(|i| (i * 13 % 241) as u8).collect();
        for body in [&body[..], &[][..]] {
            let blob = blob_in_pieces(body, 777);
            let mut chunks = BodyChunks::new(Some(blob), CHUNK, idle);
            let mut joined = Vec::new();
            while let Some(chunk) = chunks.next_chunk().await {
                let chunk = chunk.expect("a chunk");
                chunk
                    .parts()
                    .iter()
                    .for_each(|part| joined.extend_from_slice(part));
            }
            assert!(joined == body, "the chunks make up the body");
            assert_eq!(chunks.md5.hasher.is_some(), !body.is_empty());
            let md5: [u8; 16] = Md5::digest(body).into();
            assert_eq!(chunks.md5.finish().await.expect("an MD5"), md5);
        }
    }

    /// A body's chunks are its pieces as they arrived, cut at the chunk boundaries, not
    /// copies: every part of every chunk lies in the memory of one of the body's pieces, at
    /// the place its bytes came from.
    #[tokio::test]
    async fn chunks_hold_the_bodys_pieces_not_copies() {
        const CHUNK: usize = 4_096;
        let body: Vec<u8> = (0..50_001u32).map(|i| (i * 3 % 251) as u8).collect();
        let pieces: Vec<Bytes> = body.chunks(1_500).map(Bytes::copy_from_slice).collect();
        let stream = pieces.iter().cloned().map(Ok::<_, std::io::Error>);
        let blob = StreamingBlob::wrap(futures::stream::iter(stream.collect::<Vec<_>>()));
        let mut chunks = BodyChunks::new(Some(blob), CHUNK, std::time::Duration::from_secs(5));
        let mut at = 0;
        while let Some(chunk) = chunks.next_chunk().await {
            for part in chunk.expect("a chunk").parts() {
                let (piece, within) = (at / 1_500, at % 1_500);
                let expected = pieces[piece].as_ptr() as usize + within;
                assert_eq!(
                    part.as_ptr() as usize,
                    expected,
                    "the part at {at} is a copy"
                );
                assert!(within + part.len() <= 1_500, "a part within one piece");
                at += part.len();
            }
        }
        assert_eq!(at, body.len());
        let md5: [u8; 16] = Md5::digest(&body).into();
        assert_eq!(chunks.md5.finish().await.expect("an MD5"), md5);
    }
}
