//! Putting back the bytes servers kept at a power loss (`tessera-store`'s `kept` module)
//! where a file has no servers left to rebuild it from.
//!
//! A store that lost power with answered writes not synced renews itself, owes every file it
//! held, and is rebuilt from the others; it keeps its old bytes aside meanwhile. When more
//! of a file's servers owe it that way than its scheme tolerates (every server of a local
//! cluster losing power at once; any one for RAID-0), the rebuild has nothing to go on, and
//! the file's synced bytes are only in what those servers kept. So the rebuild puts the kept
//! bytes back on every server owing the file, resyncs parity and mirrors from the data (a
//! scrub: checksummed data is trusted, a torn block is rebuilt from the stripe's other units
//! where it can be, parity is rewritten where it does not match), and only then clears the
//! debts. Writes answered and never synced before the power loss may be lost, as with any
//! store that loses every copy's page cache at once; synced bytes are not.
//!
//! Crash-safe in the order of its steps: a rebuild that dies after putting bytes back finds
//! them put back when run again (the store's `.restored` mark), resyncs again and clears the
//! debts; each server's mark goes only once its debt is cleared. Only whole-file debts are
//! restored, which only a renewed (or wiped) store has: a server that merely missed writes
//! while down never has its old bytes trusted over the others'.

use crate::context::FileContext;
use crate::maintain::ScrubReport;
use crate::{Client, ClientError};
use bytes::Bytes;
use std::collections::HashMap;
use tessera_layout::{Layout, Scheme};
use tessera_wire::{
    FileDebt, FileId, IndexRange, KeptAction, ManagerRequest, ServerId, StorageRequest,
    StorageResponse,
};

impl Client {
    /// For a file whose rebuild failed: if more of its servers owe it whole than its scheme
    /// tolerates, and every one of them kept its bytes at a power loss (or put them back in a
    /// run that died), put them back, resync the file from its data and clear the debts. The
    /// resync's report, or `None` if the file does not qualify (it stays owed).
    pub(crate) async fn restore_kept(
        &self,
        file: FileId,
        debts: &mut DebtBook,
    ) -> Result<Option<ScrubReport>, ClientError> {
        let mut view = self.lookup_view(file).await?;
        let owing: Vec<ServerId> = view.missed.iter().map(|m| m.server).collect();
        let whole = [IndexRange::new(0, u64::MAX)];
        if view.missed.iter().any(|m| m.stripes != whole) {
            return Ok(None);
        }
        let ctx = self.context_from(view.clone())?;
        let columns: Vec<u32> = (0..ctx.layout.width)
            .filter(|&c| owing.contains(&ctx.columns[c as usize].server))
            .collect();
        if columns.len() != owing.len()
            || !beyond_tolerance(&ctx.layout, &columns)
            || columns.iter().any(|&c| ctx.lost_entirely(c))
        {
            return Ok(None);
        }
        // A column that kept nothing of the file is fine if it never held any of it (a file
        // smaller than a stripe); one that should have is a store lost some other way.
        let holding = columns_holding(&ctx.layout, ctx.meta.size);
        let mut kept = Vec::new();
        for &column in &columns {
            if self.kept_bytes(&ctx, column, KeptAction::Ask).await? {
                kept.push(column);
            } else if holding[column as usize] {
                return Ok(None);
            }
        }
        for &column in &kept {
            self.kept_bytes(&ctx, column, KeptAction::Restore).await?;
        }
        if kept.is_empty() {
            tracing::info!(
                "{}: servers {owing:?} owe it but hold none of its bytes: nothing to rebuild",
                ctx.meta.path
            );
        } else {
            tracing::warn!(
                "{}: no server is left to rebuild it from, so the bytes servers {owing:?} kept \
                 at a power loss are put back and its parity resynced from them (writes never \
                 synced before the power loss may be lost)",
                ctx.meta.path
            );
        }
        // Nobody writes a file that more columns owe than its scheme tolerates: the debts
        // can wait while the file is resynced with them set aside.
        view.missed.clear();
        let mut resync = self.context_from(view)?;
        resync.debts_set_aside = owing.clone();
        let mut report = ScrubReport::default();
        self.scrub_file(&resync, &mut report).await?;
        tracing::info!(
            "{}: resynced: {} stripes checked, {} skipped, {} with parity rewritten, {} copies \
             and {} corrupt blocks repaired, {} problems left",
            resync.meta.path,
            report.stripes_checked,
            report.stripes_skipped,
            report.parity_repaired,
            report.mirrors_repaired,
            report.corrupt_repaired,
            report.unrepairable.len()
        );
        for &column in &columns {
            let server = ctx.columns[column as usize].server;
            self.clear_whole_debt(server, file, debts).await?;
            if kept.contains(&column) {
                self.kept_bytes(&ctx, column, KeptAction::Drop).await?;
            }
        }
        Ok(Some(report))
    }

    /// `action` on the bytes `column`'s server kept of the file; whether it had any.
    pub(crate) async fn kept_bytes(
        &self,
        ctx: &FileContext,
        column: u32,
        action: KeptAction,
    ) -> Result<bool, ClientError> {
        let request = StorageRequest::KeptBytes {
            file: ctx.meta.id,
            action,
        };
        match ctx.rpc(self, column, request, Bytes::new()).await {
            Ok((StorageResponse::Kept { present }, _)) => Ok(present),
            Ok((other, _)) => Err(ClientError::Protocol {
                peer: format!("server {}", ctx.columns[column as usize].server),
                detail: format!("expected an answer about kept bytes, got {other:?}"),
            }),
            Err(fault) => Err(ctx.second_fault(column, column, fault)),
        }
    }

    /// Tells the manager `server` owes nothing more of `file` (its debt, under the tag it
    /// has now).
    async fn clear_whole_debt(
        &self,
        server: ServerId,
        file: FileId,
        debts: &mut DebtBook,
    ) -> Result<(), ClientError> {
        // Listed again if the file is not in the listing: its debt may be newer.
        let listed = debts.0.get(&server).is_some_and(|d| d.contains_key(&file));
        if !listed {
            let listing = self.debts_of(server).await?;
            let by_file = listing.into_iter().map(|d| (d.meta.id, d)).collect();
            debts.0.insert(server, by_file);
        }
        let Some(debt) = debts.0.get_mut(&server).and_then(|d| d.remove(&file)) else {
            return Ok(());
        };
        for stripes in debt.missed {
            let resynced = ManagerRequest::Resynced {
                server,
                file,
                stripes,
                tag: debt.tag,
            };
            if let Err(e) = self.manager_call(resynced).await {
                // A tag changed since the listing (a write skipped the server): listed again
                // next time, and this file stays owed until a rebuild runs again.
                debts.0.remove(&server);
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Other servers' debts, listed once per rebuild and taken file by file as they are cleared:
/// each listing holds every file a server owes, so listing it per file restored made a
/// rebuild of every file after a power loss quadratic in the files.
#[derive(Default)]
pub(crate) struct DebtBook(HashMap<ServerId, HashMap<FileId, FileDebt>>);

/// Whether some stripe has more of its columns among `owing` than the scheme tolerates, so
/// that the others cannot rebuild it: only then are kept bytes put back (a rebuild that
/// failed for another reason is run again instead, losing nothing the others hold). A RAID-1
/// block's copies are on neighbouring columns; every stripe of a parity scheme spans them all.
fn beyond_tolerance(layout: &Layout, owing: &[u32]) -> bool {
    match layout.scheme {
        Scheme::Raid0 => !owing.is_empty(),
        Scheme::Raid1 => owing
            .iter()
            .any(|&c| owing.contains(&((c + 1) % layout.width))),
        Scheme::Raid4 | Scheme::Raid5 | Scheme::Hybrid => owing.len() > 1,
    }
}

/// Which columns hold some of a file of `size` bytes (data, mirror, parity or overflow
/// copies): all of them once it spans a couple of stripes, fewer for a small file.
fn columns_holding(layout: &Layout, size: u64) -> Vec<bool> {
    let mut holding = vec![false; layout.width as usize];
    let blocks = size.div_ceil(u64::from(layout.stripe_unit));
    let enough = 2 * u64::from(layout.data_per_stripe());
    for block in 0..blocks.min(enough) {
        let mut columns = vec![layout.data_slot(block).column];
        columns.extend(layout.mirror_slot(block).map(|slot| slot.column));
        let stripe = layout.stripe_of_block(block);
        columns.extend(layout.parity_slot(stripe).map(|slot| slot.column));
        if layout.scheme == Scheme::Hybrid {
            columns.push(layout.overflow_column(block, tessera_layout::OverflowRole::Mirror));
        }
        for column in columns {
            holding[column as usize] = true;
        }
    }
    holding
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_bytes_are_put_back_only_where_nothing_is_left_to_rebuild_from() {
        let layout = |scheme, width| Layout::new(scheme, 4096, width).expect("layout");
        assert!(beyond_tolerance(&layout(Scheme::Raid0, 3), &[1]));
        assert!(!beyond_tolerance(&layout(Scheme::Raid0, 3), &[]));
        // RAID-1 over 5: columns 1 and 3 each leave every block a copy; 4 and 0 do not.
        assert!(!beyond_tolerance(&layout(Scheme::Raid1, 5), &[1, 3]));
        assert!(beyond_tolerance(&layout(Scheme::Raid1, 5), &[4, 0]));
        assert!(!beyond_tolerance(&layout(Scheme::Raid1, 5), &[2]));
        for scheme in [Scheme::Raid4, Scheme::Raid5, Scheme::Hybrid] {
            assert!(!beyond_tolerance(&layout(scheme, 5), &[2]));
            assert!(beyond_tolerance(&layout(scheme, 5), &[0, 3]));
        }
    }

    #[test]
    fn a_small_file_is_held_by_the_columns_of_its_blocks_and_their_copies() {
        let layout = |scheme| Layout::new(scheme, 4096, 5).expect("layout");
        let held = |scheme, size| -> Vec<u32> {
            let holding = columns_holding(&layout(scheme), size);
            (0..5).filter(|&c| holding[c as usize]).collect()
        };
        assert_eq!(held(Scheme::Raid1, 0), Vec::<u32>::new());
        assert_eq!(held(Scheme::Raid1, 100), [0, 1]);
        assert_eq!(held(Scheme::Raid0, 4097), [0, 1]);
        assert_eq!(held(Scheme::Raid0, 5 * 4096), [0, 1, 2, 3, 4]);
        let raid5 = layout(Scheme::Raid5);
        let parity = raid5.parity_slot(0).expect("parity").column;
        let mut want = vec![raid5.data_slot(0).column, parity];
        want.sort();
        assert_eq!(held(Scheme::Raid5, 10), want);
        // Two stripes or more: every column.
        assert_eq!(held(Scheme::Hybrid, 8 * 4096), [0, 1, 2, 3, 4]);
    }
}
