//! Writes: a transfer plan from `tessera-layout`, carried out per stripe by its method.
//!
//! Plain, mirrored, full-stripe and overflow writes become independent per-column requests
//! (contiguous ones coalesced) run in parallel, those to mirrors (RAID-1 copies, Hybrid
//! mirror overflow entries) once those to primaries are answered. Partial stripes under RAID-4/5 are
//! read-modify-write under the parity server's lock, one stripe at a time in ascending order,
//! so that locks are always taken lowest stripe first (CSAR 5.1). Columns that are lost are
//! skipped and recorded at the manager as owing the stripes, before the write is acknowledged.
//! Whole stripes of a committed parity-scheme file are written under a stale-parity record at
//! each parity column, durable before their data and cleared after (`tessera-store`'s `stale`
//! module); Hybrid mirror overflow trims follow the data writes they belong to.

use crate::context::{Fault, FileContext};
use crate::intent::{ParityLock, StaleRecord};
use crate::maintain::Rewrite;
use crate::pieces::{Pieces, WriteData};
use crate::{Client, ClientError, REQUESTS_IN_FLIGHT_MAX, REQUEST_BYTES_MAX};
use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use tessera_layout::{OverflowRole, Piece, Region, Scheme, StripeWrite, WriteMethod};
use tessera_wire::{IndexRange, IntentPiece, ParityIntent, StorageError, StorageRequest};

/// How often a full-stripe write asks again for its stale-parity records while a snapshot of
/// its file is being taken (fenced), and the back-off step between askings (growing to ten
/// steps): about 5 s in all, past any fence's lease.
const FENCED_RETRIES_MAX: u32 = 60;
const FENCED_BACKOFF: std::time::Duration = std::time::Duration::from_millis(10);

/// One request of a write, with the stripes it carries (for recording what a failure missed).
struct WriteOp {
    column: u32,
    stripes: IndexRange,
    request: StorageRequest,
    payload: Bytes,
}

/// Where a base write's bytes come from: the caller's data (copied once, when requests are
/// built), or the parity of a full stripe's data units (computed into its request, from the
/// units as gathered into their own requests).
enum Source {
    Caller(std::ops::Range<usize>),
    ParityOf(Vec<std::ops::Range<usize>>),
    /// The parity of a fresh partial stripe over `len` bytes of the unit: the caller's
    /// pieces, each at its place in the span, over zeros (see [`FileContext::take_fresh`]).
    SpanParity {
        len: usize,
        pieces: Vec<(usize, std::ops::Range<usize>)>,
    },
}

impl Source {
    fn len(&self) -> usize {
        match self {
            Source::Caller(range) => range.len(),
            Source::ParityOf(units) => units.first().map_or(0, |unit| unit.len()),
            Source::SpanParity { len, .. } => *len,
        }
    }
}

/// A base-file write before coalescing.
struct BaseWrite {
    column: u32,
    region: Region,
    invalidate_overflow: bool,
    offset: u64,
    stripe: u64,
    source: Source,
}

/// Trimming a column's mirror overflow entries away from a range (Hybrid full-stripe write).
struct MirrorInvalidation {
    column: u32,
    offset: u64,
    len: u64,
    stripe: u64,
}

/// Whether a RAID-4/5 read-modify-write must start over with a fresh idea of what is lost.
enum RmwOutcome {
    Done,
    Retry,
}

impl FileContext {
    /// Columns a stripe write changes.
    fn changed_columns(&self, sw: &StripeWrite) -> BTreeSet<u32> {
        let layout = &self.layout;
        let stripe = sw.extent.stripe;
        let mut columns = BTreeSet::new();
        for piece in &sw.extent.pieces {
            match sw.method {
                WriteMethod::Overflow => {
                    columns.insert(layout.overflow_column(piece.block, OverflowRole::Primary));
                    columns.insert(layout.overflow_column(piece.block, OverflowRole::Mirror));
                }
                _ => {
                    columns.insert(layout.data_slot(piece.block).column);
                }
            }
            if let Some(mirror) = layout.mirror_slot(piece.block) {
                columns.insert(mirror.column);
            }
        }
        if matches!(
            sw.method,
            WriteMethod::FullStripeParity | WriteMethod::ReadModifyWrite
        ) {
            columns.insert(layout.parity_slot(stripe).expect("parity").column);
        }
        if sw.method == WriteMethod::FullStripeParity && self.scheme() == Scheme::Hybrid {
            for block in layout.blocks_of_stripe(stripe) {
                columns.insert(layout.overflow_column(block, OverflowRole::Mirror));
            }
        }
        columns
    }

    /// Whether the stripe's data stays recoverable with `failed` columns gone.
    fn tolerable(&self, sw: &StripeWrite, failed: &BTreeSet<u32>) -> bool {
        let layout = &self.layout;
        match self.scheme() {
            Scheme::Raid0 => failed.is_empty(),
            Scheme::Raid1 => sw.extent.pieces.iter().all(|p| {
                let mirror = layout.mirror_slot(p.block).expect("mirror").column;
                !(failed.contains(&layout.data_slot(p.block).column) && failed.contains(&mirror))
            }),
            Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid => failed.len() <= 1,
        }
    }

    /// Columns lost for a stripe, among all the stripe's members.
    fn lost_members(&self, stripe: u64) -> BTreeSet<u32> {
        (0..self.layout.width)
            .filter(|&c| self.lost(c, stripe))
            .collect()
    }

    pub(crate) async fn write(
        &self,
        client: &Client,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        self.write_data(client, offset, WriteData::Slice(data))
            .await
    }

    /// [`FileContext::write`] of data in pieces (an HTTP body as it arrived): each request's
    /// payload is gathered from them, with no joined copy of the whole first.
    pub(crate) async fn write_pieces(
        &self,
        client: &Client,
        offset: u64,
        data: &Pieces,
    ) -> Result<(), ClientError> {
        self.write_data(client, offset, WriteData::Pieces(data))
            .await
    }

    async fn write_data(
        &self,
        client: &Client,
        offset: u64,
        data: WriteData<'_>,
    ) -> Result<(), ClientError> {
        if data.len() == 0 {
            return Ok(());
        }
        let plan = self.layout.plan_write(offset, data.len() as u64);
        // Refuse what cannot be kept recoverable before touching anything, and record what the
        // lost columns will miss before any byte is written.
        let mut missed: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        for sw in &plan.stripes {
            let stripe = sw.extent.stripe;
            let lost = self.lost_members(stripe);
            let changed = self.changed_columns(sw);
            touched.extend(&changed);
            let lost_changed: BTreeSet<u32> = changed.intersection(&lost).copied().collect();
            let relevant = if self.scheme().has_parity() {
                &lost
            } else {
                &lost_changed
            };
            if !self.tolerable(sw, relevant) {
                return Err(self.unavailable(relevant.iter().copied()));
            }
            for column in lost_changed {
                missed.entry(column).or_default().push(stripe);
            }
        }
        for (column, stripes) in missed {
            for range in runs(&stripes) {
                self.report_missed(client, column, range).await?;
            }
        }
        // A partial stripe's data and parity go out one after the other: their servers'
        // handshakes, if any are still to make, are made at once first.
        self.prepare_columns(client, touched).await;

        let failed: Mutex<BTreeMap<u64, BTreeSet<u32>>> = Mutex::new(BTreeMap::new());
        let fresh = self.take_fresh(client, &plan.stripes);
        fresh.wait_earlier().await;
        let (mut ops, mut later) = self.simple_ops(&plan.stripes, &fresh.stripes, data);
        let rmw: Vec<&StripeWrite> = plan
            .stripes
            .iter()
            .filter(|sw| sw.method == WriteMethod::ReadModifyWrite)
            .filter(|sw| !fresh.stripes.contains(&sw.extent.stripe))
            .collect();
        let full = full_stripes(&plan.stripes);
        let records = match full {
            Some(stripes) if self.needs_stale_records(client) => {
                self.record_full_stripes(client, stripes, [&mut ops, &mut later], &failed)
                    .await?
            }
            _ => Vec::new(),
        };
        let simple = self.renewing_stale(client, &records, async {
            self.run_ops(client, ops, &failed).await?;
            // Mirrors only once their primaries are answered (see `simple_ops`). And Hybrid
            // mirror overflow entries are trimmed only once the data units that supersede
            // them are written: a write cut short in between leaves the old entries on both
            // copies rather than on neither.
            self.run_ops(client, later, &failed).await
        });
        let partial = async {
            for sw in rmw {
                self.read_modify_write(client, sw, data, &failed).await?;
            }
            Ok::<(), ClientError>(())
        };
        let (simple, partial) = futures::join!(simple, partial);
        simple?;
        if let Some(stripes) = full {
            // Every full stripe's data and parity were answered (or their columns recorded
            // as owing them): parity matches the data again.
            let clears = records.iter().map(|r| async move {
                let cleared = self.clear_stale(client, r.column, Some(r.token), stripes);
                (r.column, cleared.await)
            });
            for (column, cleared) in futures::future::join_all(clears).await {
                if let Err(Fault::Unreachable(_)) = cleared {
                    // A record left behind would make these stripes, acknowledged now, read
                    // as an error once a column is lost: the column owes them instead, and
                    // rebuilding its parity from the data clears the record.
                    self.write_failed(client, column, stripes, &failed).await?;
                }
            }
        }
        partial?;
        let failed = failed.into_inner().unwrap();
        for sw in &plan.stripes {
            let stripe = sw.extent.stripe;
            let mut gone = self.lost_members(stripe);
            gone.extend(failed.get(&stripe).into_iter().flatten().copied());
            let changed = self.changed_columns(sw);
            let relevant: BTreeSet<u32> = if self.scheme().has_parity() {
                gone
            } else {
                gone.intersection(&changed).copied().collect()
            };
            if !self.tolerable(sw, &relevant) {
                return Err(self.unavailable(relevant));
            }
        }
        Ok(())
    }

    /// The partial stripes (RAID-4/5) of `stripes` that hold nothing yet, of a file this
    /// context made pending and alone writes: their data and parity are zeros by
    /// construction, so their parity is the new pieces' own, written beside them in one
    /// round, with no parity lock and no read of old bytes (a small put's two round trips).
    /// Every stripe planned through this context counts as touched from now on, in whatever
    /// order writes are planned. Nothing is fresh once another context of the file is made
    /// in this client (`Client::fresh_files`), nor for a file committed or given up: its
    /// writes lock and read as any file's. No other client writes a file pending here (see
    /// [`FileContext::revalidate`]).
    ///
    /// A fresh write takes no parity lock, so a later write of the same stripe (the next
    /// chunk of a stream cut anywhere, in flight beside it, or a write through a context
    /// made while it was in flight) must not start before it is done: [`Fresh`] holds a
    /// lock per fresh stripe until then, in the map every context of the file in this
    /// client shares, and the later write waits for it ([`Fresh::wait_earlier`]), whether
    /// it is fresh itself or not.
    fn take_fresh(&self, client: &Client, stripes: &[StripeWrite]) -> Fresh<'_> {
        let mut fresh = Fresh {
            ctx: self,
            stripes: BTreeSet::new(),
            held: Vec::new(),
            earlier: Vec::new(),
        };
        let mut untouched = self.fresh_from.lock().unwrap();
        // Only a pending file is in the map (`Client::end_pending` takes it out with the
        // pending one).
        let sole = (client.fresh_files().get(&self.meta.id)).is_some_and(|file| file.sole);
        if !sole {
            *untouched = None;
        }
        let mut in_flight = self.fresh_in_flight.lock().unwrap();
        for sw in stripes {
            let stripe = sw.extent.stripe;
            if let Some(earlier) = in_flight.get(&stripe) {
                fresh.earlier.push(earlier.clone());
            } else if sw.method == WriteMethod::ReadModifyWrite
                && untouched.is_some_and(|first| stripe >= first)
            {
                let lock: crate::context::FreshStripe = Arc::default();
                let guard = lock.clone().try_write_owned().expect("a new lock is free");
                in_flight.insert(stripe, lock);
                fresh.held.push(guard);
                fresh.stripes.insert(stripe);
            }
        }
        let last = stripes.iter().map(|sw| sw.extent.stripe).max();
        if let (Some(first), Some(last)) = (*untouched, last) {
            *untouched = Some(first.max(last.saturating_add(1)));
        }
        fresh
    }

    /// A fresh partial stripe's writes (see [`FileContext::take_fresh`]): each piece to its
    /// data unit, and the parity of the span they cover to the parity unit. A lost column's
    /// write is left out (it was recorded as owing the stripe before anything was written);
    /// the parity still covers a lost data column's piece.
    fn fresh_stripe_writes(&self, sw: &StripeWrite) -> Vec<BaseWrite> {
        let layout = &self.layout;
        let stripe = sw.extent.stripe;
        let pieces = &sw.extent.pieces;
        let lo = pieces.iter().map(|p| p.offset_in_unit).min().unwrap_or(0);
        let hi = pieces
            .iter()
            .map(|p| p.offset_in_unit + p.len)
            .max()
            .unwrap_or(0);
        let mut writes: Vec<BaseWrite> = (pieces.iter())
            .map(|piece| (layout.data_slot(piece.block), piece))
            .filter(|(slot, _)| !self.lost(slot.column, stripe))
            .map(|(slot, piece)| self.piece_in_unit(slot, piece, stripe))
            .collect();
        let parity = layout.parity_slot(stripe).expect("parity");
        if !self.lost(parity.column, stripe) {
            let parts = (pieces.iter())
                .map(|piece| ((piece.offset_in_unit - lo) as usize, piece.buf_range()))
                .collect();
            writes.push(BaseWrite {
                column: parity.column,
                region: Region::Redundancy,
                invalidate_overflow: false,
                offset: layout.local_offset(parity) + lo as u64,
                stripe,
                source: Source::SpanParity {
                    len: (hi - lo) as usize,
                    pieces: parts,
                },
            });
        }
        writes
    }

    /// The write of `piece`'s bytes at its place in the unit of `slot` (its data unit or a
    /// mirror of it).
    fn piece_in_unit(&self, slot: tessera_layout::Slot, piece: &Piece, stripe: u64) -> BaseWrite {
        BaseWrite {
            column: slot.column,
            region: slot.region,
            invalidate_overflow: false,
            offset: self.layout.local_offset(slot) + piece.offset_in_unit as u64,
            stripe,
            source: Source::Caller(piece.buf_range()),
        }
    }

    /// Whether this file's full-stripe writes take stale-parity records: parity schemes, for
    /// files that are committed (a pending file of this client is discarded whole if the
    /// client dies).
    fn needs_stale_records(&self, client: &Client) -> bool {
        matches!(
            self.scheme(),
            Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid
        ) && !client.pending_files().contains(&self.meta.id)
    }

    /// Records at every parity column of `stripes` (full stripes about to be written) that
    /// their parity may not match the data, durably, before any of their data is written (see
    /// `tessera-store`'s `stale` module). A column that cannot be reached is recorded as
    /// owing all of `stripes` and its requests for them are dropped from `ops`.
    async fn record_full_stripes(
        &self,
        client: &Client,
        stripes: IndexRange,
        mut ops: [&mut Vec<WriteOp>; 2],
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<Vec<StaleRecord>, ClientError> {
        // Parity rotates with a period of the width: its first stripes name every column.
        let width = u64::from(self.layout.width);
        let columns: BTreeSet<u32> = (stripes.start..stripes.end.min(stripes.start + width))
            .map(|stripe| self.layout.parity_slot(stripe).expect("parity").column)
            .filter(|&column| !self.lost_entirely(column))
            .collect();
        let mut attempt = 0;
        let (records, unreachable) = loop {
            match self.ask_stale_records(client, &columns, stripes).await? {
                Some(taken) => break taken,
                None if attempt < FENCED_RETRIES_MAX => {
                    tokio::time::sleep(FENCED_BACKOFF * (attempt + 1).min(10)).await;
                    attempt += 1;
                }
                None => {
                    let column = *columns.first().expect("a parity column");
                    let file = self.meta.id;
                    return Err(self.storage_error(column, StorageError::Fenced { file }));
                }
            }
        };
        for column in unreachable {
            self.write_failed(client, column, stripes, failed).await?;
            let inside = |op: &WriteOp| {
                op.column == column
                    && stripes.start <= op.stripes.start
                    && op.stripes.end <= stripes.end
            };
            for list in ops.iter_mut() {
                list.retain(|op| !inside(op));
            }
        }
        Ok(records)
    }

    /// Asks every parity column in `columns` for a stale-parity record of `stripes`: the
    /// records taken and the columns that could not be reached, or `None` if a column is
    /// fenced for a snapshot being taken. Then the records taken are cleared again: the other
    /// columns' fences wait for them, so holding them while waiting would stall the snapshot.
    async fn ask_stale_records(
        &self,
        client: &Client,
        columns: &BTreeSet<u32>,
        stripes: IndexRange,
    ) -> Result<Option<(Vec<StaleRecord>, Vec<u32>)>, ClientError> {
        let asks = columns.iter().map(|&column| async move {
            (column, self.record_stale(client, column, stripes).await)
        });
        let mut records = Vec::new();
        let mut unreachable = Vec::new();
        let mut fenced = false;
        let mut refused = None;
        for (column, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(record) => records.push(record),
                Err(Fault::Unreachable(_)) => unreachable.push(column),
                // A lock holder of these stripes outlasted the server's wait: as for a fence,
                // drop the records and ask again.
                Err(Fault::Refused(
                    StorageError::Fenced { .. } | StorageError::LockBusy { .. },
                )) => fenced = true,
                Err(Fault::Refused(e)) => refused = Some((column, e)),
            }
        }
        if let Some((column, e)) = refused {
            // Nothing was written; the records taken lapse with their lease.
            return Err(self.storage_error(column, e));
        }
        if fenced {
            // Only the records themselves (no stripes: that would say parity was written).
            // Best effort: a record left lapses with its lease.
            let nothing = IndexRange::new(0, 0);
            let clears = records
                .iter()
                .map(|r| self.clear_stale(client, r.column, Some(r.token), nothing));
            futures::future::join_all(clears).await;
            return Ok(None);
        }
        Ok(Some((records, unreachable)))
    }

    /// Run requests, at most [`REQUESTS_IN_FLIGHT_MAX`] at once.
    async fn run_ops(
        &self,
        client: &Client,
        ops: Vec<WriteOp>,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<(), ClientError> {
        let results: Vec<Result<(), ClientError>> = stream::iter(ops)
            .map(|op| self.run_op(client, op, failed))
            .buffer_unordered(REQUESTS_IN_FLIGHT_MAX)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Run one request; a failure is recorded as a miss of the column for its stripes.
    async fn run_op(
        &self,
        client: &Client,
        op: WriteOp,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<(), ClientError> {
        match self.rpc(client, op.column, op.request, op.payload).await {
            Ok(_) => Ok(()),
            // The manager removed the file (a lease that ran out under a stalled writer): no
            // column owes anything of it, and no other write of it can succeed.
            Err(Fault::Refused(e @ StorageError::Removed { .. })) => {
                Err(self.storage_error(op.column, e))
            }
            Err(fault) => {
                if let Fault::Refused(e) = &fault {
                    tracing::warn!("write to column {} refused: {e}", op.column);
                }
                self.write_failed(client, op.column, op.stripes, failed)
                    .await
            }
        }
    }

    async fn write_failed(
        &self,
        client: &Client,
        column: u32,
        stripes: IndexRange,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<(), ClientError> {
        {
            let mut failed = failed.lock().unwrap();
            for stripe in stripes.start..stripes.end {
                failed.entry(stripe).or_default().insert(column);
            }
        }
        self.report_missed(client, column, stripes).await
    }

    /// The independent requests of a plan: everything but read-modify-write; then what goes
    /// to mirrors (RAID-1 copies, Hybrid mirror overflow entries and invalidations), only once
    /// the others are done. A mirror is never newer than its primary that way, which is what
    /// lets a scrub repair a mirror from its primary without undoing a write in flight (see
    /// `maintain.rs`).
    fn simple_ops(
        &self,
        stripes: &[StripeWrite],
        fresh: &BTreeSet<u64>,
        data: WriteData<'_>,
    ) -> (Vec<WriteOp>, Vec<WriteOp>) {
        let layout = &self.layout;
        let file = self.meta.id;
        let hybrid = self.scheme() == Scheme::Hybrid;
        let mut base: Vec<BaseWrite> = Vec::new();
        let mut invalidations: Vec<MirrorInvalidation> = Vec::new();
        let mut ops: Vec<WriteOp> = Vec::new();
        let mut mirrored: Vec<WriteOp> = Vec::new();
        let one = |stripe: u64| IndexRange::new(stripe, stripe + 1);
        for sw in stripes {
            let stripe = sw.extent.stripe;
            match sw.method {
                WriteMethod::ReadModifyWrite if fresh.contains(&stripe) => {
                    base.extend(self.fresh_stripe_writes(sw));
                }
                WriteMethod::ReadModifyWrite => {}
                WriteMethod::Plain | WriteMethod::Mirrored => {
                    for piece in &sw.extent.pieces {
                        let mut slots = vec![layout.data_slot(piece.block)];
                        slots.extend(layout.mirror_slot(piece.block));
                        for slot in slots {
                            if !self.lost(slot.column, stripe) {
                                base.push(self.piece_in_unit(slot, piece, stripe));
                            }
                        }
                    }
                }
                WriteMethod::FullStripeParity => {
                    for piece in &sw.extent.pieces {
                        let slot = layout.data_slot(piece.block);
                        if !self.lost(slot.column, stripe) {
                            base.push(BaseWrite {
                                column: slot.column,
                                region: Region::Data,
                                invalidate_overflow: hybrid,
                                offset: layout.local_offset(slot),
                                stripe,
                                source: Source::Caller(piece.buf_range()),
                            });
                        }
                        let mirror = layout.overflow_column(piece.block, OverflowRole::Mirror);
                        if hybrid && !self.lost(mirror, stripe) {
                            invalidations.push(MirrorInvalidation {
                                column: mirror,
                                offset: layout.local_offset(slot),
                                len: self.unit() as u64,
                                stripe,
                            });
                        }
                    }
                    let slot = layout.parity_slot(stripe).expect("parity");
                    if !self.lost(slot.column, stripe) {
                        base.push(BaseWrite {
                            column: slot.column,
                            region: Region::Redundancy,
                            invalidate_overflow: false,
                            offset: layout.local_offset(slot),
                            stripe,
                            source: Source::ParityOf(
                                sw.extent.pieces.iter().map(|p| p.buf_range()).collect(),
                            ),
                        });
                    }
                }
                WriteMethod::Overflow => {
                    for piece in &sw.extent.pieces {
                        let bytes = data.copied(piece.buf_range());
                        let offset = layout.local_offset(layout.data_slot(piece.block))
                            + piece.offset_in_unit as u64;
                        for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                            let column = layout.overflow_column(piece.block, role);
                            if !self.lost(column, stripe) {
                                let op = WriteOp {
                                    column,
                                    stripes: one(stripe),
                                    request: StorageRequest::OverflowWrite { file, role, offset },
                                    payload: bytes.clone(),
                                };
                                match role {
                                    OverflowRole::Primary => ops.push(op),
                                    OverflowRole::Mirror => mirrored.push(op),
                                }
                            }
                        }
                    }
                }
            }
        }
        // RAID-1 mirror copies are the redundancy file's writes (parity is written at once).
        let (copies, primary): (Vec<WriteOp>, Vec<WriteOp>) = self
            .coalesce_writes(base, data)
            .into_iter()
            .partition(|op| {
                self.scheme() == Scheme::Raid1
                    && matches!(
                        op.request,
                        StorageRequest::Write {
                            region: Region::Redundancy,
                            ..
                        }
                    )
            });
        ops.extend(primary);
        mirrored.extend(copies);
        mirrored.extend(self.coalesce_invalidations(invalidations));
        (ops, mirrored)
    }

    /// Merge mirror invalidations that are back to back on one column into single requests.
    fn coalesce_invalidations(&self, mut all: Vec<MirrorInvalidation>) -> Vec<WriteOp> {
        all.sort_by_key(|i| (i.column, i.offset));
        let mut merged: Vec<MirrorInvalidation> = Vec::new();
        for i in all {
            match merged.last_mut() {
                Some(last) if last.column == i.column && last.offset + last.len == i.offset => {
                    last.len += i.len;
                }
                _ => merged.push(i),
            }
        }
        merged
            .into_iter()
            .map(|i| {
                // The range holds mirrors of the previous column's blocks; sorted by offset, the
                // first entry has the lowest stripe and the range's last block the highest.
                let width = self.layout.width;
                let data_column = (i.column + width - 1) % width;
                let last_local = (i.offset + i.len) / self.unit() as u64 - 1;
                let last_block = last_local * width as u64 + data_column as u64;
                let last_stripe = self.layout.stripe_of_block(last_block);
                let stripes = IndexRange::new(i.stripe, last_stripe + 1);
                WriteOp {
                    column: i.column,
                    stripes,
                    request: StorageRequest::OverflowInvalidate {
                        file: self.meta.id,
                        role: OverflowRole::Mirror,
                        offset: i.offset,
                        len: i.len,
                    },
                    payload: Bytes::new(),
                }
            })
            .collect()
    }

    /// Merge base writes that are back to back in one column's file into single requests,
    /// each payload gathered from the caller's data once; full stripes' parity is computed
    /// into its request from the data units as the data requests hold them (gathered
    /// from the caller's data only for a unit whose column is not written).
    fn coalesce_writes(&self, mut writes: Vec<BaseWrite>, data: WriteData<'_>) -> Vec<WriteOp> {
        writes.sort_by_key(|w| (w.column, w.region, w.invalidate_overflow, w.offset));
        let groups = write_groups(&writes);
        // The caller's ranges as gathered into requests, by where they start.
        let mut held: HashMap<usize, Bytes> = HashMap::new();
        let mut ops: Vec<Option<WriteOp>> = groups.iter().map(|_| None).collect();
        // Data before parity, so that parity is computed from the gathered units.
        for parity in [false, true] {
            for (op, group) in ops.iter_mut().zip(&groups) {
                let group = &writes[group.clone()];
                let has_parity = group
                    .iter()
                    .any(|w| matches!(w.source, Source::ParityOf(_)));
                if has_parity != parity {
                    continue;
                }
                let payload = gather_payload(group, data, &held);
                let mut at = 0;
                for w in group {
                    if let Source::Caller(range) = &w.source {
                        held.insert(range.start, payload.slice(at..at + range.len()));
                    }
                    at += w.source.len();
                }
                *op = Some(self.base_write_op(group, payload));
            }
        }
        ops.into_iter().map(|op| op.expect("every group")).collect()
    }

    /// The request of a run of base writes back to back in one column's file.
    fn base_write_op(&self, group: &[BaseWrite], payload: Bytes) -> WriteOp {
        let first = &group[0];
        let stripes = group.iter().map(|w| w.stripe);
        let (lo, hi) = stripes.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
        WriteOp {
            column: first.column,
            stripes: IndexRange::new(lo, hi + 1),
            request: StorageRequest::Write {
                file: self.meta.id,
                region: first.region,
                offset: first.offset,
                invalidate_overflow: first.invalidate_overflow,
            },
            payload,
        }
    }

    /// A partial stripe under RAID-4/5.
    async fn read_modify_write(
        &self,
        client: &Client,
        sw: &StripeWrite,
        data: WriteData<'_>,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<(), ClientError> {
        const ATTEMPTS_MAX: usize = 4;
        let stripe = sw.extent.stripe;
        let parity = self.layout.parity_slot(stripe).expect("parity");
        for _ in 0..ATTEMPTS_MAX {
            if self.lost(parity.column, stripe) {
                // No parity to keep consistent: write the data; the parity column owes the stripe.
                self.report_missed(client, parity.column, IndexRange::new(stripe, stripe + 1))
                    .await?;
                return self.write_pieces_plain(client, sw, data, failed).await;
            }
            let lost_touched = sw
                .extent
                .pieces
                .iter()
                .any(|p| self.lost(self.layout.data_slot(p.block).column, stripe));
            let outcome = if lost_touched {
                self.reconstruct_write(client, sw, data, failed).await?
            } else {
                self.rmw_in_place(client, sw, data, failed).await?
            };
            if let RmwOutcome::Done = outcome {
                return Ok(());
            }
        }
        Err(self.unavailable(self.lost_members(stripe)))
    }

    async fn write_pieces_plain(
        &self,
        client: &Client,
        sw: &StripeWrite,
        data: WriteData<'_>,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<(), ClientError> {
        let stripe = sw.extent.stripe;
        let writes = sw
            .extent
            .pieces
            .iter()
            .filter(|piece| !self.lost(self.layout.data_slot(piece.block).column, stripe))
            .map(|piece| self.piece_write(stripe, piece, data));
        let results =
            futures::future::join_all(writes.map(|op| self.run_op(client, op, failed))).await;
        results.into_iter().collect()
    }

    /// `P' = P ^ D ^ D'` over the touched bytes, under the parity lock.
    async fn rmw_in_place(
        &self,
        client: &Client,
        sw: &StripeWrite,
        data: WriteData<'_>,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<RmwOutcome, ClientError> {
        let stripe = sw.extent.stripe;
        let parity = self.layout.parity_slot(stripe).expect("parity");
        let pieces = &sw.extent.pieces;
        let lo = pieces
            .iter()
            .map(|p| p.offset_in_unit)
            .min()
            .expect("pieces") as usize;
        let hi = pieces
            .iter()
            .map(|p| p.offset_in_unit + p.len)
            .max()
            .expect("pieces") as usize;
        let parity_offset = self.layout.local_offset(parity) + lo as u64;
        let grant = match self
            .lock_parity(client, stripe, parity_offset, (hi - lo) as u32)
            .await
        {
            Ok(grant) => grant,
            // A grant lost on its way (the lease ran out while the server waited out another
            // writer's record, or the wait was dropped with its session): nothing is written
            // yet, so asking again is safe.
            Err(Fault::Unreachable(_)) | Err(Fault::Refused(StorageError::StaleLock { .. })) => {
                return Ok(RmwOutcome::Retry)
            }
            Err(Fault::Refused(StorageError::Corrupt { .. })) => {
                self.rebuild_column_stripe(client, parity.column, stripe, Rewrite::Corrupt)
                    .await?;
                return Ok(RmwOutcome::Retry);
            }
            Err(Fault::Refused(e)) => return Err(self.storage_error(parity.column, e)),
        };
        let lock = grant.lock;
        if grant.stale {
            self.resolve_stale(client, lock).await?;
            return Ok(RmwOutcome::Retry);
        }
        if let Some((intent, bytes)) = &grant.orphan {
            self.resolve_orphan(client, lock, intent, bytes).await?;
            return Ok(RmwOutcome::Retry);
        }
        let mut new_parity = grant.parity.to_vec();
        let old_reads = pieces.iter().map(|piece| async move {
            let slot = self.layout.data_slot(piece.block);
            let offset = self.layout.local_offset(slot) + piece.offset_in_unit as u64;
            (
                slot.column,
                self.read_region(
                    client,
                    slot.column,
                    Region::Data,
                    offset,
                    piece.len as usize,
                    false,
                )
                .await,
            )
        });
        // The manager is asked alongside the reads, which cost nothing if thrown away.
        let (olds, revalidated) = futures::join!(
            self.renewing(client, lock, futures::future::join_all(old_reads)),
            self.revalidate(client, stripe)
        );
        if !matches!(revalidated, Ok(false)) {
            // A column owes the stripe now (`revalidate`): its old bytes are not the stripe's.
            self.unlock(client, lock).await;
            return revalidated.map(|_| RmwOutcome::Retry);
        }
        let mut old_data = Vec::with_capacity(hi - lo);
        for (piece, (column, old)) in pieces.iter().zip(olds) {
            let old = match old {
                Ok(old) => old,
                Err(fault) => {
                    self.unlock(client, lock).await;
                    return match fault {
                        Fault::Unreachable(_) => Ok(RmwOutcome::Retry),
                        Fault::Refused(StorageError::Corrupt { .. }) => {
                            self.rebuild_column_stripe(client, column, stripe, Rewrite::Corrupt)
                                .await?;
                            Ok(RmwOutcome::Retry)
                        }
                        Fault::Refused(e) => Err(self.storage_error(column, e)),
                    };
                }
            };
            let at = piece.offset_in_unit as usize - lo;
            let span = &mut new_parity[at..at + piece.len as usize];
            tessera_parity::update_parity(span, &old, &data.gather(piece.buf_range()));
            old_data.extend_from_slice(&old);
        }
        let intent = self.intent_of(stripe, lo as u32, (hi - lo) as u32, pieces.iter());
        let writes: Vec<WriteOp> = pieces
            .iter()
            .map(|piece| self.piece_write(stripe, piece, data))
            .collect();
        let new_parity = Bytes::from(new_parity);
        self.write_data_then_parity(
            client,
            lock,
            (intent, old_data),
            writes,
            (parity_offset, new_parity),
            failed,
        )
        .await
    }

    /// The intent record of pieces of `stripe` inside bytes `start..start+len` of the unit.
    fn intent_of<'a>(
        &self,
        stripe: u64,
        start: u32,
        len: u32,
        pieces: impl Iterator<Item = &'a Piece>,
    ) -> ParityIntent {
        let parity = self.layout.parity_slot(stripe).expect("parity");
        ParityIntent {
            unit_offset: self.layout.local_offset(parity),
            span_start: start,
            span_len: len,
            pieces: pieces
                .map(|piece| IntentPiece {
                    column: self.layout.data_slot(piece.block).column,
                    offset_in_unit: piece.offset_in_unit,
                    len: piece.len,
                })
                .collect(),
        }
    }

    /// A touched data column is lost: rebuild its unit from parity, apply the write to whole
    /// units, and write the survivors and a freshly computed parity.
    async fn reconstruct_write(
        &self,
        client: &Client,
        sw: &StripeWrite,
        data: WriteData<'_>,
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<RmwOutcome, ClientError> {
        let stripe = sw.extent.stripe;
        let unit = self.unit();
        let parity = self.layout.parity_slot(stripe).expect("parity");
        // The lost column's new bytes go into parity only. It may have been found unreachable
        // during this operation, after the write recorded what lost columns miss: record it
        // here, before any byte is written, so that it never serves its old unit again.
        for piece in &sw.extent.pieces {
            let column = self.layout.data_slot(piece.block).column;
            if self.lost(column, stripe) {
                self.report_missed(client, column, IndexRange::new(stripe, stripe + 1))
                    .await?;
            }
        }
        let grant = match self
            .lock_parity(
                client,
                stripe,
                self.layout.local_offset(parity),
                unit as u32,
            )
            .await
        {
            Ok(grant) => grant,
            Err(_) => {
                return Err(
                    self.unavailable(self.lost_members(stripe).into_iter().chain([parity.column]))
                );
            }
        };
        let lock = grant.lock;
        if grant.stale {
            self.resolve_stale(client, lock).await?;
            return Ok(RmwOutcome::Retry);
        }
        if let Some((intent, bytes)) = &grant.orphan {
            self.resolve_orphan(client, lock, intent, bytes).await?;
            return Ok(RmwOutcome::Retry);
        }
        let revalidated = self.revalidate(client, stripe).await;
        if !matches!(revalidated, Ok(false)) {
            self.unlock(client, lock).await;
            return revalidated.map(|_| RmwOutcome::Retry);
        }
        let parity_bytes = grant.parity.to_vec();
        let blocks: Vec<u64> = self.layout.blocks_of_stripe(stripe).collect();
        let reads = blocks.iter().map(|&block| async move {
            let slot = self.layout.data_slot(block);
            if self.lost(slot.column, stripe) {
                return Ok(None);
            }
            self.read_region(
                client,
                slot.column,
                Region::Data,
                self.layout.local_offset(slot),
                unit,
                false,
            )
            .await
            .map(Some)
            .map_err(|_| slot.column)
        });
        let mut units = match self
            .renewing(client, lock, futures::future::try_join_all(reads))
            .await
        {
            Ok(units) => units,
            Err(column) => {
                self.unlock(client, lock).await;
                return Err(self.unavailable(self.lost_members(stripe).into_iter().chain([column])));
            }
        };
        let missing: Vec<usize> = (0..units.len()).filter(|&i| units[i].is_none()).collect();
        if missing.len() != 1 {
            self.unlock(client, lock).await;
            return Err(self.unavailable(self.lost_members(stripe)));
        }
        let mut lost_unit = parity_bytes;
        for u in units.iter().flatten() {
            tessera_parity::xor_into(&mut lost_unit, u);
        }
        units[missing[0]] = Some(lost_unit);
        let mut units: Vec<Vec<u8>> = units.into_iter().map(|u| u.expect("filled")).collect();
        let first = blocks[0];
        let written: Vec<&Piece> = sw
            .extent
            .pieces
            .iter()
            .filter(|piece| !self.lost(self.layout.data_slot(piece.block).column, stripe))
            .collect();
        let mut old_data = Vec::new();
        for piece in &written {
            old_data.extend_from_slice(&units[(piece.block - first) as usize][piece.unit_range()]);
        }
        let intent = self.intent_of(stripe, 0, unit as u32, written.iter().copied());
        for piece in &sw.extent.pieces {
            units[(piece.block - first) as usize][piece.unit_range()]
                .copy_from_slice(&data.gather(piece.buf_range()));
        }
        let mut new_parity = vec![0u8; unit];
        for u in &units {
            tessera_parity::xor_into(&mut new_parity, u);
        }
        let writes: Vec<WriteOp> = written
            .iter()
            .map(|piece| self.piece_write(stripe, piece, data))
            .collect();
        let parity_write = (self.layout.local_offset(parity), Bytes::from(new_parity));
        self.write_data_then_parity(
            client,
            lock,
            (intent, old_data),
            writes,
            parity_write,
            failed,
        )
        .await
    }

    /// The last steps of a read-modify-write: the intent record (durable at the parity
    /// server before any data is written, see `intent.rs`), the new data, then the new parity,
    /// whose write releases the stripe's lock and deletes the record. Only once the data is
    /// written may the next writer queued on the lock read it as its old data (CSAR 5.1);
    /// were the lock released alongside the data write, an overlapping writer could read the
    /// bytes being replaced, or have its own data overtaken by them, and leave parity that no
    /// longer matches the data. A lock lost on the way (its lease broken) means starting over:
    /// the next attempt resolves the record this one left.
    async fn write_data_then_parity(
        &self,
        client: &Client,
        lock: ParityLock,
        (intent, old_data): (ParityIntent, Vec<u8>),
        data: Vec<WriteOp>,
        (parity_offset, parity): (u64, Bytes),
        failed: &Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    ) -> Result<RmwOutcome, ClientError> {
        // Only the parity changes when every piece is on a lost column: nothing to record.
        // Nor for a file pending at this client (a put not yet committed): the record guards
        // against this writer dying between data and parity, and then the file is discarded
        // whole, never read (as for full stripes, `needs_stale_records`).
        let recorded = if intent.pieces.is_empty() || client.pending_files().contains(&self.meta.id)
        {
            Ok(())
        } else {
            self.record_intent(client, lock, intent, old_data).await
        };
        match recorded {
            Ok(()) => {}
            Err(Fault::Unreachable(_)) | Err(Fault::Refused(StorageError::StaleLock { .. })) => {
                return Ok(RmwOutcome::Retry)
            }
            Err(Fault::Refused(e)) => {
                self.unlock(client, lock).await;
                return Err(self.storage_error(lock.column, e));
            }
        }
        let writes = data.into_iter().map(|op| self.run_op(client, op, failed));
        let data = self
            .renewing(client, lock, futures::future::join_all(writes))
            .await;
        data.into_iter().collect::<Result<(), ClientError>>()?;
        let stripes = IndexRange::new(lock.stripe, lock.stripe + 1);
        match self
            .write_parity(client, lock, parity_offset, parity, true)
            .await
        {
            Ok(()) => Ok(RmwOutcome::Done),
            Err(Fault::Refused(StorageError::StaleLock { .. })) => Ok(RmwOutcome::Retry),
            Err(fault) => {
                if let Fault::Refused(e) = &fault {
                    tracing::warn!("parity write to column {} refused: {e}", lock.column);
                }
                self.write_failed(client, lock.column, stripes, failed)
                    .await
                    .map(|()| RmwOutcome::Done)
            }
        }
    }

    /// Write one piece into its data column (RAID-4/5 partial stripes).
    fn piece_write(&self, stripe: u64, piece: &Piece, data: WriteData<'_>) -> WriteOp {
        let slot = self.layout.data_slot(piece.block);
        WriteOp {
            column: slot.column,
            stripes: IndexRange::new(stripe, stripe + 1),
            request: StorageRequest::Write {
                file: self.meta.id,
                region: Region::Data,
                offset: self.layout.local_offset(slot) + piece.offset_in_unit as u64,
                invalidate_overflow: false,
            },
            payload: data.copied(piece.buf_range()),
        }
    }
}

/// Runs of base writes (sorted by column, region and offset) back to back in one column's
/// file, each at most [`REQUEST_BYTES_MAX`]: one request each.
fn write_groups(writes: &[BaseWrite]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut i = 0;
    while i < writes.len() {
        let first = &writes[i];
        let mut j = i + 1;
        let mut len = first.source.len();
        while j < writes.len()
            && writes[j].column == first.column
            && writes[j].region == first.region
            && writes[j].invalidate_overflow == first.invalidate_overflow
            && writes[j].offset == first.offset + len as u64
            && len + writes[j].source.len() <= REQUEST_BYTES_MAX
        {
            len += writes[j].source.len();
            j += 1;
        }
        groups.push(i..j);
        i = j;
    }
    groups
}

/// One request's payload: the caller's ranges copied in, parity computed in place (one pass
/// over the stripe's units, a cache-sized block of the parity at a time).
fn gather_payload(group: &[BaseWrite], data: WriteData<'_>, held: &HashMap<usize, Bytes>) -> Bytes {
    let len = group.iter().map(|w| w.source.len()).sum();
    let mut payload = BytesMut::with_capacity(len);
    for w in group {
        match &w.source {
            Source::Caller(range) => data.extend_into(range.clone(), &mut payload),
            Source::SpanParity { len, pieces } => {
                let at = payload.len();
                payload.resize(at + len, 0);
                for (offset, range) in pieces {
                    let span = &mut payload[at + offset..at + offset + range.len()];
                    tessera_parity::xor_into(span, &data.gather(range.clone()));
                }
            }
            Source::ParityOf(units) => {
                let at = payload.len();
                payload.resize(at + w.source.len(), 0);
                let units: Vec<Cow<[u8]>> = units
                    .iter()
                    .map(|range| match held.get(&range.start) {
                        Some(unit) if unit.len() == range.len() => Cow::Borrowed(&unit[..]),
                        _ => data.gather(range.clone()),
                    })
                    .collect();
                let units: Vec<&[u8]> = units.iter().map(|unit| &**unit).collect();
                tessera_parity::parity_of(&units, &mut payload[at..]);
            }
        }
    }
    payload.freeze()
}

/// The stripes a plan writes whole with fresh parity (one run: a write's whole stripes lie
/// between its leading and trailing partial ones).
fn full_stripes(stripes: &[StripeWrite]) -> Option<IndexRange> {
    let mut full = stripes
        .iter()
        .filter(|sw| sw.method == WriteMethod::FullStripeParity)
        .map(|sw| sw.extent.stripe);
    let first = full.next()?;
    let (count, last) = full.fold((1, first), |(count, _), stripe| (count + 1, stripe));
    assert_eq!(
        last - first + 1,
        count,
        "a write's whole stripes are contiguous"
    );
    Some(IndexRange::new(first, last + 1))
}

/// Sorted stripe numbers as runs of consecutive ones.
fn runs(stripes: &[u64]) -> Vec<IndexRange> {
    let mut out: Vec<IndexRange> = Vec::new();
    for &s in stripes {
        match out.last_mut() {
            Some(r) if r.end == s => r.end = s + 1,
            Some(r) if r.contains(s) => {}
            _ => out.push(IndexRange::new(s, s + 1)),
        }
    }
    out
}

/// A write's fresh stripes (see [`FileContext::take_fresh`]), the locks it holds on them
/// until it is done (dropped: success, failure or the write's future dropped), and the locks
/// of earlier fresh writes of stripes it touches too.
struct Fresh<'a> {
    ctx: &'a FileContext,
    stripes: BTreeSet<u64>,
    held: Vec<tokio::sync::OwnedRwLockWriteGuard<()>>,
    earlier: Vec<crate::context::FreshStripe>,
}

impl Fresh<'_> {
    /// Waits until every earlier fresh write of a stripe this write touches is done.
    async fn wait_earlier(&self) {
        for earlier in &self.earlier {
            drop(earlier.read().await);
        }
    }
}

impl Drop for Fresh<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.ctx.fresh_in_flight.lock().unwrap();
        for stripe in &self.stripes {
            in_flight.remove(stripe);
        }
        // The guards go after the entries: a write that found an entry waits on its lock.
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tessera_layout::Layout;

    /// The requests of `data` written at `offset`: (column, stripes, request, payload).
    fn requests(
        ctx: &FileContext,
        offset: u64,
        data: WriteData<'_>,
    ) -> Vec<(u32, IndexRange, StorageRequest, Bytes)> {
        let plan = ctx.layout.plan_write(offset, data.len() as u64);
        let (ops, later) = ctx.simple_ops(&plan.stripes, &BTreeSet::new(), data);
        let mut all: Vec<_> = ops
            .into_iter()
            .chain(later)
            .map(|op| (op.column, op.stripes, op.request, op.payload))
            .collect();
        all.sort_by_key(|(column, stripes, request, _)| {
            (*column, stripes.start, format!("{request:?}"))
        });
        all
    }

    fn scheme() -> impl Strategy<Value = Scheme> {
        prop_oneof![
            Just(Scheme::Raid0),
            Just(Scheme::Raid1),
            Just(Scheme::Raid4),
            Just(Scheme::Raid5),
            Just(Scheme::Hybrid),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A write of data in pieces makes exactly the requests, bytes and all, that the same
        /// data in one buffer makes, whatever the cuts, the scheme, the lost column, and where
        /// the write starts and ends.
        #[test]
        fn data_in_pieces_makes_the_requests_of_one_buffer(
            scheme in scheme(),
            width in 3u32..7,
            start_unit in 0u64..6,
            start_in_unit in prop_oneof![Just(0u64), 0u64..4096],
            len in 1usize..(4096 * 30),
            cuts in prop::collection::vec(any::<usize>(), 0..40),
            lost in prop::option::of(0u32..7),
            seed in any::<u8>(),
        ) {
            let layout = Layout::new(scheme, 4096, width).expect("layout");
            let mut down = vec![false; width as usize];
            if let Some(lost) = lost.filter(|&l| l < width) {
                down[lost as usize] = true;
            }
            let ctx = FileContext::detached(layout, &down);
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let pieces = crate::pieces::cut(&data, &cuts);
            let offset = start_unit * 4096 + start_in_unit;
            let whole = requests(&ctx, offset, WriteData::Slice(&data));
            let cut = requests(&ctx, offset, WriteData::Pieces(&pieces));
            prop_assert_eq!(whole, cut);
        }
    }

    /// Each full stripe's parity request holds the XOR of its data units, also when a data
    /// column is lost (its unit is not written, but counts in the parity).
    #[test]
    fn full_stripe_parity_is_the_xor_of_the_stripes_units() {
        let unit = 4096usize;
        let layout = Layout::new(Scheme::Raid5, unit as u32, 5).expect("layout");
        for lost in [None, Some(1u32)] {
            let mut down = vec![false; 5];
            if let Some(lost) = lost {
                down[lost as usize] = true;
            }
            let ctx = FileContext::detached(layout, &down);
            let data: Vec<u8> = (0..unit * 4 * 6)
                .map(|i| (i * 7 + i / 4096) as u8)
                .collect();
            let mut pieces = Pieces::new();
            for part in data.chunks(1000) {
                pieces.push(Bytes::copy_from_slice(part));
            }
            let plan = ctx.layout.plan_write(0, data.len() as u64);
            let (ops, _) =
                ctx.simple_ops(&plan.stripes, &BTreeSet::new(), WriteData::Pieces(&pieces));
            let mut checked = 0;
            for op in &ops {
                let StorageRequest::Write {
                    region: Region::Redundancy,
                    offset,
                    ..
                } = op.request
                else {
                    continue;
                };
                for (k, stripe) in (op.stripes.start..op.stripes.end).enumerate() {
                    let slot = layout.parity_slot(stripe).expect("parity");
                    if slot.column != op.column {
                        continue;
                    }
                    let at = (layout.local_offset(slot) - offset) as usize;
                    let mut expected = vec![0u8; unit];
                    let units = &data[stripe as usize * unit * 4..][..unit * 4];
                    for u in units.chunks(unit) {
                        tessera_parity::xor_into(&mut expected, u);
                    }
                    assert_eq!(
                        &op.payload[at..at + unit],
                        &expected[..],
                        "stripe {stripe}, {k}"
                    );
                    checked += 1;
                }
            }
            let written = (0..6u64)
                .filter(|&stripe| Some(layout.parity_slot(stripe).expect("parity").column) != lost)
                .count();
            assert_eq!(
                checked, written,
                "every written parity, lost column {lost:?}"
            );
            assert!(written >= 5);
        }
    }
}
