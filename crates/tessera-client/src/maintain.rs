//! Keeping redundancy whole: rebuilding what a column holds for a stripe (used for repair of
//! corrupt blocks, resync of missed regions and rebuild of a wiped server) and scrubbing.
//!
//! Which copy scrub trusts is decided by checksums, never by the order of reading: a server
//! answers [`StorageError::Corrupt`] for a block, an overflow entry or an overflow log record
//! that fails its checksum, and that column is rebuilt from the others. Only where two copies
//! both verify and still differ (a RAID-1 data unit and its mirror, a Hybrid primary overflow
//! entry and its mirror) does a rule decide: **the primary copy wins**. It is what reads have
//! been served, and copies that both verify can only differ after a write that was never
//! acknowledged as durable (a client or server crash between the two copies), for which
//! either value is allowed; what matters is that both copies agree afterwards. Scrub says so
//! (a warning naming the stripe, and its count of mirror mismatches). Those repairs are made
//! under a mirror fence, so that they never undo a write racing them (`mirror_repair.rs`).

use crate::context::{self, Fault, FileContext};
use crate::intent::ParityLock;
use crate::restore::DebtBook;
use crate::{Client, ClientError, Unrebuildable};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use std::ops::Range;
use tessera_layout::{OverflowRole, Region, Scheme, StripeMember};
use tessera_wire::{
    FileDebt, FileMeta, IndexRange, KeptAction, ManagerError, ManagerRequest, ManagerResponse,
    ServerId, ServerState, StorageError, StorageRequest, StorageResponse,
};

/// Most stripes past a file's size a rebuild or scrub looks at for bytes of unacknowledged
/// writes and damage a later write growing the file would find.
const PAST_SIZE_STRIPES_MAX: u64 = 1024;

/// Stripes rebuilt or scrubbed at once.
const STRIPES_IN_FLIGHT_MAX: usize = 8;

/// Rounds of a file's rebuild while writes keep skipping the server (each round rebuilds what
/// the debt says then); past them the rebuild of the file fails, to be run again.
const REBUILD_ROUNDS_MAX: u32 = 8;

/// Where a rebuild stands, for a progress bar.
#[derive(Debug, Clone, Copy, Default)]
pub struct RebuildProgress {
    /// Stripes rebuilt so far.
    pub stripes_done: u64,
    /// Stripes to rebuild in all (owed stripes found never written are taken off as they are
    /// found, and so are those of files that fail).
    pub stripes_total: u64,
    /// Files finished.
    pub files_done: u64,
    /// Files to rebuild.
    pub files_total: u64,
    /// Stripes owed that are a hole on every other server (never written: zeros), so there
    /// was nothing to rebuild.
    pub stripes_unallocated: u64,
}

/// What a scrub found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Files checked.
    pub files: u64,
    /// Stripes checked in full.
    pub stripes_checked: u64,
    /// Stripes not checked because a server was down or owed them.
    pub stripes_skipped: u64,
    /// Stripes not read because every server holds a hole there (never written: zeros).
    pub stripes_unallocated: u64,
    /// Stored blocks that failed their checksum and were rewritten from redundancy.
    pub corrupt_repaired: u64,
    /// Stripes whose parity did not match their data, rewritten.
    pub parity_repaired: u64,
    /// RAID-1 mirror copies or Hybrid overflow mirrors that passed their checksums but
    /// differed from the primary copy, rewritten from it (the rule in the module doc).
    pub mirrors_repaired: u64,
    /// Problems that could not be repaired, one line each.
    pub unrepairable: Vec<String>,
    /// Stripes past a file's size (up to [`PAST_SIZE_STRIPES_MAX`] of them) that some server
    /// holds bytes or damage in, checked.
    pub past_size_checked: u64,
    /// Repairs of any kind in those stripes: no byte there was acknowledged, but a write
    /// growing the file over them would find the damage, perhaps with a second server's.
    pub past_size_repaired: u64,
    /// Problems there that could not be repaired (warned, not in `unrepairable`).
    pub past_size_unrepairable: u64,
}

impl ScrubReport {
    /// Adds the counts of one stripe's scrub.
    fn add(&mut self, one: ScrubReport) {
        self.stripes_checked += one.stripes_checked;
        self.stripes_skipped += one.stripes_skipped;
        self.corrupt_repaired += one.corrupt_repaired;
        self.parity_repaired += one.parity_repaired;
        self.mirrors_repaired += one.mirrors_repaired;
        self.unrepairable.extend(one.unrepairable);
    }

    /// Adds the counts of one stripe past the file's size.
    fn add_past_size(&mut self, one: ScrubReport, path: &str) {
        self.past_size_checked += one.stripes_checked;
        self.past_size_repaired +=
            one.corrupt_repaired + one.parity_repaired + one.mirrors_repaired;
        self.past_size_unrepairable += one.unrepairable.len() as u64;
        for line in one.unrepairable {
            tracing::warn!("{path}: past the file's size, not repaired: {line}");
        }
    }
}

/// Why a column's share of a stripe is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// The column owes the stripe: writers skip it, so no write races the rebuild.
    Owed,
    /// A corrupt block was found on a column that writers still write: mirrored copies are
    /// repaired so that a write racing the repair is never undone (`mirror_repair.rs`).
    Corrupt,
}

impl FileContext {
    /// Rewrite everything `column` stores for `stripe` from the other columns: data units,
    /// parity, mirror copies and (Hybrid) primary and mirror overflow entries.
    pub(crate) async fn rebuild_column_stripe(
        &self,
        client: &Client,
        column: u32,
        stripe: u64,
        why: Rewrite,
    ) -> Result<(), ClientError> {
        let file = self.meta.id;
        let unit = self.unit();
        let layout = self.layout;
        // A repair keeps a Hybrid column's primary overflow entries, the newest bytes of
        // their blocks, and repairs only their damaged parts below (`mirror_repair.rs`).
        let keeps = why == Rewrite::Corrupt;
        for member in layout.members_on_column(stripe, column) {
            if why == Rewrite::Corrupt && self.repair_racing_writers(client, stripe, member).await?
            {
                continue;
            }
            let (slot, bytes) = match member {
                StripeMember::Data { block } => {
                    let slot = layout.data_slot(block);
                    let bytes = match self.scheme() {
                        // No redundancy: what the column held cannot be rebuilt.
                        Scheme::Raid0 => return Err(self.unavailable([column])),
                        Scheme::Raid1 => {
                            let mirror = layout.mirror_slot(block).expect("mirror");
                            self.read_from(
                                client,
                                column,
                                mirror.column,
                                stripe,
                                Region::Redundancy,
                                layout.local_offset(mirror),
                            )
                            .await?
                        }
                        _ => self.reconstruct_from_parity(client, block, 0, unit).await?,
                    };
                    (slot, bytes)
                }
                StripeMember::Mirror { block } => {
                    let bytes = self.read_data_unit(client, column, stripe, block).await?;
                    (layout.mirror_slot(block).expect("mirror"), bytes)
                }
                StripeMember::Parity => {
                    let mut parity = vec![0u8; unit];
                    for block in layout.blocks_of_stripe(stripe) {
                        let bytes = self.read_data_unit(client, column, stripe, block).await?;
                        tessera_parity::xor_into(&mut parity, &bytes);
                    }
                    (layout.parity_slot(stripe).expect("parity"), parity)
                }
            };
            let request = StorageRequest::Write {
                file,
                region: slot.region,
                offset: layout.local_offset(slot),
                invalidate_overflow: self.scheme() == Scheme::Hybrid
                    && slot.region == Region::Data
                    && !keeps,
            };
            self.rpc_or_fail(client, column, request, Bytes::from(bytes))
                .await?;
        }
        if self.scheme() == Scheme::Hybrid {
            for block in layout.blocks_of_stripe(stripe) {
                for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                    if layout.overflow_column(block, role) != column {
                        continue;
                    }
                    match (why, role) {
                        (Rewrite::Corrupt, OverflowRole::Mirror) => {
                            self.repair_overflow_mirror(client, stripe, block).await?;
                        }
                        (Rewrite::Corrupt, OverflowRole::Primary) => {
                            self.repair_damaged_primary_entries(client, stripe, block)
                                .await?;
                        }
                        _ => {
                            self.copy_overflow_entries(client, stripe, block, role)
                                .await?
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `block`'s overflow entries of `role` made those of its other role, copied from the
    /// column holding them. A primary's were already trimmed by the data write that rebuilt
    /// its unit; a mirror's are invalidated over the unit first.
    async fn copy_overflow_entries(
        &self,
        client: &Client,
        stripe: u64,
        block: u64,
        role: OverflowRole,
    ) -> Result<(), ClientError> {
        let layout = self.layout;
        let unit = self.unit() as u64;
        let column = layout.overflow_column(block, role);
        let other_role = match role {
            OverflowRole::Primary => OverflowRole::Mirror,
            OverflowRole::Mirror => OverflowRole::Primary,
        };
        let source = layout.overflow_column(block, other_role);
        let offset = layout.local_offset(layout.data_slot(block));
        if self.lost(source, stripe) {
            return Err(self.unavailable([column, source]));
        }
        let entries = self
            .overflow_list(client, source, other_role, offset, unit)
            .await
            .map_err(|fault| self.second_fault(column, source, fault))?;
        self.write_entries(client, column, role, offset, entries, None)
            .await
    }

    /// Writes `entries` as the overflow entries of `role` at `column` for the unit at
    /// `offset`: a mirror's are invalidated over the unit first (a primary's were trimmed by
    /// the data write that rebuilt its unit). Under mirror fence `fence`, if given.
    pub(crate) async fn write_entries(
        &self,
        client: &Client,
        column: u32,
        role: OverflowRole,
        offset: u64,
        entries: Vec<(tessera_wire::OverflowExtent, Bytes)>,
        fence: Option<u64>,
    ) -> Result<(), ClientError> {
        let file = self.meta.id;
        let fenced = |request| match fence {
            Some(fence) => crate::mirror_repair::under_fence(fence, request),
            None => request,
        };
        if role == OverflowRole::Mirror {
            let len = self.unit() as u64;
            let invalidate = StorageRequest::OverflowInvalidate {
                file,
                role,
                offset,
                len,
            };
            self.rpc_or_fail(client, column, fenced(invalidate), Bytes::new())
                .await?;
        }
        for (entry, bytes) in entries {
            let offset = entry.offset;
            let write = StorageRequest::OverflowWrite { file, role, offset };
            self.rpc_or_fail(client, column, fenced(write), bytes)
                .await?;
        }
        Ok(())
    }

    /// A whole unit for scrub: `None` (and its column noted in `corrupt`) if it fails its
    /// checksum.
    async fn read_unit_for_scrub(
        &self,
        client: &Client,
        slot: tessera_layout::Slot,
        corrupt: &mut Vec<u32>,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let offset = self.layout.local_offset(slot);
        match self
            .read_region(client, slot.column, slot.region, offset, self.unit(), false)
            .await
        {
            Ok(bytes) => Ok(Some(bytes)),
            Err(Fault::Refused(StorageError::Corrupt { .. })) => {
                corrupt.push(slot.column);
                Ok(None)
            }
            Err(fault) => Err(self.second_fault(slot.column, slot.column, fault)),
        }
    }

    /// Data block `block`'s whole base unit from its column, on behalf of `target`.
    async fn read_data_unit(
        &self,
        client: &Client,
        target: u32,
        stripe: u64,
        block: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let data = self.layout.data_slot(block);
        let offset = self.layout.local_offset(data);
        self.read_from(client, target, data.column, stripe, Region::Data, offset)
            .await
    }

    /// A whole unit from a surviving column, on behalf of `target`.
    async fn read_from(
        &self,
        client: &Client,
        target: u32,
        source: u32,
        stripe: u64,
        region: Region,
        offset: u64,
    ) -> Result<Vec<u8>, ClientError> {
        if self.lost(source, stripe) {
            return Err(self.unavailable([target, source]));
        }
        self.read_region(client, source, region, offset, self.unit(), false)
            .await
            .map_err(|fault| self.second_fault(target, source, fault))
    }

    /// Both copies of a block verified and differ: the primary's is kept.
    pub(crate) fn warn_copies_differ(&self, stripe: u64, block: u64, what: &str) {
        tracing::warn!(
            "{} stripe {stripe} block {block}: the primary copy and its {what} both pass their \
             checksums but differ; keeping the primary copy (what reads have served)",
            self.meta.path
        );
    }

    /// Check one stripe: every stored unit's checksum, then parity or mirrors, then overflow
    /// mirrors. Repairs what one column's loss can explain.
    async fn scrub_stripe(&self, client: &Client, stripe: u64) -> Result<ScrubReport, ClientError> {
        let mut report = ScrubReport::default();
        let layout = self.layout;
        let unit = self.unit();
        if (0..layout.width).any(|c| self.lost(c, stripe)) {
            report.stripes_skipped = 1;
            return Ok(report);
        }
        report.stripes_checked = 1;
        // Hold the parity lock while checking, so a concurrent read-modify-write is not taken
        // for corruption.
        let parity_slot = layout.parity_slot(stripe);
        let mut lock = None;
        let mut parity: Option<Vec<u8>> = None;
        let mut corrupt: Vec<u32> = Vec::new();
        if let Some(slot) = parity_slot {
            let offset = layout.local_offset(slot);
            match self.lock_parity(client, stripe, offset, unit as u32).await {
                Ok(grant) => {
                    lock = Some(ScrubLock {
                        lock: grant.lock,
                        orphan: grant.orphan.is_some(),
                        stale: grant.stale,
                    });
                    parity = Some(grant.parity.to_vec());
                }
                Err(Fault::Refused(StorageError::Corrupt { .. })) => corrupt.push(slot.column),
                Err(fault) => return Err(self.second_fault(slot.column, slot.column, fault)),
            }
        }
        // A column that went down, missed a write of this stripe and came back while the lock
        // was awaited serves old bytes: nothing may be computed from them (see `revalidate`).
        let work = async {
            match self.revalidate(client, stripe).await {
                Ok(true) => {
                    report.stripes_checked = 0;
                    report.stripes_skipped = 1;
                    Ok(())
                }
                Ok(false) => {
                    self.scrub_locked(client, stripe, parity, lock, corrupt, &mut report)
                        .await
                }
                Err(e) => Err(e),
            }
        };
        // Renewed while it works: a full-stripe writer of the stripe waits for it, rather
        // than breaking a lease that ran out under a slow (background) read and writing while
        // this computes parity from the stripe's data.
        let result = match lock {
            Some(held) => self.renewing(client, held.lock, work).await,
            None => work.await,
        };
        if let Some(held) = lock {
            self.unlock(client, held.lock).await;
        }
        result?;
        if let (false, Some(slot), false) = (
            self.debts_set_aside.is_empty() || report.unrepairable.is_empty(),
            parity_slot,
            lock.is_some_and(|held| held.stale),
        ) {
            // Kept bytes put back, a data unit corrupt (torn) and parity perhaps older than
            // the data (`restore.rs`): recorded as torn, the record left to lapse unrenewed,
            // so that no read reconstructs the unit from this parity either. (Recorded once
            // the lock is let go: a record waits for the stripe's lock holders.)
            let stripes = IndexRange::new(stripe, stripe + 1);
            self.record_stale(client, slot.column, stripes)
                .await
                .map_err(|fault| self.second_fault(slot.column, slot.column, fault))?;
        }
        Ok(report)
    }

    /// Takes `stripe` out of the orphaned stale-parity records at its parity column: its
    /// parity was just computed from its data.
    async fn clear_stale_of(&self, client: &Client, stripe: u64) -> Result<(), ClientError> {
        let column = self.layout.parity_slot(stripe).expect("parity").column;
        let stripes = IndexRange::new(stripe, stripe + 1);
        self.clear_stale(client, column, None, stripes)
            .await
            .map_err(|fault| self.second_fault(column, column, fault))
    }

    async fn scrub_locked(
        &self,
        client: &Client,
        stripe: u64,
        parity: Option<Vec<u8>>,
        lock: Option<ScrubLock>,
        mut corrupt: Vec<u32>,
        report: &mut ScrubReport,
    ) -> Result<(), ClientError> {
        let layout = self.layout;
        let unit = self.unit();
        let blocks: Vec<u64> = layout.blocks_of_stripe(stripe).collect();
        let mut data: Vec<Option<Vec<u8>>> = Vec::new();
        for &block in &blocks {
            let slot = layout.data_slot(block);
            data.push(self.read_unit_for_scrub(client, slot, &mut corrupt).await?);
        }
        let mut mirrors: Vec<Option<Vec<u8>>> = Vec::new();
        if self.scheme() == Scheme::Raid1 {
            for &block in &blocks {
                let slot = layout.mirror_slot(block).expect("mirror");
                mirrors.push(self.read_unit_for_scrub(client, slot, &mut corrupt).await?);
            }
        }
        // Overflow entries are checked against their checksums when listed.
        let mut overflow: Vec<Option<(Vec<u8>, Vec<u8>)>> = Vec::new();
        if self.scheme() == Scheme::Hybrid {
            for &block in &blocks {
                let offset = layout.local_offset(layout.data_slot(block));
                let mut sides = Vec::new();
                for role in [OverflowRole::Primary, OverflowRole::Mirror] {
                    let column = layout.overflow_column(block, role);
                    match self
                        .overflow_list(client, column, role, offset, unit as u64)
                        .await
                    {
                        Ok(entries) => sides.push(Some(flatten(&entries))),
                        Err(Fault::Refused(StorageError::Corrupt { .. })) => {
                            corrupt.push(column);
                            sides.push(None);
                        }
                        Err(fault) => return Err(self.second_fault(column, column, fault)),
                    }
                }
                overflow.push(match (sides[0].take(), sides[1].take()) {
                    (Some(p), Some(m)) => Some((p, m)),
                    _ => None,
                });
            }
        }
        corrupt.sort();
        corrupt.dedup();
        let parity_column = layout.parity_slot(stripe).map(|slot| slot.column);
        // Parity of a file whose kept bytes were just put back may predate writes never
        // synced (`restore.rs`): a corrupt (torn) data unit is not rebuilt from it, which
        // could turn the synced bytes sharing its blocks into wrong ones; it stays an error.
        let restored = !self.debts_set_aside.is_empty() && self.scheme().has_parity();
        let stale = lock.is_some_and(|held| held.stale) || restored;
        if stale && corrupt.iter().any(|&c| Some(c) != parity_column) {
            // A corrupt data unit under stale parity (an interrupted full-stripe write) has
            // nothing to be rebuilt from.
            report.unrepairable.push(format!(
                "{} stripe {stripe}: corrupt data on servers {:?} in a stripe whose parity may \
                 not match its data (an interrupted full-stripe write, or kept bytes put back \
                 after a power loss): those bytes are lost",
                self.meta.path,
                self.servers_of(&corrupt)
            ));
            return Ok(());
        }
        match corrupt.len() {
            0 => {}
            _ if self.scheme() == Scheme::Raid1 => {
                // Each block has its own two copies: a corrupt one is rewritten from the
                // other, and copies that differ elsewhere in the stripe are made one too.
                return self
                    .scrub_raid1_blocks(client, stripe, &data, &mirrors, report)
                    .await;
            }
            1 if self.scheme() != Scheme::Raid0 => {
                self.rebuild_column_stripe(client, corrupt[0], stripe, Rewrite::Corrupt)
                    .await?;
                if stale {
                    // The parity unit was rebuilt from the data: nothing stale is left.
                    self.clear_stale_of(client, stripe).await?;
                }
                report.corrupt_repaired += 1;
                if self.scheme() == Scheme::Hybrid && !self.revalidate(client, stripe).await? {
                    // The other blocks' overflow copies, which the rebuild did not look at
                    // (after a power loss they may differ anywhere in the stripe).
                    for &block in &blocks {
                        if self.repair_overflow_mirror(client, stripe, block).await? {
                            report.mirrors_repaired += 1;
                        }
                    }
                }
                return Ok(());
            }
            _ => {
                report.unrepairable.push(format!(
                    "{} stripe {stripe}: corrupt blocks on servers {:?}",
                    self.meta.path,
                    self.servers_of(&corrupt)
                ));
                return Ok(());
            }
        }
        let data: Vec<Vec<u8>> = data.into_iter().map(|d| d.expect("no corrupt")).collect();
        if let (Some(parity), Some(slot)) = (parity, layout.parity_slot(stripe)) {
            let mut expected = vec![0u8; unit];
            for d in &data {
                tessera_parity::xor_into(&mut expected, d);
            }
            let held = lock.expect("parity was read under its lock");
            if expected != parity || held.orphan || held.stale {
                // Every data block passed its checksum, so the data is right and parity is not
                // (or a dead writer's record is resolved: parity from the data covers it).
                let offset = layout.local_offset(slot);
                self.write_parity(
                    client,
                    held.lock,
                    offset,
                    Bytes::from(expected.clone()),
                    false,
                )
                .await
                .map_err(|fault| self.second_fault(slot.column, slot.column, fault))?;
                if held.stale {
                    self.clear_stale_of(client, stripe).await?;
                }
                if expected != parity {
                    report.parity_repaired += 1;
                }
            }
        }
        let raid1_differing: Vec<u64> = blocks
            .iter()
            .zip(&mirrors)
            .zip(&data)
            .filter(|((_, mirror), data)| mirror.as_deref() != Some(&data[..]))
            .map(|((&block, _), _)| block)
            .collect();
        let differing: Vec<u64> = blocks
            .iter()
            .zip(&overflow)
            .filter(|(_, sides)| matches!(sides, Some((p, m)) if p != m))
            .map(|(&block, _)| block)
            .collect();
        // Mirrors and overflow entries are written without a lock, so what was read above may
        // be old by now (a scrub waits for its lock and reads a whole stripe over a slow
        // network), and a column may have gone down since, a write then reaching only the
        // other copy: explorer seed 1012 had a scrub invalidate the only copy of acknowledged
        // overflow entries, written to the mirror while the primary's server was down, from
        // listings made before it went down. So the view is asked again, and each repair
        // compares the two copies afresh.
        let repairs = raid1_differing.len() + differing.len();
        if repairs > 0 && self.revalidate(client, stripe).await? {
            report.stripes_checked = 0;
            report.stripes_skipped = 1;
            return Ok(());
        }
        for block in raid1_differing {
            if self.repair_raid1_mirror(client, stripe, block).await? {
                report.mirrors_repaired += 1;
            }
        }
        for block in differing {
            if self.repair_overflow_mirror(client, stripe, block).await? {
                report.mirrors_repaired += 1;
            }
        }
        Ok(())
    }

    /// A RAID-1 stripe with corrupt units on several columns, block by block: a corrupt copy
    /// is rewritten from the block's other one, copies that differ as
    /// [`repair_raid1_mirror`](Self::repair_raid1_mirror) does; a block with both copies
    /// corrupt is unrepairable.
    async fn scrub_raid1_blocks(
        &self,
        client: &Client,
        stripe: u64,
        data: &[Option<Vec<u8>>],
        mirrors: &[Option<Vec<u8>>],
        report: &mut ScrubReport,
    ) -> Result<(), ClientError> {
        if self.revalidate(client, stripe).await? {
            report.stripes_checked = 0;
            report.stripes_skipped = 1;
            return Ok(());
        }
        let layout = self.layout;
        let blocks = layout.blocks_of_stripe(stripe);
        // Each copy is rewritten from the other under a mirror fence (`mirror_repair.rs`).
        for ((block, primary), mirror) in blocks.zip(data).zip(mirrors) {
            match (primary, mirror) {
                (Some(p), Some(m)) => {
                    if p != m && self.repair_raid1_mirror(client, stripe, block).await? {
                        report.mirrors_repaired += 1;
                    }
                }
                (None, Some(_)) => {
                    if self.repair_corrupt_raid1_primary(client, block).await? > 0 {
                        report.corrupt_repaired += 1;
                    }
                }
                (Some(_), None) => {
                    self.repair_raid1_mirror(client, stripe, block).await?;
                    report.corrupt_repaired += 1;
                }
                (None, None) => {
                    report.unrepairable.push(format!(
                        "{} stripe {stripe} block {block}: both copies corrupt",
                        self.meta.path
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The parity lock a scrub holds, and what its grant said was left to resolve.
#[derive(Clone, Copy)]
struct ScrubLock {
    lock: ParityLock,
    /// A dead read-modify-writer's intent record.
    orphan: bool,
    /// An orphaned stale-parity record (an interrupted full-stripe write).
    stale: bool,
}

/// Overflow entries as comparable bytes: offsets, lengths and contents in offset order.
/// Listings come oldest first, and a primary and its mirror may receive disjoint entries from
/// concurrent writers in different orders; entries of one role never overlap, so offset order
/// is the same for equal contents.
pub(crate) fn flatten(entries: &[(tessera_wire::OverflowExtent, Bytes)]) -> Vec<u8> {
    let mut sorted: Vec<&(tessera_wire::OverflowExtent, Bytes)> = entries.iter().collect();
    sorted.sort_by_key(|(entry, _)| entry.offset);
    let mut out = Vec::new();
    for (entry, bytes) in sorted {
        out.extend_from_slice(&entry.offset.to_le_bytes());
        out.extend_from_slice(&entry.len.to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// Which stripes of a file hold bytes, as far as the columns asked could say.
struct Allocation {
    /// Sorted, disjoint ranges of stripes that may hold written bytes on a column asked.
    stripes: Vec<Range<u64>>,
    /// Whether every column asked answered; if not, a stripe outside `stripes` may still hold
    /// bytes on a column that did not.
    complete: bool,
    /// One past the last stripe any column's files hold bytes of, if every column answered
    /// in full (none listed more ranges than one answer holds).
    extent_end: Option<u64>,
}

impl FileContext {
    /// The servers of `columns`, for reports.
    fn servers_of(&self, columns: &[u32]) -> Vec<ServerId> {
        columns
            .iter()
            .map(|&c| self.columns[c as usize].server)
            .collect()
    }

    /// The stripes of `0..stripes_total` that may hold written bytes, learned from every
    /// column but `exclude` (the column being rebuilt): the stripes whose slots overlap an
    /// allocated extent of some column's data or redundancy file, and every stripe some column
    /// owes. Any other stripe is a hole in every column that answered: if all did, it holds
    /// zeros, whose parity and mirrors are zeros too, so there is nothing to check or rebuild.
    ///
    /// Extents are looked for up to stripe `extents_total` (past the file's size: an
    /// unacknowledged write may have left bytes there, which a later write growing the file
    /// over them must find with their parity whole), owed stripes up to `stripes_total` only.
    async fn allocated_stripes_past(
        &self,
        client: &Client,
        exclude: Option<u32>,
        stripes_total: u64,
        extents_total: u64,
    ) -> Allocation {
        let layout = self.layout;
        let unit = u64::from(layout.stripe_unit);
        // No slot of stripe `s` sits past local index `s` on its column.
        let local_len = extents_total
            .saturating_mul(unit)
            .min(tessera_layout::COLUMN_BYTES_MAX);
        let mut stripes: Vec<Range<u64>> = Vec::new();
        let mut complete = true;
        let mut truncated = false;
        for column in (0..layout.width).filter(|&c| Some(c) != exclude) {
            if self.lost_entirely(column) {
                complete = false;
                continue;
            }
            let owed = &self.columns[column as usize].missed;
            stripes.extend(owed.iter().map(|r| r.start..r.end.min(stripes_total)));
            for region in [Region::Data, Region::Redundancy] {
                let request = StorageRequest::Allocated {
                    file: self.meta.id,
                    region,
                    offset: 0,
                    len: local_len,
                };
                let ranges = match self.rpc(client, column, request, Bytes::new()).await {
                    Ok((StorageResponse::Allocated { ranges }, _)) => ranges,
                    _ => {
                        complete = false;
                        continue;
                    }
                };
                truncated |= ranges.len() >= tessera_wire::ALLOCATED_RANGES_MAX;
                for range in ranges.iter().filter(|r| !r.is_empty()) {
                    let local_first = range.start / unit;
                    let local_last = (range.end - 1) / unit;
                    let map = |local| layout.stripe_of_local(column, region, local);
                    let (Some(first), Some(last)) = (map(local_first), map(local_last)) else {
                        continue;
                    };
                    // A Hybrid mirror overflow entry sits under the offsets of the block
                    // before: one stripe off either way at most (tessera-layout's test
                    // `overflow_entries_map_back_to_within_one_stripe_of_their_own`). Missing
                    // it would rebuild a column without the entry and clear its debt.
                    let (first, last) = match (layout.scheme, region) {
                        (Scheme::Hybrid, Region::Data) => {
                            (first.saturating_sub(1), last.saturating_add(1))
                        }
                        _ => (first, last),
                    };
                    stripes.push(first..last.saturating_add(1).min(extents_total));
                }
            }
        }
        let stripes = merge_ranges(stripes);
        let extent_end = stripes.last().map_or(0, |r| r.end);
        Allocation {
            extent_end: (complete && !truncated).then_some(extent_end),
            stripes,
            complete,
        }
    }
}

/// The runs of `range` without the sorted stripes `skipped`.
fn ranges_without(range: IndexRange, skipped: &[u64]) -> Vec<IndexRange> {
    let mut out = Vec::new();
    let mut start = range.start;
    for &stripe in skipped {
        if start < stripe {
            out.push(IndexRange::new(start, stripe));
        }
        start = stripe + 1;
    }
    if start < range.end {
        out.push(IndexRange::new(start, range.end));
    }
    out
}

/// Sorted, disjoint, non-empty ranges covering the same indices as `ranges`.
fn merge_ranges(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

/// The stripes of `range` that are in `allocated` (all of them if `allocated` is `None`).
fn clip_to(range: Range<u64>, allocated: Option<&[Range<u64>]>) -> Vec<Range<u64>> {
    let Some(allocated) = allocated else {
        return vec![range];
    };
    allocated
        .iter()
        .map(|a| a.start.max(range.start)..a.end.min(range.end))
        .filter(|r| r.start < r.end)
        .collect()
}

/// Stripes in a list of ranges.
fn count(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

impl Client {
    /// Rebuild everything server `server` owes: the regions it missed, or every file it holds
    /// if its store was wiped. `progress` is called as stripes finish. A file that cannot be
    /// rebuilt (no redundancy, too many servers lost) stays owed and the rebuild goes on with
    /// the others; [`ClientError::Unrebuildable`] names every such file at the end.
    pub async fn rebuild(
        &self,
        server: ServerId,
        progress: impl FnMut(RebuildProgress),
    ) -> Result<RebuildProgress, ClientError> {
        self.background().rebuild_marked(server, progress).await
    }

    /// This client, its requests marked as rebuild and scrub work: the servers serve them as
    /// best effort, under their rebuild rate cap (`tessera_server::schedule`).
    fn background(&self) -> Client {
        Client {
            service: crate::stream::ServiceClock::Background,
            ..self.clone()
        }
    }

    async fn rebuild_marked(
        &self,
        server: ServerId,
        mut progress: impl FnMut(RebuildProgress),
    ) -> Result<RebuildProgress, ClientError> {
        let status = self.status().await?;
        let me = status
            .iter()
            .find(|s| s.id == server)
            .ok_or(ClientError::NoSuchServer(server))?;
        if me.state == ServerState::Down {
            return Err(ClientError::ServerDown(server));
        }
        let debts = self.debts_of(server).await?;
        let mut state = RebuildProgress {
            files_total: debts.len() as u64,
            ..Default::default()
        };
        state.stripes_total = debts
            .iter()
            .map(|d| d.missed.iter().map(|r| owed(&d.meta, r)).sum::<u64>())
            .sum();
        progress(state);
        let mut failed: Vec<(String, Unrebuildable)> = Vec::new();
        let mut others = DebtBook::default();
        for debt in debts {
            let owed_here: u64 = debt.missed.iter().map(|r| owed(&debt.meta, r)).sum();
            let done_before = state.stripes_done + state.stripes_unallocated;
            let result = if debt.meta.layout.scheme == Scheme::Raid0 && owed_here > 0 {
                // Nothing to rebuild from: the file stays owed (and unreadable there) rather
                // than ever serving zeros for lost bytes.
                Err(Unrebuildable::NoRedundancy)
            } else {
                match self
                    .rebuild_file_until_stable(server, debt.clone(), &mut state, &mut progress)
                    .await
                {
                    Ok(()) => Ok(()),
                    // Removed meanwhile (or a pending file given up): nothing is owed.
                    Err(ClientError::Metadata(ManagerError::NotFound(_))) => Ok(()),
                    // Nothing else can succeed either.
                    Err(e @ ClientError::ManagerUnreachable { .. }) => return Err(e),
                    Err(e @ ClientError::TornStripe { .. }) => {
                        Err(Unrebuildable::TornStripes(e.to_string()))
                    }
                    Err(e) => Err(Unrebuildable::Failed(e.to_string())),
                }
            };
            let result = match result {
                Err(why) => self.restore_instead(&debt, why, &mut others).await,
                ok => ok,
            };
            if let Err(why) = result {
                failed.push((debt.meta.path.clone(), why));
                let done_here = state.stripes_done + state.stripes_unallocated - done_before;
                state.stripes_total = state
                    .stripes_total
                    .saturating_sub(owed_here.saturating_sub(done_here));
            }
            state.files_done += 1;
            progress(state);
        }
        if !failed.is_empty() {
            return Err(ClientError::Unrebuildable {
                server,
                files_total: state.files_total,
                failed,
            });
        }
        Ok(state)
    }

    /// A file the rebuild could not rebuild from the other servers: put back what its
    /// servers kept at a power loss, if that is what is left (`restore.rs`), or fail as `why`.
    async fn restore_instead(
        &self,
        debt: &FileDebt,
        why: Unrebuildable,
        others: &mut DebtBook,
    ) -> Result<(), Unrebuildable> {
        match self.restore_kept(debt.meta.id, others).await {
            Ok(Some(report)) => {
                for line in &report.unrepairable {
                    tracing::warn!("{}: after putting kept bytes back: {line}", debt.meta.path);
                }
                Ok(())
            }
            Ok(None) => Err(why),
            Err(e) => {
                tracing::warn!("{}: kept bytes not put back: {e}", debt.meta.path);
                Err(why)
            }
        }
    }

    /// The files `server` owes stripes of, with what it owes (one manager request).
    pub async fn debts_of(&self, server: ServerId) -> Result<Vec<FileDebt>, ClientError> {
        match self
            .manager_call(ManagerRequest::FilesOnServer { server })
            .await?
        {
            ManagerResponse::Debts(debts) => {
                Ok(debts.into_iter().filter(|d| !d.missed.is_empty()).collect())
            }
            other => Err(ClientError::Protocol {
                peer: format!("manager {}", self.manager()),
                detail: format!("expected debts, got {other:?}"),
            }),
        }
    }

    /// [`rebuild_file`](Self::rebuild_file), again while writes that skipped the server
    /// during the rebuild changed its debt (the manager refuses the `Resynced` of a debt
    /// whose tag changed): at most [`REBUILD_ROUNDS_MAX`] rounds.
    async fn rebuild_file_until_stable(
        &self,
        server: ServerId,
        mut debt: FileDebt,
        state: &mut RebuildProgress,
        progress: &mut impl FnMut(RebuildProgress),
    ) -> Result<(), ClientError> {
        let mut round = 1;
        loop {
            match self.rebuild_file(server, &debt, state, progress).await {
                Err(ClientError::Metadata(ManagerError::DebtChanged { .. }))
                    if round < REBUILD_ROUNDS_MAX =>
                {
                    tracing::debug!("{}: owed more during its rebuild, again", debt.meta.path);
                    round += 1;
                    let listed = self.debts_of(server).await?;
                    match listed.into_iter().find(|d| d.meta.id == debt.meta.id) {
                        Some(again) => debt = again,
                        None => return Ok(()),
                    }
                }
                other => return other,
            }
        }
    }

    /// Rebuild what `server` owes of one file, range by range, walking only the stripes that
    /// hold bytes; each range is reported resynced once all of it is done.
    async fn rebuild_file(
        &self,
        server: ServerId,
        debt: &FileDebt,
        state: &mut RebuildProgress,
        progress: &mut impl FnMut(RebuildProgress),
    ) -> Result<(), ClientError> {
        let ctx = self.context_of(debt.meta.id).await?;
        let Some(column) = ctx.meta.servers.iter().position(|&s| s == server) else {
            return Ok(());
        };
        let column = column as u32;
        let size_stripes = ctx.layout.stripes_for_size(ctx.meta.size);
        // A stripe whose bytes might be only on a column that could not say is rebuilt (and
        // fails if it needs that column), never taken for zeros. Stripes past the size that
        // hold bytes (of a write never acknowledged) are rebuilt too: a write that later grows
        // the file over them updates their parity in place.
        // Bounded: a damaged overflow log record makes its server report every range it may
        // have changed, up to the end of the range asked.
        let extents_total = size_stripes.saturating_add(PAST_SIZE_STRIPES_MAX);
        let allocation = ctx
            .allocated_stripes_past(self, Some(column), size_stripes, extents_total)
            .await;
        let stripes_total = allocation
            .extent_end
            .map_or(size_stripes, |end| end.max(size_stripes));
        let allocated = allocation.complete.then_some(allocation.stripes);
        // Stripes of interrupted full-stripe writes whose unit here cannot be rebuilt (stale
        // parity): they stay owed, so that they read as an error, never as wrong bytes.
        let mut torn: Option<ClientError> = None;
        for range in &debt.missed {
            let owed_range = range.start..range.end.min(stripes_total).max(range.start);
            let walk = clip_to(owed_range.clone(), allocated.as_deref());
            let holes = (owed_range.end - owed_range.start) - count(&walk);
            let mut rebuilds = stream::iter(walk.into_iter().flatten())
                .map(|stripe| {
                    let ctx = &ctx;
                    async move {
                        (
                            stripe,
                            ctx.rebuild_column_stripe(self, column, stripe, Rewrite::Owed)
                                .await,
                        )
                    }
                })
                .buffer_unordered(STRIPES_IN_FLIGHT_MAX);
            let mut skipped = Vec::new();
            while let Some((stripe, result)) = rebuilds.next().await {
                match result {
                    Err(e @ ClientError::TornStripe { .. }) => {
                        skipped.push(stripe);
                        torn.get_or_insert(e);
                    }
                    // Past the size, best effort: no byte there was acknowledged, and a
                    // damaged overflow log may name ranges there that no read ever repairs.
                    Err(e) if stripe >= size_stripes => tracing::warn!(
                        "{}: stripe {stripe}, past the file's size, not rebuilt: {e}",
                        ctx.meta.path
                    ),
                    other => other?,
                }
                state.stripes_done += 1;
                progress(*state);
            }
            // Nothing to do for them: no longer part of the work the progress bar shows.
            state.stripes_unallocated += holes;
            // (The file may have grown since its debt was listed: never below zero.)
            state.stripes_total = state.stripes_total.saturating_sub(holes);
            if ctx.scheme().has_parity() {
                // Parity units rebuilt here were computed from the data: an orphaned
                // stale-parity record over them has nothing left to say. Best effort: one
                // left only makes a later reader resolve it. Cleared before the sync below,
                // so that the clearing is durable with the rebuilt bytes: a clearing lost to
                // a power loss brought the record back, and with one more server lost the
                // stripe read as torn though its parity was whole (explorer seed 1133 of
                // `power_losses_with_server_faults_every_scheme`). A clearing kept while the
                // rebuilt parity was lost is safe: the stripes are still owed until
                // `Resynced` below.
                let _ = ctx.clear_stale(self, column, None, *range).await;
            }
            // The rebuilt bytes must be durable before the manager stops counting them owed:
            // a power loss would otherwise take them back with nobody knowing.
            ctx.rpc_or_fail(self, column, StorageRequest::Sync, Bytes::new())
                .await?;
            // Bytes it kept at a power loss never outlive the debt they stood in for
            // (`restore.rs`): a later power loss of every server would bring them back.
            self.kept_bytes(&ctx, column, KeptAction::Drop).await?;
            skipped.sort_unstable();
            for stripes in ranges_without(*range, &skipped) {
                self.manager_call(ManagerRequest::Resynced {
                    server,
                    file: debt.meta.id,
                    stripes,
                    tag: debt.tag,
                })
                .await?;
            }
        }
        // A wiped store lost its records too: give it the file's back.
        ctx.describe_column(self, column, false).await;
        torn.map_or(Ok(()), Err)
    }

    /// Check every stripe that holds bytes of one file, or of every file, and repair what can
    /// be repaired. Stripes that are a hole on every server are counted, not read. Stripes
    /// past the size that some server holds bytes or damage in are checked too (at most
    /// [`PAST_SIZE_STRIPES_MAX`]), counted apart: a flipped bit there (a checksum entry of a
    /// block never written, a damaged overflow log record, which may have named any range)
    /// would otherwise wait, unrepaired, for a write growing the file over it, and with a
    /// second such server in the same stripe make it unreadable.
    pub async fn scrub(&self, path: Option<&str>) -> Result<ScrubReport, ClientError> {
        self.background().scrub_marked(path).await
    }

    async fn scrub_marked(&self, path: Option<&str>) -> Result<ScrubReport, ClientError> {
        let files = match path {
            Some(path) => vec![self.open(path).await?.id],
            None => self.list("").await?.into_iter().map(|m| m.id).collect(),
        };
        let mut report = ScrubReport::default();
        for file in files {
            let ctx = self.context_of(file).await?;
            self.scrub_file(&ctx, &mut report).await?;
        }
        Ok(report)
    }

    /// Scrub one file, as its context `ctx` sees it, adding to `report`.
    pub(crate) async fn scrub_file(
        &self,
        ctx: &FileContext,
        report: &mut ScrubReport,
    ) -> Result<(), ClientError> {
        report.files += 1;
        let stripes = ctx.layout.stripes_for_size(ctx.meta.size);
        let extents_total = stripes.saturating_add(PAST_SIZE_STRIPES_MAX);
        let allocation = ctx
            .allocated_stripes_past(self, None, stripes, extents_total)
            .await;
        let lost = (0..ctx.layout.width).any(|c| ctx.lost_entirely(c));
        // With a column lost, every stripe is skipped rather than read, so those that hold
        // nothing on the other columns are counted without a visit. A column that
        // answered but refused to say is not lost: then everything is visited.
        let known = (allocation.complete || lost).then_some(&allocation.stripes[..]);
        let walk = clip_to(0..stripes, known);
        let not_walked = stripes - count(&walk);
        if allocation.complete {
            report.stripes_unallocated += not_walked;
        } else {
            report.stripes_skipped += not_walked;
        }
        let mut checks = stream::iter(walk.into_iter().flatten())
            .map(|stripe| ctx.scrub_stripe(self, stripe))
            .buffer_unordered(STRIPES_IN_FLIGHT_MAX);
        while let Some(result) = checks.next().await {
            report.add(result?);
        }
        if !allocation.complete {
            return Ok(());
        }
        let past = clip_to(stripes..extents_total, Some(&allocation.stripes));
        let mut checks = stream::iter(past.into_iter().flatten())
            .map(|stripe| ctx.scrub_stripe(self, stripe))
            .buffer_unordered(STRIPES_IN_FLIGHT_MAX);
        while let Some(result) = checks.next().await {
            match result {
                Ok(one) => report.add_past_size(one, &ctx.meta.path),
                Err(e) => {
                    tracing::warn!("{}: past the file's size: {e}", ctx.meta.path);
                    report.past_size_unrepairable += 1;
                }
            }
        }
        Ok(())
    }
}

/// What [`Client::resolve_torn`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TornResolution {
    /// Stripes under orphaned stale-parity records the server listed.
    pub stripes: u64,
    /// Of those, stripes whose parity was recomputed from their data (or found right) and
    /// taken out of the records.
    pub resolved: u64,
    /// Stripes left torn: a column of the stripe is lost or owes it, so its parity cannot be
    /// computed now (a later pass, a scrub or a rebuild does it).
    pub left: u64,
}

impl Client {
    /// The parts of `range` (bytes of `file`) that may hold written bytes, in whole stripes
    /// clipped to `range`, from the extents of every column's data and redundancy files (and
    /// the stripes a column owes); every other byte of `range` reads as zeros on every
    /// column. `None` if some column could not say, or listed more extents than one answer
    /// holds: then any of `range` may hold bytes. A shrinking truncation zeroes only these,
    /// so cutting a sparse file's tail costs what it holds, not its length.
    pub async fn written_ranges(
        &self,
        file: &crate::File,
        range: Range<u64>,
    ) -> Result<Option<Vec<Range<u64>>>, ClientError> {
        let ctx = self.context_of(file.id).await?;
        let stripe = ctx.layout.stripe_bytes();
        let (first, end) = (range.start / stripe, range.end.div_ceil(stripe));
        let allocation = ctx.allocated_stripes_past(self, None, end, end).await;
        if !allocation.complete || allocation.extent_end.is_none() {
            return Ok(None);
        }
        let clip = |stripes: &Range<u64>| {
            let start = stripes
                .start
                .max(first)
                .saturating_mul(stripe)
                .max(range.start);
            let stop = stripes.end.min(end).saturating_mul(stripe).min(range.end);
            (start < stop).then_some(start..stop)
        };
        Ok(Some(allocation.stripes.iter().filter_map(clip).collect()))
    }
}

impl Client {
    /// Resolve the torn stripes server `server` holds orphaned stale-parity records of
    /// (full-stripe writes whose writer died): each stripe is locked, which hands the lock
    /// holder the record, and its parity is recomputed from the data, as a scrub of the
    /// stripe does. Run by each server's daemon in the background (`tessera-store`'s `stale`
    /// module argues it), so that a torn stripe does not wait for its next writer.
    pub async fn resolve_torn(&self, server: ServerId) -> Result<TornResolution, ClientError> {
        let status = self.status().await?;
        let me = status
            .iter()
            .find(|s| s.id == server)
            .ok_or(ClientError::NoSuchServer(server))?;
        let addr = me
            .addr
            .parse()
            .map_err(|_| ClientError::ServerDown(server))?;
        let listed = context::call_store(
            self,
            addr,
            me.incarnation,
            StorageRequest::ListStale,
            Bytes::new(),
        )
        .await;
        let ranges = match listed {
            Ok((StorageResponse::StaleList { ranges }, _)) => ranges,
            _ => return Err(ClientError::ServerDown(server)),
        };
        let mut done = TornResolution::default();
        for (file, range) in ranges {
            let ctx = match self.context_of(file).await {
                Ok(ctx) => ctx,
                // Removed meanwhile: its records go with it.
                Err(ClientError::Metadata(ManagerError::NotFound(_))) => continue,
                Err(e) => return Err(e),
            };
            for stripe in range.start..range.end {
                done.stripes += 1;
                match ctx.scrub_stripe(self, stripe).await {
                    Ok(report) if report.stripes_checked == 1 => done.resolved += 1,
                    Ok(_) => done.left += 1,
                    Err(e) => {
                        tracing::warn!("{}: stripe {stripe} left torn: {e}", ctx.meta.path);
                        done.left += 1;
                    }
                }
            }
        }
        Ok(done)
    }
}

/// Stripes of `range` that hold some of a file of `meta`'s size.
fn owed(meta: &FileMeta, range: &IndexRange) -> u64 {
    let stripes = meta.layout.stripes_for_size(meta.size);
    range.end.min(stripes).saturating_sub(range.start)
}
