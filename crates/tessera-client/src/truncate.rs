//! Truncation as POSIX has it: a file cut to a size reads as zeros past it if it grows again
//! (the manager's size alone only hides those bytes).
//!
//! Writing zeros over everything cut costs as much as writing the file did. Instead only the
//! stripe holding the new end has its tail zeroed by a write; every later stripe is discarded
//! at every column's server ([`StorageRequest::Discard`], one request per column and region):
//!
//! 1. A fence of the file's writes at every column's server (the snapshot fence,
//!    [`StorageRequest::SnapshotFence`], under an epoch of its own): it waits until no
//!    read-modify-write, full-stripe write or stale-parity record of the file is in flight
//!    there, and holds new ones off, so no other writer computes parity from a mix of
//!    discarded and kept bytes. A server refuses a discard its fence does not cover.
//! 2. A stale-parity record at each parity column over every stripe discarded
//!    ([`StorageRequest::RecordDiscard`]; up to the last stripe any column holds bytes of,
//!    past the file's size too). The discards of the columns are not atomic: if this client
//!    dies part-way, some columns hold zeros and others the old bytes, and parity matches
//!    neither. The record is then orphaned and resolved as a torn full-stripe write's is
//!    (parity recomputed from the data, each byte old or zero, both allowed for a truncation
//!    never acknowledged); meanwhile a degraded read of those stripes is an error, never
//!    wrong bytes.
//! 3. The discards, the records cleared, the fences released.
//!
//! Where a discard cannot be done (a server down or owing stripes, an unresolved intent
//! record, a fence that does not drain or lapses), the stripes are zeroed by writes instead,
//! which take the stripes' locks and supersede the records. The manager's size is set last,
//! so a truncation that fails leaves the file at its old size.
//!
//! Hybrid files discard like the others. The explorer's seed that read zeros with Hybrid
//! discards showed the resolver scrubbing a stripe under a live writer whose data request to
//! one column was lost; the likely cause, a lost renewal that held the next round back past
//! the record's lease, is fixed in `FileContext::renewing_stale`, and the seed passes.
//!
//! Writes of the file by other clients racing the truncation (RAID-0 and RAID-1 writes, and
//! Hybrid's overflow writes, take no lock) may land before or after it at each column, as
//! they may with zeros written.

use crate::intent::StaleRecord;
use crate::{Client, ClientError, File};
use bytes::Bytes;
use std::ops::Range;
use tessera_layout::{OverflowRole, Region, Scheme, COLUMN_BYTES_MAX};
use tessera_wire::{IndexRange, StorageRequest, StorageResponse};

/// Zeros written per request when a range must be zeroed by writes.
const ZERO_WRITE_BYTES: u64 = 8 << 20;

/// Fence epochs of discards have this bit set: snapshot epochs count up from 1 and never
/// reach it, so a discard's fence never lifts a snapshot's.
const DISCARD_FENCE_BIT: u64 = 1 << 63;

/// What a truncation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Truncation {
    /// Bytes of zeros written (the stripe holding the new end, or everything cut that held
    /// bytes where the discard could not be done).
    pub zeroed_bytes: u64,
    /// Whether the stripes past the new end were discarded at the servers.
    pub discarded: bool,
}

impl Client {
    /// Sets `file`'s size to `size`; bytes past a smaller size read as zeros if the file
    /// grows again. See the module doc for how the bytes cut are cleared.
    pub async fn truncate(&self, file: &File, size: u64) -> Result<Truncation, ClientError> {
        let ctx = self.context_of(file.id).await?;
        ctx.check_range(size, 0)?;
        let old = ctx.meta.size;
        let mut done = Truncation::default();
        if size < old {
            let stripe = ctx.layout.stripe_bytes();
            let boundary = size.div_ceil(stripe) * stripe;
            done.zeroed_bytes += self.zero_written(file, size..boundary.min(old)).await?;
            if boundary < old {
                match ctx.discard_stripes(self, boundary / stripe).await {
                    Ok(()) => done.discarded = true,
                    Err(e) => {
                        tracing::debug!(path = %file.path, "discard not done, zeroing: {e}");
                        done.zeroed_bytes += self.zero_written(file, boundary..old).await?;
                    }
                }
            }
        }
        self.set_size(file, size).await?;
        Ok(done)
    }

    /// Writes zeros over the parts of `range` of `file` its servers may hold bytes of (all
    /// of it where one cannot say); the bytes written.
    async fn zero_written(&self, file: &File, range: Range<u64>) -> Result<u64, ClientError> {
        if range.is_empty() {
            return Ok(0);
        }
        let written = self.written_ranges(file, range.clone()).await?;
        let mut zeroed = 0;
        for range in written.unwrap_or_else(|| vec![range]) {
            let mut at = range.start;
            while at < range.end {
                let len = (range.end - at).min(ZERO_WRITE_BYTES);
                self.write_at(file, at, &vec![0u8; len as usize]).await?;
                at += len;
                zeroed += len;
            }
        }
        Ok(zeroed)
    }
}

impl crate::context::FileContext {
    /// Discards stripes `first..` of the file at every column, behind a fence of its writes
    /// at every column's server and under stale-parity records of the stripes (see the
    /// module doc). Fails, with nothing or part of it done, if any column is down or
    /// refuses; what was done is then left under the records.
    async fn discard_stripes(&self, client: &Client, first: u64) -> Result<(), ClientError> {
        let width = self.layout.width;
        if let Some(column) = (0..width).find(|&c| self.lost_entirely(c)) {
            return Err(self.unavailable([column]));
        }
        if let Some(column) = (0..width).find(|&c| !self.columns[c as usize].missed.is_empty()) {
            // A server owing stripes is rebuilt from the others; let the zeros reach it so.
            return Err(self.unavailable([column]));
        }
        let fence = DISCARD_FENCE_BIT | (rand::random::<u64>() & !DISCARD_FENCE_BIT);
        let files = vec![self.meta.id];
        let fence_request = |_| {
            vec![StorageRequest::SnapshotFence {
                epoch: fence,
                files: files.clone(),
            }]
        };
        let mut done = self.every_column(client, fence_request).await;
        if done.is_ok() {
            done = self.discard_fenced(client, first, fence).await;
        }
        let release = |_| {
            vec![StorageRequest::SnapshotRelease {
                epoch: fence,
                files: files.clone(),
            }]
        };
        // Also after a failure: a fence not released would stall the file's writers until
        // it lapses.
        let _ = self.every_column(client, release).await;
        done
    }

    /// The discard proper, with the fence `fence` standing at every column: records at the
    /// parity columns over every stripe from `first` to the last any column holds bytes of,
    /// then the discards, then the records cleared. A failure keeps the records (they are
    /// orphaned and resolved, or superseded by the zeros written instead).
    async fn discard_fenced(
        &self,
        client: &Client,
        first: u64,
        fence: u64,
    ) -> Result<(), ClientError> {
        let stripes = IndexRange::new(first, self.held_stripes_end(client, first).await?);
        let mut records = Vec::new();
        if self.layout.scheme.has_parity() && !stripes.is_empty() {
            let count = (stripes.end - stripes.start).min(u64::from(self.layout.width));
            let mut columns: Vec<u32> = (stripes.start..stripes.start + count)
                .filter_map(|s| self.layout.parity_slot(s).map(|slot| slot.column))
                .collect();
            columns.sort_unstable();
            columns.dedup();
            for column in columns {
                let request = StorageRequest::RecordDiscard {
                    file: self.meta.id,
                    stripes,
                    fence,
                };
                match self
                    .rpc_or_fail(client, column, request, Bytes::new())
                    .await?
                {
                    (StorageResponse::StaleRecorded { token }, _) => {
                        records.push(StaleRecord { column, token })
                    }
                    (other, _) => return Err(self.not_done(column, &other)),
                }
            }
        }
        let discards = self.every_column(client, |column| self.discards(column, first, fence));
        self.renewing_stale(client, &records, discards).await?;
        for record in records {
            let cleared = self.clear_stale(client, record.column, Some(record.token), stripes);
            // A record left behind only makes the resolver recompute parity that is right.
            let _ = cleared.await;
        }
        Ok(())
    }

    /// One past the last stripe from `first` on that some column holds bytes of (its files'
    /// extents, overflow entries included), and at least the file's stripes: what a record
    /// must cover, since bytes past the file's size become the file's again if it grows.
    async fn held_stripes_end(&self, client: &Client, first: u64) -> Result<u64, ClientError> {
        let layout = self.layout;
        let unit = u64::from(layout.stripe_unit);
        let mut end = layout.stripes_for_size(self.meta.size).max(first);
        for column in 0..layout.width {
            for region in [Region::Data, Region::Redundancy] {
                let Some(index) = layout.first_local_of_stripe(column, region, first) else {
                    continue;
                };
                let Some(last) = self
                    .allocated_end(client, column, region, index * unit)
                    .await?
                else {
                    continue;
                };
                if let Some(stripe) = layout.stripe_of_local(column, region, (last - 1) / unit) {
                    // Mirror overflow entries sit under the previous column's offsets: one
                    // stripe more covers them.
                    end = end.max(stripe + 2);
                }
            }
        }
        Ok(end)
    }

    /// One past the last byte from `offset` on of `column`'s `region` file that may hold
    /// written bytes, or `None` if none does. An answer at the listing's limit runs its last
    /// range to the end of what was asked (a superset), so the listing is paged from that
    /// range's start: taking it as it is would make a fragmented file's record span to the
    /// column's end.
    async fn allocated_end(
        &self,
        client: &Client,
        column: u32,
        region: Region,
        mut offset: u64,
    ) -> Result<Option<u64>, ClientError> {
        let mut end = None;
        loop {
            let request = StorageRequest::Allocated {
                file: self.meta.id,
                region,
                offset,
                len: COLUMN_BYTES_MAX - offset,
            };
            let ranges = match self
                .rpc_or_fail(client, column, request, Bytes::new())
                .await?
            {
                (StorageResponse::Allocated { ranges }, _) => ranges,
                (other, _) => return Err(self.not_done(column, &other)),
            };
            let ranges: Vec<_> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
            let Some(last) = ranges.last() else {
                return Ok(end);
            };
            if ranges.len() < tessera_wire::ALLOCATED_RANGES_MAX || last.start <= offset {
                return Ok(Some(last.end));
            }
            // Kept only if the next page finds nothing (bytes cut meanwhile): a superset.
            end = Some(last.end);
            offset = last.start;
        }
    }

    fn not_done(&self, column: u32, answer: &StorageResponse) -> ClientError {
        ClientError::Protocol {
            peer: self.columns[column as usize].addr.to_string(),
            detail: format!("unexpected answer {answer:?}"),
        }
    }

    /// The requests that discard stripes `first..` on `column`: its data and redundancy
    /// files from the first local index of those stripes, and under Hybrid the mirror
    /// overflow entries it keeps for the previous column, under that column's offsets.
    fn discards(&self, column: u32, first: u64, fence: u64) -> Vec<StorageRequest> {
        let file = self.meta.id;
        let layout = &self.layout;
        let unit = u64::from(layout.stripe_unit);
        let mut requests = Vec::new();
        for region in [Region::Data, Region::Redundancy] {
            if let Some(index) = layout.first_local_of_stripe(column, region, first) {
                requests.push(StorageRequest::Discard {
                    file,
                    region,
                    from: index * unit,
                    fence,
                });
            }
        }
        if layout.scheme == Scheme::Hybrid {
            let primary = (column + layout.width - 1) % layout.width;
            if let Some(index) = layout.first_local_of_stripe(primary, Region::Data, first) {
                let offset = index * unit;
                requests.push(StorageRequest::OverflowInvalidate {
                    file,
                    role: OverflowRole::Mirror,
                    offset,
                    len: COLUMN_BYTES_MAX - offset,
                });
            }
        }
        requests
    }

    /// Sends each column's requests (`requests(column)`, in order) to its server, all
    /// columns at once; fails with the first refusal or unreachable server.
    async fn every_column(
        &self,
        client: &Client,
        requests: impl Fn(u32) -> Vec<StorageRequest>,
    ) -> Result<(), ClientError> {
        let requests = &requests;
        let calls = (0..self.layout.width).map(|column| async move {
            for request in requests(column) {
                match self
                    .rpc_or_fail(client, column, request, Bytes::new())
                    .await?
                {
                    (StorageResponse::Done, _) => {}
                    (other, _) => return Err(self.not_done(column, &other)),
                }
            }
            Ok(())
        });
        futures::future::try_join_all(calls).await.map(|_| ())
    }
}
