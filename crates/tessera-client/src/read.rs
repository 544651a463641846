//! Reads: coalesced per-column requests in parallel; degraded pieces reconstructed from the
//! survivors; corrupt blocks reconstructed, repaired in place, and never returned.

use crate::context::{Fault, FileContext};
use crate::maintain::Rewrite;
use crate::{Client, ClientError, Pieces, REQUESTS_IN_FLIGHT_MAX, REQUEST_BYTES_MAX};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use tessera_layout::{OverflowRole, Piece, Region, Scheme};
use tessera_wire::StorageError;

/// Times a degraded read reads a stripe again after finding a full-stripe write in flight
/// there (each wait bounded by the parity server, 0.5 s: about 4 s in all), or a write that
/// completed while it read.
const RECONSTRUCT_ATTEMPTS: usize = 8;

/// Pieces of one access that sit back to back in one column's data file, read as one request.
struct Chunk {
    column: u32,
    local_offset: u64,
    len: usize,
    pieces: Vec<Piece>,
}

/// Group pieces by column and merge those that are contiguous on disk.
fn coalesce(ctx: &FileContext, pieces: &[Piece]) -> Vec<Chunk> {
    let mut placed: Vec<(u32, u64, Piece)> = pieces
        .iter()
        .map(|p| {
            let slot = ctx.layout.data_slot(p.block);
            (
                slot.column,
                ctx.layout.local_offset(slot) + p.offset_in_unit as u64,
                *p,
            )
        })
        .collect();
    placed.sort_by_key(|(column, offset, _)| (*column, *offset));
    let mut chunks: Vec<Chunk> = Vec::new();
    for (column, offset, piece) in placed {
        if let Some(last) = chunks.last_mut() {
            if last.column == column
                && last.local_offset + last.len as u64 == offset
                && last.len + piece.len as usize <= REQUEST_BYTES_MAX
            {
                last.len += piece.len as usize;
                last.pieces.push(piece);
                continue;
            }
        }
        chunks.push(Chunk {
            column,
            local_offset: offset,
            len: piece.len as usize,
            pieces: vec![piece],
        });
    }
    chunks
}

impl FileContext {
    /// Read into `out` from `offset`; returns how many bytes the file had there.
    pub(crate) async fn read_into(
        &self,
        client: &Client,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, ClientError> {
        let read = self.read_parts(client, offset, out.len()).await?;
        let mut got = 0;
        for (piece, bytes) in read {
            out[piece.buf_range()].copy_from_slice(&bytes);
            got += bytes.len();
        }
        Ok(got)
    }

    /// Up to `len` bytes from `offset` (fewer past the file's end), as the servers' answers
    /// hold them: each stripe unit's piece a slice of the answer it came in, in file order,
    /// with no copy (a piece rebuilt from redundancy is a buffer of its own).
    pub(crate) async fn read_pieces(
        &self,
        client: &Client,
        offset: u64,
        len: usize,
    ) -> Result<Pieces, ClientError> {
        let mut read = self.read_parts(client, offset, len).await?;
        read.sort_unstable_by_key(|(piece, _)| piece.buf_offset);
        let mut pieces = Pieces::new();
        for (_, bytes) in read {
            pieces.push(bytes);
        }
        Ok(pieces)
    }

    /// Every piece of bytes `offset..offset + len` the file holds, with its bytes (in no
    /// particular order): healthy columns' pieces sliced from their answers as received,
    /// lost or corrupt ones rebuilt.
    async fn read_parts(
        &self,
        client: &Client,
        offset: u64,
        len: usize,
    ) -> Result<Vec<(Piece, Bytes)>, ClientError> {
        let end = offset.saturating_add(len as u64).min(self.meta.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let (healthy, degraded): (Vec<Piece>, Vec<Piece>) = self
            .layout
            .split(offset, end - offset)
            .into_iter()
            .flat_map(|extent| extent.pieces)
            .partition(|p| {
                let column = self.layout.data_slot(p.block).column;
                !self.lost(column, self.layout.stripe_of_block(p.block))
            });
        let overlay = self.scheme() == Scheme::Hybrid;
        let results: Vec<(Chunk, Result<Bytes, Fault>)> = stream::iter(coalesce(self, &healthy))
            .map(|chunk| async move {
                let read = self
                    .read_region_bytes(
                        client,
                        chunk.column,
                        Region::Data,
                        chunk.local_offset,
                        chunk.len,
                        overlay,
                    )
                    .await;
                (chunk, read)
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT_MAX)
            .collect()
            .await;
        let mut read = Vec::with_capacity(healthy.len() + degraded.len());
        let mut retry: Vec<(Piece, Option<StorageError>)> =
            degraded.into_iter().map(|p| (p, None)).collect();
        for (chunk, result) in results {
            match result {
                Ok(bytes) => {
                    let mut at = 0;
                    for piece in &chunk.pieces {
                        read.push((*piece, bytes.slice(at..at + piece.len as usize)));
                        at += piece.len as usize;
                    }
                }
                Err(Fault::Unreachable(_)) => retry.extend(chunk.pieces.iter().map(|p| (*p, None))),
                Err(Fault::Refused(e @ StorageError::Corrupt { .. })) => {
                    retry.extend(chunk.pieces.iter().map(|p| (*p, Some(e.clone()))))
                }
                Err(Fault::Refused(e)) => return Err(self.storage_error(chunk.column, e)),
            }
        }
        let recovered: Vec<(Piece, Result<Vec<u8>, ClientError>)> = stream::iter(retry)
            .map(|(piece, corrupt)| async move {
                let bytes = self.recover_piece(client, piece, corrupt).await;
                (piece, bytes)
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT_MAX)
            .collect()
            .await;
        for (piece, bytes) in recovered {
            read.push((piece, Bytes::from(bytes?)));
        }
        Ok(read)
    }

    /// Bytes of a piece whose column is lost or returned a corrupt block. A corrupt unit is
    /// repaired from redundancy first, then read again.
    async fn recover_piece(
        &self,
        client: &Client,
        piece: Piece,
        corrupt: Option<StorageError>,
    ) -> Result<Vec<u8>, ClientError> {
        let slot = self.layout.data_slot(piece.block);
        let stripe = self.layout.stripe_of_block(piece.block);
        if let (Some(error), Scheme::Raid0) = (&corrupt, self.scheme()) {
            // No redundancy to repair from: report the corruption, never the bad bytes.
            return Err(self.storage_error(slot.column, error.clone()));
        }
        if corrupt.is_some() && !self.lost(slot.column, stripe) && self.snapshot.is_none() {
            tracing::warn!(
                "corrupt block in file {} block {} on server {}: repairing",
                self.meta.path,
                piece.block,
                self.columns[slot.column as usize].server
            );
            self.rebuild_column_stripe(client, slot.column, stripe, Rewrite::Corrupt)
                .await?;
            let offset = self.layout.local_offset(slot) + piece.offset_in_unit as u64;
            let overlay = self.scheme() == Scheme::Hybrid;
            match self
                .read_region(
                    client,
                    slot.column,
                    Region::Data,
                    offset,
                    piece.len as usize,
                    overlay,
                )
                .await
            {
                Ok(bytes) => return Ok(bytes),
                Err(Fault::Unreachable(_)) => {}
                Err(Fault::Refused(e)) => return Err(self.storage_error(slot.column, e)),
            }
        }
        self.reconstruct_piece(client, piece).await
    }

    /// Rebuild the bytes of a piece without its own column.
    pub(crate) async fn reconstruct_piece(
        &self,
        client: &Client,
        piece: Piece,
    ) -> Result<Vec<u8>, ClientError> {
        let slot = self.layout.data_slot(piece.block);
        let stripe = self.layout.stripe_of_block(piece.block);
        let within = piece.offset_in_unit as u64;
        let len = piece.len as usize;
        match self.scheme() {
            Scheme::Raid0 => Err(self.unavailable([slot.column])),
            Scheme::Raid1 => {
                let mirror = self.layout.mirror_slot(piece.block).expect("raid1 mirror");
                if self.lost(mirror.column, stripe) {
                    return Err(self.unavailable([slot.column, mirror.column]));
                }
                let offset = self.layout.local_offset(mirror) + within;
                self.read_region(
                    client,
                    mirror.column,
                    Region::Redundancy,
                    offset,
                    len,
                    false,
                )
                .await
                .map_err(|fault| self.second_fault(slot.column, mirror.column, fault))
            }
            Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid => {
                let mut bytes = self
                    .reconstruct_from_parity(client, piece.block, within, len)
                    .await?;
                if self.scheme() == Scheme::Hybrid && self.snapshot.is_some() {
                    // Overflow mirror entries are not kept for snapshots (`tessera-store`'s
                    // `snapshot` module): a Hybrid snapshot needs every column.
                    return Err(self.unavailable([slot.column]));
                }
                if self.scheme() == Scheme::Hybrid {
                    let mirror = self
                        .layout
                        .overflow_column(piece.block, OverflowRole::Mirror);
                    if self.lost(mirror, stripe) {
                        return Err(self.unavailable([slot.column, mirror]));
                    }
                    let start = self.layout.local_offset(slot) + within;
                    let entries = self
                        .overflow_list(client, mirror, OverflowRole::Mirror, start, len as u64)
                        .await
                        .map_err(|fault| self.second_fault(slot.column, mirror, fault))?;
                    for (entry, data) in entries {
                        let at = (entry.offset - start) as usize;
                        bytes[at..at + data.len()].copy_from_slice(&data);
                    }
                }
                Ok(bytes)
            }
        }
    }

    /// Base bytes `within..within+len` of `block`, as parity XOR the stripe's other data blocks
    /// (base contents: parity covers base data, never overflow). A full-stripe write in flight
    /// over the stripe is waited for (by its parity server, bounded) and the stripe read again.
    pub(crate) async fn reconstruct_from_parity(
        &self,
        client: &Client,
        block: u64,
        within: u64,
        len: usize,
    ) -> Result<Vec<u8>, ClientError> {
        for _ in 0..RECONSTRUCT_ATTEMPTS {
            if let Some(bytes) = self.reconstruct_once(client, block, within, len).await? {
                return Ok(bytes);
            }
        }
        let stripe = self.layout.stripe_of_block(block);
        let parity = self.layout.parity_slot(stripe).expect("parity scheme");
        Err(self.storage_error(parity.column, StorageError::LockBusy { stripe }))
    }

    /// One attempt of [`Self::reconstruct_from_parity`]: `None` if a full-stripe write was
    /// under way while the stripe was read, or a write to the stripe completed meanwhile.
    async fn reconstruct_once(
        &self,
        client: &Client,
        block: u64,
        within: u64,
        len: usize,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let stripe = self.layout.stripe_of_block(block);
        let own = self.layout.data_slot(block).column;
        let parity = self.layout.parity_slot(stripe).expect("parity scheme");
        let sources = self.parity_sources(block);
        let lost: Vec<u32> = sources
            .iter()
            .map(|s| s.0)
            .filter(|&c| self.lost(c, stripe))
            .collect();
        if !lost.is_empty() {
            return Err(self.unavailable(std::iter::once(own).chain(lost)));
        }
        // The stripe's generation before the reads (the parity server's `ParityLocks`
        // argues it): a write that completes while they run changes it, so a mix of its old
        // and new units is never taken for bytes.
        let before = self
            .read_intent(client, stripe)
            .await
            .map_err(|fault| self.second_fault(own, parity.column, fault))?;
        if before.waited {
            return Ok(None);
        }
        let reads = sources.iter().map(|&(column, region, base)| async move {
            self.read_region(client, column, region, base + within, len, false)
                .await
                .map(|unit| (column, unit))
                .map_err(|fault| self.second_fault(own, column, fault))
        });
        let units = futures::future::try_join_all(reads).await?;
        let mut out = vec![0u8; len];
        for (_, unit) in &units {
            tessera_parity::xor_into(&mut out, unit);
        }
        if self.snapshot.is_some() {
            // Intent and stale records describe the live stripe, not the snapshot's.
            return Ok(Some(out));
        }
        // A record a dead writer left (see `intent.rs`): the parity read does not match what
        // the written columns hold inside its span. Asked after the reads, so that a record
        // present while they ran is seen, and a write that completed during them too.
        let found = self
            .read_intent(client, stripe)
            .await
            .map_err(|fault| self.second_fault(own, parity.column, fault))?;
        if found.waited || found.generation != before.generation {
            return Ok(None);
        }
        if found.stale {
            // An interrupted full-stripe write: this parity implies neither the old nor the
            // new bytes of the lost column (`tessera-store`'s `stale` module).
            return Err(self.torn(own, stripe));
        }
        if let Some((intent, bytes)) = found.intent {
            crate::intent::parity_as_before(
                &mut out,
                within,
                own,
                parity.column,
                &units,
                &intent,
                &bytes,
            );
        }
        Ok(Some(out))
    }

    /// Where `block`'s stripe keeps what reconstructs it: the parity unit, then every other
    /// data unit (column, region, offset of the unit in the column's file).
    fn parity_sources(&self, block: u64) -> Vec<(u32, Region, u64)> {
        let stripe = self.layout.stripe_of_block(block);
        let parity = self.layout.parity_slot(stripe).expect("parity scheme");
        let mut sources = vec![(
            parity.column,
            Region::Redundancy,
            self.layout.local_offset(parity),
        )];
        for other in self.layout.blocks_of_stripe(stripe).filter(|&b| b != block) {
            let slot = self.layout.data_slot(other);
            sources.push((slot.column, Region::Data, self.layout.local_offset(slot)));
        }
        sources
    }

    /// A survivor failed while covering for a lost column: two failures.
    pub(crate) fn second_fault(&self, lost: u32, survivor: u32, fault: Fault) -> ClientError {
        match fault {
            Fault::Unreachable(_) => self.unavailable([lost, survivor]),
            Fault::Refused(e) => self.storage_error(survivor, e),
        }
    }
}
