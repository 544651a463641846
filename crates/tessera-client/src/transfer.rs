//! Whole transfers: a stream of bytes into or out of a file, several chunks in flight.
//!
//! A transfer works on an [`OpenFile`]: the file's view (layout, the server of each column,
//! what they owe, its size) taken from the manager once, by the open, and used by every chunk.
//! So the chunks cost the manager nothing: no lookup and no size update per chunk. A writer
//! tells the manager the size once, at the end: [`Client::sync_open`] (the `sync` promise:
//! data, size and records durable before it returns) or, for a pending file,
//! [`Client::commit_upload`], whose commit carries the size durably.
//!
//! ```no_run
//! # async fn demo(client: tessera_client::Client) -> Result<(), tessera_client::ClientError> {
//! use tessera_client::{LayoutRequest, Scheme};
//! let layout = LayoutRequest { scheme: Scheme::Raid5, stripe_unit: 65536, width: None };
//! let (pending, mut open) = client.create_pending_open("isos/big.iso", layout).await?;
//! let mut source = std::io::Cursor::new(vec![7u8; 100_000]);
//! client.upload(&mut open, 0, &mut source, None, &mut |_| {}).await?;
//! client.commit_upload(&open).await?; // two manager round trips in all, with the create
//! let mut copy = Vec::new();
//! let open = client.open_file("isos/big.iso").await?; // one more
//! client.download(&open, 0, open.size(), &mut copy, None, &mut |_| {}).await?;
//! # drop(pending); Ok(()) }
//! ```

use crate::context::FileContext;
use crate::stream::StreamClock;
use crate::{Client, ClientError, File, PendingFile, Pieces};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use std::borrow::Cow;
use std::io::{Read, Write};
use tessera_layout::Layout;
use tessera_wire::{FileMeta, LayoutRequest, ManagerRequest, ManagerResponse, StorageRequest};

/// Bytes moved by one chunk of a transfer (whole stripes near this).
pub const TRANSFER_CHUNK_BYTES: u64 = 8 << 20;
/// Chunks of one transfer in flight at once.
pub const TRANSFERS_IN_FLIGHT: usize = 3;
/// Bytes an upload writes between the syncs it starts while it goes on, when asked to
/// ([`OpenFile::sync_ahead`]).
pub const SYNC_AHEAD_BYTES: u64 = 32 << 20;

/// A file opened for transfers: its view as the manager gave it at the open, and the size
/// this handle's writes gave it since.
pub struct OpenFile {
    file: File,
    ctx: FileContext,
    /// The size the manager holds (as far as this handle knows).
    size_at_manager: u64,
    /// Uploads sync the servers after every so many bytes (see [`OpenFile::sync_ahead`]).
    sync_every: Option<u64>,
}

impl OpenFile {
    fn new(ctx: FileContext) -> OpenFile {
        OpenFile {
            file: File {
                id: ctx.meta.id,
                path: ctx.meta.path.clone(),
            },
            size_at_manager: ctx.meta.size,
            ctx,
            sync_every: None,
        }
    }

    /// Have uploads through this handle sync the file's servers after every
    /// [`SYNC_AHEAD_BYTES`] they write, while the next chunks go on, for a file that is
    /// synced once written (a put's, committed by [`Client::commit_upload`]). The servers
    /// write to their page cache and reach the disk only when synced: left to the final
    /// sync, all of a large file's bytes went to disk after the last chunk, one step after
    /// the transfer rather than beside it (for a 256 MiB RAID-5 put, 320 MiB: about 0.4 s at
    /// the ~800 MB/s of the disk it was measured on). Syncs started this
    /// way are hints: one that fails is not an error, the final sync decides.
    pub fn sync_ahead(mut self) -> OpenFile {
        self.sync_every = Some(SYNC_AHEAD_BYTES);
        self
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its metadata at the open, with the size this handle's writes gave it.
    pub fn meta(&self) -> &FileMeta {
        &self.ctx.meta
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.ctx.layout
    }

    /// Its size: as at the open, grown by this handle's writes.
    pub fn size(&self) -> u64 {
        self.ctx.meta.size
    }

    /// Refuse a byte range that passes the largest size a file of this layout can have, or
    /// whose end does not fit in a `u64` ([`ClientError::TooLarge`]).
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.ctx.check_range(offset, len)
    }

    /// Bytes per chunk: whole stripes near [`TRANSFER_CHUNK_BYTES`], or for a reserved
    /// stream near a quarter of its budget per period (whole stripes still), so that chunks
    /// released at the rate finish within the period whose bytes they carry.
    pub fn chunk_bytes(&self, stream: Option<&StreamClock>) -> u64 {
        chunk_bytes(&self.ctx, stream)
    }
}

/// See [`OpenFile::chunk_bytes`].
fn chunk_bytes(ctx: &FileContext, stream: Option<&StreamClock>) -> u64 {
    let stripe = ctx.layout.stripe_bytes();
    let target = stream.map_or(TRANSFER_CHUNK_BYTES, |stream| {
        (stream.budget_bytes() / 4).min(TRANSFER_CHUNK_BYTES)
    });
    stripe * (target / stripe).max(1)
}

/// The syncs an upload starts while it goes on ([`OpenFile::sync_ahead`]): at most one at a
/// time, polled while the upload waits for its writes.
struct SyncAhead<'a> {
    every: Option<u64>,
    /// Bytes written since the last sync started.
    unsynced: u64,
    running: Option<futures::future::BoxFuture<'a, ()>>,
}

impl<'a> SyncAhead<'a> {
    fn new(every: Option<u64>) -> SyncAhead<'a> {
        SyncAhead {
            every,
            unsynced: 0,
            running: None,
        }
    }

    /// `bytes` more were written: starts a sync of every column of `ctx` once enough were
    /// and none is running.
    fn written(&mut self, client: &'a Client, ctx: &'a FileContext, bytes: u64) {
        let Some(every) = self.every else {
            return;
        };
        self.unsynced += bytes;
        if self.unsynced < every || self.running.is_some() {
            return;
        }
        self.unsynced = 0;
        self.running = Some(Box::pin(async move {
            let syncs = (0..ctx.layout.width)
                .filter(|&column| !ctx.lost_entirely(column))
                .map(|column| ctx.rpc(client, column, StorageRequest::Sync, Bytes::new()));
            // A hint: the final sync decides, and accounts for a column that fails.
            let _ = futures::future::join_all(syncs).await;
        }));
    }

    /// The next of `in_flight` to complete, the running sync polled meanwhile.
    async fn next_of<F: std::future::Future>(
        &mut self,
        in_flight: &mut FuturesUnordered<F>,
    ) -> Option<F::Output> {
        loop {
            let Some(sync) = self.running.as_mut() else {
                return in_flight.next().await;
            };
            tokio::select! {
                biased;
                done = in_flight.next() => return done,
                () = sync => self.running = None,
            }
        }
    }

    /// Waits for the running sync, if any (a sync dropped unanswered would leave its
    /// request behind; the final sync waits for it at the servers anyway).
    async fn finish(&mut self) {
        if let Some(sync) = self.running.take() {
            sync.await;
        }
    }
}

/// Where an upload's bytes come from.
enum Source<'a> {
    /// Read (and copied) chunk by chunk.
    Reader(&'a mut (dyn Read + Send)),
    /// Already in memory: written from where they are.
    Bytes(&'a [u8]),
}

impl<'a> Source<'a> {
    /// The next chunk of at most `len` bytes; shorter only at the end.
    fn next(&mut self, len: usize) -> Result<Cow<'a, [u8]>, ClientError> {
        match self {
            Source::Bytes(rest) => {
                let (head, tail) = rest.split_at(len.min(rest.len()));
                *rest = tail;
                Ok(Cow::Borrowed(head))
            }
            Source::Reader(reader) => {
                let mut buf = vec![0u8; len];
                let mut filled = 0;
                while filled < len {
                    match reader.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(error) => return Err(local("read input", error)),
                    }
                }
                buf.truncate(filled);
                Ok(Cow::Owned(buf))
            }
        }
    }
}

fn local(action: &'static str, error: std::io::Error) -> ClientError {
    ClientError::Local { action, error }
}

impl Client {
    /// Open a file by path for transfers: one manager round trip.
    pub async fn open_file(&self, path: &str) -> Result<OpenFile, ClientError> {
        let request = ManagerRequest::Lookup {
            path: path.to_string(),
        };
        match self.manager_call(request).await? {
            ManagerResponse::File(view) => Ok(OpenFile::new(self.context_from(view)?)),
            other => Err(self.unexpected("file", other)),
        }
    }

    /// Open a file by id (a pending file too) for transfers: one manager round trip.
    pub async fn open_id(&self, file: &File) -> Result<OpenFile, ClientError> {
        Ok(OpenFile::new(self.context_of(file.id).await?))
    }

    /// [`Client::create_pending`], with the new file open for transfers (the view comes with
    /// the creation: no round trip more).
    pub async fn create_pending_open(
        &self,
        path: &str,
        layout: LayoutRequest,
    ) -> Result<(PendingFile, OpenFile), ClientError> {
        let (pending, view) = self.create_pending_view(path, layout).await?;
        let ctx = self.context_from(view)?;
        // A new file, empty everywhere, and this its only context: its partial stripes are
        // written without reading zeros back first (`FileContext::take_fresh`).
        *ctx.fresh_from.lock().unwrap() = Some(0);
        let file = crate::context::FreshFile {
            sole: true,
            in_flight: ctx.fresh_in_flight.clone(),
        };
        self.fresh_files().insert(ctx.meta.id, file);
        Ok((pending, OpenFile::new(ctx)))
    }

    /// Write everything `source` yields at `offset`, several chunks in flight, calling
    /// `progress` with the bytes of each chunk done; with `stream`, chunks start at its rate.
    /// Returns the bytes written. The manager learns the size only from
    /// [`Client::sync_open`] or [`Client::commit_upload`].
    pub async fn upload(
        &self,
        open: &mut OpenFile,
        offset: u64,
        source: &mut (dyn Read + Send),
        stream: Option<&mut StreamClock>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, ClientError> {
        let source = Source::Reader(source);
        self.upload_from(open, offset, source, stream, progress)
            .await
    }

    /// Write `data` at `offset` as [`Client::upload`] does, from where it is (no copy).
    pub async fn upload_bytes(
        &self,
        open: &mut OpenFile,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        let source = Source::Bytes(data);
        self.upload_from(open, offset, source, None, &mut |_| {})
            .await
            .map(|_| ())
    }

    async fn upload_from(
        &self,
        open: &mut OpenFile,
        offset: u64,
        mut source: Source<'_>,
        mut stream: Option<&mut StreamClock>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, ClientError> {
        let chunk = open.chunk_bytes(stream.as_deref()) as usize;
        let ctx = &open.ctx;
        // Not for a reserved stream: its chunks keep to their periods.
        let mut ahead = SyncAhead::new(open.sync_every.filter(|_| stream.is_none()));
        let mut in_flight = FuturesUnordered::new();
        let (mut at, mut total) = (offset, 0u64);
        let outcome = loop {
            let want = stream.as_deref().map_or(chunk, |stream| {
                stream.chunk_bytes_at(total, at, chunk as u64) as usize
            });
            let data = match source.next(want) {
                Ok(data) => data,
                Err(e) => break Err(e),
            };
            let filled = data.len();
            if filled > 0 {
                if let Err(e) = ctx.check_range(at, filled as u64) {
                    break Err(e);
                }
                if let Some(stream) = stream.as_deref_mut() {
                    let release = stream.pacing().release(total);
                    wait_draining(release, &mut in_flight, stream, progress).await?;
                }
                let start = at;
                (at, total) = (at + filled as u64, total + filled as u64);
                in_flight.push(async move { ctx.write(self, start, &data).await.map(|()| filled) });
            }
            while in_flight.len() >= TRANSFERS_IN_FLIGHT || (filled < want && !in_flight.is_empty())
            {
                match ahead.next_of(&mut in_flight).await.expect("non-empty") {
                    Ok(done) => {
                        ahead.written(self, ctx, done as u64);
                        progress(done as u64);
                        if let Some(stream) = stream.as_deref_mut() {
                            stream.done(done as u64);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if filled < want {
                ahead.finish().await;
                break Ok(total);
            }
        };
        // A chunk written before a failure still counts: the size covers what may be there.
        drop((in_flight, ahead));
        if total > 0 {
            open.ctx.meta.size = open.ctx.meta.size.max(offset + total);
        }
        outcome
    }

    /// Write the chunks `source` yields, one after another from `offset`, with up to
    /// [`TRANSFERS_IN_FLIGHT`] writes in flight while the next chunk is awaited (a request
    /// body arriving over the network, say), and the servers synced as it goes if `open`
    /// asks for it ([`OpenFile::sync_ahead`]). Chunks of whole stripes
    /// ([`OpenFile::chunk_bytes`]) write without reading parity back; a chunk (one buffer,
    /// or [`crate::Pieces`] as they arrived) is gathered into each request from where it is
    /// (one copy). Returns the bytes written. As with [`Client::upload`], the manager learns
    /// the size only from [`Client::sync_open`] or [`Client::commit_upload`].
    pub async fn upload_stream<S, C, E>(
        &self,
        open: &mut OpenFile,
        offset: u64,
        mut source: S,
    ) -> Result<u64, StreamUploadError<E>>
    where
        S: futures::Stream<Item = Result<C, E>> + Unpin,
        C: Into<crate::Pieces>,
    {
        let ctx = &open.ctx;
        let mut ahead = SyncAhead::new(open.sync_every);
        let mut in_flight = FuturesUnordered::new();
        let (mut at, mut ended) = (offset, false);
        let outcome = loop {
            tokio::select! {
                biased;
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    match done {
                        Ok(len) => ahead.written(self, ctx, len),
                        Err(e) => break Err(StreamUploadError::Store(e)),
                    }
                }
                // Awaited before the upload ends too (see `SyncAhead::finish`).
                () = async {
                    if let Some(sync) = ahead.running.as_mut() {
                        sync.await;
                    }
                }, if ahead.running.is_some() => ahead.running = None,
                next = source.next(), if !ended && in_flight.len() < TRANSFERS_IN_FLIGHT => {
                    match next {
                        None => ended = true,
                        Some(Err(e)) => break Err(StreamUploadError::Source(e)),
                        Some(Ok(chunk)) => {
                            let chunk: crate::Pieces = chunk.into();
                            let (start, len) = (at, chunk.len() as u64);
                            if let Err(e) = ctx.check_range(start, len) {
                                break Err(StreamUploadError::Store(e));
                            }
                            at += len;
                            in_flight.push(async move {
                                ctx.write_pieces(self, start, &chunk).await.map(|()| len)
                            });
                        }
                    }
                }
                else => break Ok(at - offset),
            }
        };
        // A chunk written before a failure still counts: the size covers what may be there.
        drop((in_flight, ahead));
        if at > offset {
            open.ctx.meta.size = open.ctx.meta.size.max(at);
        }
        outcome
    }

    /// Make an open file's writes durable, as [`Client::sync`] does, with the size they gave
    /// it: the manager's sync grows the file to it (one request).
    pub async fn sync_open(&self, open: &mut OpenFile) -> Result<(), ClientError> {
        let size = open.size();
        if size > open.size_at_manager {
            self.note_grown(open.file.id, size);
        }
        open.ctx.sync(self, true).await?;
        open.size_at_manager = open.size_at_manager.max(size);
        Ok(())
    }

    /// Make a pending file's writes durable on its servers and give it its path and size
    /// in one commit (see [`Client::commit_pending`]): the commit is durable, so the size
    /// needs no request of its own, and the manager no sync.
    pub async fn commit_upload(&self, open: &OpenFile) -> Result<(), ClientError> {
        self.sync_upload(open).await?;
        self.commit_synced(open).await
    }

    /// The servers' half of [`Client::commit_upload`]: a pending file's writes made durable
    /// on its servers (no manager request), so that its commit by [`Client::commit_synced`]
    /// can follow, after other work that ran beside this.
    pub async fn sync_upload(&self, open: &OpenFile) -> Result<(), ClientError> {
        open.ctx.sync(self, false).await
    }

    /// The manager's half of [`Client::commit_upload`]: a pending file synced by
    /// [`Client::sync_upload`] since its last write gets its path and size in one commit.
    pub async fn commit_synced(&self, open: &OpenFile) -> Result<(), ClientError> {
        let file = &open.file;
        // Once the commit may have been applied, a torn write could no longer be discarded.
        self.end_pending(file.id);
        let request = ManagerRequest::CommitPendingSized {
            file: file.id,
            size: open.size(),
        };
        match self.manager_call(request).await? {
            ManagerResponse::Committed { replaced } => self.committed(&open.ctx, replaced).await,
            other => Err(self.unexpected("committed", other)),
        }
    }

    /// Read `len` bytes at `offset` (fewer past the end of the file) into `sink`, in order,
    /// several chunks in flight, calling `progress` with the bytes of each chunk written;
    /// with `stream`, chunks start at its rate. Returns the bytes read.
    pub async fn download(
        &self,
        open: &OpenFile,
        offset: u64,
        len: u64,
        sink: &mut dyn Write,
        stream: Option<&mut StreamClock>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, ClientError> {
        self.download_from(&open.ctx, offset, len, sink, stream, progress)
            .await
    }

    /// [`Client::download`] of the file `ctx` describes (a live file, or a snapshot's).
    pub(crate) async fn download_from(
        &self,
        ctx: &FileContext,
        offset: u64,
        len: u64,
        sink: &mut dyn Write,
        mut stream: Option<&mut StreamClock>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, ClientError> {
        ctx.check_range(offset, len)?;
        let chunk = chunk_bytes(ctx, stream.as_deref());
        let len = len.min(ctx.meta.size.saturating_sub(offset));
        let pacing = stream.as_ref().map(|stream| stream.pacing());
        let mut done = 0;
        let pieces = std::iter::from_fn(|| {
            let piece = pacing.as_ref().map_or(chunk, |pacing| {
                pacing.chunk_bytes_at(done, offset + done, chunk)
            });
            let piece = piece.min(len - done);
            (piece > 0).then(|| {
                done += piece;
                (done - piece, piece)
            })
        });
        let chunks = pieces.map(|(from, piece)| {
            let at = offset + from;
            let release = pacing.as_ref().map(|pacing| pacing.release(from));
            async move {
                if let Some(release) = release {
                    tokio::time::sleep_until(release).await;
                }
                ctx.read_pieces(self, at, piece as usize).await
            }
        });
        let mut reads = futures::stream::iter(chunks).buffered(TRANSFERS_IN_FLIGHT);
        let mut total = 0;
        while let Some(pieces) = reads.next().await {
            // Written from the answers as received: gathering them into a chunk first was a
            // zeroing and a copy of every byte (9% of a 1 GiB get's CPU).
            let pieces = pieces?;
            for part in pieces.parts() {
                sink.write_all(part).map_err(|e| local("write output", e))?;
            }
            let len = pieces.len() as u64;
            progress(len);
            total += len;
            if let Some(stream) = stream.as_deref_mut() {
                stream.done(len);
            }
        }
        sink.flush().map_err(|e| local("write output", e))?;
        Ok(total)
    }

    /// Bytes `range` of a file already open (no manager round trip), in blocks of
    /// `block_bytes` from its start (the last one ending at its end), `read_ahead` read at
    /// once and yielded in order, each as the servers' answers hold it ([`Pieces`]: slices of
    /// the answers, no copy; fewer bytes past the file's end). For a sender that only passes
    /// the bytes on, like the S3 gateway's GET: copying them into a block first was 15% of
    /// its CPU.
    pub fn read_open_blocks(
        &self,
        open: OpenFile,
        range: std::ops::Range<u64>,
        block_bytes: usize,
        read_ahead: usize,
    ) -> impl futures::Stream<Item = Result<Pieces, ClientError>> {
        let ctx = std::sync::Arc::new(open.ctx);
        // Blocks of no bytes would never advance: taken as blocks of one.
        let block_bytes = block_bytes.max(1);
        let offsets = range.clone().step_by(block_bytes);
        let read = (range.end, block_bytes, read_ahead);
        piece_blocks(self.clone(), ctx, offsets, read).map(|block| block.map(|(pieces, _)| pieces))
    }

    /// Fill `out` from `offset` straight from the servers, several chunks in flight; returns
    /// the bytes the file had there (fewer than `out` holds past its end).
    pub async fn download_into(
        &self,
        open: &OpenFile,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, ClientError> {
        let ctx = &open.ctx;
        ctx.check_range(offset, out.len() as u64)?;
        let chunk = open.chunk_bytes(None) as usize;
        // Collected first: a future holding the lazy iterator (a closure over `&mut [u8]`)
        // would not be `Send` (rustc cannot see the closure is general over the lifetime).
        let reads: Vec<_> = out
            .chunks_mut(chunk)
            .enumerate()
            .map(|(i, part)| {
                let at = offset + (i * chunk) as u64;
                async move { ctx.read_into(self, at, part).await }
            })
            .collect();
        let mut reads = futures::stream::iter(reads).buffer_unordered(TRANSFERS_IN_FLIGHT);
        let mut total = 0;
        while let Some(got) = reads.next().await {
            total += got?;
        }
        Ok(total)
    }
}

/// The blocks of `block_bytes` at `offsets` of the file `ctx` describes, none past `end`,
/// `read_ahead` read at once, in order (see [`Client::read_blocks`]).
pub(crate) fn blocks(
    client: Client,
    ctx: std::sync::Arc<FileContext>,
    offsets: impl IntoIterator<Item = u64, IntoIter: Send + 'static>,
    end: u64,
    block_bytes: usize,
    read_ahead: usize,
) -> impl futures::Stream<Item = Result<(Vec<u8>, std::time::Duration), ClientError>> {
    let read = (end, block_bytes, read_ahead);
    piece_blocks(client, ctx, offsets, read).map(|block| {
        block.map(|(pieces, took)| {
            // The one copy of each byte, as a read into a buffer makes.
            let mut buf = Vec::with_capacity(pieces.len());
            pieces
                .parts()
                .iter()
                .for_each(|part| buf.extend_from_slice(part));
            (buf, took)
        })
    })
}

/// [`blocks`] as the servers' answers hold them ([`Pieces`]), each with how long it took;
/// `(end, block_bytes, read_ahead)` as there.
fn piece_blocks(
    client: Client,
    ctx: std::sync::Arc<FileContext>,
    offsets: impl IntoIterator<Item = u64, IntoIter: Send + 'static>,
    (end, block_bytes, read_ahead): (u64, usize, usize),
) -> impl futures::Stream<Item = Result<(Pieces, std::time::Duration), ClientError>> {
    futures::stream::iter(offsets)
        .map(move |offset| {
            let (client, ctx) = (client.clone(), ctx.clone());
            let len = (block_bytes as u64).min(end.saturating_sub(offset));
            async move {
                let began = std::time::Instant::now();
                ctx.check_range(offset, len)?;
                let pieces = ctx.read_pieces(&client, offset, len as usize).await?;
                Ok((pieces, began.elapsed()))
            }
        })
        .buffered(read_ahead.max(1))
}

/// Why [`Client::upload_stream`] stopped: its source failed, or the store refused a write.
#[derive(Debug)]
pub enum StreamUploadError<E> {
    /// The source yielded this error.
    Source(E),
    /// Writing to the store failed.
    Store(ClientError),
}

/// Waits until `release` (the next chunk's period), meanwhile taking the chunks in flight
/// that complete (out of order: the ledger counts bytes as they complete). Not polled
/// while the loop slept until the next period, a period's last chunk was sent, and its
/// completion counted, only after that period's deadline (`lab radon`: every period
/// 0.3-4 ms late, 1 of 9 deadlines met).
async fn wait_draining<F>(
    release: tokio::time::Instant,
    in_flight: &mut FuturesUnordered<F>,
    stream: &mut StreamClock,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<(), ClientError>
where
    F: std::future::Future<Output = Result<usize, ClientError>>,
{
    let sleep = tokio::time::sleep_until(release);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return Ok(()),
            Some(result) = in_flight.next(), if !in_flight.is_empty() => {
                let done = result?;
                progress(done as u64);
                stream.done(done as u64);
            }
        }
    }
}
