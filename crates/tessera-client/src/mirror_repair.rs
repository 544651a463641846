//! A scrub's repairs of mirrored copies (RAID-1 units, Hybrid overflow entries) while writers
//! may be writing them.
//!
//! Mirrored copies are written without a lock: a write goes to both copies, and a scrub that
//! reads the two and copies one over the other can undo a write that landed in between. Read
//! the primary, a write lands on both, copy the old primary onto the mirror: the write was
//! acknowledged, yet its mirror copy is gone, and a read with the primary's server down
//! serves old bytes. Two rules close that:
//!
//! 1. **A writer reaches a mirror only once the primary copy is answered** (`write.rs`), so
//!    at any moment the primary holds every write the mirror holds, or a newer one. (The
//!    exception, a primary whose write failed, leaves its column owing the stripe, and a
//!    scrub skips stripes with a column owing them.)
//! 2. **A repair of the mirror is made under a mirror fence there**
//!    (`StorageRequest::MirrorFence`): the mirror's server holds back every write of the file
//!    not made under the fence until it is released. Under it, the scrub reads the primary
//!    and the mirror and, if they differ, writes the primary's bytes to the mirror.
//!
//! Why that undoes nothing: a write whose mirror copy landed before the fence had its primary
//! copy answered before that, so the primary read under the fence holds it (or a newer write
//! over it). A write whose mirror copy comes later waits out the fence and lands over the
//! repair. So the repair only ever brings the mirror forward to what the primary held, and
//! each write's last copy lands after it.
//!
//! The other direction (a corrupt primary unit rewritten from its mirror) cannot lean on rule
//! 1: a write may have landed on the primary with its mirror copy still on the way. Under a
//! fence at the primary, only the 4 KiB blocks that *still* fail their checksum are rewritten,
//! from the mirror's bytes: no write landed on those (a write over a whole block makes it
//! verify again, and one over part of a failing block is refused by the store and leaves the
//! column owing the stripe), so nothing newer is there to undo.
//!
//! The same holds where a read or a write finds a corrupt block and repairs the column's
//! stripe ([`Rewrite::Corrupt`](crate::maintain::Rewrite)): RAID-1 units and mirrors there
//! are repaired as above, a Hybrid mirror's overflow entries too, and a Hybrid data unit is
//! rebuilt from parity *keeping* the primary overflow entries it holds (the newest bytes of
//! the block) rather than replacing them with the mirror's. Where those entries are bad (a
//! damaged overflow log record, entry bytes that fail their checksum), the server repairs
//! only the bad parts from the
//! mirror's entries (`StorageRequest::OverflowRepairDamaged`), atomically under the file's
//! lock: an entry written since the damage cleared the damage over its range and stays,
//! whatever the mirror holds. (Left: an entry that landed *before* the damaged record, whose
//! mirror copy is still on the way when the repair runs, is lost at the primary. The damage
//! is found when the server replays its log at a restart, well after any such write.) A
//! column that *owes* the stripe is rebuilt without fences: writers skip it, so nothing
//! races the rebuild.

use crate::context::{Fault, FileContext};
use crate::maintain::flatten;
use crate::{Client, ClientError};
use bytes::Bytes;
use tessera_layout::{OverflowRole, Region, Scheme, StripeMember};
use tessera_wire::{StorageError, StorageRequest};

/// The store's checksummed block: the unit a corrupt primary is repaired in.
const BLOCK_BYTES: u64 = 4096;

/// `request` made under mirror fence `fence`.
pub(crate) fn under_fence(fence: u64, request: StorageRequest) -> StorageRequest {
    StorageRequest::UnderMirrorFence {
        fence,
        request: Box::new(request),
    }
}

impl FileContext {
    /// Runs `repair` (given the fence's token) with every write of this file held back at
    /// `column`'s server; the fence is released after, whatever `repair` returned.
    pub(crate) async fn with_mirror_fence<T>(
        &self,
        client: &Client,
        column: u32,
        repair: impl AsyncFnOnce(u64) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let fence = rand::random::<u64>();
        let file = self.meta.id;
        let raise = StorageRequest::MirrorFence { file, fence };
        self.rpc_or_fail(client, column, raise, Bytes::new())
            .await?;
        let result = repair(fence).await;
        // Best effort: a release lost only keeps writes waiting until the fence lapses.
        let release = StorageRequest::MirrorRelease { file, fence };
        let _ = self.rpc(client, column, release, Bytes::new()).await;
        result
    }

    /// Makes `block`'s RAID-1 mirror copy its primary copy, if the two differ (or the mirror
    /// fails its checksum) when read under a fence at the mirror; whether it was rewritten.
    pub(crate) async fn repair_raid1_mirror(
        &self,
        client: &Client,
        stripe: u64,
        block: u64,
    ) -> Result<bool, ClientError> {
        let layout = self.layout;
        let (primary, mirror) = self.raid1_copies(block);
        self.with_mirror_fence(client, mirror.column, async |fence| {
            let offset = layout.local_offset(primary);
            let unit = self.unit();
            let bytes = self
                .read_region_bytes(client, primary.column, Region::Data, offset, unit, false)
                .await
                .map_err(|fault| self.second_fault(mirror.column, primary.column, fault))?;
            let offset = layout.local_offset(mirror);
            match self
                .read_region_bytes(client, mirror.column, mirror.region, offset, unit, false)
                .await
            {
                Ok(copy) if copy == bytes => return Ok(false),
                Ok(_) => self.warn_copies_differ(stripe, block, "RAID-1 mirror"),
                Err(Fault::Refused(StorageError::Corrupt { .. })) => {}
                Err(fault) => return Err(self.fault_error(mirror.column, fault)),
            }
            self.write_unit_under(client, fence, mirror, bytes).await?;
            Ok(true)
        })
        .await
    }

    /// Rewrites the 4 KiB blocks of `block`'s primary RAID-1 copy that still fail their
    /// checksum under a fence at the primary, each from its mirror copy; how many it rewrote.
    pub(crate) async fn repair_corrupt_raid1_primary(
        &self,
        client: &Client,
        block: u64,
    ) -> Result<u64, ClientError> {
        let layout = self.layout;
        let (primary, mirror) = self.raid1_copies(block);
        let (base, mirror_base) = (layout.local_offset(primary), layout.local_offset(mirror));
        let end = base + self.unit() as u64;
        self.with_mirror_fence(client, primary.column, async |fence| {
            let mut at = base;
            let mut rewritten = 0;
            while at < end {
                let len = (end - at) as usize;
                let bad = match self
                    .read_region_bytes(client, primary.column, Region::Data, at, len, false)
                    .await
                {
                    Ok(_) => break,
                    Err(Fault::Refused(StorageError::Corrupt { offset, .. }))
                        if (at..end).contains(&offset) && offset % BLOCK_BYTES == 0 =>
                    {
                        offset
                    }
                    Err(fault) => return Err(self.fault_error(primary.column, fault)),
                };
                let from = mirror_base + (bad - base);
                let good = self
                    .read_region_bytes(
                        client,
                        mirror.column,
                        Region::Redundancy,
                        from,
                        BLOCK_BYTES as usize,
                        false,
                    )
                    .await
                    .map_err(|fault| self.second_fault(primary.column, mirror.column, fault))?;
                let write = StorageRequest::Write {
                    file: self.meta.id,
                    region: Region::Data,
                    offset: bad,
                    invalidate_overflow: false,
                };
                self.rpc_or_fail(client, primary.column, under_fence(fence, write), good)
                    .await?;
                rewritten += 1;
                at = bad + BLOCK_BYTES;
            }
            Ok(rewritten)
        })
        .await
    }

    /// One member of a stripe on a column found corrupt, which writers still write, repaired
    /// as above; whether it was (else the caller rewrites it as for an owed column, keeping a
    /// Hybrid unit's primary overflow entries). A RAID-1 unit or mirror is repaired under a
    /// fence.
    pub(crate) async fn repair_racing_writers(
        &self,
        client: &Client,
        stripe: u64,
        member: StripeMember,
    ) -> Result<bool, ClientError> {
        match (self.scheme(), member) {
            (Scheme::Raid1, StripeMember::Data { block }) => {
                self.repair_corrupt_raid1_primary(client, block).await?;
                Ok(true)
            }
            (Scheme::Raid1, StripeMember::Mirror { block }) => {
                self.repair_raid1_mirror(client, stripe, block).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Repairs the damaged parts of `block`'s primary overflow entries (a damaged log
    /// record) from its mirror's entries, leaving every part not damaged as it is
    /// (`StorageRequest::OverflowRepairDamaged`): entries written there since the damage
    /// may be newer than the mirror's, whose copies may still be on the way.
    pub(crate) async fn repair_damaged_primary_entries(
        &self,
        client: &Client,
        stripe: u64,
        block: u64,
    ) -> Result<(), ClientError> {
        let layout = self.layout;
        let primary = layout.data_slot(block);
        let mirror = layout.overflow_column(block, OverflowRole::Mirror);
        let (offset, len) = (layout.local_offset(primary), self.unit() as u64);
        if self.lost(mirror, stripe) {
            return Err(self.unavailable([primary.column, mirror]));
        }
        let mut entries = self
            .overflow_list(client, mirror, OverflowRole::Mirror, offset, len)
            .await
            .map_err(|fault| self.second_fault(primary.column, mirror, fault))?;
        entries.sort_by_key(|(entry, _)| entry.offset);
        let mut bytes = bytes::BytesMut::new();
        for (_, piece) in &entries {
            bytes.extend_from_slice(piece);
        }
        let request = StorageRequest::OverflowRepairDamaged {
            file: self.meta.id,
            role: OverflowRole::Primary,
            offset,
            len,
            entries: entries.into_iter().map(|(entry, _)| entry).collect(),
        };
        self.rpc_or_fail(client, primary.column, request, bytes.freeze())
            .await
            .map(|_| ())
    }

    /// `block`'s primary and mirror RAID-1 copies.
    fn raid1_copies(&self, block: u64) -> (tessera_layout::Slot, tessera_layout::Slot) {
        let mirror = self.layout.mirror_slot(block).expect("a RAID-1 file");
        (self.layout.data_slot(block), mirror)
    }

    /// A whole unit written into `slot` under fence `fence`.
    async fn write_unit_under(
        &self,
        client: &Client,
        fence: u64,
        slot: tessera_layout::Slot,
        bytes: Bytes,
    ) -> Result<(), ClientError> {
        let request = StorageRequest::Write {
            file: self.meta.id,
            region: slot.region,
            offset: self.layout.local_offset(slot),
            invalidate_overflow: false,
        };
        self.rpc_or_fail(client, slot.column, under_fence(fence, request), bytes)
            .await
            .map(|_| ())
    }

    /// Makes `block`'s overflow mirror entries those of its primary, if the two differ when
    /// listed under a fence at the mirror; whether they did. Only this block's mirror:
    /// rebuilding the mirror column's whole stripe would also replace *other* blocks'
    /// primary entries there by their mirrors, which an interrupted write may have left short
    /// (explorer seed 1012 read 1,304 bytes of a write as zeros that way).
    pub(crate) async fn repair_overflow_mirror(
        &self,
        client: &Client,
        stripe: u64,
        block: u64,
    ) -> Result<bool, ClientError> {
        let layout = self.layout;
        let offset = layout.local_offset(layout.data_slot(block));
        let mirror_column = layout.overflow_column(block, OverflowRole::Mirror);
        self.with_mirror_fence(client, mirror_column, async |fence| {
            let (primary_column, len) = (layout.data_slot(block).column, self.unit() as u64);
            let entries = self
                .overflow_list(client, primary_column, OverflowRole::Primary, offset, len)
                .await
                .map_err(|fault| self.second_fault(mirror_column, primary_column, fault))?;
            // A mirror that lists as corrupt (a damaged log record) is rewritten all the same.
            match self
                .overflow_list(client, mirror_column, OverflowRole::Mirror, offset, len)
                .await
            {
                Ok(mirror) if flatten(&mirror) == flatten(&entries) => return Ok(false),
                Ok(_) => self.warn_copies_differ(stripe, block, "overflow mirror"),
                Err(Fault::Refused(StorageError::Corrupt { .. })) => {}
                Err(fault) => return Err(self.fault_error(mirror_column, fault)),
            }
            self.write_entries(
                client,
                mirror_column,
                OverflowRole::Mirror,
                offset,
                entries,
                Some(fence),
            )
            .await?;
            Ok(true)
        })
        .await
    }
}
